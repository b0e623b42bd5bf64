"""The pdpfl Flower app under Flower's own Simulation Engine (Ray backend), in one process tree.

:func:`run_flower_simulation` is what ``pdpfl run CONFIG --runtime flower-simulation`` does: it
runs the very same ServerApp and ClientApp as ``--runtime flower``
(:mod:`pdpfl.runtime.flower.apps`, hence the same :func:`pdpfl.runtime.loop.run_federation`) under
:func:`flwr.simulation.run_simulation` with one *virtual* SuperNode per silo. The ServerApp runs
in a thread of this process; the ClientApps run in a pool of Ray actors, each given the
``client_resources`` of the config (``flower.simulation.client_resources``: CPUs and GPU
fraction per actor), so the pool has ``CPUs / num_cpus`` actors. Needs the ``simulation`` extra
(``pip install 'pdpfl[simulation]'``: ``flwr[simulation]``, i.e. Ray).

Node and run config
-------------------
``run_simulation`` gives each virtual SuperNode only ``partition-id`` and ``num-partitions``, and
the apps an empty run config. The launcher writes the run config and one node config per silo
(the same as :func:`~pdpfl.runtime.flower.launcher.silo_node_configs` gives the SuperNodes of
``--runtime flower``: ``state-dir``, and ``data-dir``/``hooks`` when given) to
``<out>/flower/simulation.json`` and names it in :data:`PLAN_ENV`; the thin wrappers
:data:`server_app` and :data:`client_app` hand the apps a :class:`flwr.app.Context` completed
from it (the virtual node's ``partition-id`` selects its node config).

A round's messages grow with the sample, not the federation
-----------------------------------------------------------
The ServerApp evaluates each round's model only on the silos its messages reach anyway -- the
next round's Poisson sample, whose training request carries the evaluation -- instead of every
virtual SuperNode (``clients_evaluated`` in the metrics line; the pooled metrics are over them).
A silo's Type II catch-up charge for the rounds it sat out is applied the next time it is asked,
before its pre-check and charge, and for every silo in the final round, which all of them
evaluate. A run that stops earlier (diverged, interrupted, too few silos left) has every silo's
ledger caught up by the operator once the engine stopped, before its ledgers and summary are
collected (:mod:`pdpfl.runtime.flower.catch_up`): however the run ends, its ledgers are the
in-process simulator's for the rounds it reached.

Where a silo lives between messages
-----------------------------------
Ray hands each message to whichever actor is free: a silo's next message may run in another
process. Every message is therefore handled as in Flower's per-message mode: the actor rebuilds
the silo from its data and its sealed state folder, answers, writes the silo's state, ledger and
summary *before* the reply leaves, and then drops the silo (and its state lock) from memory, so
no actor ever holds a stale copy of a silo's ledger. Protocols whose silo side keeps secrets
between stages (secure summation, private weighting) are refused before the run starts (their
keys would have to be written to disk); use ``--runtime flower`` for them.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from pdpfl.errors import TrainingDiverged
from pdpfl.io import write_json
from pdpfl.runtime.flower import apps
from pdpfl.runtime.flower.apps import RESULT_FILE, STATUS_FILE
from pdpfl.runtime.flower.engine_signals import stop_on_signals
from pdpfl.runtime.flower.hooks import DEFAULT_HOOKS, PARTITION_ID, load_hooks
from pdpfl.runtime.flower.transport import FlowerRunError

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig

__all__ = [
    "EXTRA_HINT",
    "PLAN_ENV",
    "client_app",
    "ray_available",
    "run_flower_simulation",
    "server_app",
]

#: Environment variable naming the run's plan (run config + node configs); Ray's workers inherit
#: it from this process.
PLAN_ENV = "PDPFL_FLOWER_SIMULATION_PLAN"
PLAN_FILE = "simulation.json"
LOG_FILE = "simulation.log"
EXTRA_HINT = "pip install 'pdpfl[simulation]'"


def ray_available() -> bool:
    """True when Ray (Flower's simulation backend) can be imported here."""
    return importlib.util.find_spec("ray") is not None


@functools.lru_cache(maxsize=4)
def _read_plan(path: str, mtime_ns: int) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or "run_config" not in data or "node_configs" not in data:
        raise ValueError(f"{path}: not a pdpfl Flower simulation plan")
    return data


def load_plan() -> dict[str, Any]:
    """The plan named by :data:`PLAN_ENV` (read once per process and plan file)."""
    path = os.environ.get(PLAN_ENV)
    if not path:
        raise RuntimeError(
            f"{PLAN_ENV} is not set: the pdpfl simulation apps run only under "
            "pdpfl run --runtime flower-simulation"
        )
    return _read_plan(path, Path(path).stat().st_mtime_ns)


def _context(
    context: Context, run_config: Mapping[str, Any], node_config: Mapping[str, Any]
) -> Context:
    return Context(
        run_id=context.run_id,
        node_id=context.node_id,
        node_config=dict(node_config),
        state=context.state,
        run_config=dict(run_config),
    )


def virtual_node_context(context: Context) -> Context:
    """``context`` of a virtual SuperNode completed with its silo's node config and the run's
    config from the plan (its ``partition-id``, set by Flower, picks the silo)."""
    plan = load_plan()
    index = int(str(context.node_config[PARTITION_ID]))
    nodes = plan["node_configs"]
    if not 0 <= index < len(nodes):
        raise ValueError(f"virtual SuperNode partition-id={index} not in [0, {len(nodes)})")
    return _context(context, plan["run_config"], {**context.node_config, **nodes[index]})


class _VirtualSuperNodeApp(ClientApp):
    """:data:`pdpfl.runtime.flower.apps.client_app`, one message at a time, on a virtual node."""

    def __call__(self, message: Message, context: Context) -> Message:
        from pdpfl.runtime.flower.silo import HOST

        try:
            return apps.client_app(message, virtual_node_context(context))
        finally:
            # The silo's next message may go to another actor: its state is on disk (written
            # before the reply), so drop it here and release its state lock.
            HOST.clear()


#: Set when the Simulation Engine stopped under the ServerApp (e.g. Ray failed to start): the
#: ServerApp's next grid call raises instead of waiting out its timeouts.
ENGINE_STOPPED = threading.Event()


class _StoppableGrid:
    """The engine's grid; every call raises :class:`FlowerRunError` once the engine stopped."""

    def __init__(self, grid: Grid, stopped: threading.Event) -> None:
        self._grid, self._stopped = grid, stopped

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._grid, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._stopped.is_set():
                raise FlowerRunError("Flower's Simulation Engine stopped under the ServerApp")
            return attr(*args, **kwargs)

        return call


class _PlannedServerApp(ServerApp):
    """:data:`pdpfl.runtime.flower.apps.server_app` with the run config of the plan."""

    def __call__(self, grid: Grid, context: Context) -> None:
        plan = load_plan()
        stoppable = cast(Grid, _StoppableGrid(grid, ENGINE_STOPPED))
        apps.server_app(stoppable, _context(context, plan["run_config"], context.node_config))


#: The apps handed to :func:`flwr.simulation.run_simulation`.
client_app: ClientApp = _VirtualSuperNodeApp()
server_app: ServerApp = _PlannedServerApp()


def check_simulation(config: Any, hooks: str = DEFAULT_HOOKS) -> None:
    """Refuse (``ValueError`` naming the field) what the Simulation Engine cannot run."""
    algorithm = getattr(config, "algorithm", None)
    if algorithm is not None and hooks == DEFAULT_HOOKS and algorithm.simulation_only:
        raise ValueError(
            f"algorithm.name: {algorithm.name!r} runs only in the in-process simulator; "
            "use runtime: simulation"
        )
    resources = getattr(
        getattr(getattr(config, "flower", None), "simulation", None), "client_resources", None
    )
    if resources is not None:
        check_resources(
            resources.num_cpus, resources.num_gpus, "flower.simulation.client_resources"
        )
    if not hasattr(config, "aggregation"):
        return
    from pdpfl.fl.aggregation import holds_secrets, protocol_from_config

    name = protocol_from_config(config).name
    if holds_secrets(name):
        raise ValueError(
            f"runtime: flower-simulation hands each message to whichever Ray actor is free, so "
            f"the {name!r} protocol's keys and mask seeds would have to be written to the silos' "
            "disks between its stages; use runtime: flower (warm silo workers) or "
            "aggregation: plain"
        )


def check_resources(num_cpus: float, num_gpus: float, field: str = "client_resources") -> None:
    """Refuse per-actor resources that no actor on this machine can get (Ray would start an
    empty actor pool): more CPUs than this machine has, or GPUs where torch sees fewer."""
    cpus = os.cpu_count() or 1
    if num_cpus > cpus:
        raise ValueError(
            f"{field}.num_cpus: {num_cpus:g} is more than the {cpus} CPUs of this machine (no "
            f"ClientApp actor could start); use a value in (0, {cpus}]"
        )
    if num_gpus > 0:
        import math

        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < math.ceil(num_gpus):
            raise ValueError(
                f"{field}.num_gpus: {num_gpus:g} but torch sees {gpus} CUDA device(s) here (no "
                "ClientApp actor could start); use 0, or at most the number of GPUs"
            )


def backend_config(client_resources: Mapping[str, float] | None) -> dict[str, Any]:
    """Flower's ``backend_config`` for the Ray backend: per-actor resources, no dashboard.

    (Flower sets Ray's ``runtime_env`` itself; Ray's workers inherit this process's
    environment, :data:`PLAN_ENV` included.)"""
    resources = {"num_cpus": 1.0, "num_gpus": 0.0, **dict(client_resources or {})}
    return {
        "client_resources": {k: float(v) for k, v in resources.items()},
        "init_args": {
            "include_dashboard": False,
            "log_to_driver": False,
            "logging_level": logging.WARNING,
        },
    }


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the run (Ray's actors inherit them), then restore them
    (and ``PYTHONPATH``, which Flower's Ray backend rewrites in this process)."""
    old = {k: os.environ.get(k) for k in [*values, "PYTHONPATH"]}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _flower_log(path: Path) -> Iterator[None]:
    """Flower's log lines to ``path`` instead of the console while the run goes."""
    from flwr.common.logger import FLOWER_LOGGER, console_handler

    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    FLOWER_LOGGER.addHandler(handler)
    level = console_handler.level
    console_handler.setLevel(logging.CRITICAL + 1)  # errors too: the caller reports them
    try:
        yield
    finally:
        console_handler.setLevel(level)
        FLOWER_LOGGER.removeHandler(handler)
        handler.close()


def _ticker(tick: Callable[[], object], stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        while not stop.wait(0.5):
            with contextlib.suppress(Exception):  # progress only
                tick()

    thread = threading.Thread(target=loop, name="pdpfl-progress", daemon=True)
    thread.start()
    return thread


def run_flower_simulation(
    config: ExperimentConfig,
    out_dir: str | Path,
    resume: bool = False,
    *,
    hooks: str = DEFAULT_HOOKS,
    round_timeout_s: float = 600.0,
    startup_timeout_s: float | None = None,
    min_silos: int = 1,
    data_dirs: Mapping[int, str] | None = None,
    client_resources: Mapping[str, float] | None = None,
    progress: bool = False,
    prefetch: bool = True,
) -> dict[str, Any]:
    """Run ``config`` under Flower's Simulation Engine and return the run's summary.

    The outputs are those of :func:`~pdpfl.runtime.flower.launcher.run_flower` (the simulator's
    files plus ``flower/``: silo state folders, ``simulation.json``, ``simulation.log``).

    Parameters
    ----------
    client_resources
        Ray resources of each ClientApp actor (``num_cpus``, ``num_gpus``); default: the
        config's ``flower.simulation.client_resources`` (1 CPU, no GPU).
    round_timeout_s, startup_timeout_s, min_silos, data_dirs, hooks, progress, prefetch
        As for :func:`~pdpfl.runtime.flower.launcher.run_flower` (the start-up timeout covers
        Ray's start and the first hello of every virtual SuperNode).

    Raises
    ------
    FlowerRunError
        Ray is not installed, or the run failed (the ServerApp's error is named).
    ValueError
        A configuration the Simulation Engine cannot run (see :func:`check_simulation`).
    """
    from pdpfl.runtime.flower.coordinator import CoordinatorProgress
    from pdpfl.runtime.flower.launcher import (
        app_run_config,
        check_resume,
        collect_result,
        default_startup_timeout,
        silo_node_configs,
    )

    if not ray_available():
        raise FlowerRunError(f"flower-simulation needs the simulation extra: {EXTRA_HINT}")
    check_simulation(config, hooks)
    from pdpfl.runtime.preflight import check_key_dir

    check_key_dir()  # checkpoints and silo state are sealed: check the key folder now
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
    if client_resources is None:
        section = getattr(getattr(config, "flower", None), "simulation", None)
        resources = getattr(section, "client_resources", None)
        if resources is not None:
            client_resources = {"num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus}
    else:
        check_resources(
            float(client_resources.get("num_cpus", 1.0)),
            float(client_resources.get("num_gpus", 0.0)),
        )
    out = Path(out_dir).resolve()
    check_resume(config, out, resume)
    flower_dir = out / "flower"
    flower_dir.mkdir(parents=True, exist_ok=True)
    for name in (RESULT_FILE, STATUS_FILE):
        (flower_dir / name).unlink(missing_ok=True)
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
    # One operator, virtual silos: a round asks (evaluates, catches up) only the sampled silos;
    # the others catch up when next asked and all of them in the final round.
    run_config[apps.EVALUATE_SAMPLED] = True
    node_configs = silo_node_configs(
        flower_dir, num_silos, data_dirs=data_dirs, hooks=hooks, config=config
    )
    plan_path = flower_dir / PLAN_FILE
    write_json(plan_path, {"run_config": run_config, "node_configs": node_configs})
    rounds = int(getattr(getattr(config, "training", None), "rounds", 1))
    display = CoordinatorProgress(out, rounds, num_silos, enabled=progress)
    stop, interrupted = threading.Event(), threading.Event()
    ENGINE_STOPPED.clear()
    env = {
        PLAN_ENV: str(plan_path),
        "FLWR_TELEMETRY_ENABLED": "0",
        "RAY_DEDUP_LOGS": "0",
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        # Ray's C++ failure-signal handler would take SIGTERM from this process's handler and
        # abort it (exit 134: no checkpoint message, no catch-up of the silos' ledgers)
        "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "1",
    }
    failure: BaseException | None = None
    received: list[int] = []
    try:
        with (
            _environment(env),
            _flower_log(flower_dir / LOG_FILE),
            stop_on_signals(interrupted, ENGINE_STOPPED, received),
        ):
            from flwr.simulation import run_simulation

            ticker = _ticker(display.tick, stop) if progress else None
            try:
                with warnings.catch_warnings():
                    # Ray's notice about a future default (visible devices with num_gpus=0)
                    warnings.filterwarnings("ignore", category=FutureWarning, module="ray")
                    run_simulation(
                        server_app=server_app,
                        client_app=client_app,
                        num_supernodes=num_silos,
                        backend_config=backend_config(client_resources),
                    )
            except Exception as err:  # the ServerApp's own error is in its result file
                failure = err
            finally:
                ENGINE_STOPPED.set()  # a ServerApp still waiting gives up now
                stop.set()
                if ticker is not None:
                    ticker.join(timeout=2.0)
                    display.tick()
    except KeyboardInterrupt as err:
        interrupted.set()
        received.append(int(getattr(err, "signum", 2)))
    finally:
        display.close()
    # However the run ended (a second stop signal too): every silo's ledger caught up to the
    # rounds it reached before its ledgers and summary are collected (catch_up's docstring).
    from pdpfl.checkpoint import has_checkpoint
    from pdpfl.runtime.flower.catch_up import catch_up_silos, note_behind

    if (failure is not None or interrupted.is_set()) and has_checkpoint(out):
        _wait_for(flower_dir / RESULT_FILE, 10.0)  # the stopped ServerApp writes who was lost
    report = catch_up_silos(out, run_config, node_configs)
    if interrupted.is_set():
        from pdpfl.runtime.flower.launcher import rounds_saved
        from pdpfl.runtime.flower.processes import FlowerInterrupted

        raise FlowerInterrupted(out, rounds_saved(out), received[0] if received else 2)
    if failure is not None:
        _wait_for(flower_dir / RESULT_FILE, 10.0)  # the stopped ServerApp writes its error
        result = (
            json.loads((flower_dir / RESULT_FILE).read_text())
            if (flower_dir / RESULT_FILE).exists()
            else {}
        )
        if result.get("status") not in ("ok", "diverged"):
            raise FlowerRunError(
                f"Flower's Simulation Engine failed ({type(failure).__name__}: {failure}); the "
                f"ServerApp: {result.get('error', 'no result')}; see {flower_dir / LOG_FILE}"
            )
    try:
        summary = collect_result(config, out, num_silos, missing=f"see {flower_dir / LOG_FILE}")
    except TrainingDiverged as err:  # its outputs are written: say which ledgers lag, if any
        if isinstance(err.result, dict):
            err.result = note_behind(err.result, report, out)
        raise
    return note_behind(summary, report, out)


def _wait_for(path: Path, timeout_s: float) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
