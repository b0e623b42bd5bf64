"""SCF (rPDP-FL Alg. 2), BinarySearch (Boenisch et al.), and the σ choices (a), (b), (c)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from pdpfl.budgets import BoundedMixGauss
from pdpfl.calibration import (
    BinarySearchEstimator,
    CertifiedEstimator,
    SCFEstimator,
    calibrate,
    estimator_from_dict,
    group_sampling_rates,
    noise_for_max_budget,
    noise_for_uniform_rate,
)
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.two_stage import plan_epsilon

#: The rPDP-FL tutorial setting of the issue.
TUTORIAL = TrainingPlan(noise_multiplier=3.508, delta=1e-3, steps=5, rounds=20, client_rate=0.5)


def eps(q, plan, adversary="third-party") -> np.ndarray:
    return np.asarray(plan_epsilon(np.atleast_1d(np.asarray(q, float)), plan, adversary)[0])


@pytest.fixture(scope="module")
def scf() -> SCFEstimator:
    return SCFEstimator.fit(TUTORIAL)


def test_scf_reproduces_the_tutorial_rate(scf: SCFEstimator) -> None:
    assert scf.rates(np.array([1.0]))[0] == pytest.approx(0.150, abs=0.005)
    assert scf.r2 > 0.99
    assert scf.rates(np.array([scf.eps_at_one, 1e3]))[0] == 1.0


def test_scf_overspends_and_the_report_counts_it(scf: SCFEstimator) -> None:
    b = BoundedMixGauss().sample(400, np.random.default_rng(0))
    res = calibrate(b, TUTORIAL, method="scf")
    over = int(np.sum(eps(res.rates, TUTORIAL) > b))
    assert res.report.over_budget == over
    assert over > 0  # the fit is never checked against the exact bound
    assert res.report.details["r2"] == scf.r2
    cert = calibrate(b, TUTORIAL, allow_exclusion=True)
    assert cert.report.over_budget == 0


def test_scf_json_round_trip(scf: SCFEstimator) -> None:
    again = estimator_from_dict(json.loads(json.dumps(scf.to_dict())))
    b = np.linspace(0.1, 10, 50)
    np.testing.assert_array_equal(again.rates(b), scf.rates(b))


@pytest.mark.slow
def test_binary_search_agrees_with_certified_within_tolerance() -> None:
    plan = dataclasses.replace(TUTORIAL, rounds=10, client_rate=0.8)
    b = np.array([0.2, 0.5, 0.5, 1.0, 2.5, 7.0, 50.0])
    cert = CertifiedEstimator.fit(plan)
    bs = BinarySearchEstimator.fit(plan, q_tol=1e-6)
    q_c, q_b = cert.rates(b), bs.rates(b)
    assert np.all(eps(q_b[q_b > 0], plan) <= b[q_b > 0])  # feasible end of the bracket
    # Both are below the optimum q*: certified by < one grid gap, bisection by < q_tol.
    assert np.all(np.abs(q_b - q_c) <= cert.resolution(q_c) + 1e-6)
    res = calibrate(b, plan, method="binary-search")
    assert res.report.over_budget == 0 and res.report.distinct_budgets == 6
    again = estimator_from_dict(json.loads(json.dumps(bs.to_dict())))
    np.testing.assert_array_equal(again.rates(b), q_b)


@pytest.mark.parametrize("adversary", ["third-party", "server"])
def test_noise_for_max_budget_is_tight(adversary: str) -> None:
    sigma = noise_for_max_budget(10.0, TUTORIAL, adversary)
    plan = dataclasses.replace(TUTORIAL, noise_multiplier=sigma)
    assert eps(1.0, plan, adversary)[0] <= 10.0
    looser = dataclasses.replace(TUTORIAL, noise_multiplier=sigma * 0.99)
    assert eps(1.0, looser, adversary)[0] > 10.0


def test_noise_for_uniform_rate_is_tight() -> None:
    sigma = noise_for_uniform_rate(1.0, 0.1, TUTORIAL)
    assert eps(0.1, dataclasses.replace(TUTORIAL, noise_multiplier=sigma))[0] <= 1.0
    assert eps(0.1, dataclasses.replace(TUTORIAL, noise_multiplier=sigma * 0.99))[0] > 1.0
    with pytest.raises(ValueError, match="rate"):
        noise_for_uniform_rate(1.0, 1.5, TUTORIAL)


@pytest.mark.slow
def test_group_sampling_rates_idp_fedavg_algorithm_1() -> None:
    # Client-level: 100 clients, c = 10 per round, 50 rounds, ε 1-2-3, 54/37/9 %.
    template = TrainingPlan(noise_multiplier=1.0, delta=1e-5, steps=50, rounds=None)
    budgets, sizes = np.array([1.0, 2.0, 3.0]), np.array([54, 37, 9])
    sigma, rates = group_sampling_rates(budgets, sizes, 0.1, template, rate_tol=1e-3)
    plan = dataclasses.replace(template, noise_multiplier=sigma)
    assert np.all(eps(rates, plan) <= budgets)
    mean = float(sizes @ rates / sizes.sum())
    assert 0.1 * (1 - 1e-3) <= mean <= 0.1
    assert rates[0] < 0.1 < rates[2] and np.all(np.diff(rates) > 0)
    assert sigma < noise_for_uniform_rate(1.0, 0.1, template)  # σ was lowered
