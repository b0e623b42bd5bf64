"""The Flower services a host runs for ``pdpfl flower ...`` (library side of the commands).

:func:`flower_environment` is the environment every Flower process gets; :func:`write_supernode_key`
creates a SuperNode's authentication key pair; :func:`connection_home` a ``FLWR_HOME`` that names
one SuperLink; :func:`supernode_commands` the SuperNode and its warm silo worker;
:func:`app_run_config` the Flower app's run config for an experiment; :func:`run_services`
starts services in this process's group and stops them all together (Ctrl-C, SIGTERM, SIGHUP or
one ending; the kill matrix in ``docs/flower.md``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig

__all__ = [
    "FLOWER_QUIET",
    "app_run_config",
    "connection_home",
    "flower_environment",
    "run_services",
    "supernode_commands",
    "write_supernode_key",
]

#: Flower's quiet settings (no telemetry, no update check).
FLOWER_QUIET = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}


def flower_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment + Flower's quiet settings, with this Python's scripts first on PATH
    (the SuperLink starts ``flower-superexec`` by name)."""
    env = {**os.environ, **FLOWER_QUIET, **(extra or {})}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def write_supernode_key(out: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode key pair (ECDSA P-384, OpenSSH format): ``out/name.key`` (mode 600) and
    ``out/name.pub``. FileExistsError naming a file that exists (nothing is overwritten)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private, public = out / f"{name}.key", out / f"{name}.pub"
    for path in (private, public):
        if path.exists():
            raise FileExistsError(str(path))
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption(),
            )
        )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        + b"\n"
    )
    return private, public


def connection_home(superlink_address: str, root_certificates: Path | None) -> Path:
    """A fresh ``FLWR_HOME`` whose ``local`` connection is the SuperLink at the address."""
    from pdpfl.runtime.flower.processes import write_connection

    home = Path(tempfile.mkdtemp(prefix="pdpfl-flwr-home-"))
    write_connection(
        home,
        superlink_address,
        root_certificates=str(root_certificates) if root_certificates else None,
    )
    return home


def supernode_commands(
    supernode_binary: str,
    node_config: Mapping[str, Any],
    *,
    superlink_address: str,
    port: int,
    insecure: bool,
    root_certificates: Path | None,
    auth_key: Path | None,
    connect_timeout: float,
    secret: Path,
    warm: bool,
) -> tuple[list[str], list[str] | None]:
    """The SuperNode's command line and, in ``warm`` mode, its silo worker's (the worker
    authenticates to the SuperNode's local API with ``secret``)."""
    from pdpfl.runtime.flower.processes import node_config_arg, worker_command

    cmd = [supernode_binary]
    cmd += ["--insecure"] if insecure else ["--root-certificates", str(root_certificates)]
    if auth_key is not None:
        cmd += ["--auth-supernode-private-key", str(auth_key.resolve())]
    cmd += ["--superlink", superlink_address, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--max-wait-time", f"{connect_timeout:g}"]
    cmd += ["--node-config", node_config_arg(node_config)]
    if not warm:
        return cmd, None
    cmd += ["--isolation", "process", "--superexec-auth-secret-file", str(secret)]
    return cmd, worker_command([f"127.0.0.1:{port}"], [str(secret)], os.getpid())


def app_run_config(
    config: ExperimentConfig,
    out: Path,
    *,
    resume: bool,
    round_timeout: float | None,
    startup_timeout: float | None,
) -> dict[str, Any]:
    """The Flower app's run config for an experiment: the encoded config, the hooks, the
    ServerApp's output folder and its timeouts (startup: 60 s + 10 s per silo by default)."""
    from pdpfl.config import config_to_dict
    from pdpfl.runtime.flower.codec import encode_config
    from pdpfl.runtime.flower.hooks import DEFAULT_HOOKS
    from pdpfl.runtime.flower.launcher import default_startup_timeout

    startup = startup_timeout
    if startup is None:
        n = config.data.num_clients
        startup = default_startup_timeout(int(n)) if n is not None else 600.0
    return {
        "pdpfl-config": encode_config(config_to_dict(config)),
        "pdpfl-hooks": DEFAULT_HOOKS,
        "pdpfl-out-dir": str(out.expanduser().resolve()),
        "pdpfl-resume": bool(resume),
        "pdpfl-round-timeout": float(round_timeout or 300.0),
        "pdpfl-startup-timeout": float(startup),
        "pdpfl-min-silos": 1,
    }


def run_services(commands: list[list[str]], names: list[str], *, ended_hint: str = "") -> int:
    """Start ``commands`` in this process's group and wait; stop all (and what they started)
    when one ends, or on Ctrl-C, SIGTERM or SIGHUP. Returns the exit code: 128 + the signal on
    interruption, else 1 (a service ended by itself)."""
    from pdpfl.runtime.flower.processes import stop_processes
    from pdpfl.runtime.signals import exit_code, signal_name, signal_of

    env = flower_environment()
    procs: list[subprocess.Popen[Any]] = []
    code = 0
    try:
        for cmd in commands:
            procs.append(subprocess.Popen(cmd, env=env))
        while True:
            ended = [(n, p) for n, p in zip(names, procs, strict=True) if p.poll() is not None]
            if ended:
                name, proc = ended[0]
                code = 1  # a service is meant to run until it is stopped
                print(
                    f"the {name} stopped (exit code {proc.returncode}); stopping the others"
                    + (f"; {ended_hint}" if ended_hint else ""),
                    file=sys.stderr,
                    flush=True,
                )
                break
            time.sleep(0.2)
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM or SIGHUP (pdpfl.runtime.signals)
        code = exit_code(err)
        print(
            f"\n{signal_name(signal_of(err))}: stopping the SuperNode", file=sys.stderr, flush=True
        )
    finally:
        stop_processes(procs, grace_s=2.0)
    return code
