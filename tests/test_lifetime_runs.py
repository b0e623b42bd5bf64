"""A person's budget is for life (issue #35), end to end in the simulator: runs on the same data
compose in the budget store, the next run's units sit out or the run is refused, the headline
and summary.json say it; --resume never starts a run; the δ-only floor and tiny budgets are
named."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import pdpfl
from pdpfl.cli import app
from pdpfl.config import ConfigError, config_from_dict, with_updates
from pdpfl.fl.lifetime import LifetimeExceeded, silo_target
from pdpfl.ledger import StoreBusy
from pdpfl.privacy.orders import DEFAULT_ORDERS
from pdpfl.runtime.outputs import OutputDirError
from pdpfl.runtime.simulation import load_federation_for, run_simulation

#: Budgets 1 / 8 / 15; ``minimum`` charges everyone ε_min = 1 per run, ``rpdp`` each record up
#: to its own budget (15: capped at ε_max = 8, q = 1).
BASE: dict[str, Any] = {
    "name": "life",
    "seed": 4,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 3},
    "model": {"name": "logreg"},
    "algorithm": {"name": "minimum"},
    "budgets": {
        "scenario": "three-levels",
        "params": {"values": [1.0, 8.0, 15.0], "ratios": [0.5, 0.3, 0.2]},
        "cap_at_epsilon_max": True,
    },
    "privacy": {"epsilon_max": 8.0, "delta": 1e-3},
    "training": {"rounds": 2, "local_steps": 2, "client_rate": 1.0, "lr": 0.3, "batch_size": 8},
}


def _quiet(*args: Any, **kwargs: Any) -> dict[str, Any]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_simulation(*args, progress=False, **kwargs)


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """minimum, minimum, rpdp on the same data (one budget store, this module's)."""
    out = tmp_path_factory.mktemp("runs")
    summaries = [
        _quiet(config_from_dict(BASE, over), out / f"run{i}")
        for i, over in enumerate([[], [], ["algorithm.name=rpdp"]])
    ]
    return {"summaries": summaries, "out": out, "store": Path(os.environ["PDPFL_BUDGET_DIR"])}


@pytest.mark.slow
def test_the_second_run_reports_the_composition_of_both(three_runs: dict[str, Any]) -> None:
    import dp_accounting as dpa

    first, second, _ = three_runs["summaries"]
    assert first["lifetime"]["enforced"] and first["lifetime"]["prior_units"] == 0
    assert first["lifetime"]["epsilon"] == pytest.approx(first["epsilon"], rel=1e-12)
    # the ε = 1 records spent everything in run 1: all of them sat out run 2, named by count
    g1 = second["per_group"]["1"]
    assert g1["stopped"] == g1["count"] > 0 and g1["max_spent_third_party"] == 0
    assert any(f"{g1['count']} of " in w and "no lifetime budget" in w for w in second["warnings"])
    # the others' lifetime ε: both runs' mechanisms composed -- dp-accounting's RdpAccountant
    # composing the two runs' events (λ = 1: T·τ Poisson-sampled Gaussian steps each) on the
    # same orders (its fractional-order series differs from pdpfl's exact one by < 1e-4
    # relative, always upward; integer orders agree to 1e-9: test_lifetime_compose)
    g8 = second["per_group"]["8"]
    q, sigma, steps = g8["rate"], second["noise_multiplier"], 2 * 2
    acc = dpa.rdp.RdpAccountant(orders=[float(a) for a in DEFAULT_ORDERS])
    for _ in range(2):
        acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
    reference = acc.get_epsilon(1e-3)
    for value in (g8["lifetime_max_third_party"], second["lifetime"]["epsilon"]):
        assert value == pytest.approx(reference, rel=1e-4) and value <= reference
    assert second["lifetime"]["earlier_runs"] == 1
    assert g8["max_spent_third_party"] < reference < 2 * g8["max_spent_third_party"]


@pytest.mark.slow
def test_a_third_run_that_would_exceed_makes_those_units_sit_out(
    three_runs: dict[str, Any],
) -> None:
    third = three_runs["summaries"][2]
    groups = third["per_group"]
    assert groups["1"]["stopped"] == groups["1"]["count"]  # no budget left at all
    assert groups["8"]["stopped"] == groups["8"]["count"] > 0  # stopped when the next round
    assert groups["15"]["stopped"] == 0  # would exceed; the 15s had room for the whole run
    for label, g in groups.items():
        assert g["lifetime_max_third_party"] <= float(label) * (1 + 1e-9)
    assert third["lifetime"]["over_budget"] == 0 and third["lifetime"]["earlier_runs"] == 2
    on_disk = json.loads((three_runs["out"] / "run2" / "summary.json").read_text())
    assert on_disk["lifetime"] == json.loads(json.dumps(third["lifetime"]))
    # the headline shows lifetime beside this run's spend
    from rich.console import Console

    from pdpfl.reports.tables import run_tables

    console = Console(record=True, width=100)
    for table in run_tables(third):
        console.print(table)
    text = console.export_text()
    assert "· lifetime" in text and "lifetime budgets" in text and "earlier runs" in text


@pytest.mark.slow
def test_privacy_store_shows_each_units_runs_and_what_remains(three_runs: dict[str, Any]) -> None:
    store = three_runs["store"]
    res = CliRunner().invoke(app, ["privacy", "--store", str(store), "--json"])
    assert res.exit_code == 0, res.output
    stores = json.loads(res.stdout)["stores"]
    assert len(stores) == 3 and all(len(s["runs"]) == 3 for s in stores)
    frame = pdpfl.lifetime_budgets(store, as_frame=False)
    rid = int(frame["id"][np.argmax(frame["budget"] == 15.0)])
    res = CliRunner().invoke(app, ["privacy", "--store", str(store), "--id", str(rid)])
    assert res.exit_code == 0, res.output
    assert "3 run(s) charged it" in res.stdout and "remaining" in res.stdout
    one = pdpfl.lifetime_budgets(store, unit_id=rid, as_frame=False)
    assert one["runs"].tolist() == [3] and one["remaining_third_party"][0] > 0
    missing = CliRunner().invoke(app, ["privacy", "--store", str(store), "--id", "-5"])
    assert missing.exit_code == 2 and "no unit with id" in missing.output


@pytest.mark.slow
def test_an_algorithm_without_a_filter_is_refused_naming_how_many(tmp_path: Path) -> None:
    uldp = {**BASE, "algorithm": {"name": "uldp-naive"}, "data": {**BASE["data"]}}
    uldp["data"]["options"] = {"num_users": 12}
    uldp["privacy"] = {"noise_multiplier": 2.0, "delta": 1e-5}
    cfg = config_from_dict({k: v for k, v in uldp.items() if k != "budgets"})
    _quiet(cfg, tmp_path / "a")
    with pytest.raises(LifetimeExceeded, match=r"12 of 12 user\(s\) would exceed"):
        _quiet(cfg, tmp_path / "b")
    assert not (tmp_path / "b" / "metrics.jsonl").exists()  # refused before round 1


def test_training_without_dp_is_refused_unless_respending_is_declared(tmp_path: Path) -> None:
    cfg = config_from_dict(BASE, ["algorithm.name=privacy-free", "rounds=1"])
    with pytest.raises(LifetimeExceeded, match="ε = ∞"):
        _quiet(cfg, tmp_path / "a")
    declared = _quiet(with_updates(cfg, ["lifetime.allow_respend=true"]), tmp_path / "b")
    assert declared["lifetime"]["enforced"] is False  # the explicit choice, stated
    # ... and recorded: every record of the data now has ε = ∞ for life
    frame = pdpfl.lifetime_budgets(as_frame=False)
    assert np.isinf(frame["epsilon_third_party"].astype(float)).all()


def test_a_concurrent_run_on_the_same_data_is_refused(tmp_path: Path) -> None:
    cfg = config_from_dict(BASE, ["rounds=1"])
    target = silo_target(cfg, 1, load_federation_for(cfg).clients[1])
    with target.store().open():  # another run charges silo 1's store right now
        with pytest.raises(StoreBusy, match="being charged by"):
            _quiet(cfg, tmp_path / "a")


# ---------------------------------------------------------------------- --resume never starts


def test_resume_on_a_missing_folder_exits_2_in_every_runtime(tmp_path: Path) -> None:
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(json.dumps(BASE))
    missing = tmp_path / "nothere"
    for runtime in ("simulation", "flower", "flower-simulation"):
        res = CliRunner().invoke(
            app, ["run", str(cfg_file), "--out", str(missing), "--resume", "--runtime", runtime]
        )
        if runtime == "flower-simulation" and "simulation extra" in res.output:
            continue  # Ray missing: refused for that first
        assert res.exit_code == 2, res.output
        assert "nothing to resume" in res.output and str(missing) in res.output
        assert not missing.exists()
    with pytest.raises(OutputDirError, match="does not exist"):
        run_simulation(config_from_dict(BASE), missing, resume=True, progress=False)
    assert not missing.exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(OutputDirError, match="it is empty"):
        run_simulation(config_from_dict(BASE), tmp_path / "empty", resume=True, progress=False)


@pytest.mark.slow  # importing Flower takes seconds
def test_flower_runtimes_refuse_a_resume_without_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("flwr")
    from pdpfl.runtime.flower.apps import _run_key
    from pdpfl.runtime.flower.launcher import check_resume

    with pytest.raises(OutputDirError, match="nothing to resume"):
        check_resume(config_from_dict(BASE), tmp_path / "nothere", True)
    (tmp_path / "out" / "flower").mkdir(parents=True)
    with pytest.raises(ValueError, match="nothing to resume"):
        _run_key(tmp_path / "out" / "flower", True)  # the ServerApp (flower submit --resume)


# ---------------------------------------------------------------------- every group named


@pytest.mark.slow
def test_the_delta_only_floor_group_is_named_with_its_count(tmp_path: Path) -> None:
    cfg = config_from_dict(
        BASE,
        [
            "algorithm.name=rpdp",
            "budgets.params.values=[0.1, 1.0, 5.0]",
            "budgets.cap_at_epsilon_max=false",
            "privacy.epsilon_max=10",
            "rounds=1",
            "local_steps=5",
        ],
    )
    summary = _quiet(cfg, tmp_path)
    floor = summary["per_group"]["0.1"]["floor"]
    assert floor == summary["per_group"]["0.1"]["count"] == summary["units_floor"] > 0
    assert summary["per_group"]["1"]["floor"] == 0
    assert any(
        f"{floor} record(s) contribute almost nothing at ε = 0.1" in w for w in summary["warnings"]
    )
    from rich.console import Console

    from pdpfl.reports.tables import run_tables

    console = Console(record=True, width=100)
    for table in run_tables(summary):
        console.print(table)
    assert "δ-only floor" in console.export_text()


def test_tiny_and_non_finite_budgets_are_refused_with_file_row_and_column(tmp_path: Path) -> None:
    from pdpfl.budgets import load_budgets
    from pdpfl.data.budget_table import read_table
    from pdpfl.data.validation import DataValidationError

    table = tmp_path / "budgets.csv"
    table.write_text("record_id,epsilon\n1,0.5\n2,1e-300\n")
    with pytest.raises(DataValidationError, match=r"budgets.csv, column 'epsilon'.*row 3.*1e-300"):
        read_table(table)
    table.write_text("record_id,epsilon\n1,0.5\n2,inf\n")
    with pytest.raises(DataValidationError, match=r"column 'epsilon'.*row 3.*finite"):
        read_table(table)
    plain = tmp_path / "eps.csv"
    plain.write_text("epsilon\n1.0\n0.0000001\n")
    with pytest.raises(ValueError, match=r"eps.csv: line 3, column 'epsilon'.*below the smallest"):
        load_budgets(plain)
    with pytest.raises(ConfigError, match=r"budgets: params: .*1e-300 is below the minimum"):
        config_from_dict(BASE, ["budgets.params.values=[1e-300, 1.0, 5.0]"])
