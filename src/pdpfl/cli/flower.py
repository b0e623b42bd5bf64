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

import tempfile
from pathlib import Path

import typer

from pdpfl.cli._common import fail
from pdpfl.cli._flower_args import (
    address,
    binary,
    check_port,
    client_tls,
    exec_or_print,
    loopback_only,
    tls_args,
)
from pdpfl.cli.supernode import supernode

flower_app = typer.Typer(
    help="Run pdpfl as a Flower federation across hosts (SuperLink, SuperNodes, app).",
    no_args_is_help=True,
)


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
    loopback_only(insecure, "--host", host)
    cmd = [binary("flower-superlink"), *tls_args(insecure, certfile, keyfile, ca_certfile)]
    if not dry_run:
        check_port(host, port)
    cmd += ["--host", host, "--port", str(port), "--disable-runtime-dependency-installation"]
    if supernode_auth:
        cmd += ["--enable-supernode-auth"]
    if database is not None:
        cmd += ["--database", str(database)]
    exec_or_print(cmd, dry_run)


@flower_app.command("keygen")
def keygen(
    out: Path = typer.Option(..., "--out", help="Folder for supernode.key and supernode.pub."),
    name: str = typer.Option("supernode", "--name", help="File name stem."),
) -> None:
    """Create a SuperNode key pair (ECDSA P-384, OpenSSH format) for SuperNode authentication.

    The private key (mode 600) stays on the silo's host; send the ``.pub`` file to the
    coordinator, who registers it with ``pdpfl flower register``.
    """
    from pdpfl.runtime.flower.services import write_supernode_key

    try:
        private, public = write_supernode_key(out, name)
    except FileExistsError as err:
        fail(f"--out: {err} already exists (not overwritten)")
    typer.echo(f"{private}\n{public}")


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
    address(superlink_address)
    client_tls(insecure, root_certificates)
    loopback_only(insecure, "--superlink", superlink_address)
    if not public_key.is_file():
        fail(f"PUBLIC_KEY: file not found: {public_key}")
    from pdpfl.runtime.flower.services import connection_home

    home = connection_home(superlink_address, root_certificates)
    cmd = [binary("flwr"), "supernode", "register", str(public_key.resolve()), "local"]
    exec_or_print(cmd, dry_run, env={"FLWR_HOME": str(home)})


flower_app.command("supernode")(supernode)


def _app_for(
    config_path: Path,
    overrides: list[str] | None,
    out: Path,
    app_dir: Path,
    *,
    resume: bool = False,
    **timeouts: float | None,
) -> Path:
    from pdpfl.config import ConfigError, load_config
    from pdpfl.runtime.flower.processes import write_app
    from pdpfl.runtime.flower.services import app_run_config

    if out.expanduser().exists() and not out.expanduser().is_dir():
        fail(f"--out: {out} is a file, not a folder (the run's outputs go there)")
    try:
        config = load_config(config_path, overrides or [])
    except ConfigError as err:
        fail("; ".join(err.problems))
    return write_app(
        app_dir,
        app_run_config(
            config,
            out,
            resume=resume,
            round_timeout=timeouts["round_timeout"],
            startup_timeout=timeouts.get("startup_timeout"),
        ),
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
    address(superlink_address)
    client_tls(insecure, root_certificates)
    loopback_only(insecure, "--superlink", superlink_address)
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
    from pdpfl.runtime.flower.services import connection_home

    home = connection_home(superlink_address, root_certificates)
    cmd = [binary("flwr"), "run", str(app_dir), "local", "--stream"]
    exec_or_print(cmd, dry_run, env={"FLWR_HOME": str(home)})


def register(app: typer.Typer) -> None:
    """Add ``pdpfl flower ...`` to the main app."""
    app.add_typer(flower_app, name="flower")
