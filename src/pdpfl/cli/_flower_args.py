"""The options ``pdpfl flower ...`` commands share: addresses, ports, TLS, the Flower binaries
(each problem exits 2 naming its option)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import typer

from pdpfl.cli._common import fail

__all__ = [
    "address",
    "binary",
    "check_port",
    "client_tls",
    "exec_or_print",
    "loopback_only",
    "tls_args",
    "wait_for_superlink",
]


def tls_args(
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


def client_tls(insecure: bool, root_certificates: Path | None) -> None:
    if insecure == (root_certificates is not None):
        fail("give exactly one of --root-certificates (TLS) and --insecure")
    if root_certificates is not None and not root_certificates.is_file():
        fail(f"--root-certificates: file not found: {root_certificates}")


def loopback_only(insecure: bool, option: str, address: str) -> None:
    """``--insecure`` only where ``address`` is loopback (exit 2 naming both otherwise)."""
    if insecure:
        from pdpfl.runtime.flower.loopback import check_insecure

        try:
            check_insecure([(option, address)])
        except ValueError as err:
            fail(str(err))


def address(value: str, option: str = "--superlink") -> str:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        fail(f"{option}: expected host:port with a port in [1, 65535], got {value!r}")
    return value


def check_port(host: str, port: int, option: str = "--port") -> None:
    """Exit 2 naming ``option`` when nothing could listen on ``host:port`` right now."""
    from pdpfl.runtime.flower.ports import port_problem

    problem = port_problem(host, port)
    if problem is None:
        return
    if "not an address" in problem or "resolve" in problem:
        fail(f"--host: {problem}; give one of this machine's addresses (0.0.0.0: all)")
    fail(f"{option}: {problem}; choose another with {option}")


def wait_for_superlink(address: str, timeout_s: float) -> None:
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


def exec_or_print(cmd: list[str], dry_run: bool, env: dict[str, str] | None = None) -> None:
    """Print ``cmd`` (dry run) or replace this process with it (signals reach it directly)."""
    if dry_run:
        typer.echo(shlex.join(cmd))
        raise typer.Exit()
    from pdpfl.runtime.flower.services import flower_environment

    os.execve(cmd[0], cmd, flower_environment(env))


def binary(name: str) -> str:
    """The Flower executable ``name`` beside this Python (exit 2 naming it when missing)."""
    from pdpfl.runtime.flower.processes import flower_binary
    from pdpfl.runtime.flower.transport import FlowerRunError

    try:
        return flower_binary(name)
    except FlowerRunError as err:
        fail(str(err))
