"""Certified calibration: never over budget, within the stated resolution of the optimum."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.calibration import (
    CertifiedEstimator,
    InfeasibleBudgetError,
    calibrate,
    estimator_from_dict,
    fit_estimator,
)
from pdpfl.calibration.certified import rate_grid
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.two_stage import plan_epsilon

PLAN = TrainingPlan(noise_multiplier=3.5, delta=1e-3, steps=5, rounds=20, client_rate=0.5)


def eps_at(q: float, plan: TrainingPlan, adversary: str = "third-party") -> float:
    """The exact accountant at one rate, called on its own (independent of any batching)."""
    return float(np.asarray(plan_epsilon(np.array([q]), plan, adversary)[0])[0])


@pytest.fixture(scope="module")
def estimator() -> CertifiedEstimator:
    return CertifiedEstimator.fit(PLAN)


plans = st.builds(
    TrainingPlan,
    noise_multiplier=st.floats(0.7, 6.0),
    delta=st.sampled_from([1e-5, 1e-4, 1e-3, 1e-2]),
    steps=st.integers(1, 10),
    rounds=st.one_of(st.none(), st.integers(1, 40)),
    client_rate=st.floats(0.1, 1.0),
)


@pytest.mark.slow
@given(
    plan=plans,
    adversary=st.sampled_from(["third-party", "server", "both"]),
    budgets=st.lists(st.floats(0.02, 30.0), min_size=1, max_size=4),
)
@settings(max_examples=15)
def test_certified_never_exceeds_and_is_within_resolution(plan, adversary, budgets) -> None:
    est = CertifiedEstimator.fit(plan, adversary, rel_step=0.05, abs_step=0.01)
    b = np.array(budgets)
    q = est.rates(b)
    for qi, bi, gap in zip(q, b, est.resolution(q), strict=True):
        if qi > 0:
            assert eps_at(qi, plan, adversary) <= bi  # the guarantee, checked independently
        if qi < 1:
            nxt = qi + gap if qi > 0 else est.q_grid[0]
            assert eps_at(nxt, plan, adversary) > bi  # the next grid rate is infeasible


@pytest.mark.parametrize(
    ("q_min", "rel", "step"), [(1e-6, 0.01, 1e-3), (1e-3, 0.05, 0.01), (0.2, 0.01, 1e-3)]
)
def test_grid_resolution_statement(q_min: float, rel: float, step: float) -> None:
    g = rate_grid(q_min, rel, step)
    assert g[0] == pytest.approx(q_min) and g[-1] == 1.0 and np.all(np.diff(g) > 0)
    assert np.all(np.diff(g) <= np.minimum(rel * g[:-1], step) * (1 + 1e-9))


def test_default_grid_size() -> None:
    assert 2000 <= rate_grid().size <= 2100


def test_calibrate_report_and_monotone_rates(estimator: CertifiedEstimator) -> None:
    rng = np.random.default_rng(0)
    b = rng.uniform(0.1, 20.0, size=500)
    res = calibrate(b, PLAN, client_ids=rng.integers(0, 4, size=500))
    r = res.report
    assert r.n == 500 and r.distinct_budgets == 500 and r.over_budget == 0 and r.excluded == 0
    assert r.method == "certified" and r.sigma == PLAN.noise_multiplier
    assert 0 < r.min_utilization <= r.median_utilization <= 1.0
    order = np.argsort(b)
    assert np.all(np.diff(res.rates[order]) >= 0)
    assert sum(r.expected_batch_size.values()) == pytest.approx(res.rates.sum())
    assert set(r.expected_batch_size) == {"0", "1", "2", "3"}
    np.testing.assert_array_equal(res.rates, estimator.rates(b))


def test_large_budgets_get_rate_one(estimator: CertifiedEstimator) -> None:
    e1 = eps_at(1.0, PLAN)
    q = estimator.rates(np.array([e1, e1 * 2, 1e6]))
    np.testing.assert_array_equal(q, 1.0)
    assert estimator.rates(np.array([e1 * 0.999]))[0] < 1.0


@pytest.mark.slow
def test_infeasible_budgets_raise_or_are_excluded() -> None:
    # With δ = 1e-8 even the smallest grid rate costs ε > 0 (with δ = 1e-3 it costs 0).
    plan = dataclasses.replace(PLAN, delta=1e-8)
    estimator = CertifiedEstimator.fit(plan)
    assert estimator.min_epsilon > 0
    tiny = estimator.min_epsilon / 2
    b = np.array([tiny, tiny, 1.0])
    with pytest.raises(InfeasibleBudgetError, match=r"2 record\(s\).*smallest achievable") as info:
        calibrate(b, plan)
    assert info.value.count == 2 and info.value.min_epsilon == pytest.approx(estimator.min_epsilon)
    res = calibrate(b, plan, allow_exclusion=True)
    np.testing.assert_array_equal(res.rates[:2], 0.0)
    assert res.rates[2] > 0 and res.report.excluded == 2 and res.report.over_budget == 0


def test_estimator_json_round_trip_is_exact(estimator: CertifiedEstimator) -> None:
    b = np.random.default_rng(1).uniform(0.05, 15, size=1000)
    wire = json.loads(json.dumps(estimator.to_dict()))
    again = estimator_from_dict(wire)
    assert isinstance(again, CertifiedEstimator)
    np.testing.assert_array_equal(again.rates(b), estimator.rates(b))
    assert again.verify()
    forged = dict(wire, plan=dict(wire["plan"], noise_multiplier=1.0))  # claims less noise
    assert not estimator_from_dict(forged).verify()
    wire["eps_certified"][-2] = wire["eps_exact"][-2] * 0.5
    with pytest.raises(ValueError, match="certified"):
        estimator_from_dict(wire)


@pytest.mark.slow
def test_both_adversaries_is_the_stricter() -> None:
    b = np.array([0.3, 1.0, 4.0])
    q_both = fit_estimator(PLAN, adversary="both").rates(b)
    q_tp = fit_estimator(PLAN, adversary="third-party").rates(b)
    q_srv = fit_estimator(PLAN, adversary="server").rates(b)
    np.testing.assert_array_equal(q_both, np.minimum(q_tp, q_srv))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"method": "curve"}, "method"), ({"adversary": "eve"}, "adversary")],
)
def test_bad_method_or_adversary(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        calibrate(np.array([1.0]), PLAN, **kwargs)


@pytest.mark.parametrize("bad", [[], [1.0, -1.0], [np.nan], [[1.0]]])
def test_bad_budgets_are_rejected(bad: list) -> None:
    with pytest.raises(ValueError, match="budgets"):
        calibrate(np.asarray(bad, dtype=float), PLAN)


@pytest.mark.slow
def test_pld_certified_calibration_gives_larger_rates_and_matches_the_ledger() -> None:
    # A coarse grid keeps the one-time PLD grid computation small in a unit test.
    from pdpfl.ledger import PrivacyLedger

    plan = TrainingPlan(noise_multiplier=1.5, delta=1e-5, steps=5, rounds=6, client_rate=0.5)
    grid = dict(q_min=1e-3, rel_step=0.3, abs_step=0.1)
    budgets = np.array([0.3, 0.8, 2.0, 5.0])
    rdp = calibrate(budgets, plan, **grid)
    pld = calibrate(budgets, plan, accountant="pld", **grid)
    assert pld.report.accountant == "pld" and pld.report.over_budget == 0
    assert np.all(pld.rates >= rdp.rates) and np.any(pld.rates > rdp.rates)
    # the ledger (PLD, same rates) charged T rounds spends exactly the certified ε
    ledger = PrivacyLedger(budgets, pld.rates, plan, accountant="pld")
    for _ in range(plan.rounds):
        ledger.record_round(participated=np.zeros(4, bool), active=np.ones(4, bool))
    est = pld.estimator
    spent = ledger.spent_epsilon("third-party")
    np.testing.assert_array_equal(spent, est.rates_and_spent(budgets)[1])
    assert np.all(spent <= budgets)
    round_trip = estimator_from_dict(est.to_dict())
    assert round_trip.accountant == "pld"
