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

from pdpfl.runtime.flower.apps import RESULT_FILE, STATUS_FILE
from pdpfl.runtime.flower.codec import encode_config
from pdpfl.runtime.flower.hooks import (
    DATA_DIR,
    DEFAULT_HOOKS,
    HOOKS_KEY,
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
MODES = ("warm", "per-message")
WORKERS = ("shared", "per-silo")
SECRET_NAME = "superexec.secret"


class FlowerInterrupted(KeyboardInterrupt):
    """A Flower run stopped by Ctrl-C/SIGTERM; its checkpoint (if any) can be resumed."""

    def __init__(self, out_dir: Path, rounds_done: int) -> None:
        super().__init__(f"interrupted after {rounds_done} round(s); outputs in {out_dir}")
        self.out_dir = out_dir
        self.rounds_done = rounds_done


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

    from pdpfl._version import __version__

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


def worker_command(
    runtime_apis: list[str], secret_files: list[str], parent_pid: int | None = None
) -> list[str]:
    """``python -m pdpfl.runtime.flower.worker ...`` serving the given SuperNodes."""
    cmd = [sys.executable, "-m", "pdpfl.runtime.flower.worker"]
    for address in runtime_apis:
        cmd += ["--runtime-api", address]
    for path in secret_files:
        cmd += ["--auth-secret-file", str(path)]
    if parent_pid is not None:
        cmd += ["--parent-pid", str(parent_pid)]
    return cmd


# ------------------------------------------------------------------------ process handling


def _children_map() -> dict[int, list[int]]:
    """Parent PID → child PIDs, for every process visible in /proc (Linux)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(entry))
    return out


def descendants(pids: list[int]) -> list[int]:
    """Every process started (directly or not) by ``pids``, found through /proc."""
    children = _children_map()
    seen: list[int] = []
    stack = list(pids)
    while stack:
        pid = stack.pop()
        for child in children.get(pid, []):
            if child not in seen:
                seen.append(child)
                stack.append(child)
    return seen


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie (exited, not yet reaped) counts as stopped
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _signal(pid: int, sig: int, *, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def stop_processes(procs: list[subprocess.Popen[bytes]], grace_s: float = 2.0) -> None:
    """SIGTERM ``procs`` (each the leader of its own process group) and everything they started,
    then SIGKILL whatever is still alive after ``grace_s``; reap the children.

    Flower's SuperLink starts its SuperExec (and so the ``flwr-serverapp``) in a new session, so
    a process group is not enough: the descendants are found through /proc *before* signalling.
    """
    leaders = [p.pid for p in procs if p.poll() is None]
    extra = descendants([p.pid for p in procs])
    for pid in leaders:
        _signal(pid, signal.SIGTERM, group=True)
    for pid in extra:
        _signal(pid, signal.SIGTERM, group=False)
    deadline = time.monotonic() + grace_s
    everyone = leaders + extra
    while time.monotonic() < deadline and any(_alive(pid) for pid in everyone):
        for proc in procs:
            proc.poll()
        time.sleep(0.05)
    for pid in leaders:
        _signal(pid, signal.SIGKILL, group=True)
    for pid in extra:
        if _alive(pid):
            _signal(pid, signal.SIGKILL, group=False)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)


class LocalFederation:
    """SuperLink + SuperNodes (+ silo workers) as child processes on loopback (a context manager).

    Parameters
    ----------
    work_dir
        Where logs, the Flower home and (by default) the silos' state folders go.
    node_configs
        One ``--node-config`` dictionary per SuperNode.
    env
        Extra environment variables for every child.
    startup_timeout_s
        Longest wait for the SuperLink, and for each SuperNode's Runtime API.
    mode, workers
        See the module docstring.
    start_concurrency
        At most this many SuperNodes/workers starting at once (default: CPU count, at least 2).
    superlink_args, supernode_args
        Extra command-line arguments (TLS, authentication) for the Flower services; TLS needs
        ``root_certificates`` for ``flwr run``.
    """

    def __init__(
        self,
        work_dir: str | Path,
        node_configs: list[dict[str, Any]],
        *,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 60.0,
        mode: str = "warm",
        workers: str = "shared",
        start_concurrency: int | None = None,
        superlink_args: list[str] | None = None,
        supernode_args: list[list[str]] | None = None,
        root_certificates: str | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
        if workers not in WORKERS:
            raise ValueError(f"workers: must be one of {WORKERS}, got {workers!r}")
        self.work_dir = Path(work_dir).resolve()
        self.node_configs = node_configs
        self.startup_timeout_s = float(startup_timeout_s)
        self.mode, self.workers_mode = mode, workers
        self.start_concurrency = int(start_concurrency or max(2, os.cpu_count() or 2))
        self.superlink_args = list(superlink_args or [])
        self.supernode_args = supernode_args
        self.root_certificates = root_certificates
        self.flwr_home = self.work_dir / "home"
        self.env = dict(os.environ)
        self.env.update(FLOWER_ENV)
        self.env["FLWR_HOME"] = str(self.flwr_home)
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.env.update(env or {})
        self.superlink: subprocess.Popen[bytes] | None = None
        self.supernodes: list[subprocess.Popen[bytes]] = []
        self.workers: list[subprocess.Popen[bytes]] = []
        self.others: list[subprocess.Popen[bytes]] = []
        self.runtime_ports: list[int] = []
        self._logs: list[TextIO] = []
        self.port = 0
        self.started_s: dict[str, float] = {}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

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

    def _secret_file(self, i: int) -> Path:
        from pdpfl.runtime.flower.worker import write_secret

        state = self.node_configs[i].get(STATE_DIR)
        folder = Path(str(state)) if state else self.work_dir / f"silo-{i}"
        return write_secret(folder / SECRET_NAME)

    def start(self) -> None:
        t0 = time.perf_counter()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        write_connection(self.flwr_home, self.address, root_certificates=self.root_certificates)
        tls = self.superlink_args or ["--insecure"]
        self.superlink = self._spawn(
            [
                flower_binary("flower-superlink"),
                *tls,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--disable-runtime-dependency-installation",
            ],
            "superlink.log",
        )
        self._wait_for_port(self.port, self.superlink, "superlink.log")
        self.started_s["superlink"] = time.perf_counter() - t0
        secrets: list[Path] = []
        starting: list[tuple[int, subprocess.Popen[bytes], str]] = []
        for i, node_config in enumerate(self.node_configs):
            port = free_port()
            self.runtime_ports.append(port)
            args = [flower_binary("flower-supernode")]
            if self.supernode_args is not None:
                args += self.supernode_args[i]
            else:
                args += ["--insecure"]
            args += ["--superlink", self.address, "--host", "127.0.0.1", "--port", str(port)]
            args += ["--node-config", node_config_arg(node_config)]
            if self.mode == "warm":
                secret = self._secret_file(i)
                secrets.append(secret)
                args += ["--isolation", "process", "--superexec-auth-secret-file", str(secret)]
            proc = self._spawn(args, f"supernode-{i}.log")
            self.supernodes.append(proc)
            starting.append((port, proc, f"supernode-{i}.log"))
            if len(starting) >= self.start_concurrency:
                self._wait_for_port(*starting.pop(0))
        for item in starting:
            self._wait_for_port(*item)
        self.started_s["supernodes"] = time.perf_counter() - t0
        if self.mode == "warm":
            apis = [f"127.0.0.1:{p}" for p in self.runtime_ports]
            if self.workers_mode == "shared":
                groups = [list(range(len(apis)))]
            else:
                groups = [[i] for i in range(len(apis))]
            warming: list[tuple[Path, subprocess.Popen[bytes], str]] = []
            for g, members in enumerate(groups):
                name = "worker" if len(groups) == 1 else f"worker-{g}"
                ready = self.work_dir / f"{name}.ready"
                ready.unlink(missing_ok=True)
                cmd = worker_command(
                    [apis[i] for i in members], [str(secrets[i]) for i in members], os.getpid()
                )
                proc = self._spawn([*cmd, "--ready-file", str(ready)], f"{name}.log")
                self.workers.append(proc)
                warming.append((ready, proc, f"{name}.log"))
                if len(warming) >= self.start_concurrency:  # bounded: torch imports are heavy
                    self._wait_for_file(*warming.pop(0))
        self.started_s["workers"] = time.perf_counter() - t0

    def _wait_for_port(self, port: int, proc: subprocess.Popen[bytes], log_name: str) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise FlowerRunError(
                    f"{log_name.split('.')[0]} exited with code {proc.returncode}; "
                    f"see {self.work_dir / log_name}"
                )
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                return
            time.sleep(0.1)
        raise FlowerRunError(
            f"{log_name.split('.')[0]} did not listen on port {port} within "
            f"{self.startup_timeout_s:g} s; see {self.work_dir / log_name}"
        )

    def _wait_for_file(self, path: Path, proc: subprocess.Popen[bytes], log_name: str) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while not path.exists():
            if proc.poll() is not None:
                raise FlowerRunError(
                    f"{log_name.split('.')[0]} exited with code {proc.returncode}; "
                    f"see {self.work_dir / log_name}"
                )
            if time.monotonic() > deadline:
                raise FlowerRunError(f"{log_name.split('.')[0]} did not start in time")
            time.sleep(0.1)

    def run_app(
        self,
        app_dir: str | Path,
        timeout_s: float,
        *,
        on_tick: Callable[[], None] | None = None,
        log_name: str = "flwr-run.log",
    ) -> int:
        """``flwr run APP local --stream``; returns its exit code (bounded by ``timeout_s``).

        ``on_tick`` is called about twice a second while the run is going (progress display).
        """
        proc = self._spawn(
            [flower_binary("flwr"), "run", str(Path(app_dir).resolve()), "local", "--stream"],
            log_name,
        )
        self.others.append(proc)
        deadline = time.monotonic() + timeout_s
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise FlowerRunError(
                        f"the Flower run did not finish within {timeout_s:g} s; "
                        f"logs in {self.work_dir}"
                    )
                for worker in self.workers:
                    if worker.poll() is not None:
                        raise FlowerRunError(
                            f"a silo worker exited with code {worker.returncode}; "
                            f"see {self.work_dir}/worker*.log"
                        )
                if on_tick is not None:
                    on_tick()
                time.sleep(0.25 if on_tick is None else 0.5)
            if on_tick is not None:
                on_tick()
            return int(proc.returncode)
        finally:
            if proc.poll() is None:  # interrupted or timed out: stop() collects it
                _signal(proc.pid, signal.SIGTERM, group=True)

    def kill_supernode(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Kill one silo's SuperNode (and what it started): failure drills."""
        proc = self.supernodes[index]
        _signal(proc.pid, sig, group=True)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def all_processes(self) -> list[int]:
        """PIDs of every process of this federation (children and their descendants)."""
        procs = [*self.others, *self.workers, *self.supernodes]
        if self.superlink is not None:
            procs.append(self.superlink)
        pids = [p.pid for p in procs]
        return pids + descendants(pids)

    def stop(self) -> None:
        """Stop every process of the federation (see :func:`stop_processes`): ≤ 2.5 s."""
        procs = [*self.others, *self.workers, *self.supernodes]
        if self.superlink is not None:
            procs.append(self.superlink)
        stop_processes([p for p in procs if p is not None], grace_s=1.5)
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


# ------------------------------------------------------------------------------ progress


class CoordinatorProgress:
    """The coordinator's progress on stderr, read from the ServerApp's files (rich).

    Discovery: silos ready / connected. Rounds: the round bar with the sampled silos, the pooled
    accuracy and -- on loopback, where one operator owns every silo -- the ε headline collected
    from the local silos' own summaries (``eps≤`` third party / server).
    """

    def __init__(self, out: Path, rounds: int, num_silos: int, *, enabled: bool) -> None:
        self.out, self.rounds, self.num_silos = out, rounds, num_silos
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None
        self._seen = 0
        self._status_mtime = 0.0
        self._run_key: str | None = None

    def _start(self, completed: int) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(
            "silos", total=self.num_silos, completed=0, info="starting the federation"
        )
        self._seen = completed

    def _epsilon(self) -> str:
        if self._run_key is None:
            path = self.out / "flower" / "run_key"
            if path.exists():
                self._run_key = path.read_text().strip()
        if not self._run_key:
            return ""
        merged = _silo_summaries(self.out / "flower", self._run_key, self.num_silos)
        if merged is None:
            return ""
        tp, sv = merged.spent_max("third-party"), merged.spent_max("server")
        if tp is None and sv is None:
            return ""
        fmt = lambda x: "-" if x is None else f"{x:.3g}"  # noqa: E731
        return f" | ε max {fmt(tp)} (3rd) / {fmt(sv)} (server)"

    def tick(self) -> None:
        if not self.enabled:
            return
        if self._progress is None:
            self._start(0)
        status_path = self.out / "flower" / STATUS_FILE
        with contextlib.suppress(OSError, ValueError):
            mtime = status_path.stat().st_mtime
            if mtime != self._status_mtime:
                self._status_mtime = mtime
                status = json.loads(status_path.read_text())
                if status.get("phase") == "discovery":
                    missing = status.get("missing", [])
                    info = f"{status.get('connected', 0)} connected"
                    if missing:
                        more = " …" if len(missing) > 8 else ""
                        shown = ", ".join(map(str, missing[:8])) + more
                        info += f"; waiting for silo(s) {shown}"
                    self._progress.update(
                        self._task, completed=len(status.get("ready", [])), info=info
                    )
        from pdpfl.runtime.loop import read_metrics

        with contextlib.suppress(OSError, ValueError):
            lines = read_metrics(self.out)
            if lines and self._progress.tasks[0].description != "round":
                self._progress.update(
                    self._task, description="round", total=self.rounds, completed=0
                )
            if len(lines) > self._seen or (lines and self._seen == 0):
                last = lines[-1]
                acc = last.get("accuracy")
                info = f"sampled {last.get('selected')}"
                if isinstance(acc, float):
                    info += f" | acc {acc:.3f}"
                info += self._epsilon()
                self._progress.update(self._task, completed=len(lines), info=info)
                self._seen = len(lines)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


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
) -> list[dict[str, Any]]:
    """One node config per local silo: its index, the number of silos, its state folder
    ``<flower_dir>/silo-<i>``, and its data folder and hooks spec when given."""
    node_configs = []
    for i in range(num_silos):
        node_config: dict[str, Any] = {
            PARTITION_ID: i,
            NUM_PARTITIONS: num_silos,
            STATE_DIR: str(flower_dir / f"silo-{i}"),
        }
        if data_dirs and i in data_dirs:
            node_config[DATA_DIR] = str(Path(data_dirs[i]).resolve())
        if hooks != DEFAULT_HOOKS:
            node_config[HOOKS_KEY] = hooks
        node_configs.append(node_config)
    return node_configs


def default_startup_timeout(num_silos: int) -> float:
    """Seconds to wait for all silos: grows with their number (start-up is CPU-bound)."""
    return 60.0 + 10.0 * num_silos


def run_flower(
    config: Any,
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
        On Ctrl-C/SIGTERM, after every process was stopped; resume with ``resume=True``.
    """
    algorithm = getattr(config, "algorithm", None)
    if algorithm is not None and hooks == DEFAULT_HOOKS and algorithm.simulation_only:
        raise ValueError(
            f"algorithm.name: {algorithm.name!r} runs only in the simulator; "
            "use runtime: simulation"
        )
    check_mode(config, mode)
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
        spec.config_to_dict(config), out, resume, hooks=hooks, round_timeout_s=round_timeout_s,
        startup_timeout_s=startup_timeout_s, min_silos=min_silos, prefetch=prefetch,
    )
    app_dir = write_app(flower_dir / "app", run_config)
    node_configs = silo_node_configs(flower_dir, num_silos, data_dirs=data_dirs, hooks=hooks)
    display = CoordinatorProgress(out, rounds, num_silos, enabled=progress)
    try:
        with (
            _sigterm_as_interrupt(),
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
    except KeyboardInterrupt:
        display.close()
        from pdpfl.runtime.loop import read_metrics

        raise FlowerInterrupted(out, len(read_metrics(out))) from None
    finally:
        display.close()
    return collect_result(
        config, out, num_silos,
        missing=f"flwr run exit code {code}; see {flower_dir}/flwr-run.log and superlink.log",
    )


def collect_result(config: Any, out: Path, num_silos: int, *, missing: str) -> dict[str, Any]:
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
    summary = _operator_summary(config, summary, flower_dir, out, result.get("run_key", ""),
                                num_silos)
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


def check_resume(config: Any, out: Path, resume: bool) -> None:
    """Before any process starts: a resume must keep the T its mechanism was calibrated for
    (:func:`pdpfl.runtime.loop.check_planned_rounds`; the Flower runtimes rebuild every silo
    at the configured T, so extending a finished run is the simulator's)."""
    if not resume:
        return
    from pdpfl.runtime.loop import check_planned_rounds, load_checkpoint

    ckpt = load_checkpoint(out)
    rounds = getattr(getattr(config, "training", None), "rounds", None)
    if ckpt is not None and rounds is not None:
        check_planned_rounds(ckpt, int(rounds), out)


def check_mode(config: Any, mode: str) -> None:
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


def _silo_summaries(flower_dir: Path, run_key: str, n: int) -> Any:
    """The typed merge of the local silos' own privacy summaries (None if none is written)."""
    from pdpfl.ledger import PrivacySummary

    parts = []
    for i in range(n):
        path = flower_dir / f"silo-{i}" / f"run-{run_key}" / f"privacy-summary-silo-{i}.json"
        with contextlib.suppress(OSError, ValueError):
            parts.append(PrivacySummary.from_dict(json.loads(path.read_text())))
    return PrivacySummary.merge(parts) if parts else None


def _operator_summary(
    config: Any, summary: dict[str, Any], flower_dir: Path, out: Path, run_key: str, n: int
) -> dict[str, Any]:
    """On loopback one operator owns every silo: merge the silos' own privacy summaries (read
    from their state folders after the run) with the coordinator's (e.g. a server-side user
    ledger) into the summary, labelled as such."""
    silos = _silo_summaries(flower_dir, run_key, n)
    if silos is None or not hasattr(config, "privacy"):
        return summary
    from pdpfl.checkpoint import finite as _finite
    from pdpfl.io import write_json
    from pdpfl.ledger import PrivacySummary
    from pdpfl.runtime.outputs import privacy_fields

    own = summary.get("privacy")
    parts = [silos] + ([PrivacySummary.from_dict(own)] if isinstance(own, dict) else [])
    merged = dict(summary)
    warnings = [w for w in summary.get("warnings", []) if not w.startswith("privacy.adversary")]
    merged.update(privacy_fields(config, PrivacySummary.merge(parts), "operator-collected"))
    merged["warnings"] = warnings + [w for w in merged["warnings"] if w not in warnings]
    merged = _finite(merged)
    write_json(out / "summary.json", merged)
    return merged


def _collect_ledgers(flower_dir: Path, out: Path, run_key: str, num_silos: int) -> None:
    """Copy each (local) silo's ledger to ``out/ledgers/client_i.npz`` like the simulator:
    verified with the silo's key (it is sealed by the silo), sealed again with the operator's
    (on loopback one operator holds every silo's key)."""
    from pdpfl.ledger import load_ledger, save_ledger

    for i in range(num_silos):
        src = flower_dir / f"silo-{i}" / f"run-{run_key}" / f"ledger-silo-{i}.npz"
        if src.exists():
            (out / "ledgers").mkdir(parents=True, exist_ok=True)
            ledger = load_ledger(src, party=f"silo-{i}")
            save_ledger(ledger, out / "ledgers" / f"client_{i}.npz",
                        identity=f"flower-run-{run_key}")
