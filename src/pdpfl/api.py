"""The short path: your data, your torch model, per-record budgets -> a trained federation.

::

    import pdpfl
    fed = pdpfl.federation_from_dataframe(df, silo="hospital", label="disease",
                                          record_id="patient_id", drop=["epsilon"])
    summary = pdpfl.train(fed, my_module, budgets=dict(zip(df.patient_id, df.epsilon)),
                          rounds=10, local_steps=20, batch_size=16, epsilon_max=10,
                          out="runs/mine")
    my_module            # now holds the final global model

:func:`train` builds the same validated :class:`~pdpfl.config.ExperimentConfig` as a YAML
file would (every keyword is a config field, checked with the same messages), records the
federation and the budgets truthfully, and runs the in-process simulator
(:func:`pdpfl.runtime.simulation.run_simulation`): rPDP-FL by default, any registered algorithm
with ``algorithm=...``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from pdpfl.data.budget_table import budget_table, check_budget_file
from pdpfl.data.federation import Federation
from pdpfl.data.user import (
    BUDGET_TABLE_COLUMNS,
    align_budgets,
    federation_from_arrays,
    federation_from_dataframe,
    federation_from_silos,
)
from pdpfl.data.validation import check_federation_data

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from torch import nn

    from pdpfl.config import ExperimentConfig

__all__ = [
    "align_budgets",
    "federation_from_arrays",
    "federation_from_dataframe",
    "federation_from_silos",
    "lifetime_budgets",
    "load_model",
    "privacy_table",
    "register_module",
    "train",
    "verify_run",
]

#: Keywords of :func:`train` that are not config leaf names.
_SPECIAL = {"algorithm": "algorithm.name"}


#: What ``model=`` accepts: a registered model name, a module, or a builder
#: ``f(input_shape, num_classes) -> torch.nn.Module``.
ModelSpec: TypeAlias = "str | nn.Module | Callable[..., nn.Module]"
#: What ``config=`` accepts: a validated config, a raw mapping of sections, or a YAML path.
ConfigSpec: TypeAlias = "ExperimentConfig | Mapping[str, object] | str | Path | None"
#: A table of columns: a pandas DataFrame, or a dict of numpy columns without pandas.
Table: TypeAlias = "pd.DataFrame | dict[str, np.ndarray]"


def register_module(module: nn.Module | Callable[..., nn.Module]) -> str:
    """Register a torch module (or a builder ``f(input_shape, num_classes) -> module``) and
    return its model name (usable as ``model.name`` in a config).

    A module is registered under ``user-<Class>-<hash of its architecture>``: its current
    weights are the public starting point x⁰ of training, and every silo starts from a copy.
    Registering a module of the same architecture again replaces the weights used. A module
    without trainable parameters, or a function that cannot be called as a builder (e.g. a
    ``lambda x: ...`` meant as the model itself), is refused with a ``ValueError`` naming
    ``model``.
    """
    import copy

    import torch

    from pdpfl.models import MODELS

    if isinstance(module, torch.nn.Module):
        if not any(p.requires_grad for p in module.parameters()):
            raise ValueError(
                f"model: the {type(module).__name__} module has no trainable parameters; DP "
                "training releases parameters, so the module needs at least one "
                "(requires_grad=True)"
            )
        arch = repr(module) + repr([tuple(p.shape) for p in module.parameters()])
        name = f"user-{type(module).__name__}-{hashlib.sha256(arch.encode()).hexdigest()[:10]}"
        template = copy.deepcopy(module).cpu()

        def build(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
            return copy.deepcopy(template)

        MODELS[name] = build
        return name
    if callable(module):
        _check_builder(module)
        qual = f"{getattr(module, '__module__', '')}.{getattr(module, '__qualname__', '')}"
        name = (
            f"user-{getattr(module, '__name__', 'builder')}-"
            + hashlib.sha256(qual.encode()).hexdigest()[:10]
        )
        MODELS[name] = module
        return name
    raise TypeError(
        f"model: expected a registered name, a torch.nn.Module or a builder, got "
        f"{type(module).__name__}"
    )


def _check_builder(builder: Callable[..., Any]) -> None:
    """A function given as ``model`` is a builder ``f(input_shape, num_classes)``: refuse one
    whose signature cannot take those two arguments (most often the model's forward pass, such
    as ``lambda x: x @ w``, given instead of a module)."""
    import inspect

    try:
        signature = inspect.signature(builder)
    except (TypeError, ValueError):  # a builtin or C callable: its call will tell
        return
    try:
        signature.bind((1,), 2)
    except TypeError:
        shown = getattr(builder, "__name__", type(builder).__name__)
        raise ValueError(
            f"model: {shown}{signature} cannot be called as a builder "
            "f(input_shape, num_classes) -> torch.nn.Module; pass a torch.nn.Module (e.g. "
            "torch.nn.Sequential(...)), a builder of that signature, or a registered model name"
        ) from None


def _model_name(model: ModelSpec) -> str:
    if isinstance(model, str):
        return model
    return register_module(model)


def _check_module(model: ModelSpec, federation: Federation) -> None:
    """Run two records through the module: a clear message (naming ``model``) instead of a
    shape or type error after training started."""
    import torch

    from pdpfl.runtime.preflight import check_module_output

    if not isinstance(model, torch.nn.Module):
        return
    first = next((c for c in federation.clients if len(c.x_train)), None)
    if first is None:
        return
    batch = min(2, len(first.x_train))
    x = torch.as_tensor(np.asarray(first.x_train[:batch], dtype=np.float32))
    try:
        with torch.no_grad():
            was = model.training
            model.eval()
            y = model(x)
            model.train(was)
    except Exception as err:  # noqa: BLE001 - reported as the user's model problem
        raise ValueError(
            f"model: the module fails on a batch of shape {tuple(x.shape)} "
            f"(features {federation.input_shape}): {type(err).__name__}: {err}"
        ) from None
    check_module_output(
        y, federation.num_classes, batch=batch, what=f"the {type(model).__name__} module"
    )


def _raw_config(config: ConfigSpec) -> dict[str, Any]:
    from pdpfl.config import ExperimentConfig, config_to_dict, read_config_file

    if config is None:
        return {}
    if isinstance(config, ExperimentConfig):
        return config_to_dict(config)
    if isinstance(config, Mapping):
        raw: dict[str, Any] = json.loads(json.dumps(dict(config), default=_plain))
        return raw
    if isinstance(config, str | Path):
        return read_config_file(config)
    raise TypeError(
        f"config: expected an ExperimentConfig, a dict or a YAML path, got {type(config).__name__}"
    )


def _plain(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not a plain value: {type(value).__name__}")


def make_config(
    federation: Federation,
    model: ModelSpec = "logreg",
    *,
    config: ConfigSpec = None,
    budgets_file: str | None = None,
    **settings: object,
) -> ExperimentConfig:
    """The validated config :func:`train` runs (``settings`` are config leaf names such as
    ``rounds``, ``local_steps``, ``batch_size``, ``epsilon_max``, ``lr``; ``algorithm`` sets
    ``algorithm.name``, ``name`` the experiment name)."""
    from pdpfl.config import ConfigError, config_from_dict
    from pdpfl.config.loading import leaf_index

    raw = _raw_config(config)
    settings = dict(settings)
    if "name" in settings:
        raw["name"] = settings.pop("name")
    raw.setdefault("name", federation.name)
    raw.setdefault("data", {"dataset": federation.name})
    raw.setdefault("training", {})
    model_section = dict(raw.get("model") or {})
    model_section["name"] = _model_name(model)
    if not isinstance(model, str):
        model_section.pop("options", None)
    raw["model"] = model_section
    overrides = []
    index = leaf_index()
    problems = []
    for key, value in settings.items():
        path = _SPECIAL.get(key)
        if path is None:
            paths = index.get(key, [])
            if len(paths) != 1:
                where = f"one of {', '.join(paths)}" if paths else "not a config field"
                problems.append(
                    f"{key}: {where}; give it in config={{...}} by section "
                    "(e.g. config={'training': {'lr': 0.1}})"
                )
                continue
            path = paths[0]
        overrides.append(f"{path}={json.dumps(value, default=_plain)}")
    if problems:
        raise ConfigError(problems)
    if budgets_file is not None:
        overrides.append(f"budgets.file={json.dumps(budgets_file)}")
    return config_from_dict(raw, overrides)


def train(
    federation: Federation,
    model: ModelSpec = "logreg",
    *,
    budgets: object = None,
    out: str | Path | None = None,
    config: ConfigSpec = None,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = False,
    allow_over_budget: bool = False,
    **settings: object,
) -> dict[str, Any]:
    """Train ``model`` on ``federation`` with per-record privacy budgets; return the summary.

    Parameters
    ----------
    federation
        From :func:`federation_from_dataframe`, :func:`federation_from_arrays`,
        :func:`federation_from_silos` or :func:`pdpfl.data.load_federation`.
    model
        A registered model name (``"logreg"``, ``"mlp"``, your ``@register_model`` name), any
        ``torch.nn.Module`` (its current weights are the starting point; after training it
        holds the final global model), or a builder ``f(input_shape, num_classes)``.
    budgets
        Each record's ε, matched by record id: a dict or pandas Series ``id -> ε``, a pair
        ``(ids, values)``, a 1-D array indexed by id, or a budgets file path (``budgets.file``).
        ``None``: the config's budget scenario (default ThreeLevels 0.1/1/5 at 70/20/10 %).
        Budgets for ids that are not in the federation are an error unless
        ``on_unmatched="ignore"`` (then a warning in the summary); budgets above
        ``epsilon_max`` are an error unless ``cap_at_epsilon_max=True``.
    out
        Output folder (default ``runs/<name>``); refused when it holds files unless
        ``overwrite=True`` or ``resume=True``.
    config
        Optional base: an :class:`~pdpfl.config.ExperimentConfig`, a dict or a YAML path.
    allow_over_budget
        With ``resume=True`` and more ``rounds`` than the run was planned for: extend it even
        though an algorithm whose units cannot sit out takes some over their budget (refused
        otherwise, :mod:`pdpfl.fl.extension`; the summary then says budgets are exceeded).
    **settings
        Config fields by leaf name: ``rounds`` (T), ``local_steps`` (τ), ``batch_size`` (the
        public expected batch size B, required under DP), ``epsilon_max`` or
        ``noise_multiplier``, ``delta``, ``lr``, ``client_rate`` (λ), ``max_grad_norm`` (C),
        ``optimizer``, ``adversary``, ``randomness``, ``seed``; ``algorithm`` (default
        ``rpdp``; also ``minimum``, ``dropout``, ``privacy-free``, ...) and ``name``.

    Raises
    ------
    pdpfl.config.ConfigError
        A setting is unknown or out of range (the message names the field).
    ValueError
        Budgets missing for some records, a model that does not fit the data, an output
        folder that cannot be used.
    """
    from pdpfl.io import write_text
    from pdpfl.models import get_params, set_params
    from pdpfl.runtime.outputs import prepare_output_dir
    from pdpfl.runtime.simulation import simulate_into

    if not isinstance(federation, Federation):
        raise TypeError(
            "federation: expected a pdpfl Federation (see "
            "pdpfl.federation_from_dataframe / federation_from_arrays)"
        )
    check_federation_data(federation)
    _check_module(model, federation)
    table = None
    budgets_file = None
    if isinstance(budgets, str | Path):
        budgets_file = str(budgets)
    elif budgets is not None:
        table = budget_table(budgets)
    name = settings.get("name") or (_raw_config(config).get("name") if config else None)
    out_dir = Path(out) if out is not None else Path("runs") / str(name or federation.name)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"out: {out_dir} is a file, not a folder (the run's outputs go there)")
    if table is not None:
        budgets_file = str(out_dir / "budgets.csv")
    cfg = make_config(federation, model, config=config, budgets_file=budgets_file, **settings)
    if table is not None:  # every training record has a valid ε; unknown ids per the config
        align_budgets(federation, budgets, on_unmatched=cfg.budgets.on_unmatched)
    else:
        check_budget_file(cfg, federation)
    fresh = not out_dir.exists() or not any(out_dir.iterdir())
    prepare_output_dir(out_dir, resume=resume, overwrite=overwrite, option="out")
    try:
        if table is not None:  # the budgets as given (the run reports ids it ignored)
            lines = [",".join(BUDGET_TABLE_COLUMNS)]
            lines.extend(
                f"{int(i)},{float(v)!r}" for i, v in zip(table.ids, table.values, strict=True)
            )
            write_text(out_dir / "budgets.csv", "\n".join(lines) + "\n")
        summary = simulate_into(
            cfg,
            out_dir,
            resume,
            progress=progress,
            federation=federation,
            allow_over_budget=allow_over_budget,
        )
    except ValueError:  # refused while building (e.g. budgets above ε_max): leave nothing
        if fresh and not (out_dir / "metrics.jsonl").exists():
            import shutil

            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    if not isinstance(model, str):
        import torch

        if isinstance(model, torch.nn.Module):
            with np.load(out_dir / "model.npz", allow_pickle=False) as z:
                params = [z[k] for k in sorted(z.files)]
            if len(params) == len(get_params(model)):
                set_params(model, params)
    return summary


def privacy_table(run_dir: str | Path, *, unit_id: object = None, as_frame: bool = True) -> Table:
    """Each person's ε by id, from a run's ledgers (what ``pdpfl privacy RUN_DIR`` writes).

    One row per unit (record, client or user): ``id``, ``unit``, ``holder`` (which ledger: the
    silo's name in the data, or ``server``),
    ``budget``, ``group``, ``rate``, ``noise_multiplier``, ``rounds_<observer>`` and
    ``epsilon_<observer>`` for the third party and the server, ``stopped``, ``excluded``. A
    pandas DataFrame when pandas is installed and ``as_frame`` (else a dict of numpy columns);
    ``unit_id`` keeps the rows of one person. Works on a run folder (``ledgers/``) and on a Flower
    silo's state folder.

    Every ledger is verified first (:func:`pdpfl.ledger.runfolder.open_run`): a run folder whose
    ledgers are unsealed, of another run or older than its checkpoint raises
    :class:`~pdpfl.ledger.runfolder.RunFolderError` (a ``ValueError``) naming the file; a folder
    that names no run is read with an :class:`~pdpfl.ledger.runfolder.UnverifiedRunWarning`.
    :func:`verify_run` says what was verified.
    """
    from pdpfl.ledger.table import privacy_table as table_of
    from pdpfl.ledger.table import select_id
    from pdpfl.runtime.outputs import holder_names, with_silo_names

    folder = Path(run_dir)
    table = with_silo_names(
        table_of(run_dir), holder_names(folder if folder.is_dir() else folder.parent)
    )
    if unit_id is not None:
        table = select_id(table, str(unit_id))
    if as_frame:
        try:
            import pandas as pd
        except ImportError:  # pragma: no cover - pandas is optional
            return table
        return pd.DataFrame(table)
    return table


def verify_run(run_dir: str | Path) -> dict[str, Any]:
    """What pdpfl verifies of a run folder before it reports from it: ``verified`` (False for a
    folder that names no run), ``kind``, ``run_id``, ``round`` (what the checkpoint records),
    ``ledgers`` and ``note`` (the sentence the reports print). Raises
    :class:`~pdpfl.ledger.runfolder.RunFolderError` naming a ledger that does not verify
    (unsealed, of another run, stale, edited, missing or added)."""
    from pdpfl.ledger.runfolder import open_run

    return open_run(run_dir).to_dict()


def lifetime_budgets(
    store: str | Path | None = None,
    *,
    unit_id: object = None,
    delta: float | None = None,
    as_frame: bool = True,
) -> Table:
    """Each person's budget for life, from the budget stores every run charged (what
    ``pdpfl privacy --store STORE`` shows).

    One row per unit of every store under ``store`` (default: the store folder runs use,
    ``$PDPFL_BUDGET_DIR`` or ``$XDG_DATA_HOME/pdpfl/budgets``; a Flower silo's is
    ``<state-dir>/budgets``): ``store``, ``party`` (``silo-<i>`` or ``server``), ``dataset``
    (the store's key), ``unit``, ``id``, ``budget``, ``group``, ``epsilon_<observer>`` -- the
    lifetime ε, every run that charged the unit composed (RDP curves summed, PLDs composed; see
    :mod:`pdpfl.privacy.lifetime`) at ``delta`` (default the smallest δ of the store's runs) --
    ``remaining_<observer>``, ``runs`` and ``run_ids``. A pandas DataFrame when pandas is
    installed and ``as_frame`` (else a dict of numpy columns); ``unit_id`` keeps one person's
    rows. Every file is verified (a tampered, rolled-back or foreign store is refused).
    """
    from pdpfl.ledger.budget_store import default_store_dir
    from pdpfl.ledger.lifetime import lifetime_table

    table = lifetime_table(default_store_dir() if store is None else store, delta=delta)
    if unit_id is not None:
        keep = np.array([str(v) == str(unit_id) for v in table["id"]], dtype=bool)
        table = {k: v[keep] for k, v in table.items()}
    if as_frame:
        try:
            import pandas as pd
        except ImportError:  # pragma: no cover - pandas is optional
            return table
        return pd.DataFrame(table)
    return table


def load_model(
    run: str | Path,
    module: nn.Module | None = None,
    *,
    round: int | None = None,
) -> nn.Module | dict[str, np.ndarray]:
    """The trained global model of a run: into ``module`` (returned), or as name → array.

    ``run`` is a run folder (its ``model.safetensors``; ``round=N`` reads
    ``models/round-NNNN.safetensors`` of a run with ``save_models: every-round``) or a model
    file. With a ``module``, every trainable parameter is loaded by name; a missing, extra or
    mis-shaped name is a ``ValueError`` naming it (buffers are not part of the release).

    The model is verified with its run (:func:`pdpfl.runtime.model_file.verified_model`): in a
    run folder, a model whose tensors or header were edited, of another run, or older than the
    run's checkpoint raises :class:`~pdpfl.integrity.IntegrityError` (a ``ValueError``); a file
    that cannot be checked loads with an :class:`~pdpfl.ledger.runfolder.UnverifiedRunWarning`.
    """
    from pdpfl.runtime.model_file import MODEL_NAME, verified_model

    path = Path(run)
    final = round is None
    if path.is_dir():
        name = MODEL_NAME if round is None else f"models/round-{int(round):04d}.safetensors"
        path = path / name
    elif path.parent.name == "models":
        final = False
    if not path.is_file():
        raise ValueError(f"model: no model file at {path}")
    tensors, _, _ = verified_model(path, final=final)
    if module is None:
        return tensors
    import torch

    from pdpfl.models import trainable_parameters

    named = dict(trainable_parameters(module))
    missing, extra = set(named) - set(tensors), set(tensors) - set(named)
    if missing or extra:
        raise ValueError(
            f"model: the module's trainable parameters do not match {path.name} "
            f"(missing: {sorted(missing) or 'none'}; not in the module: {sorted(extra) or 'none'})"
        )
    with torch.no_grad():
        for name, tensor in named.items():
            value = tensors[name]
            if tuple(value.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"model: {name} has shape {tuple(value.shape)} in {path.name}, "
                    f"{tuple(tensor.shape)} in the module"
                )
            tensor.copy_(torch.as_tensor(value, dtype=tensor.dtype))
    return module
