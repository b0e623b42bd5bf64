"""``--insecure`` (no TLS) is refused unless every address is loopback.

``pdpfl flower superlink --host``, and ``--superlink`` of ``supernode``, ``register`` and
``submit``: a non-loopback address with ``--insecure`` exits 2 naming ``--insecure`` and the
address, before anything starts; loopback addresses (127.0.0.0/8, ``::1``, ``localhost``) and
TLS for any address are accepted. The loopback launcher (``--runtime flower``) binds 127.0.0.1.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdpfl.runtime.flower.loopback import check_insecure, is_loopback, split_host

pytest.importorskip("flwr")

from pdpfl.cli import app  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
runner = CliRunner()

LOOPBACK = ["127.0.0.1", "127.0.0.1:9093", "127.255.0.3:1", "localhost", "LOCALHOST:9093",
            "::1", "[::1]:9093", "[::ffff:127.0.0.1]:9093"]  # fmt: skip
NOT_LOOPBACK = [
    "0.0.0.0",
    "0.0.0.0:9093",
    "10.0.0.5:9093",
    "192.168.1.2",
    "8.8.8.8:53",
    "coordinator.example.org:9093",
    "localhost.example.org:1",
    "127.0.0.1.example.org:1",
    "[::]:9093",
    "::",
    "[2001:db8::1]:9093",
    "[::ffff:10.0.0.1]:1",
    "",
    "h:1",
]


@pytest.mark.parametrize("address", LOOPBACK)
def test_loopback_addresses_pass(address: str) -> None:
    assert is_loopback(address)
    check_insecure([("--superlink", address)])


@pytest.mark.parametrize("address", NOT_LOOPBACK)
def test_other_addresses_are_refused(address: str) -> None:
    assert not is_loopback(address)
    with pytest.raises(ValueError) as err:
        check_insecure([("--host", "127.0.0.1"), ("--superlink", address)])
    assert str(err.value).startswith(f"--insecure: refused for --superlink {address}, which")


def test_host_parsing() -> None:
    assert split_host("[::1]:9093") == "::1" and split_host("::1") == "::1"
    assert split_host("h.example:1") == "h.example" and split_host("10.0.0.5") == "10.0.0.5"


def _flower(*args: str):
    return runner.invoke(app, ["flower", *args])


def test_every_flower_command_refuses_insecure_beyond_loopback(tmp_path: Path) -> None:
    pub = tmp_path / "a.pub"
    pub.write_text("x")
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    remote = "10.0.0.5:9093"
    commands = {
        "superlink": (["superlink", "--host", "0.0.0.0"], "--host 0.0.0.0"),
        "supernode": (
            [
                "supernode",
                "--silo",
                "0",
                "--num-silos",
                "2",
                "--superlink",
                remote,
                "--state-dir",
                str(tmp_path / "state"),
            ],
            f"--superlink {remote}",
        ),  # fmt: skip
        "register": (["register", str(pub), "--superlink", remote], f"--superlink {remote}"),
        "submit": (
            [
                "submit",
                str(EXAMPLES / "digits_demo.yaml"),
                "--superlink",
                remote,
                "--out",
                str(tmp_path / "out"),
            ],
            f"--superlink {remote}",
        ),  # fmt: skip
    }
    for name, (args, named) in commands.items():
        refused = _flower(*args, "--insecure", "--dry-run")
        assert refused.exit_code == 2, (name, refused.output)
        assert f"error: --insecure: refused for {named}, which is not a loopback" in (
            refused.output
        ), name
        assert "Traceback" not in refused.output
        # The same address over TLS is the deployment path: accepted.
        tls = ["--root-certificates", str(ca)] if name != "superlink" else []
        if name == "superlink":
            tls = ["--ssl-certfile", str(ca), "--ssl-keyfile", str(ca)]
        accepted = _flower(*args, *tls, "--dry-run")
        assert accepted.exit_code == 0, (name, accepted.output)
    assert not (tmp_path / "state").exists() and not (tmp_path / "out").exists()
    # Loopback with --insecure: accepted (testing on one machine).
    link = _flower("superlink", "--host", "127.0.0.1", "--insecure", "--dry-run")
    assert link.exit_code == 0 and "--insecure" in shlex.split(link.output)
    node = _flower("supernode", "--silo", "0", "--num-silos", "1", "--superlink", "[::1]:9093",
                   "--insecure", "--state-dir", str(tmp_path / "s"), "--dry-run")  # fmt: skip
    assert node.exit_code == 0, node.output
