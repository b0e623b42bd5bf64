"""`pdpfl flower ...`: run the pdpfl Flower app across institutions (one process per host).

``superlink`` starts the coordinator's Flower SuperLink; ``supernode`` starts one institution's
SuperNode *and* its warm pdpfl silo worker (silo index as ``partition-id``, no runtime
dependency installation); ``keygen`` and ``register`` set up Flower's SuperNode authentication;
``app`` writes the Flower app folder for a config; ``submit`` sends it to a SuperLink with
``flwr run``. For a whole federation on one machine use ``pdpfl run CONFIG --runtime flower``.
Every command that starts something accepts ``--dry-run`` to print the underlying commands.

Before anything starts, the ports a command would listen on are checked (``--port``: exit 2
when taken) and a SuperNode waits at most ``--connect-timeout`` seconds for its SuperLink
(exit 2 naming ``--superlink``). ``pdpfl flower supernode`` keeps its SuperNode and silo worker
in its own process group and stops both on Ctrl-C, SIGTERM or SIGHUP (exit 128 + the signal);
see the kill matrix in ``docs/flower.md``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import typer

from pdpfl.cli._common import check_key_dir, fail

flower_app = typer.Typer(
    help="Run pdpfl as a Flower federation across hosts (SuperLink, SuperNodes, app).",
    no_args_is_help=True,
)

_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}


def _environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment + Flower's quiet settings, with this Python's scripts first on PATH
    (the SuperLink starts ``flower-superexec`` by name)."""
    import sys

    env = {**os.environ, **_ENV, **(extra or {})}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _tls_args(
    insecure: bool, certfile: Path | None, keyfile: Path | None, ca_certfile: Path | None
) -> list[str]:
    if insecure:
        if certfile or keyfile or ca_certfile:
            fail("--insecure: do not combine with --ssl-certfile/--ssl-keyfile/--ssl-ca-certfile")
        return ["--insecure"]
    if not (certfile and keyfile):
        fail("--ssl-certfile and --ssl-keyfile are required unless --insecure is given")
    args = []
    for flag, path in (
        ("--ssl-certfile", certfile),
        ("--ssl-keyfile", keyfile),
        ("--ssl-ca-certfile", ca_certfile),
    ):
        if path is not None:
            if not path.is_file():
                fail(f"{flag}: file not found: {path}")
            args += [flag, str(path.resolve())]
    return args


def _client_tls(insecure: bool, root_certificates: Path | None) -> None:
    if insecure == (root_certificates is not None):
        fail("give exactly one of --root-certificates (TLS) and --insecure")
    if root_certificates is not None and not root_certificates.is_file():
        fail(f"--root-certificates: file not found: {root_certificates}")


def _loopback_only(insecure: bool, option: str, address: str) -> None:
    """``--insecure`` only where ``address`` is loopback (exit 2 naming both otherwise)."""
    if insecure:
        from pdpfl.runtime.flower.loopback import check_insecure

        try:
            check_insecure([(option, address)])
        except ValueError as err:
            fail(str(err))


def _address(value: str, option: str = "--superlink") -> str:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        fail(f"{option}: expected host:port with a port in [1, 65535], got {value!r}")
    return value


def _check_port(host: str, port: int, option: str = "--port") -> None:
    """Exit 2 naming ``option`` when nothing could listen on ``host:port`` right now."""
    from pdpfl.runtime.flower.ports import port_problem

    problem = port_problem(host, port)
    if problem is None:
        return
    if "not an address" in problem or "resolve" in problem:
        fail(f"--host: {problem}; give one of this machine's addresses (0.0.0.0: all)")
    fail(f"{option}: {problem}; choose another with {option}")


def _wait_for_superlink(address: str, timeout_s: float) -> None:
    """Exit 2 naming ``--superlink`` unless the SuperLink accepts connections within
    ``timeout_s`` seconds (a SuperNode alone would retry forever)."""
    from pdpfl.runtime.flower.ports import wait_for_listener

    host, _, port = address.rpartition(":")
    typer.echo(f"waiting for the SuperLink at {address} (up to {timeout_s:g} s)", err=True)
    problem = wait_for_listener(host.strip("[]"), int(port), timeout_s)
    if problem is not None:
        fail(
            f"--superlink: no SuperLink at {address}: {problem}; is it started (pdpfl flower "
            "superlink), and are the host, the port and the firewall right? "
            "(--connect-timeout sets the wait)"
        )


def _exec(cmd: list[str], dry_run: bool, env: dict[str, str] | None = None) -> None:
    """Print ``cmd`` (dry run) or replace this process with it (signals reach it directly)."""
    if dry_run:
        typer.echo(shlex.join(cmd))
        raise typer.Exit()
    os.execve(cmd[0], cmd, _environment(env))


def _binary(name: str) -> str:
    from pdpfl.runtime.flower.processes import flower_binary
    from pdpfl.runtime.flower.transport import FlowerRunError

    try:
        return flower_binary(name)
    except FlowerRunError as err:
        fail(str(err))


@flower_app.command("superlink")
def superlink(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: all)."),
    port: int = typer.Option(9093, "--port", min=1, max=65535, help="Fleet + Control API port."),
    insecure: bool = typer.Option(False, "--insecure", help="No TLS (loopback/testing only)."),
    certfile: Path | None = typer.Option(None, "--ssl-certfile", help="Server certificate (PEM)."),
    keyfile: Path | None = typer.Option(None, "--ssl-keyfile", help="Server private key (PEM)."),
    ca_certfile: Path | None = typer.Option(None, "--ssl-ca-certfile", help="CA certificate."),
    supernode_auth: bool = typer.Option(
        False,
        "--enable-supernode-auth",
        help="Accept only SuperNodes whose public key was registered (pdpfl flower register).",
    ),
    database: Path | None = typer.Option(
        None, "--database", help="State database (default: memory)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the Flower command only."),
) -> None:
    """Start the federation's SuperLink (the coordinating server; runs the ServerApp)."""
    if supernode_auth and insecure:
        fail("--enable-supernode-auth: SuperNode authentication needs TLS (drop --insecure)")
    _loopback_only(insecure, "--host", host)
    cmd = [_binary("flower-superlink"), *_tls_args(insecure, certfile, keyfile, ca_certfile)]
    if not dry_run:
        _check_port(host, port)
    cmd += ["--host", host, "--port", str(port), "--disable-runtime-dependency-installation"]
    if supernode_auth:
        cmd += ["--enable-supernode-auth"]
    if database is not None:
        cmd += ["--database", str(database)]
    _exec(cmd, dry_run)


@flower_app.command("keygen")
def keygen(
    out: Path = typer.Option(..., "--out", help="Folder for supernode.key and supernode.pub."),
    name: str = typer.Option("supernode", "--name", help="File name stem."),
) -> None:
    """Create a SuperNode key pair (ECDSA P-384, OpenSSH format) for SuperNode authentication.

    The private key (mode 600) stays on the silo's host; send the ``.pub`` file to the
    coordinator, who registers it with ``pdpfl flower register``.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private, public = out / f"{name}.key", out / f"{name}.pub"
    for path in (private, public):
        if path.exists():
            fail(f"--out: {path} already exists (not overwritten)")
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
    typer.echo(f"{private}\n{public}")


def _connection_home(
    superlink_address: str, insecure: bool, root_certificates: Path | None
) -> Path:
    from pdpfl.runtime.flower.processes import write_connection

    home = Path(tempfile.mkdtemp(prefix="pdpfl-flwr-home-"))
    write_connection(
        home,
        superlink_address,
        root_certificates=str(root_certificates) if root_certificates else None,
    )
    return home


@flower_app.command("register")
def register_key(
    public_key: Path = typer.Argument(..., help="A SuperNode's public key (from keygen)."),
    superlink_address: str = typer.Option(..., "--superlink", help="SuperLink host:port."),
    insecure: bool = typer.Option(False, "--insecure", help="No TLS (loopback/testing only)."),
    root_certificates: Path | None = typer.Option(
        None, "--root-certificates", help="CA certificate (PEM) that signed the SuperLink's."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the Flower command only."),
) -> None:
    """Allow the SuperNode holding PUBLIC_KEY's private key to join (``flwr supernode register``).

    Run by the coordinator, against a SuperLink started with ``--enable-supernode-auth``.
    """
    _address(superlink_address)
    _client_tls(insecure, root_certificates)
    _loopback_only(insecure, "--superlink", superlink_address)
    if not public_key.is_file():
        fail(f"PUBLIC_KEY: file not found: {public_key}")
    home = _connection_home(superlink_address, insecure, root_certificates)
    cmd = [_binary("flwr"), "supernode", "register", str(public_key.resolve()), "local"]
    _exec(cmd, dry_run, env={"FLWR_HOME": str(home)})


@flower_app.command("supernode")
def supernode(
    silo: int = typer.Option(..., "--silo", min=0, help="This institution's silo index i."),
    num_silos: int = typer.Option(..., "--num-silos", min=1, help="Number of silos N."),
    superlink_address: str = typer.Option(..., "--superlink", help="SuperLink address host:port."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="This silo's data folder."),
    state_dir: Path = typer.Option(
        Path("~/.pdpfl/silo-state"), "--state-dir", help="Where the silo keeps its ledger."
    ),
    budget_store: Path | None = typer.Option(
        None,
        "--budget-store",
        help="Where the silo keeps its people's budgets for life, across runs (default: "
        "STATE_DIR/budgets).",
    ),
    allow_respend: bool = typer.Option(
        False,
        "--allow-respend",
        help="Let runs that ask for it (lifetime.allow_respend) re-spend this silo's data "
        "(public or synthetic data only).",
    ),
    port: int = typer.Option(
        9094, "--port", min=1, max=65535, help="Local Runtime API port (127.0.0.1 only)."
    ),
    insecure: bool = typer.Option(False, "--insecure", help="No TLS (loopback/testing only)."),
    root_certificates: Path | None = typer.Option(
        None, "--root-certificates", help="CA certificate (PEM) that signed the SuperLink's."
    ),
    auth_key: Path | None = typer.Option(
        None,
        "--auth-supernode-private-key",
        help="This SuperNode's private key (pdpfl flower keygen), registered by the coordinator.",
    ),
    expect_config: Path | None = typer.Option(
        None,
        "--expect-config",
        help="Only run this experiment (YAML, with --set overrides): runs with any other "
        "configuration are refused at the silo.",
    ),
    overrides: list[str] | None = typer.Option(
        None, "--set", help="key=value override of --expect-config (repeatable)."
    ),
    mode: str = typer.Option(
        "warm",
        "--mode",
        help="warm: a pdpfl worker keeps the silo in memory; per-message: Flower starts one "
        "ClientApp process per message.",
    ),
    peer_keys: Path | None = typer.Option(
        None,
        "--peer-keys",
        help="The silos' public keys (a folder of silo-<i>.pub files from pdpfl flower "
        "identity, or one JSON list), given out of band: needed for aggregation: secure.",
    ),
    connect_timeout: float = typer.Option(
        120.0,
        "--connect-timeout",
        min=1.0,
        help="Seconds to wait for the SuperLink before starting, and the longest the SuperNode "
        "keeps retrying once it lost it (then it stops).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the commands only."),
) -> None:
    """Start one institution's SuperNode and its silo worker (the silo's data stays here).

    Runs in the foreground until Ctrl-C, SIGTERM or SIGHUP, which stops both processes (exit
    128 + the signal; the silo's state folder keeps every charge: start it again with the same
    --state-dir to continue a run).
    """
    from pdpfl.runtime.flower.hooks import (
        ALLOW_RESPEND,
        BUDGET_STORE,
        DATA_DIR,
        NUM_PARTITIONS,
        PARTITION_ID,
        STATE_DIR,
    )
    from pdpfl.runtime.flower.processes import MODES, SECRET_NAME, node_config_arg, worker_command

    if silo >= num_silos:
        fail(f"--silo: must be in [0, {num_silos - 1}] for --num-silos {num_silos}, got {silo}")
    _address(superlink_address)
    _client_tls(insecure, root_certificates)
    _loopback_only(insecure, "--superlink", superlink_address)
    if mode not in MODES:
        fail(f"--mode: must be one of {', '.join(MODES)}, got {mode!r}")
    if auth_key is not None:
        if insecure:
            fail("--auth-supernode-private-key: SuperNode authentication needs TLS")
        if not auth_key.is_file():
            fail(f"--auth-supernode-private-key: file not found: {auth_key}")
    if data_dir is not None and not data_dir.expanduser().is_dir():
        fail(f"--data-dir: not a folder: {data_dir}")
    if state_dir.expanduser().exists() and not state_dir.expanduser().is_dir():
        fail(
            f"--state-dir: {state_dir} is a file, not a folder (the silo keeps its ledger and "
            "state files there)"
        )
    state = state_dir.expanduser().resolve()
    node_config: dict[str, object] = {
        PARTITION_ID: silo,
        NUM_PARTITIONS: num_silos,
        STATE_DIR: str(state),
    }
    if data_dir is not None:
        node_config[DATA_DIR] = str(data_dir.expanduser().resolve())
    if budget_store is not None:
        if budget_store.expanduser().exists() and not budget_store.expanduser().is_dir():
            fail(f"--budget-store: {budget_store} is a file, not a folder")
        node_config[BUDGET_STORE] = str(budget_store.expanduser().resolve())
    if allow_respend:
        node_config[ALLOW_RESPEND] = True
    if peer_keys is not None:
        from pdpfl.runtime.flower.hooks import PEER_KEYS

        if not peer_keys.expanduser().exists():
            fail(f"--peer-keys: {peer_keys} does not exist (the silos' public keys)")
        node_config[PEER_KEYS] = str(peer_keys.expanduser().resolve())
    if expect_config is not None:
        from pdpfl.config import ConfigError, config_to_dict, load_config
        from pdpfl.runtime.flower.hooks import CONFIG_HASH_KEY, config_digest

        try:  # the digest the silo computes of the run it is asked to join (runtime/flower/silo)
            agreed = load_config(expect_config, overrides or [])
            node_config[CONFIG_HASH_KEY] = config_digest(config_to_dict(agreed))
        except ConfigError as err:
            fail("--expect-config: " + "; ".join(err.problems))
    elif overrides:
        fail("--set: only meaningful with --expect-config")
    cmd = [_binary("flower-supernode")]
    cmd += ["--insecure"] if insecure else ["--root-certificates", str(root_certificates)]
    if auth_key is not None:
        cmd += ["--auth-supernode-private-key", str(auth_key.resolve())]
    cmd += ["--superlink", superlink_address, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--max-wait-time", f"{connect_timeout:g}"]
    cmd += ["--node-config", node_config_arg(node_config)]
    secret = state / SECRET_NAME
    worker = None
    if mode == "warm":
        cmd += ["--isolation", "process", "--superexec-auth-secret-file", str(secret)]
        worker = worker_command([f"127.0.0.1:{port}"], [str(secret)], os.getpid())
    if dry_run:
        typer.echo(shlex.join(cmd))
        if worker is not None:
            typer.echo(shlex.join(worker))
        raise typer.Exit()
    _check_port("127.0.0.1", port)
    check_key_dir(f"silo-{silo}")
    _wait_for_superlink(superlink_address, connect_timeout)
    if worker is not None:
        from pdpfl.runtime.flower.worker import write_secret

        write_secret(secret)  # fresh per start; only this user can read it
    names = ["SuperNode"] + (["silo worker"] if worker else [])
    raise typer.Exit(
        _run_services(
            [cmd] + ([worker] if worker else []),
            names,
            ended_hint=f"if it lost the SuperLink at {superlink_address} for more than "
            f"--connect-timeout {connect_timeout:g} s, start it again once the SuperLink is up",
        )
    )


def _run_services(commands: list[list[str]], names: list[str], *, ended_hint: str = "") -> int:
    """Start ``commands`` in this process's group and wait; stop all (and what they started)
    when one ends, or on Ctrl-C, SIGTERM or SIGHUP. Returns the exit code: 128 + the signal on
    interruption, else 1 (a service ended by itself)."""
    import time

    from pdpfl.runtime.flower.processes import stop_processes
    from pdpfl.runtime.signals import exit_code, signal_name, signal_of

    env = _environment()
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
                typer.echo(
                    f"the {name} stopped (exit code {proc.returncode}); stopping the others"
                    + (f"; {ended_hint}" if ended_hint else ""),
                    err=True,
                )
                break
            time.sleep(0.2)
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM or SIGHUP (pdpfl.runtime.signals)
        code = exit_code(err)
        typer.echo(f"\n{signal_name(signal_of(err))}: stopping the SuperNode", err=True)
    finally:
        stop_processes(procs, grace_s=2.0)
    return code


def _app_for(
    config_path: Path,
    overrides: list[str] | None,
    out: Path,
    app_dir: Path,
    *,
    resume: bool = False,
    **timeouts: float | None,
) -> Path:
    from pdpfl.config import ConfigError, config_to_dict, load_config
    from pdpfl.runtime.flower.codec import encode_config
    from pdpfl.runtime.flower.hooks import DEFAULT_HOOKS
    from pdpfl.runtime.flower.launcher import default_startup_timeout
    from pdpfl.runtime.flower.processes import write_app

    if out.expanduser().exists() and not out.expanduser().is_dir():
        fail(f"--out: {out} is a file, not a folder (the run's outputs go there)")
    try:
        config = load_config(config_path, overrides or [])
    except ConfigError as err:
        fail("; ".join(err.problems))
    startup = timeouts.get("startup_timeout")
    if startup is None:
        n = config.data.num_clients
        startup = default_startup_timeout(int(n)) if n is not None else 600.0
    return write_app(
        app_dir,
        {
            "pdpfl-config": encode_config(config_to_dict(config)),
            "pdpfl-hooks": DEFAULT_HOOKS,
            "pdpfl-out-dir": str(out.expanduser().resolve()),
            "pdpfl-resume": bool(resume),
            "pdpfl-round-timeout": float(timeouts["round_timeout"] or 300.0),
            "pdpfl-startup-timeout": float(startup),
            "pdpfl-min-silos": 1,
        },
    )


_CONFIG = typer.Argument(..., help="Experiment YAML.")
_SET = typer.Option(None, "--set", help="key=value override (repeatable).")
_OUT = typer.Option(..., "--out", help="Output folder ON THE SUPERLINK HOST (ServerApp writes).")
_ROUND_TIMEOUT = typer.Option(300.0, "--round-timeout", min=1.0, help="Seconds per exchange.")
_STARTUP_TIMEOUT = typer.Option(
    None, "--startup-timeout", min=1.0, help="Wait for silos (default: 60 s + 10 s per silo)."
)


@flower_app.command("app")
def app_command(
    config_path: Path = _CONFIG,
    out: Path = _OUT,
    app_dir: Path = typer.Option(Path("pdpfl-flower-app"), "--app-dir", help="Folder to write."),
    overrides: list[str] | None = _SET,
    round_timeout: float = _ROUND_TIMEOUT,
    startup_timeout: float | None = _STARTUP_TIMEOUT,
) -> None:
    """Write the Flower app folder for CONFIG (then: flwr run APP_DIR <connection>)."""
    path = _app_for(
        config_path,
        overrides,
        out,
        app_dir,
        round_timeout=round_timeout,
        startup_timeout=startup_timeout,
    )
    typer.echo(str(path))


@flower_app.command("submit")
def submit(
    config_path: Path = _CONFIG,
    superlink_address: str = typer.Option(..., "--superlink", help="SuperLink host:port."),
    out: Path = _OUT,
    overrides: list[str] | None = _SET,
    insecure: bool = typer.Option(False, "--insecure", help="No TLS (loopback/testing only)."),
    root_certificates: Path | None = typer.Option(
        None, "--root-certificates", help="CA certificate (PEM) that signed the SuperLink's."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run whose checkpoint is in --out."
    ),
    round_timeout: float = _ROUND_TIMEOUT,
    startup_timeout: float | None = _STARTUP_TIMEOUT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the Flower command only."),
) -> None:
    """Submit CONFIG to a running SuperLink (``flwr run --stream``) and follow its logs."""
    _address(superlink_address)
    _client_tls(insecure, root_certificates)
    _loopback_only(insecure, "--superlink", superlink_address)
    work = Path(tempfile.mkdtemp(prefix="pdpfl-flower-"))
    app_dir = _app_for(
        config_path,
        overrides,
        out,
        work / "app",
        resume=resume,
        round_timeout=round_timeout,
        startup_timeout=startup_timeout,
    )
    home = _connection_home(superlink_address, insecure, root_certificates)
    cmd = [_binary("flwr"), "run", str(app_dir), "local", "--stream"]
    _exec(cmd, dry_run, env={"FLWR_HOME": str(home)})


def register(app: typer.Typer) -> None:
    """Add ``pdpfl flower ...`` to the main app."""
    app.add_typer(flower_app, name="flower")
