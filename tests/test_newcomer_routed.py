"""Issue #17 items that live in other branches' files: the failing tests, written here.

They were strict xfails until the owning branch's fix was merged; they now pass on main.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from pdpfl.cli import app


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _clean_exit_2(res, needle: str) -> None:
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output and "error: " in res.output and needle in res.output


def test_account_with_a_vanishing_sigma_exits_2() -> None:
    _clean_exit_2(
        _invoke("account", "--sigma", "1e-170", "--delta", "1e-5", "--q", "0.1"), "--sigma"
    )


def test_calibrate_out_into_an_unwritable_place_exits_2(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = _invoke(
        "calibrate",
        "--scenario",
        "three-levels",
        "--n",
        "50",
        "--sigma",
        "1",
        "--delta",
        "1e-5",
        "--steps",
        "5",
        "--rounds",
        "3",
        "--client-rate",
        "1",
        "--out",
        str(blocker / "q.npy"),
    )
    _clean_exit_2(res, "--out")


_CALIBRATE = (
    "calibrate",
    "--scenario",
    "three-levels",
    "--n",
    "1000",
    "--delta",
    "1e-5",
    "--client-rate",
    "1",
    "--json",
)


def test_calibrate_warns_when_utilization_is_poor() -> None:
    # σ too small for these budgets: ε(q) jumps from 0 to more than 0.1 between two grid
    # points, so every record gets a rate that spends nothing (median utilization 0).
    res = _invoke(*_CALIBRATE, "--sigma", "0.6", "--steps", "1", "--rounds", "1")
    assert res.exit_code == 0, res.output
    assert "warning:" in res.stderr and "utilization" in res.stderr
    out = json.loads(res.stdout)
    assert any("utilization" in w for w in out["warnings"])


def test_calibrate_warns_when_records_are_over_budget() -> None:
    res = _invoke(*_CALIBRATE, "--sigma", "1", "--steps", "50", "--rounds", "15", "--method", "scf")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["over_budget"] == 1000
    assert "warning:" in res.stderr and "over budget" in res.stderr
    assert any("over budget" in w and "certified" in w for w in out["warnings"])


def _quick_start():
    from pdpfl.budgets import assign_budgets, make_scenario
    from pdpfl.calibration import calibrate, noise_for_max_budget
    from pdpfl.privacy import plan_epsilon
    from pdpfl.privacy.plan import TrainingPlan
    from pdpfl.seeding import numpy_generator

    eps = assign_budgets(make_scenario("three-levels"), 2_000, numpy_generator(42, "budgets"))
    template = TrainingPlan(noise_multiplier=1.0, delta=1e-3, steps=5, rounds=20, client_rate=0.5)
    plan = template.with_noise(noise_for_max_budget(10.0, template))
    result = calibrate(eps, plan, method="certified", adversary="third-party")
    spent, _ = plan_epsilon(result.rates, plan)
    return eps, plan, result, spent


@pytest.mark.slow
def test_calibration_report_min_epsilon_describes_the_records() -> None:
    _, _, result, spent = _quick_start()
    assert spent.min() > 0.09
    assert result.report.min_spent_epsilon == pytest.approx(float(spent.min()), rel=1e-6)
    assert result.report.max_spent_epsilon == pytest.approx(float(spent.max()), rel=1e-6)
    # the plan's floor (smallest ε a positive rate can spend) is named as such
    assert result.report.min_achievable_epsilon <= result.report.min_spent_epsilon


def test_ledger_summary_says_which_observer_is_over_budget() -> None:
    from pdpfl.ledger import PrivacyLedger

    eps, plan, result, _ = _quick_start()
    ledger = PrivacyLedger(eps, result.rates, plan)
    for _ in range(plan.rounds):
        active = ~ledger.would_exceed(adversary="third-party")
        ledger.record_round(participated=active, active=active)
    summary = ledger.summary()
    assert summary.over_budget("third-party") == 0
    assert summary.over_budget("server") == int(
        np.count_nonzero(ledger.spent_epsilon("server") > eps)
    )
