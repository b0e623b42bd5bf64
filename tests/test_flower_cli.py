"""`pdpfl flower ...`: option validation (exit code 2) and the Flower commands it runs."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("flwr")

from pdpfl.cli import app  # noqa: E402
from pdpfl.runtime.flower.apps import decode_config  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, ["flower", *args])


def test_supernode_command_maps_silo_to_partition_id(tmp_path: Path) -> None:
    result = _run(
        "supernode", "--silo", "1", "--num-silos", "3", "--superlink", "10.0.0.5:9093",
        "--insecure", "--state-dir", str(tmp_path / "state"), "--data-dir", str(tmp_path),
        "--dry-run",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    cmd = shlex.split(result.output.strip())
    assert Path(cmd[0]).name == "flower-supernode"
    assert cmd[cmd.index("--superlink") + 1] == "10.0.0.5:9093"
    node_config = cmd[cmd.index("--node-config") + 1]
    assert "partition-id=1" in node_config and "num-partitions=3" in node_config
    assert f'data-dir="{tmp_path.resolve()}"' in node_config


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--silo", "3", "--num-silos", "3", "--superlink", "h:1", "--insecure"], "--silo"),
        (["--silo", "0", "--num-silos", "3", "--superlink", "nohost", "--insecure"], "--superlink"),
        (["--silo", "0", "--num-silos", "3", "--superlink", "h:1"], "--root-certificates"),
        (
            [
                "--silo",
                "0",
                "--num-silos",
                "2",
                "--superlink",
                "h:1",
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
