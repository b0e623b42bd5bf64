"""`pdpfl run` / `pdpfl compare`: exit codes, messages naming the field, no partial output."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdpfl.cli import app

TINY = {
    "name": "cli-tiny",
    "seed": 3,
    "threads": 1,
    "data": {"dataset": "breast-cancer", "num_clients": 2},
    "model": {"name": "logreg"},
    "privacy": {"epsilon_max": 5.0, "delta": 1e-3},
    "training": {"rounds": 2, "local_steps": 2, "lr": 0.3, "batch_size": 8},
}


def _write(tmp_path: Path, raw: dict, name: str = "cfg.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(raw))
    return p


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_bad_config_exits_2_naming_fields_and_writes_nothing(tmp_path: Path) -> None:
    raw = {**TINY, "training": {**TINY["training"], "rounds": 0, "speed": 3}}
    out = tmp_path / "out"
    res = _invoke("run", str(_write(tmp_path, raw)), "--out", str(out))
    assert res.exit_code == 2
    assert "training.rounds" in res.output and "training.speed: unknown key" in res.output
    assert not out.exists()


def test_bad_set_override_and_bad_data_exit_2(tmp_path: Path) -> None:
    cfg = _write(tmp_path, TINY)
    out = tmp_path / "out"
    res = _invoke("run", str(cfg), "--out", str(out), "--set", "rounds=-1")
    assert res.exit_code == 2 and "training.rounds" in res.output
    res = _invoke("run", str(cfg), "--out", str(out), "--set", "data.dataset=nope")
    assert res.exit_code == 2 and "data" in res.output
    res = _invoke("run", str(tmp_path / "missing.yaml"), "--out", str(out))
    assert res.exit_code == 2 and "not found" in res.output
    assert not out.exists()


def test_invalid_choice_exits_2_without_output(tmp_path: Path) -> None:
    cfg = _write(tmp_path, TINY)
    out = tmp_path / "out"
    res = _invoke("run", str(cfg), "--out", str(out), "--set", "calibration=nonsense")
    assert res.exit_code == 2 and "privacy.calibration" in res.output
    assert not out.exists()


@pytest.mark.slow
def test_run_writes_outputs_and_json(tmp_path: Path) -> None:
    cfg = _write(tmp_path, TINY)
    out = tmp_path / "out"
    res = _invoke("run", str(cfg), "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["rounds_completed"] == 2 and summary["over_budget"] == 0
    assert (out / "summary.json").is_file() and (out / "metrics.jsonl").is_file()
    # a second run into the same folder needs --resume
    res = _invoke("run", str(cfg), "--out", str(out))
    assert res.exit_code == 2 and "--resume" in res.output
    res = _invoke("run", str(cfg), "--out", str(out), "--resume", "--quiet")
    assert res.exit_code == 0, res.output
    assert "cli-tiny · rpdp" in res.stdout and "outputs written" in res.stdout


@pytest.mark.slow
def test_compare_table_and_csv(tmp_path: Path) -> None:
    cfg = _write(tmp_path, {**TINY, "lifetime": {"allow_respend": True}})  # privacy-free: ε = ∞
    table = tmp_path / "runs.csv"
    res = _invoke(
        "compare",
        str(cfg),
        "--methods",
        "rpdp",
        "privacy-free",
        "--seeds",
        "1",
        "2",
        "--csv",
        str(table),
    )
    assert res.exit_code == 0, res.output
    assert "rpdp" in res.stdout and "±" in res.stdout
    with table.open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["method"], r["seed"]) for r in rows] == [
        ("rpdp", "1"),
        ("rpdp", "2"),
        ("privacy-free", "1"),
        ("privacy-free", "2"),
    ]
    # the privacy unit of each run's ε and over-budget count is a column since the typed summary
    assert list(rows[0]) == [
        "method",
        "seed",
        "final_accuracy",
        "last3_mean_accuracy",
        "over_budget",
        "seconds",
        "unit",
        "epsilon",
        "private",
    ]
    assert all(int(r["over_budget"]) == 0 for r in rows if r["method"] == "rpdp")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--methods", "magic"], "--methods"),
        (["--seeds", "x"], "--seeds"),
        (["--methods", "uniform:-1"], "uniform"),
        (["--bogus"], "--bogus"),
    ],
)
def test_compare_bad_input_exits_2(tmp_path: Path, args: list[str], needle: str) -> None:
    cfg = _write(tmp_path, TINY)
    table = tmp_path / "t.csv"
    res = _invoke("compare", str(cfg), *args, "--csv", str(table))
    assert res.exit_code == 2
    assert needle in res.output
    assert not table.exists()
