"""In-process simulation: every silo is a Python object, the transport is a direct call.

It runs the same :func:`pdpfl.runtime.loop.run_federation` loop and the same algorithm objects as
the Flower runtime, so with ``randomness: reproducible`` and the same seed both produce the same
model. Each silo object keeps its own secret randomness (``randomness: secure``), exactly as a
silo process would.

Because one operator owns every silo here, the simulator may read each silo's privacy summary
and assemble a full report (per budget group, per observer); a Flower deployment cannot, since
those summaries stay at the silos.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pdpfl.config import ExperimentConfig
from pdpfl.fl.api import ClientAlgorithm, Contribution, Params, Scalars
from pdpfl.runtime.loop import run_federation


class InProcessTransport:
    """A :class:`~pdpfl.runtime.loop.Transport` that calls client objects directly."""

    def __init__(self, clients: dict[int, ClientAlgorithm]) -> None:
        self.clients = dict(sorted(clients.items()))
        self.client_ids = list(self.clients)
        #: Each silo's private protocol memory (never read by the server side).
        self._silo_memory: dict[int, dict[str, Any]] = {c: {} for c in self.client_ids}

    def exchange(
        self, protocol: str, stage: str, requests: dict[int, dict[str, Any]], round_index: int
    ) -> dict[int, dict[str, Any]]:
        from pdpfl.fl.aggregation import SiloContext, handle_silo_stage

        return {
            c: handle_silo_stage(
                protocol,
                stage,
                payload,
                round_index,
                SiloContext(self.clients[c], c, self._silo_memory[c]),
            )
            for c, payload in requests.items()
        }

    def fit(
        self, selected: list[int], params: Params, round_index: int, config: Scalars
    ) -> list[Contribution]:
        return [self.clients[c].fit(params, round_index, config) for c in selected]

    def evaluate(
        self, client_ids: list[int], params: Params, round_index: int, config: Scalars
    ) -> dict[int, Scalars]:
        return {c: self.clients[c].evaluate(params, round_index, config) for c in client_ids}

    def privacy_summaries(self) -> dict[int, Scalars]:
        return {c: client.privacy_summary() for c, client in self.clients.items()}

    def client_states(self) -> dict[int, dict]:
        return {c: client.state_dict() for c, client in self.clients.items()}

    def load_client_states(self, states: dict[int, dict]) -> None:
        for c, state in states.items():
            self.clients[int(c)].load_state_dict(state)


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Temporarily set torch's intra-op thread count (no-op for None)."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


class SetupWarning(UserWarning):
    """A problem found before training that does not stop the run (also in ``summary.json``)."""


#: Key under which :func:`load_federation_for` marks a federation with the config it came from.
_LOADED_FROM = "pdpfl.loaded_from"


def _data_key(config: ExperimentConfig) -> str:
    import json

    return json.dumps([config.data.model_dump(mode="json"), config.seed], sort_keys=True)


def load_federation_for(config: ExperimentConfig) -> Any:
    """The federation described by ``config.data`` (seeded from ``config.seed``)."""
    from pdpfl.data import load_federation

    d = config.data
    kwargs: dict[str, Any] = dict(
        partition=d.partition,
        partition_params=dict(d.partition_params),
        seed=config.seed,
        data_dir=d.data_dir,
        **dict(d.options),
    )
    if d.num_clients is not None:
        kwargs["num_clients"] = d.num_clients
    federation = load_federation(d.dataset, **kwargs)
    federation.metadata[_LOADED_FROM] = _data_key(config)
    return federation


def from_config(config: ExperimentConfig, federation: Any) -> bool:
    """True if ``federation`` was loaded by :func:`load_federation_for` from ``config.data``."""
    return getattr(federation, "metadata", {}).get(_LOADED_FROM) == _data_key(config)


def describe_data(config: ExperimentConfig, federation: Any) -> dict[str, Any]:
    """``summary["data"]``: the federation a run really trained on (sizes are operator-only)."""
    user = not from_config(config, federation)
    meta = {k: v for k, v in getattr(federation, "metadata", {}).items()
            if k != _LOADED_FROM and isinstance(v, str | int | float | bool | type(None))}
    return {
        "source": "user-supplied federation (passed to run_simulation; config.data not used)"
        if user else "config.data",
        "dataset": str(federation.name),
        "clients": len(federation.clients),
        "silo_names": [str(c.name) for c in federation.clients],
        "train_records": int(sum(len(c.y_train) for c in federation.clients)),
        "test_records": int(sum(len(c.y_test) for c in federation.clients)),
        "input_shape": [int(v) for v in federation.input_shape],
        "num_classes": int(federation.num_classes),
        **({"partition": meta.pop("partition")} if "partition" in meta else {}),
        "metadata": meta,
    }


def config_for_federation(config: ExperimentConfig, federation: Any) -> ExperimentConfig:
    """``config`` with a truthful ``data`` section for a user-supplied ``federation``.

    A federation loaded from ``config.data`` keeps the config unchanged; any other one is
    recorded by name (``data.dataset``), number of silos and partition ``user``, so that
    ``summary.json`` and the resume check never describe a dataset that was not used.
    """
    if from_config(config, federation):
        return config
    from pdpfl.config import DataConfig

    data = DataConfig(
        dataset=str(federation.name) or "user-data",
        num_clients=len(federation.clients),
        partition=str(getattr(federation, "metadata", {}).get("partition", "user")),
        public_silo_sizes=config.data.public_silo_sizes,
    )
    return config.model_copy(update={"data": data})


def check_federation(config: ExperimentConfig, federation: Any) -> list[str]:
    """Problems that make a run meaningless (raised) and warnings (returned), before training.

    * a silo without training records is an error naming the silo;
    * silos without test records are left out of the pooled metrics (one warning naming them;
      when no silo has any, accuracy and loss are not measured at all);
    * a scenario's budget mix that cannot be kept because silos are too small (each silo rounds
      the shares to whole records) is an error naming the configured and realized mix;
    * a public batch size B larger than a silo's training set is a warning;
    * a ``budgets.file`` table with budgets for record ids that are not in the data is an
      error, or a warning under ``budgets.on_unmatched: ignore``
      (:func:`pdpfl.data.budget_table.check_budget_file`).
    """
    clients = list(federation.clients)
    empty = [f"{k} ({c.name!r})" for k, c in enumerate(clients) if len(c.y_train) == 0]
    if empty:
        raise ValueError(
            f"data: silo(s) {_few(empty)} have no training records; use fewer silos "
            "(data.num_clients), a partition that gives every silo records (e.g. dirichlet "
            "min_size), or leave those silos out of the federation"
        )
    warnings: list[str] = []
    no_test = [str(c.name) for c in clients if len(c.y_test) == 0]
    if len(no_test) == len(clients):
        warnings.append(
            "data: no silo has test records, so test accuracy and loss are not measured "
            "(they are reported as missing and the accuracy plot says so)"
        )
    elif no_test:
        warnings.append(
            f"data: {len(no_test)} silo(s) have no test records ({_few(no_test)}); pooled test "
            f"metrics use the {sum(len(c.y_test) for c in clients)} test records of the "
            f"other {len(clients) - len(no_test)} silo(s)"
        )
    from pdpfl.data.budget_table import check_budget_file

    warnings.extend(check_budget_file(config, federation))
    _check_budget_mix(config, clients)
    warnings.extend(_batch_size_warnings(config, clients))
    return warnings


def _few(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


#: Largest tolerated gap between a level's configured and realized share of all records.
MIX_TOLERANCE = 0.05


def _check_budget_mix(config: ExperimentConfig, clients: list[Any]) -> None:
    """Refuse a discrete budget scenario whose shares the silos are too small to keep."""
    import numpy as np

    from pdpfl import budgets as budgets_mod
    from pdpfl.fl.common import client_budgets
    from pdpfl.fl.registry import get_algorithm
    from pdpfl.seeding import numpy_generator

    if config.budgets.file is not None or get_algorithm(config.algorithm.name).unit != "record":
        return  # per-record budgets from a file, or budgets that are not per record
    scenario = budgets_mod.make_scenario(config.budgets.scenario, **config.budgets.params)
    if isinstance(scenario, budgets_mod.PerLabel):
        return  # the labels decide: no configured shares to keep
    total = sum(len(c.y_train) for c in clients)
    reference = budgets_mod.assign_budgets(
        scenario, total, numpy_generator(config.seed, "budget-mix-check")
    )
    levels, want = np.unique(reference, return_counts=True)
    if len(levels) > 8:
        return  # a continuous scenario: no exact shares
    realized = np.concatenate(
        [client_budgets(config, k, c) for k, c in enumerate(clients)]
    )
    got = np.array([np.sum(np.isclose(realized, v)) for v in levels], dtype=float)
    want_share, got_share = want / total, got / max(len(realized), 1)
    if np.max(np.abs(want_share - got_share)) <= MIX_TOLERANCE:
        return
    sizes = [len(c.y_train) for c in clients]
    fmt = ", ".join
    raise ValueError(
        f"budgets: the {config.budgets.scenario} mix cannot be kept in silos this small: "
        f"configured {fmt(f'ε={v:g}: {w:.0%}' for v, w in zip(levels, want_share, strict=True))}"
        f", but the records got {fmt(f'ε={v:g}: {g:.0%}' for v, g in zip(levels, got_share, strict=True))}"
        f" (each of the {len(clients)} silos, holding {min(sizes)}-{max(sizes)} training records, "
        "rounds the shares to whole records); use fewer silos (data.num_clients), a continuous "
        "scenario, or per-record budgets (budgets.file)"
    )


def _batch_size_warnings(config: ExperimentConfig, clients: list[Any]) -> list[str]:
    """B larger than a silo's training set: no Poisson batch can reach it (operator view)."""
    batch = config.training.batch_size
    if batch is None:
        return []
    too_big = []
    for k, c in enumerate(clients):
        b = config.training.batch_size_for(k)
        if b is not None and b > len(c.y_train):
            too_big.append((k, b, len(c.y_train)))
    if not too_big:
        return []
    k, b, n = max(too_big, key=lambda t: t[1] / max(t[2], 1))
    private = bool(getattr(config.algorithm, "private", True))
    effect = (
        "each noisy sum is divided by B although at most n records can be sampled, so the "
        f"updates shrink by at least B/n = {b / max(n, 1):.3g}x"
        if private else "the privacy-free baseline samples at rate min(1, B/n) = 1 (full batches)"
    )
    return [
        f"training.batch_size: B = {b:g} is larger than the training set of {len(too_big)} "
        f"silo(s) (e.g. silo {k} has n = {n}): {effect}; set B near the expected number of "
        "records sampled per step"
    ]


def run_simulation(
    config: ExperimentConfig,
    out_dir: str | Path,
    resume: bool = False,
    *,
    progress: bool = True,
    federation: Any | None = None,
    stop_after: int | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run ``config`` in-process and write every output to ``out_dir``; returns the summary.

    ``federation`` may be passed to reuse an already-loaded one or to train on your own data
    (see :mod:`pdpfl.api`); a federation that was not loaded from ``config.data`` is recorded
    truthfully (``summary["data"]``, and ``config.data`` in the summary names it). ``stop_after``
    stops (as if interrupted) after that many rounds, leaving a checkpoint that ``resume=True``
    continues.

    The output rule: a folder that already holds files is refused unless ``overwrite=True``
    (pdpfl's previous outputs there are replaced) or ``resume=True`` (continue its checkpoint).
    """
    from pdpfl.runtime.outputs import prepare_output_dir

    prepare_output_dir(out_dir, resume=resume, overwrite=overwrite)
    return simulate_into(config, out_dir, resume, progress=progress, federation=federation,
                         stop_after=stop_after)


def simulate_into(
    config: ExperimentConfig,
    out_dir: str | Path,
    resume: bool = False,
    *,
    progress: bool = True,
    federation: Any | None = None,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """:func:`run_simulation` into a folder its caller has already checked with
    :func:`~pdpfl.runtime.outputs.prepare_output_dir` (the output rule is not applied again)."""
    import time
    import warnings

    from pdpfl.fl.factory import build_federation_algorithms, prepare
    from pdpfl.runtime.outputs import write_outputs

    started = time.perf_counter()
    if federation is None:
        federation = load_federation_for(config)
    data = describe_data(config, federation)
    config = config_for_federation(config, federation)
    if str(config.output_dir) != str(out_dir):  # the summary records where outputs really are
        config = config.model_copy(update={"output_dir": str(out_dir)})
    original = config
    config, federation = prepare(config, federation)
    setup_warnings = check_federation(config, federation)
    for message in setup_warnings:
        warnings.warn(message, SetupWarning, stacklevel=3)
    with torch_threads(config.threads):
        server, clients = build_federation_algorithms(config, federation)
        transport = InProcessTransport(clients)
        result = run_federation(
            config, server, transport, out_dir, resume=resume, progress=progress,
            stop_after=stop_after,
        )
    result["setup_seconds"] = time.perf_counter() - started - result["seconds"]
    summary = write_outputs(original, result, out_dir, clients=clients, view="operator",
                            warnings=setup_warnings, data=data)
    return summary
