"""The local Flower processes of a federation on this machine: SuperLink, SuperNodes and the
silo workers, started as child processes on 127.0.0.1 (free ports, logs in ``<out>/flower/``),
and stopped -- with every process they started -- by PID (:class:`LocalFederation`).

Every child stays in its parent's process group (no new session): a signal to the group -- a
terminal's Ctrl-C, ``kill -- -PGID``, systemd or SLURM stopping a job -- reaches all of them,
and the parent stops them (with what they started) when it stops. Only Flower's own SuperExec
and app processes run in sessions of their own; each of them exits when its parent does
(Flower's parent monitor), and :func:`stop_processes` also signals them by PID.

The federation's run itself (the app, the coordinator's progress, its outputs) is
:mod:`pdpfl.runtime.flower.launcher`.
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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from pdpfl.runtime.flower.hooks import (
    STATE_DIR,
)
from pdpfl.runtime.flower.loopback import check_insecure
from pdpfl.runtime.flower.ports import free_port
from pdpfl.runtime.flower.transport import FlowerRunError

__all__ = [
    "FlowerInterrupted",
    "LocalFederation",
    "descendants",
    "flower_binary",
    "free_port",
    "stop_processes",
]

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
    """A Flower run stopped by Ctrl-C, SIGTERM or SIGHUP (``signum``); its checkpoint (if any)
    can be resumed."""

    def __init__(self, out_dir: Path, rounds_done: int, signum: int = signal.SIGINT) -> None:
        super().__init__(f"interrupted after {rounds_done} round(s); outputs in {out_dir}")
        self.out_dir = out_dir
        self.rounds_done = rounds_done
        self.signum = int(signum)


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


def write_connection(
    flwr_home: str | Path, address: str, *, root_certificates: str | None = None
) -> Path:
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


def _own_group(pid: int) -> bool:
    """True if ``pid`` leads a process group other than this process's (signal the group)."""
    try:
        return os.getpgid(pid) == pid and pid != os.getpgrp()
    except (ProcessLookupError, PermissionError):
        return False


def stop_processes(procs: list[subprocess.Popen[bytes]], grace_s: float = 2.0) -> None:
    """SIGTERM ``procs`` and everything they started, then SIGKILL whatever is still alive
    after ``grace_s``; reap the children.

    The children share this process's group, so each is signalled by PID (a child that leads
    a group of its own gets the group signal). Flower's SuperLink and SuperNodes start their
    SuperExec (and so the ``flwr-serverapp``) in new sessions: the descendants are found
    through /proc *before* signalling, and signalled by PID too.
    """
    children = [p.pid for p in procs if p.poll() is None]
    extra = [pid for pid in descendants([p.pid for p in procs]) if pid not in children]
    everyone = children + extra
    for pid in children:
        _signal(pid, signal.SIGTERM, group=_own_group(pid))
    for pid in extra:
        _signal(pid, signal.SIGTERM, group=False)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in everyone):
        for proc in procs:
            proc.poll()
        time.sleep(0.05)
    for pid in everyone:
        if _alive(pid):
            _signal(pid, signal.SIGKILL, group=pid in children and _own_group(pid))
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
            # this process's group: a signal to the group reaches every child too; stop()
            # ends each child (and what it started) by PID
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
        if "--insecure" in tls:
            check_insecure([("--superlink", self.address)])  # loopback only
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
                _signal(proc.pid, signal.SIGTERM, group=_own_group(proc.pid))

    def kill_supernode(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Kill one silo's SuperNode (and what it started): failure drills."""
        proc = self.supernodes[index]
        for pid in [proc.pid, *descendants([proc.pid])]:
            _signal(pid, sig, group=False)
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
