"""What the Flower apps need to know about an experiment, behind one small interface.

The ServerApp and ClientApp are generic: they obtain the configuration, the algorithms and the
round loop from an :class:`AppHooks` object named by an import spec (``"module:attribute"``)
in the run config. :data:`PDPFL_HOOKS` wires in pdpfl's own configuration
(:mod:`pdpfl.config`), algorithm factory (:mod:`pdpfl.fl.factory`), data loaders
(:mod:`pdpfl.data`) and :func:`pdpfl.runtime.loop.run_federation`, i.e. exactly the code the
in-process simulator runs. Tests substitute a toy algorithm through the same interface.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdpfl.fl.api import ClientAlgorithm, Scalars, ServerAlgorithm, Transport
from pdpfl.fl.messages import SILO_INFO, MessageId

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig
    from pdpfl.data.federation import ClientData, Federation
    from pdpfl.runtime.loop import RoundCallback

#: Set (to "1") in a warm worker process: silos stay in memory between messages.
WARM_ENV = "PDPFL_WARM_WORKER"
#: Node-config keys a SuperNode is started with (``--node-config "partition-id=0 ..."``).
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
DATA_DIR = "data-dir"
STATE_DIR = "state-dir"
#: Node-config key naming a non-default hooks spec this silo agrees to load (tests, extensions).
HOOKS_KEY = "hooks"
#: Node-config key pinning the experiment a silo agrees to run (:func:`config_digest`).
CONFIG_HASH_KEY = "config-hash"
#: Node-config key: where the silo keeps its budget stores (default ``<state-dir>/budgets``).
BUDGET_STORE = "budget-store"
#: Node-config key: the silo lets a run re-spend its data (``lifetime.allow_respend`` of the
#: run is honoured only then; a silo's budgets are never re-spent on the server's word alone).
ALLOW_RESPEND = "allow-respend"
#: Node-config key: the other silos' public keys (a folder of ``silo-<i>.pub`` files or one
#: JSON list), given to the silo out of band; secure summation authenticates every key and
#: survivor set with them (:mod:`pdpfl.fl.aggregation.secure_identity`). The silo's own private
#: identity stays in its state folder (``<state-dir>/identity/silo-<i>.key``).
PEER_KEYS = "peer-keys"


def silo_store_root(node_config: Mapping[str, Any]) -> Path | None:
    """The silo's budget store folder: ``budget-store``, else ``<state-dir>/budgets``."""
    if node_config.get(BUDGET_STORE):
        return Path(str(node_config[BUDGET_STORE])).expanduser()
    if node_config.get(STATE_DIR):
        return Path(str(node_config[STATE_DIR])).expanduser() / "budgets"
    return None


def _truthy(value: object) -> bool:
    return value is True or str(value).strip().lower() in ("1", "true", "yes")


def config_digest(config_dict: dict[str, Any]) -> str:
    """SHA-256 (16 hex digits) of a config's canonical JSON, ``output_dir`` excluded: what a
    pinned silo (``--expect-config``) compares. Unlike :func:`pdpfl.config.config_hash` it keeps
    sections at their defaults (both sides hash the same full dictionary)."""
    import hashlib
    import json

    data = dict(config_dict)
    data.pop("output_dir", None)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


DEFAULT_HOOKS = "pdpfl.runtime.flower.hooks:PDPFL_HOOKS"


@dataclass(frozen=True)
class AppHooks:
    """The experiment-specific callables used by the generic Flower apps.

    Attributes
    ----------
    config_from_dict, config_to_dict
        (De)serialise the experiment configuration (it travels as JSON in the run config).
    num_silos
        Number of silos the configuration expects (the number of SuperNodes to wait for).
    silo_info
        At a silo, ``(config, silo, node_config) -> Scalars``: public facts the server needs to
        set up the mechanism (shapes, names; the silo size only when the config declares sizes
        public). Never budgets or their statistics.
    build_server
        At the server, ``(config, silo_infos) -> (ServerAlgorithm, public)``; ``public`` is a
        JSON-able dict sent to every silo with each message (e.g. the published calibration).
    build_client
        At a silo, ``(config, silo, node_config, public) -> ClientAlgorithm`` from that silo's
        data only.
    run
        The round loop ``(config, server, transport, out_dir, resume, on_round=None) -> result``
        (``on_round(round_index, metrics_line)`` is called after every round).
    finish
        At the server, ``(config, result, out_dir) -> summary``: writes the run's outputs.
    run_facts
        Optional, at the server, ``(config, silo_infos) -> dict`` added to the run's result
        before ``finish``: public facts of the run, such as ``parameter_names`` (the model's
        ``state_dict`` names, so that every runtime writes the same named model file) and
        ``data`` (the federation as the silos described it: names, shapes; no sizes).
    silo_info_message
        The declared message (:mod:`pdpfl.fl.messages`) that ``silo_info``'s facts must be:
        pdpfl's :data:`~pdpfl.fl.messages.SILO_INFO` by default; hooks that send other facts
        register their own schema and name it here.
    """

    config_from_dict: Callable[[dict[str, Any]], Any]
    config_to_dict: Callable[[Any], dict[str, Any]]
    num_silos: Callable[[Any], int]
    silo_info: Callable[[Any, int, Mapping[str, Any]], Scalars]
    build_server: Callable[[Any, dict[int, Scalars]], tuple[ServerAlgorithm, dict[str, Any]]]
    build_client: Callable[[Any, int, Mapping[str, Any], dict[str, Any]], ClientAlgorithm]
    run: Callable[..., dict[str, Any]]
    finish: Callable[[Any, dict[str, Any], Path], dict[str, Any]]
    run_facts: Callable[[Any, dict[int, Scalars]], dict[str, Any]] | None = None
    silo_info_message: MessageId = SILO_INFO


def load_hooks(spec: str) -> AppHooks:
    """Import ``"package.module:attribute"`` and check that it is an :class:`AppHooks`."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"hooks spec {spec!r}: expected 'module:attribute'")
    hooks = getattr(importlib.import_module(module_name), attr)
    if not isinstance(hooks, AppHooks):
        raise TypeError(f"hooks spec {spec!r} is a {type(hooks).__name__}, not an AppHooks")
    return hooks


# ----------------------------------------------------------------------- pdpfl's own hooks


def _config_from_dict(raw: dict[str, Any]) -> ExperimentConfig:
    from pdpfl.config import config_from_dict

    return config_from_dict(raw)


def _config_to_dict(config: ExperimentConfig) -> dict[str, Any]:
    from pdpfl.config import config_to_dict

    return config_to_dict(config)


#: Federations loaded by this process, by (data section, seed, data folder): a warm worker
#: serving several local silos loads a data set once.
_FEDERATIONS: dict[str, Federation] = {}
_MAX_FEDERATIONS = 4


def _load_silo_federation(config: ExperimentConfig, node_config: Mapping[str, Any]) -> Federation:
    """The federation as seen from one silo (its ``data-dir`` overrides ``data.data_dir``)."""
    import json

    from pdpfl.runtime.simulation import load_federation_for

    data_dir = node_config.get(DATA_DIR)
    if data_dir:
        from pdpfl.config import with_updates

        config = with_updates(config, [f"data.data_dir={Path(str(data_dir)).expanduser()}"])
    key = json.dumps([config.data.model_dump(mode="json"), config.seed], sort_keys=True)
    if key not in _FEDERATIONS:
        while len(_FEDERATIONS) >= _MAX_FEDERATIONS:
            _FEDERATIONS.pop(next(iter(_FEDERATIONS)))
        _FEDERATIONS[key] = load_federation_for(config)
    return _FEDERATIONS[key]


def _num_silos(config: ExperimentConfig) -> int:
    if config.data.num_clients is not None:
        return int(config.data.num_clients)
    return int(len(_load_silo_federation(config, {}).clients))


def _silo_info(config: ExperimentConfig, silo: int, node_config: Mapping[str, Any]) -> Scalars:
    """Shapes and the silo's name (and its size only if ``data.public_silo_sizes``)."""
    import json

    federation = _load_silo_federation(config, node_config)
    info: Scalars = {
        "input_shape": json.dumps([int(s) for s in federation.input_shape]),
        "num_classes": int(federation.num_classes),
        "name": str(federation.clients[silo].name),
    }
    if config.data.public_silo_sizes:
        info["num_examples"] = int(len(federation.clients[silo].y_train))
    return info


def _build_server(
    config: ExperimentConfig, silo_infos: dict[int, Scalars]
) -> tuple[ServerAlgorithm, dict[str, Any]]:
    """The server, from the silos' public facts; the public setup is computed once, here."""
    import json

    from pdpfl.fl.algorithm import as_algorithm
    from pdpfl.fl.api import FederationInfo
    from pdpfl.fl.common import party_randomness

    first = silo_infos[min(silo_infos)]
    ids = sorted(silo_infos)
    info = FederationInfo(
        input_shape=tuple(json.loads(str(first["input_shape"]))),
        num_classes=int(first["num_classes"]),
        client_ids=tuple(ids),
        client_names=tuple(str(silo_infos[s].get("name", s)) for s in ids),
        silo_sizes=(
            tuple(int(silo_infos[s]["num_examples"]) for s in ids)
            if config.data.public_silo_sizes
            else None
        ),
    )
    algorithm = as_algorithm(config.algorithm)
    setup = algorithm.setup(config, info)
    server = algorithm.server(config, info, setup, party_randomness(config, "server"))
    _server_target(config, server)
    return server, {"info": info.to_dict(), "setup": setup.to_dict()}


def _server_target(config: ExperimentConfig, server: ServerAlgorithm) -> None:
    """The coordinator's own budget store (ULDP-FL's users), as in the simulator."""
    import numpy as np

    from pdpfl.fl.lifetime import TARGET_ATTR, server_target
    from pdpfl.ledger import PrivacyLedger

    ledger = getattr(server, "ledger", None)
    private = bool(getattr(type(config.algorithm), "private", True))
    units = (
        ledger.n if isinstance(ledger, PrivacyLedger) else np.size(getattr(server, "budgets", []))
    )
    if isinstance(ledger, PrivacyLedger) or (not private and units):
        setattr(server, TARGET_ATTR, server_target(config, int(units)))


def _silo_data(config: ExperimentConfig, silo: int, node_config: Mapping[str, Any]) -> ClientData:
    """This silo's :class:`~pdpfl.data.federation.ClientData`, cached in its own state folder.

    In the per-message mode a SuperNode starts one ClientApp process per message; the cache
    (``.npz``, no pickle, keyed by the data config, seed and silo) saves re-reading and
    re-partitioning the data set. A warm worker builds each silo once.
    """
    import dataclasses
    import hashlib
    import json

    import numpy as np

    from pdpfl.data.federation import ClientData
    from pdpfl.io import save_npz

    state_dir = node_config.get(STATE_DIR)
    key = hashlib.sha256(
        json.dumps(
            [config.data.model_dump(mode="json"), config.seed, silo, node_config.get(DATA_DIR)],
            sort_keys=True,
        ).encode()
    ).hexdigest()[:16]
    cache = Path(str(state_dir)) / "data-cache" / f"silo-{silo}-{key}.npz" if state_dir else None
    if cache is not None and cache.exists():
        with np.load(cache, allow_pickle=False) as npz:
            fields = {k: npz[k] for k in npz.files}
        fields["name"] = str(fields["name"])
        return ClientData(**fields)
    data = _load_silo_federation(config, node_config).clients[silo]
    if cache is not None:
        arrays = {
            f.name: getattr(data, f.name)
            for f in dataclasses.fields(data)
            if getattr(data, f.name) is not None
        }
        save_npz(cache, **arrays)
    return data


def _build_client(
    config: ExperimentConfig, silo: int, node_config: Mapping[str, Any], public: dict[str, Any]
) -> ClientAlgorithm:
    from pdpfl.fl.algorithm import as_algorithm
    from pdpfl.fl.api import FederationInfo
    from pdpfl.fl.common import party_randomness
    from pdpfl.fl.lifetime import TARGET_ATTR, silo_target
    from pdpfl.ledger import PrivacyLedger

    algorithm = as_algorithm(config.algorithm)
    info = FederationInfo.from_dict(public["info"])
    setup = algorithm.setup_type.from_dict(public["setup"])
    data = _silo_data(config, silo, node_config)
    client = algorithm.client(
        config, silo, data, info, setup, party_randomness(config, f"silo-{silo}")
    )
    if isinstance(getattr(client, "ledger", None), PrivacyLedger) or not algorithm.private:
        # the silo's own budget store, in its SuperNode's state folder
        target = silo_target(
            config,
            silo,
            data,
            root=silo_store_root(node_config),
            allow_respend=config.lifetime.allow_respend and _truthy(node_config.get(ALLOW_RESPEND)),
        )
        setattr(client, TARGET_ATTR, target)
    return client


def _run(
    config: ExperimentConfig,
    server: ServerAlgorithm,
    transport: Transport,
    out_dir: Path,
    resume: bool,
    on_round: RoundCallback | None = None,
) -> dict[str, Any]:
    from pdpfl.errors import TrainingDiverged
    from pdpfl.fl.aggregation import protocol_from_config
    from pdpfl.runtime.loop import run_federation

    try:
        result = run_federation(
            config,
            server,
            transport,
            out_dir,
            resume=resume,
            progress=False,
            on_round=on_round,
            # the simulator's choice exactly: secure summation with its participation mode and
            # parameters, or ULDP-FL's private weighting (algorithm.weights: private)
            protocol=protocol_from_config(config),
        )
    except TrainingDiverged as err:  # the partial run's outputs include the server's ledger
        if err.result is not None:
            err.result["server"] = server
        raise
    result["server"] = server  # its own ledger (ULDP-FL's users) is written by _finish
    return result


def _run_facts(config: ExperimentConfig, silo_infos: dict[int, Scalars]) -> dict[str, Any]:
    """The model's parameter names (built from the public initial model x⁰, as the simulator
    does) and the federation's public description (the silos' names and shapes; sizes stay at
    the silos unless the config declares them public)."""
    import json

    from pdpfl.models import initial_model, trainable_parameters

    first = silo_infos[min(silo_infos)]
    shape = tuple(int(v) for v in json.loads(str(first["input_shape"])))
    classes = int(first["num_classes"])
    x0 = initial_model(
        config.model.name, shape, classes, dict(config.model.options), seed=config.seed
    )
    ids = sorted(silo_infos)
    data: dict[str, Any] = {
        "source": "config.data (described by the silos)",
        "dataset": str(config.data.dataset),
        "clients": len(ids),
        "silo_names": [str(silo_infos[s].get("name", s)) for s in ids],
        "input_shape": list(shape),
        "num_classes": classes,
    }
    if config.data.public_silo_sizes:
        data["train_records"] = int(sum(int(silo_infos[s]["num_examples"]) for s in ids))
    return {"parameter_names": [n for n, _ in trainable_parameters(x0)], "data": data}


def _finish(config: ExperimentConfig, result: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """``summary.json``, the named ``model.safetensors`` (and ``model.npz``) and plots by the
    simulator's writer, coordinator view (the silos' privacy summaries stay at the silos)."""
    from pdpfl.runtime.outputs import write_outputs

    server = result.pop("server", None)
    return write_outputs(
        config,
        result,
        out_dir,
        view="coordinator",
        server=server,
        data=result.pop("data", None),
        parameter_names=result.pop("parameter_names", None),
    )


PDPFL_HOOKS = AppHooks(
    config_from_dict=_config_from_dict,
    config_to_dict=_config_to_dict,
    num_silos=_num_silos,
    silo_info=_silo_info,
    build_server=_build_server,
    build_client=_build_client,
    run=_run,
    finish=_finish,
    run_facts=_run_facts,
)
