"""`pdpfl calibrate`: JSON report, rates file, and bad input → exit 2 without output."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.io import save_npy

PLAN_ARGS = ["--delta", "1e-3", "--steps", "5", "--rounds", "20", "--client-rate", "0.5"]


def run(args: list[str]):
    return CliRunner().invoke(app, ["calibrate", *args])


def test_calibrate_budget_file_writes_rates_and_json(tmp_path) -> None:
    save_npy(tmp_path / "b.npy", np.array([0.5, 1.0, 5.0, 5.0]))
    out = tmp_path / "q.npy"
    res = run(
        [
            "--budgets",
            str(tmp_path / "b.npy"),
            "--sigma",
            "3.5",
            *PLAN_ARGS,
            "--out",
            str(out),
            "--json",
        ]
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    for key in (
        "n",
        "seconds",
        "over_budget",
        "min_utilization",
        "median_utilization",
        "sigma",
        "method",
        "distinct_budgets",
        "excluded",
    ):
        assert key in report
    assert report["n"] == 4 and report["distinct_budgets"] == 3 and report["over_budget"] == 0
    assert report["method"] == "certified" and report["sigma"] == 3.5
    q = np.load(out)
    assert q.shape == (4,) and np.all((q > 0) & (q <= 1)) and q[2] == q[3]


def test_calibrate_scenario_with_epsilon_max_and_scf(tmp_path) -> None:
    res = run(
        [
            "--scenario",
            "three-levels",
            "--n",
            "200",
            "--epsilon-max",
            "10",
            *PLAN_ARGS,
            "--method",
            "scf",
            "--json",
        ]
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["method"] == "scf" and report["n"] == 200 and report["distinct_budgets"] == 3
    assert 3.0 < report["sigma"] < 4.0


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (np.array([1.0, -0.5]), "<= 0"),
        (np.array([1.0, np.nan]), "NaN"),
        (np.ones((2, 2)), "1-D"),
        (np.array([]), "empty"),
    ],
)
def test_bad_budgets_exit_2_and_write_nothing(tmp_path, content, match) -> None:
    save_npy(tmp_path / "b.npy", content)
    out = tmp_path / "q.npy"
    res = run(
        [
            "--budgets",
            str(tmp_path / "b.npy"),
            "--sigma",
            "3.5",
            *PLAN_ARGS,
            "--out",
            str(out),
            "--json",
        ]
    )
    assert res.exit_code == 2
    assert "--budgets" in res.stderr and match in res.stderr
    assert not out.exists()


def test_empty_csv_and_infeasible_budgets_exit_2(tmp_path) -> None:
    (tmp_path / "b.csv").write_text("")
    out = tmp_path / "q.npy"
    res = run(
        ["--budgets", str(tmp_path / "b.csv"), "--sigma", "3.5", *PLAN_ARGS, "--out", str(out)]
    )
    assert res.exit_code == 2 and "empty" in res.stderr and not out.exists()
    save_npy(tmp_path / "tiny.npy", np.array([2e-3, 1.0]))  # above MIN_BUDGET, below reach
    strict = ["--delta", "1e-8", "--steps", "5", "--rounds", "20", "--client-rate", "0.5"]
    res = run(
        ["--budgets", str(tmp_path / "tiny.npy"), "--sigma", "3.5", *strict, "--out", str(out)]
    )
    assert res.exit_code == 2 and "smallest achievable" in res.stderr and not out.exists()
    res = run(
        [
            "--budgets",
            str(tmp_path / "tiny.npy"),
            "--sigma",
            "3.5",
            *strict,
            "--allow-exclusion",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert res.exit_code == 0 and json.loads(res.stdout)["excluded"] == 1 and out.exists()


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (
            ["--scenario", "three-levels", "--n", "5", "--sigma", "1", "--epsilon-max", "3"],
            "exactly one",
        ),
        (["--scenario", "nope", "--n", "5", "--sigma", "1"], "unknown name"),
        (["--scenario", "three-levels", "--sigma", "1"], "--n"),
        (["--scenario", "three-levels", "--n", "5", "--sigma", "1", "--method", "x"], "method"),
        (
            ["--scenario", "three-levels", "--n", "5", "--sigma", "1", "--adversary", "x"],
            "adversary",
        ),
        (["--scenario", "three-levels", "--n", "5", "--sigma", "-1"], "--sigma"),
    ],
)
def test_bad_options_exit_2(extra: list[str], match: str) -> None:
    res = run([*extra, *PLAN_ARGS])
    assert res.exit_code == 2 and match in res.stderr


def test_client_unit_and_pld_accountant(tmp_path) -> None:
    from pdpfl.calibration import calibrate
    from pdpfl.privacy.unit import PrivacyUnit, SampledGaussianPlan

    budgets = tmp_path / "b.npy"
    np.save(budgets, np.array([0.5, 1.0, 2.0, 4.0]))
    base = [
        "calibrate",
        "--budgets",
        str(budgets),
        "--sigma",
        "2.0",
        "--delta",
        "1e-5",
        "--rounds",
        "20",
        "--json",
    ]
    res = run([*base[1:], "--unit", "client", "--out", str(tmp_path / "q.npy")])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["unit"] == "client" and report["over_budget"] == 0
    mech = SampledGaussianPlan(PrivacyUnit.CLIENT, 2.0, 1e-5, 20)
    ref = calibrate(np.array([0.5, 1.0, 2.0, 4.0]), mech)
    np.testing.assert_array_equal(np.load(tmp_path / "q.npy"), ref.rates)
    bad = run([*base[1:], "--unit", "user", "--steps", "3"])
    assert bad.exit_code == 2 and "--steps" in bad.output
    bad = run([*base[1:], "--unit", "record"])
    assert bad.exit_code == 2 and "--steps" in bad.output
    bad = run([*base[1:], "--unit", "client", "--accountant", "moments"])
    assert bad.exit_code == 2 and "--accountant" in bad.output
