"""Run a whole Flower federation on this machine: SuperLink + one SuperNode per silo.

:func:`run_flower` is what ``pdpfl run CONFIG`` does when ``runtime: flower``: it writes the
pdpfl Flower app (a folder with a ``pyproject.toml``) under ``<out>/flower/app``, starts
``flower-superlink`` and N × ``flower-supernode`` as child processes on 127.0.0.1 (free ports,
logs in ``<out>/flower/``), submits the app with ``flwr run`` (connection in
``$FLWR_HOME/config.toml``), waits with bounded timeouts, and stops every child by PID (its
process group) at the end, on Ctrl-C/SIGTERM or on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from pdpfl.runtime.flower.apps import RESULT_FILE, encode_config
from pdpfl.runtime.flower.hooks import (
    DATA_DIR,
    DEFAULT_HOOKS,
    NUM_PARTITIONS,
    PARTITION_ID,
    STATE_DIR,
    load_hooks,
)
from pdpfl.runtime.flower.transport import FlowerRunError

FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    # How often a SuperExec looks for a ClientApp/ServerApp to launch (Flower's default: 1 s).
    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1",
}
APP_NAME = "pdpfl-federation"


def flower_binary(name: str) -> str:
    """Path of a Flower console script (next to this Python first, then on PATH)."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise FlowerRunError(
            f"{name} not found: install the Flower extra (pip install pdpfl[flower])"
        )
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def node_config_arg(values: Mapping[str, Any]) -> str:
    """``--node-config`` text: ``key=value`` pairs, strings quoted (TOML basic strings)."""
    parts = []
    for key, value in values.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int | float):
            text = repr(value)
        else:
            text = json.dumps(str(value))
        parts.append(f"{key}={text}")
    return " ".join(parts)


def write_app(app_dir: str | Path, run_config: Mapping[str, Any]) -> Path:
    """Write the pdpfl Flower app (``pyproject.toml`` only) with ``run_config`` as its defaults."""
    import tomli_w

    from pdpfl import __version__

    project = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {
            "name": APP_NAME,
            "version": __version__,
            "description": "pdpfl federation (ServerApp + ClientApp from the pdpfl package)",
            "license": "Apache-2.0",
            "dependencies": [],
        },
        "tool": {
            "flwr": {
                "app": {
                    "publisher": "pdpfl",
                    "components": {
                        "serverapp": "pdpfl.runtime.flower.apps:server_app",
                        "clientapp": "pdpfl.runtime.flower.apps:client_app",
                    },
                    "config": dict(run_config),
                }
            }
        },
    }
    path = Path(app_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / "pyproject.toml").write_text(tomli_w.dumps(project))
    return path


def write_connection(flwr_home: str | Path, address: str, *, root_certificates: str | None = None):
    """``$FLWR_HOME/config.toml`` with one connection, ``local``, to the SuperLink ``address``."""
    import tomli_w

    conn: dict[str, Any] = {"address": address}
    if root_certificates:
        conn["root-certificates"] = str(Path(root_certificates).resolve())
    else:
        conn["insecure"] = True
    home = Path(flwr_home)
    home.mkdir(parents=True, exist_ok=True)
    text = tomli_w.dumps({"superlink": {"default": "local", "local": conn}})
    (home / "config.toml").write_text(text)
    return home / "config.toml"


class LocalFederation:
    """SuperLink + SuperNodes as child processes on loopback (a context manager).

    Each child runs in its own process group, so stopping it by PID also stops the
    ``flwr-serverapp``/``flwr-clientapp`` processes it spawned.
    """

    def __init__(
        self,
        work_dir: str | Path,
        node_configs: list[dict[str, Any]],
        *,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 60.0,
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.node_configs = node_configs
        self.startup_timeout_s = float(startup_timeout_s)
        self.flwr_home = self.work_dir / "home"
        self.env = dict(os.environ)
        self.env.update(FLOWER_ENV)
        self.env["FLWR_HOME"] = str(self.flwr_home)
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.env.update(env or {})
        self.superlink: subprocess.Popen[bytes] | None = None
        self.supernodes: list[subprocess.Popen[bytes]] = []
        self._logs: list[TextIO] = []
        self.port = 0

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = (self.work_dir / log_name).open("ab")
        self._logs.append(log)  # type: ignore[arg-type]
        return subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,  # own process group: stopped (with its children) by PID
        )

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        write_connection(self.flwr_home, f"127.0.0.1:{self.port}")
        self.superlink = self._spawn(
            [
                flower_binary("flower-superlink"),
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--disable-runtime-dependency-installation",
            ],
            "superlink.log",
        )
        self._wait_for_port(self.port, self.superlink, "superlink.log")
        for i, node_config in enumerate(self.node_configs):
            self.supernodes.append(
                self._spawn(
                    [
                        flower_binary("flower-supernode"),
                        "--insecure",
                        "--superlink",
                        f"127.0.0.1:{self.port}",
                        "--port",
                        str(free_port()),
                        "--node-config",
                        node_config_arg(node_config),
                    ],
                    f"supernode-{i}.log",
                )
            )

    def _wait_for_port(self, port: int, proc: subprocess.Popen[bytes], log_name: str) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise FlowerRunError(
                    f"flower-superlink exited with code {proc.returncode}; "
                    f"see {self.work_dir / log_name}"
                )
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                return
            time.sleep(0.2)
        raise FlowerRunError(f"flower-superlink did not listen on port {port} in time")

    def run_app(self, app_dir: str | Path, timeout_s: float) -> int:
        """``flwr run APP local --stream``; returns its exit code (bounded by ``timeout_s``)."""
        proc = self._spawn(
            [flower_binary("flwr"), "run", str(Path(app_dir).resolve()), "local", "--stream"],
            "flwr-run.log",
        )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise FlowerRunError(
                f"the Flower run did not finish within {timeout_s:g} s; logs in {self.work_dir}"
            ) from None
        finally:
            _stop(proc)

    def kill_supernode(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Kill one silo's SuperNode (and the ClientApp it may be running): failure drills."""
        proc = self.supernodes[index]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop every child (SIGTERM to all process groups at once, then SIGKILL stragglers)."""
        procs = [p for p in [*self.supernodes, self.superlink] if p is not None]
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in procs:
            _stop(proc, grace_s=1.0)
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> LocalFederation:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM the child's process group, then SIGKILL it after ``grace_s``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # The group may outlive its leader (spawned flwr-clientapp / flwr-serverapp processes).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C while the federation runs (so children are stopped)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_flower(
    config: Any,
    out_dir: str | Path,
    resume: bool = False,
    *,
    hooks: str = DEFAULT_HOOKS,
    round_timeout_s: float = 120.0,
    startup_timeout_s: float = 120.0,
    run_timeout_s: float | None = None,
    min_silos: int = 1,
    data_dirs: Mapping[int, str] | None = None,
    env: Mapping[str, str] | None = None,
    on_started: Callable[[LocalFederation], None] | None = None,
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
        Longest wait for the SuperLink and for all SuperNodes to connect.
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
    """
    algorithm = getattr(getattr(config, "algorithm", None), "name", None)
    if algorithm is not None and hooks == DEFAULT_HOOKS:
        from pdpfl.fl.registry import get_algorithm

        if get_algorithm(algorithm).simulation_only:
            raise ValueError(
                f"algorithm.name: {algorithm!r} runs only in the simulator; use runtime: simulation"
            )
    for name, value in (
        ("round_timeout_s", round_timeout_s),
        ("startup_timeout_s", startup_timeout_s),
    ):
        if not value > 0:
            raise ValueError(f"{name}: must be > 0, got {value}")
    spec = load_hooks(hooks)
    out = Path(out_dir).resolve()
    flower_dir = out / "flower"
    flower_dir.mkdir(parents=True, exist_ok=True)
    (flower_dir / RESULT_FILE).unlink(missing_ok=True)
    num_silos = spec.num_silos(config)
    rounds = int(getattr(getattr(config, "training", None), "rounds", 1))
    if run_timeout_s is None:
        run_timeout_s = startup_timeout_s + 2 * rounds * round_timeout_s + 60.0
    run_config = {
        "pdpfl-config": encode_config(spec.config_to_dict(config)),
        "pdpfl-hooks": hooks,
        "pdpfl-out-dir": str(out),
        "pdpfl-resume": bool(resume),
        "pdpfl-round-timeout": float(round_timeout_s),
        "pdpfl-startup-timeout": float(startup_timeout_s),
        "pdpfl-min-silos": int(min_silos),
    }
    app_dir = write_app(flower_dir / "app", run_config)
    node_configs = []
    for i in range(num_silos):
        node_config: dict[str, Any] = {
            PARTITION_ID: i,
            NUM_PARTITIONS: num_silos,
            STATE_DIR: str(flower_dir / f"silo-{i}"),
        }
        if data_dirs and i in data_dirs:
            node_config[DATA_DIR] = str(Path(data_dirs[i]).resolve())
        node_configs.append(node_config)
    with (
        _sigterm_as_interrupt(),
        LocalFederation(
            flower_dir, node_configs, env=env, startup_timeout_s=startup_timeout_s
        ) as federation,
    ):
        if on_started is not None:
            on_started(federation)
        code = federation.run_app(app_dir, run_timeout_s)
    result_path = flower_dir / RESULT_FILE
    if not result_path.exists():
        raise FlowerRunError(
            f"the ServerApp wrote no result (flwr run exit code {code}); "
            f"see {flower_dir}/flwr-run.log and superlink.log"
        )
    result = json.loads(result_path.read_text())
    if result.get("status") != "ok":
        raise FlowerRunError(f"the Flower run failed: {result.get('error')}")
    _collect_ledgers(flower_dir, out, result.get("run_key", ""), num_silos)
    summary = result.get("summary") or {}
    return _operator_summary(config, summary, flower_dir, out, result.get("run_key", ""), num_silos)


def _operator_summary(
    config: Any, summary: dict[str, Any], flower_dir: Path, out: Path, run_key: str, n: int
) -> dict[str, Any]:
    """On loopback one operator owns every silo: merge the silos' own privacy summaries (read
    from their state folders after the run) into the coordinator's summary, labelled as such."""
    summaries = {}
    for i in range(n):
        path = flower_dir / f"silo-{i}" / f"run-{run_key}" / f"privacy-summary-silo-{i}.json"
        if path.exists():
            summaries[i] = json.loads(path.read_text())
    if not summaries or not hasattr(config, "privacy"):
        return summary
    from pdpfl.io import write_json
    from pdpfl.runtime.loop import _finite
    from pdpfl.runtime.outputs import privacy_fields

    merged = dict(summary)
    merged.update(privacy_fields(config, summaries, "operator-collected"))
    merged = _finite(merged)
    write_json(out / "summary.json", merged)
    return merged


def _collect_ledgers(flower_dir: Path, out: Path, run_key: str, num_silos: int) -> None:
    """Copy each (local) silo's ledger to ``out/ledgers/client_i.npz`` like the simulator."""
    for i in range(num_silos):
        src = flower_dir / f"silo-{i}" / f"run-{run_key}" / f"ledger-silo-{i}.npz"
        if src.exists():
            (out / "ledgers").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out / "ledgers" / f"client_{i}.npz")
