"""`pdpfl flower ...`: run the pdpfl Flower app across institutions (one process per host).

``superlink`` and ``supernode`` start the Flower services with pdpfl's conventions (silo index as
``partition-id``, no runtime dependency installation); ``app`` writes the Flower app folder
for a config; ``submit`` sends it to a SuperLink with ``flwr run``. For a whole federation on one
machine use ``pdpfl run CONFIG --set runtime=flower``. Every command accepts ``--dry-run`` to
print the underlying Flower command instead of running it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path

import typer

from pdpfl.cli._common import fail

flower_app = typer.Typer(
    help="Run pdpfl as a Flower federation across hosts (SuperLink, SuperNodes, app).",
    no_args_is_help=True,
)


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


def _exec(cmd: list[str], dry_run: bool, env: dict[str, str] | None = None) -> None:
    if dry_run:
        typer.echo(shlex.join(cmd))
        raise typer.Exit()
    full_env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    full_env.update(env or {})
    try:
        code = subprocess.call(cmd, env=full_env)
    except KeyboardInterrupt:
        code = 130
    raise typer.Exit(code)


def _binary(name: str) -> str:
    from pdpfl.runtime.flower.launcher import flower_binary
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
    database: Path | None = typer.Option(
        None, "--database", help="State database (default: memory)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the Flower command only."),
) -> None:
    """Start the federation's SuperLink (the coordinating server; runs the ServerApp)."""
    cmd = [_binary("flower-superlink"), *_tls_args(insecure, certfile, keyfile, ca_certfile)]
    cmd += ["--host", host, "--port", str(port), "--disable-runtime-dependency-installation"]
    if database is not None:
        cmd += ["--database", str(database)]
    _exec(cmd, dry_run)


@flower_app.command("supernode")
def supernode(
    silo: int = typer.Option(..., "--silo", min=0, help="This institution's silo index i."),
    num_silos: int = typer.Option(..., "--num-silos", min=1, help="Number of silos N."),
    superlink_address: str = typer.Option(..., "--superlink", help="SuperLink address host:port."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="This silo's data folder."),
    state_dir: Path = typer.Option(
        Path("~/.pdpfl/silo-state"), "--state-dir", help="Where the silo keeps its ledger."
    ),
    port: int = typer.Option(9094, "--port", min=1, max=65535, help="Local ClientAppIo port."),
    insecure: bool = typer.Option(False, "--insecure", help="No TLS (loopback/testing only)."),
    root_certificates: Path | None = typer.Option(
        None, "--root-certificates", help="CA certificate (PEM) that signed the SuperLink's."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the Flower command only."),
) -> None:
    """Start one institution's SuperNode (runs the pdpfl ClientApp next to the silo's data)."""
    from pdpfl.runtime.flower.hooks import DATA_DIR, NUM_PARTITIONS, PARTITION_ID, STATE_DIR
    from pdpfl.runtime.flower.launcher import node_config_arg

    if silo >= num_silos:
        fail(f"--silo: must be in [0, {num_silos - 1}] for --num-silos {num_silos}, got {silo}")
    if ":" not in superlink_address:
        fail(f"--superlink: expected host:port, got {superlink_address!r}")
    if insecure == (root_certificates is not None):
        fail("give exactly one of --root-certificates (TLS) and --insecure")
    if root_certificates is not None and not root_certificates.is_file():
        fail(f"--root-certificates: file not found: {root_certificates}")
    if data_dir is not None and not data_dir.expanduser().is_dir():
        fail(f"--data-dir: not a folder: {data_dir}")
    node_config: dict[str, object] = {
        PARTITION_ID: silo,
        NUM_PARTITIONS: num_silos,
        STATE_DIR: str(state_dir.expanduser().resolve()),
    }
    if data_dir is not None:
        node_config[DATA_DIR] = str(data_dir.expanduser().resolve())
    cmd = [_binary("flower-supernode")]
    cmd += ["--insecure"] if insecure else ["--root-certificates", str(root_certificates)]
    cmd += ["--superlink", superlink_address, "--port", str(port)]
    cmd += ["--node-config", node_config_arg(node_config)]
    _exec(cmd, dry_run)


def _app_for(
    config_path: Path, overrides: list[str] | None, out: Path, app_dir: Path, **timeouts: float
) -> Path:
    from pdpfl.config import ConfigError, config_to_dict, load_config
    from pdpfl.runtime.flower.apps import encode_config
    from pdpfl.runtime.flower.hooks import DEFAULT_HOOKS
    from pdpfl.runtime.flower.launcher import write_app

    try:
        config = load_config(config_path, overrides or [])
    except ConfigError as err:
        fail("; ".join(err.problems))
    return write_app(
        app_dir,
        {
            "pdpfl-config": encode_config(config_to_dict(config)),
            "pdpfl-hooks": DEFAULT_HOOKS,
            "pdpfl-out-dir": str(out.expanduser().resolve()),
            "pdpfl-resume": False,
            "pdpfl-round-timeout": float(timeouts["round_timeout"]),
            "pdpfl-startup-timeout": float(timeouts["startup_timeout"]),
            "pdpfl-min-silos": 1,
        },
    )


_CONFIG = typer.Argument(..., help="Experiment YAML.")
_SET = typer.Option(None, "--set", help="key=value override (repeatable).")
_OUT = typer.Option(..., "--out", help="Output folder ON THE SUPERLINK HOST (ServerApp writes).")
_ROUND_TIMEOUT = typer.Option(300.0, "--round-timeout", min=1.0, help="Seconds per exchange.")
_STARTUP_TIMEOUT = typer.Option(600.0, "--startup-timeout", min=1.0, help="Wait for silos.")


@flower_app.command("app")
def app_command(
    config_path: Path = _CONFIG,
    out: Path = _OUT,
    app_dir: Path = typer.Option(Path("pdpfl-flower-app"), "--app-dir", help="Folder to write."),
    overrides: list[str] | None = _SET,
    round_timeout: float = _ROUND_TIMEOUT,
    startup_timeout: float = _STARTUP_TIMEOUT,
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
    round_timeout: float = _ROUND_TIMEOUT,
    startup_timeout: float = _STARTUP_TIMEOUT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the Flower command only."),
) -> None:
    """Submit CONFIG to a running SuperLink (``flwr run --stream``) and follow its logs."""
    from pdpfl.runtime.flower.launcher import write_connection

    if ":" not in superlink_address:
        fail(f"--superlink: expected host:port, got {superlink_address!r}")
    if insecure == (root_certificates is not None):
        fail("give exactly one of --root-certificates (TLS) and --insecure")
    if root_certificates is not None and not root_certificates.is_file():
        fail(f"--root-certificates: file not found: {root_certificates}")
    work = Path(tempfile.mkdtemp(prefix="pdpfl-flower-"))
    app_dir = _app_for(
        config_path,
        overrides,
        out,
        work / "app",
        round_timeout=round_timeout,
        startup_timeout=startup_timeout,
    )
    write_connection(
        work / "home",
        superlink_address,
        root_certificates=str(root_certificates) if root_certificates else None,
    )
    cmd = [_binary("flwr"), "run", str(app_dir), "local", "--stream"]
    _exec(cmd, dry_run, env={"FLWR_HOME": str(work / "home")})


def register(app: typer.Typer) -> None:
    """Add ``pdpfl flower ...`` to the main app."""
    app.add_typer(flower_app, name="flower")
