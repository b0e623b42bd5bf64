"""`pdpfl flower supernode`: one institution's SuperNode and its warm pdpfl silo worker.

The silo index is the SuperNode's ``partition-id``; the silo's data, state folder (its ledger)
and budget store stay on this host. Before anything starts, the local port is checked
(``--port``: exit 2 when taken) and the SuperNode waits at most ``--connect-timeout`` seconds
for its SuperLink (exit 2 naming ``--superlink``). Both processes run in this process's group
and stop together on Ctrl-C, SIGTERM or SIGHUP (exit 128 + the signal;
:func:`pdpfl.runtime.flower.services.run_services`, the kill matrix in ``docs/flower.md``).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from pdpfl.cli._common import check_key_dir, fail
from pdpfl.cli._flower_args import (
    address,
    binary,
    check_port,
    client_tls,
    loopback_only,
    wait_for_superlink,
)

__all__ = ["supernode"]


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
    from pdpfl.runtime.flower.processes import MODES, SECRET_NAME
    from pdpfl.runtime.flower.services import run_services, supernode_commands

    if silo >= num_silos:
        fail(f"--silo: must be in [0, {num_silos - 1}] for --num-silos {num_silos}, got {silo}")
    address(superlink_address)
    client_tls(insecure, root_certificates)
    loopback_only(insecure, "--superlink", superlink_address)
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
    secret = state / SECRET_NAME
    cmd, worker = supernode_commands(
        binary("flower-supernode"),
        node_config,
        superlink_address=superlink_address,
        port=port,
        insecure=insecure,
        root_certificates=root_certificates,
        auth_key=auth_key,
        connect_timeout=connect_timeout,
        secret=secret,
        warm=mode == "warm",
    )
    if dry_run:
        typer.echo(shlex.join(cmd))
        if worker is not None:
            typer.echo(shlex.join(worker))
        raise typer.Exit()
    check_port("127.0.0.1", port)
    check_key_dir(f"silo-{silo}")
    wait_for_superlink(superlink_address, connect_timeout)
    if worker is not None:
        from pdpfl.runtime.flower.worker import write_secret

        write_secret(secret)  # fresh per start; only this user can read it
    names = ["SuperNode"] + (["silo worker"] if worker else [])
    raise typer.Exit(
        run_services(
            [cmd] + ([worker] if worker else []),
            names,
            ended_hint=f"if it lost the SuperLink at {superlink_address} for more than "
            f"--connect-timeout {connect_timeout:g} s, start it again once the SuperLink is up",
        )
    )
