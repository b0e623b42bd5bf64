"""Each person's ε by id: `pdpfl privacy RUN_DIR`, `pdpfl.privacy_table` and the ledger files
agree with the silos' own ledgers, survive a resume, and speak in the run's unit."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import pdpfl
from pdpfl.cli import app
from pdpfl.config import config_from_dict
from pdpfl.runtime.simulation import run_simulation

TINY = {
    "name": "tiny",
    "seed": 5,
    "randomness": "reproducible",
    "data": {"dataset": "breast-cancer", "num_clients": 3},
    "model": {"name": "logreg"},
    "budgets": {
        "scenario": "three-levels",
        "params": {"values": [0.5, 2.0, 8.0], "ratios": [0.5, 0.3, 0.2]},
    },
    "privacy": {"epsilon_max": 8.0, "delta": 1e-3},
    "training": {"rounds": 3, "local_steps": 3, "client_rate": 0.7, "lr": 0.3, "batch_size": 8},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("run")
    summary = run_simulation(config_from_dict(TINY), out, progress=False)
    return out, summary


@pytest.mark.slow
def test_the_table_has_one_row_per_record_with_its_id_and_matches_the_summary(run) -> None:
    out, summary = run
    table = pdpfl.privacy_table(out, as_frame=False)
    assert summary["privacy_unit"] == "record"
    assert len(table["id"]) == summary["units"] == summary["privacy"]["units"]
    assert len(set(table["id"])) == len(table["id"])  # record ids are unique
    assert set(table["unit"]) == {"record"}
    for obs, tag in (("third-party", "third_party"), ("server", "server")):
        assert np.max(table[f"epsilon_{tag}"]) == pytest.approx(
            summary["privacy"]["spent_max"][obs], rel=1e-12
        )
        assert np.all(table[f"epsilon_{tag}"] <= table["budget"] * (1 + 1e-9))
    # the rounds charged to third parties: every round each active record was not stopped
    assert np.all(table["rounds_third_party"] <= 3)
    assert np.all(table["rounds_server"] <= table["rounds_third_party"])


@pytest.mark.slow
def test_the_cli_writes_privacy_csv_and_answers_for_one_id(run) -> None:
    out, summary = run
    runner = CliRunner()
    res = runner.invoke(app, ["privacy", str(out)])
    assert res.exit_code == 0, res.output
    assert "records" in res.stdout and "budget ε" in res.stdout
    with (out / "privacy.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == summary["units"]
    pick = rows[len(rows) // 2]
    res = runner.invoke(app, ["privacy", str(out), "--id", pick["id"], "--json"])
    assert res.exit_code == 0, res.output
    answer = json.loads(res.stdout)["rows"]
    assert len(answer) == 1
    assert answer[0]["epsilon_third_party"] == pytest.approx(float(pick["epsilon_third_party"]))
    assert answer[0]["budget"] == pytest.approx(float(pick["budget"]))
    res = runner.invoke(app, ["privacy", str(out), "--id", pick["id"]])
    assert f"record {pick['id']}" in res.stdout and "third party: ε spent" in res.stdout


@pytest.mark.slow
def test_unknown_ids_and_folders_without_ledgers_are_clear_errors(run, tmp_path) -> None:
    out, _ = run
    runner = CliRunner()
    res = runner.invoke(app, ["privacy", str(out), "--id", "no-such-person"])
    assert res.exit_code == 2 and "--id" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["privacy", str(tmp_path)])
    assert res.exit_code == 2 and "no ledger files" in res.output


@pytest.mark.slow
def test_ids_and_charges_survive_a_resume(tmp_path) -> None:
    full = tmp_path / "full"
    part = tmp_path / "part"
    # the same data twice, each run with its own budget store (as if on two copies of it)
    for out in (full, part):
        cfg = config_from_dict(TINY, [f"lifetime.store={tmp_path / 'budgets' / out.name}"])
        run_simulation(cfg, out, progress=False, stop_after=None if out == full else 1)
    run_simulation(cfg, part, resume=True, progress=False)
    a = pdpfl.privacy_table(full, as_frame=False)
    b = pdpfl.privacy_table(part, as_frame=False)
    np.testing.assert_array_equal(a["id"], b["id"])
    for col in ("rounds_third_party", "rounds_server", "epsilon_third_party", "epsilon_server"):
        np.testing.assert_array_equal(a[col], b[col])


def test_the_privacy_free_baseline_reports_infinite_epsilon_in_its_unit(tmp_path) -> None:
    cfg = config_from_dict(TINY, ["algorithm.name=privacy-free", "lifetime.allow_respend=true"])
    summary = run_simulation(cfg, tmp_path, progress=False)
    assert summary["privacy"]["private"] is False
    assert summary["over_budget"] == summary["units"] > 0
    assert summary["epsilon"] is None  # ∞ is written as null in JSON
