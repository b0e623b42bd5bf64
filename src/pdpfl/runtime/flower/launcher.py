"""Run a whole Flower federation on this machine: SuperLink + one SuperNode per silo.

:func:`run_flower` is what ``pdpfl run CONFIG --runtime flower`` does: it writes the pdpfl Flower
app (a folder with a ``pyproject.toml``) under ``<out>/flower/app``, starts ``flower-superlink``,
N × ``flower-supernode`` and the silo worker(s) as child processes on 127.0.0.1 (free ports, logs
in ``<out>/flower/``), submits the app with ``flwr run`` (connection in
``$FLWR_HOME/config.toml``), shows the coordinator's progress, waits with bounded timeouts, and
stops every process it started -- and every process those started -- by PID at the end, on
Ctrl-C/SIGTERM or on failure.

Modes (``mode=``)
-----------------
``warm`` (default)
    Each SuperNode runs with ``--isolation process`` and a SuperExec secret (mode 600, in the
    silo's state folder); the pdpfl silo worker (:mod:`pdpfl.runtime.flower.worker`) claims its
    tasks and keeps the silo in memory. ``workers="shared"`` (default) hosts every local silo in
    one worker process, as the simulator hosts every silo object in one process;
    ``workers="per-silo"`` starts one worker per SuperNode, like a deployment.
``per-message``
    Flower's stock ``subprocess`` isolation: one ``flwr-clientapp`` process per message, which
    rebuilds the silo from its data and state file (the "before" of ``benchmarks/flower.py``).

SuperNodes (and per-silo workers) are started a few at a time: at most ``start_concurrency``
are starting at once; the next ones start when their Runtime API listens.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdpfl.runtime.flower.apps import RESULT_FILE, STATUS_FILE
from pdpfl.runtime.flower.codec import encode_config
from pdpfl.runtime.flower.coordinator import CoordinatorProgress, silo_summaries
from pdpfl.runtime.flower.hooks import (
    ALLOW_RESPEND,
    BUDGET_STORE,
    DATA_DIR,
    DEFAULT_HOOKS,
    HOOKS_KEY,
    NUM_PARTITIONS,
    PARTITION_ID,
    PEER_KEYS,
    STATE_DIR,
    load_hooks,
)
from pdpfl.runtime.flower.processes import (
    FlowerInterrupted,
    LocalFederation,
    write_app,
)
from pdpfl.runtime.flower.transport import FlowerRunError
from pdpfl.runtime.signals import stop_signals_interrupt

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig

# ------------------------------------------------------------------------------ run_flower


def app_run_config(
    config_dict: dict[str, Any],
    out: Path,
    resume: bool,
    *,
    hooks: str,
    round_timeout_s: float,
    startup_timeout_s: float,
    min_silos: int,
    prefetch: bool,
) -> dict[str, Any]:
    """The app's run config (see :mod:`pdpfl.runtime.flower.apps`)."""
    return {
        "pdpfl-config": encode_config(config_dict),
        "pdpfl-hooks": hooks,
        "pdpfl-out-dir": str(out),
        "pdpfl-resume": bool(resume),
        "pdpfl-round-timeout": float(round_timeout_s),
        "pdpfl-startup-timeout": float(startup_timeout_s),
        "pdpfl-min-silos": int(min_silos),
        "pdpfl-prefetch": bool(prefetch),
    }


def silo_node_configs(
    flower_dir: Path,
    num_silos: int,
    *,
    data_dirs: Mapping[int, str] | None = None,
    hooks: str = DEFAULT_HOOKS,
    config: ExperimentConfig | None = None,
) -> list[dict[str, Any]]:
    """One node config per local silo: its index, the number of silos, its state folder
    ``<flower_dir>/silo-<i>``, and its data folder and hooks spec when given.

    With ``config`` (one operator owns every local silo), the silos keep their budget stores
    where the simulator keeps them (``lifetime.store``, ``$PDPFL_BUDGET_DIR``, ...; never
    inside the run's folder, which ``--force`` replaces) and honour ``lifetime.allow_respend``
    as the operator's own choice."""
    lifetime: dict[str, Any] = {}
    if config is not None and hasattr(config, "lifetime"):
        from pdpfl.fl.lifetime import lifetime_options

        options = lifetime_options(config)
        lifetime = {
            BUDGET_STORE: str(options.root.resolve()),
            ALLOW_RESPEND: bool(options.allow_respend),
        }
    # On loopback the operator sets up every silo's long-term identity in its state folder and
    # hands each silo the others' public keys (out of band: a file, never through the server).
    from pdpfl.runtime.identities import provision_silos

    keys = flower_dir.parent / "keys"
    provision_silos({i: flower_dir / f"silo-{i}" for i in range(num_silos)}, keys)
    node_configs = []
    for i in range(num_silos):
        node_config: dict[str, Any] = {
            PARTITION_ID: i,
            NUM_PARTITIONS: num_silos,
            STATE_DIR: str(flower_dir / f"silo-{i}"),
            PEER_KEYS: str(keys),
        }
        if data_dirs and i in data_dirs:
            node_config[DATA_DIR] = str(Path(data_dirs[i]).resolve())
        if hooks != DEFAULT_HOOKS:
            node_config[HOOKS_KEY] = hooks
        node_config.update(lifetime)
        node_configs.append(node_config)
    return node_configs


def default_startup_timeout(num_silos: int) -> float:
    """Seconds to wait for all silos: grows with their number (start-up is CPU-bound)."""
    return 60.0 + 10.0 * num_silos


def run_flower(
    config: ExperimentConfig,
    out_dir: str | Path,
    resume: bool = False,
    *,
    hooks: str = DEFAULT_HOOKS,
    round_timeout_s: float = 120.0,
    startup_timeout_s: float | None = None,
    run_timeout_s: float | None = None,
    min_silos: int = 1,
    data_dirs: Mapping[int, str] | None = None,
    env: Mapping[str, str] | None = None,
    on_started: Callable[[LocalFederation], None] | None = None,
    mode: str = "warm",
    workers: str = "shared",
    progress: bool = False,
    prefetch: bool = True,
) -> dict[str, Any]:
    """Run ``config`` as a Flower federation on loopback and return the run's summary.

    Parameters
    ----------
    config
        The experiment configuration (a :class:`pdpfl.config.ExperimentConfig` for the default
        ``hooks``).
    out_dir
        Output folder: the same files as the simulator (``metrics.jsonl``, ``summary.json``,
        ``model.npz``, ``checkpoint.npz``, ``ledgers/``) plus ``flower/`` (app, logs, silo state).
    resume
        Continue from ``out_dir/checkpoint.npz``; silos reload their own state files.
    hooks
        Import spec of the :class:`~pdpfl.runtime.flower.hooks.AppHooks` to use.
    round_timeout_s
        Longest wait for the replies of one message round (see the failure rule in
        :mod:`pdpfl.runtime.flower.transport`).
    startup_timeout_s
        Longest wait for the SuperLink and for all SuperNodes to answer (default
        :func:`default_startup_timeout`: 60 s + 10 s per silo).
    run_timeout_s
        Bound on the whole run (default: startup + 2 × rounds × round timeout + 60 s).
    min_silos
        Abort when fewer silos than this remain reachable.
    data_dirs
        Optional per-silo data folder (``data-dir`` node config).
    env
        Extra environment variables for the Flower processes.
    on_started
        Called with the running :class:`LocalFederation` once it is up (failure drills).
    mode, workers
        ``warm`` (default) or ``per-message``; ``shared`` (default) or ``per-silo`` workers.
    progress
        Show the coordinator's progress on stderr.
    prefetch
        Send each round's training request with the evaluation of the model it starts from, in
        one message per silo (one Flower message exchange and polling wait per round instead of
        two; see :class:`FlowerTransport`).

    Raises
    ------
    FlowerInterrupted
        On Ctrl-C, SIGTERM or SIGHUP, after every process was stopped; resume with
        ``resume=True``.
    """
    algorithm = getattr(config, "algorithm", None)
    if algorithm is not None and hooks == DEFAULT_HOOKS and algorithm.simulation_only:
        raise ValueError(
            f"algorithm.name: {algorithm.name!r} runs only in the simulator; "
            "use runtime: simulation"
        )
    check_mode(config, mode)
    from pdpfl.runtime.preflight import check_key_dir

    check_key_dir()  # the coordinator seals its checkpoints, the silos their state: check now
    spec = load_hooks(hooks)
    num_silos = spec.num_silos(config)
    if startup_timeout_s is None:
        startup_timeout_s = default_startup_timeout(num_silos)
    for name, value in (
        ("round_timeout_s", round_timeout_s),
        ("startup_timeout_s", startup_timeout_s),
    ):
        if not value > 0:
            raise ValueError(f"{name}: must be > 0, got {value}")
    out = Path(out_dir).resolve()
    check_resume(config, out, resume)
    flower_dir = out / "flower"
    flower_dir.mkdir(parents=True, exist_ok=True)
    for name in (RESULT_FILE, STATUS_FILE):
        (flower_dir / name).unlink(missing_ok=True)
    rounds = int(getattr(getattr(config, "training", None), "rounds", 1))
    if run_timeout_s is None:
        run_timeout_s = startup_timeout_s + 2 * rounds * round_timeout_s + 60.0
    run_config = app_run_config(
        spec.config_to_dict(config),
        out,
        resume,
        hooks=hooks,
        round_timeout_s=round_timeout_s,
        startup_timeout_s=startup_timeout_s,
        min_silos=min_silos,
        prefetch=prefetch,
    )
    app_dir = write_app(flower_dir / "app", run_config)
    node_configs = silo_node_configs(
        flower_dir, num_silos, data_dirs=data_dirs, hooks=hooks, config=config
    )
    display = CoordinatorProgress(out, rounds, num_silos, enabled=progress)
    try:
        with (
            stop_signals_interrupt(),
            LocalFederation(
                flower_dir,
                node_configs,
                env=env,
                startup_timeout_s=startup_timeout_s,
                mode=mode,
                workers=workers,
            ) as federation,
        ):
            if on_started is not None:
                on_started(federation)
            code = federation.run_app(app_dir, run_timeout_s, on_tick=display.tick)
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM, SIGHUP: every process is stopped
        display.close()
        from pdpfl.runtime.signals import signal_of

        raise FlowerInterrupted(out, rounds_saved(out), signal_of(err)) from None
    finally:
        display.close()
    return collect_result(
        config,
        out,
        num_silos,
        missing=f"flwr run exit code {code}; see {flower_dir}/flwr-run.log and superlink.log",
    )


def rounds_saved(out: Path) -> int:
    """Rounds the run's checkpoint in ``out`` holds (what a resume continues from)."""
    from pdpfl.runtime.loop import has_checkpoint, load_checkpoint

    try:
        ckpt = load_checkpoint(out) if has_checkpoint(out) else None
    except ValueError:
        return 0
    return int(ckpt["next_round"]) if ckpt is not None else 0


def collect_result(
    config: ExperimentConfig, out: Path, num_silos: int, *, missing: str
) -> dict[str, Any]:
    """After a local Flower run: the ServerApp's result, the silos' ledgers copied to
    ``out/ledgers/`` and their privacy summaries merged into the operator's summary (one
    operator owns every local silo); raises on a failed or diverged run (``missing`` says
    where to look when the ServerApp wrote no result)."""
    flower_dir = out / "flower"
    result_path = flower_dir / RESULT_FILE
    if not result_path.exists():
        raise FlowerRunError(f"the ServerApp wrote no result ({missing})")
    result = json.loads(result_path.read_text())
    if result.get("status") not in ("ok", "diverged"):
        raise FlowerRunError(f"the Flower run failed: {result.get('error')}")
    _collect_ledgers(flower_dir, out, result.get("run_key", ""), num_silos)
    summary = result.get("summary") or {}
    summary = _operator_summary(
        config, summary, flower_dir, out, result.get("run_key", ""), num_silos
    )
    raise_if_diverged(result, summary)
    return summary


def raise_if_diverged(result: Mapping[str, Any], summary: dict[str, Any]) -> None:
    """Raise :class:`~pdpfl.errors.TrainingDiverged` for a ServerApp result that says the
    training diverged (its outputs, ``completed: false``, are written), as the simulator does."""
    from pdpfl.errors import TrainingDiverged

    if result.get("status") != "diverged":
        return
    info = dict(result.get("diverged") or {})
    silo = info.get("silo")
    err = TrainingDiverged(
        str(info.get("cause", "a non-finite model, update or loss")),
        round_index=int(info.get("round", 0)),
        silo=None if silo is None else int(silo),
    )
    err.result = summary
    raise err


def check_resume(config: object, out: Path, resume: bool) -> None:
    """Before any process starts: a resume needs a checkpoint in ``out`` (``--resume`` never
    starts a run), and must keep the T its mechanism was calibrated for
    (:func:`pdpfl.runtime.loop.check_planned_rounds`; the Flower runtimes rebuild every silo
    at the configured T, so extending a finished run is the simulator's)."""
    if not resume:
        return
    from pdpfl.runtime.loop import check_planned_rounds, load_checkpoint
    from pdpfl.runtime.outputs import check_resumable

    check_resumable(out)
    ckpt = load_checkpoint(out)
    rounds = getattr(getattr(config, "training", None), "rounds", None)
    if ckpt is not None and rounds is not None:
        check_planned_rounds(ckpt, int(rounds), out)


def check_mode(config: ExperimentConfig, mode: str) -> None:
    """Refuse, before any process starts, ``mode="per-message"`` with a summation protocol whose
    silo side keeps secrets between its stages (keys, mask seeds, Shamir shares: secure summation,
    private weighting): a fresh process per message would have to write them to disk."""
    if mode != "per-message":
        return
    from pdpfl.fl.aggregation import holds_secrets, protocol_from_config

    name = protocol_from_config(config).name
    if holds_secrets(name):
        raise ValueError(
            f"mode: per-message starts a fresh silo process for every message, so the {name!r} "
            "protocol's keys and mask seeds would have to be written to the silos' disks "
            "between its stages; use --mode warm (the default: the pdpfl silo worker keeps them "
            "in memory) or aggregation: plain"
        )


def _operator_summary(
    config: ExperimentConfig,
    summary: dict[str, Any],
    flower_dir: Path,
    out: Path,
    run_key: str,
    n: int,
) -> dict[str, Any]:
    """On loopback one operator owns every silo: merge the silos' own privacy summaries (read
    from their state folders after the run) with the coordinator's (e.g. a server-side user
    ledger) into the summary, labelled as such."""
    silos = silo_summaries(flower_dir, run_key, n)
    if silos is None or not hasattr(config, "privacy"):
        return summary
    from pdpfl.checkpoint import finite_record
    from pdpfl.io import write_json
    from pdpfl.ledger import PrivacySummary
    from pdpfl.runtime.outputs import privacy_fields

    own = summary.get("privacy")
    parts = [silos] + ([PrivacySummary.from_dict(own)] if isinstance(own, dict) else [])
    merged = dict(summary)
    warnings = [w for w in summary.get("warnings", []) if not w.startswith("privacy.adversary")]
    merged.update(privacy_fields(config, PrivacySummary.merge(parts), "operator-collected"))
    merged["warnings"] = warnings + [w for w in merged["warnings"] if w not in warnings]
    merged = finite_record(merged)
    write_json(out / "summary.json", merged)
    _restamp_model(out, merged)
    return merged


def _restamp_model(out: Path, summary: dict[str, Any]) -> None:
    """The model file's header with the operator's privacy summary (the coordinator wrote it
    without one): the same header the simulator writes; the tensors are unchanged. The file is
    verified with its run first and sealed again at the same run id and round (the operator
    holds the key that sealed it), so a replaced model is refused, never re-stamped."""
    from pdpfl.runtime.model_file import (
        MODEL_NAME,
        model_metadata,
        read_model,
        verified_model,
        write_model,
    )

    path = out / MODEL_NAME
    try:
        read_model(path)
    except ValueError:  # no model file (a run stopped before writing one): nothing to stamp
        return
    tensors, old, _ = verified_model(path, final=True)
    run_id, at = old.get("run_id"), old.get("sealed_round")
    write_model(
        path,
        list(tensors.values()),
        list(tensors),
        model_metadata(summary),
        run_id=run_id,
        round_count=None if at is None else int(at),
    )


def _collect_ledgers(flower_dir: Path, out: Path, run_key: str, num_silos: int) -> None:
    """Copy each (local) silo's ledger to ``out/ledgers/client_i.npz`` like the simulator:
    verified with the silo's key (it is sealed by the silo), sealed again with the operator's
    (on loopback one operator holds every silo's key) under the coordinator's run id and round,
    and added to the run's ledger manifest (:func:`pdpfl.ledger.runfolder.seal_ledgers`)."""
    from pdpfl.checkpoint import run_identity
    from pdpfl.ledger import load_ledger
    from pdpfl.ledger.runfolder import seal_ledgers

    found = {}
    for i in range(num_silos):
        src = flower_dir / f"silo-{i}" / f"run-{run_key}" / f"ledger-silo-{i}.npz"
        if src.exists():
            found[f"client_{i}"] = load_ledger(src, party=f"silo-{i}")
    ident = run_identity(out)
    if found and ident is not None:
        seal_ledgers(out / "ledgers", found, ident[0], ident[1], add=True)
