"""`pdpfl flower ...`: option validation (exit code 2) and the Flower commands it runs."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("flwr")

from pdpfl.cli import app  # noqa: E402
from pdpfl.runtime.flower.codec import decode_config  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, ["flower", *args])


def test_supernode_command_maps_silo_to_partition_id(tmp_path: Path) -> None:
    result = _run(
        "supernode", "--silo", "1", "--num-silos", "3", "--superlink", "127.0.0.1:9093",
        "--insecure", "--state-dir", str(tmp_path / "state"), "--data-dir", str(tmp_path),
        "--dry-run",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    cmd = shlex.split(result.output.strip())
    assert Path(cmd[0]).name == "flower-supernode"
    assert cmd[cmd.index("--superlink") + 1] == "127.0.0.1:9093"
    node_config = cmd[cmd.index("--node-config") + 1]
    assert "partition-id=1" in node_config and "num-partitions=3" in node_config
    assert f'data-dir="{tmp_path.resolve()}"' in node_config


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--silo", "3", "--num-silos", "3", "--superlink", "localhost:1", "--insecure"], "--silo"),
        (["--silo", "0", "--num-silos", "3", "--superlink", "nohost", "--insecure"], "--superlink"),
        (["--silo", "0", "--num-silos", "3", "--superlink", "localhost:1"], "--root-certificates"),
        (
            [
                "--silo",
                "0",
                "--num-silos",
                "2",
                "--superlink",
                "localhost:1",
                "--root-certificates",
                "/nope",
            ],
            "file not found",
        ),
    ],
)
def test_supernode_rejects_bad_options(args: list[str], message: str) -> None:
    result = _run("supernode", *args, "--dry-run")
    assert result.exit_code == 2
    assert message in result.output


def test_superlink_requires_tls_or_insecure(tmp_path: Path) -> None:
    result = _run("superlink", "--dry-run")
    assert result.exit_code == 2 and "--ssl-certfile" in result.output
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("y")
    result = _run("superlink", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--dry-run")
    assert result.exit_code == 0, result.output
    cmd = shlex.split(result.output.strip())
    assert "--insecure" not in cmd and "--disable-runtime-dependency-installation" in cmd
    assert cmd[cmd.index("--ssl-certfile") + 1] == str(cert.resolve())


def test_app_command_embeds_the_validated_config(tmp_path: Path) -> None:
    result = _run(
        "app", str(EXAMPLES / "digits_demo.yaml"), "--out", str(tmp_path / "out"),
        "--app-dir", str(tmp_path / "app"), "--set", "rounds=2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    project = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    flwr = project["tool"]["flwr"]["app"]
    assert flwr["components"]["serverapp"] == "pdpfl.runtime.flower.apps:server_app"
    assert decode_config(flwr["config"]["pdpfl-config"])["training"]["rounds"] == 2
    bad = _run("app", str(EXAMPLES / "digits_demo.yaml"), "--out", "o", "--set", "rounds=0")
    assert bad.exit_code == 2 and "training.rounds" in bad.output


def test_supernode_starts_a_warm_worker_next_to_the_supernode(tmp_path: Path) -> None:
    result = _run(
        "supernode", "--silo", "0", "--num-silos", "2", "--superlink", "127.0.0.1:9093",
        "--insecure", "--state-dir", str(tmp_path / "state"), "--port", "9191", "--dry-run",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    supernode, worker = (shlex.split(line) for line in result.output.strip().splitlines())
    assert supernode[supernode.index("--isolation") + 1] == "process"
    secret = supernode[supernode.index("--superexec-auth-secret-file") + 1]
    assert secret == str((tmp_path / "state").resolve() / "superexec.secret")
    assert supernode[supernode.index("--host") + 1] == "127.0.0.1"
    assert worker[1:3] == ["-m", "pdpfl.runtime.flower.worker"]
    assert worker[worker.index("--runtime-api") + 1] == "127.0.0.1:9191"
    assert worker[worker.index("--auth-secret-file") + 1] == secret
    # Flower's stock per-message processes: no worker, default isolation.
    result = _run(
        "supernode", "--silo", "0", "--num-silos", "2", "--superlink", "localhost:1", "--insecure",
        "--mode", "per-message", "--dry-run",
    )  # fmt: skip
    assert result.exit_code == 0 and len(result.output.strip().splitlines()) == 1
    assert "--isolation" not in result.output
    bad = _run(
        "supernode",
        "--silo",
        "0",
        "--num-silos",
        "2",
        "--superlink",
        "localhost:1",
        "--insecure",
        "--mode",
        "lazy",
        "--dry-run",
    )
    assert bad.exit_code == 2 and "--mode" in bad.output


def test_supernode_can_pin_its_experiment(tmp_path: Path) -> None:
    from pdpfl.config import config_to_dict, load_config
    from pdpfl.runtime.flower.hooks import config_digest

    config = EXAMPLES / "digits_demo.yaml"
    result = _run(
        "supernode", "--silo", "0", "--num-silos", "10", "--superlink", "localhost:1", "--insecure",
        "--expect-config", str(config), "--set", "rounds=2", "--dry-run",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    expected = config_digest(config_to_dict(load_config(config, ["rounds=2"])))  # as the silo
    assert f'config-hash="{expected}"' in result.output.splitlines()[0]
    bad = _run("supernode", "--silo", "0", "--num-silos", "2", "--superlink", "localhost:1",
               "--insecure", "--set", "rounds=2", "--dry-run")  # fmt: skip
    assert bad.exit_code == 2 and "--expect-config" in bad.output


def test_supernode_authentication_options(tmp_path: Path) -> None:
    key = tmp_path / "k.key"
    key.write_text("x")
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    ok = _run("supernode", "--silo", "0", "--num-silos", "1", "--superlink", "localhost:1",
              "--root-certificates", str(ca), "--auth-supernode-private-key", str(key),
              "--dry-run")  # fmt: skip
    assert ok.exit_code == 0, ok.output
    cmd = shlex.split(ok.output.splitlines()[0])
    assert cmd[cmd.index("--auth-supernode-private-key") + 1] == str(key.resolve())
    insecure = _run("supernode", "--silo", "0", "--num-silos", "1", "--superlink", "localhost:1",
                    "--insecure", "--auth-supernode-private-key", str(key),
                    "--dry-run")  # fmt: skip
    assert insecure.exit_code == 2 and "needs TLS" in insecure.output
    link = _run("superlink", "--insecure", "--enable-supernode-auth", "--dry-run")
    assert link.exit_code == 2 and "needs TLS" in link.output


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    result = _run("keygen", "--out", str(tmp_path / "keys"))
    assert result.exit_code == 0, result.output
    private, public = tmp_path / "keys" / "supernode.key", tmp_path / "keys" / "supernode.pub"
    assert private.stat().st_mode & 0o777 == 0o600
    key = serialization.load_ssh_private_key(private.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert public.read_text().startswith("ecdsa-sha2-nistp384 ")
    again = _run("keygen", "--out", str(tmp_path / "keys"))
    assert again.exit_code == 2 and "already exists" in again.output


def test_register_and_submit_commands(tmp_path: Path) -> None:
    pub = tmp_path / "a.pub"
    pub.write_text("x")
    result = _run("register", str(pub), "--superlink", "127.0.0.1:9093", "--insecure", "--dry-run")
    assert result.exit_code == 0, result.output
    cmd = shlex.split(result.output.strip())
    assert cmd[1:4] == ["supernode", "register", str(pub.resolve())] and cmd[4] == "local"
    missing = _run(
        "register", str(tmp_path / "nope.pub"), "--superlink", "localhost:1", "--insecure"
    )
    assert missing.exit_code == 2 and "file not found" in missing.output
    submit = _run(
        "submit", str(EXAMPLES / "digits_demo.yaml"), "--superlink", "localhost:1", "--insecure",
        "--out", str(tmp_path / "out"), "--resume", "--dry-run",
    )  # fmt: skip
    assert submit.exit_code == 0, submit.output
    app_dir = Path(shlex.split(submit.output.strip())[2])
    flwr = tomllib.loads((app_dir / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert flwr["config"]["pdpfl-resume"] is True
    from pdpfl.config import load_config

    silos = load_config(EXAMPLES / "digits_demo.yaml").data.num_clients
    assert flwr["config"]["pdpfl-startup-timeout"] == 60.0 + 10.0 * silos  # scales with them
