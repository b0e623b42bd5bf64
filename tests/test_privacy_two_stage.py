"""rPDP-FL two-stage bound, RDP→(ε, δ) conversion, and the noise-multiplier search."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.privacy import (
    DEFAULT_ORDERS,
    Adversary,
    TrainingPlan,
    find_noise_multiplier,
    plan_epsilon,
    plan_rdp,
    poisson_gaussian_rdp,
    rdp_to_delta,
    rdp_to_epsilon,
    round_rdp,
)

dpa = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")

PLAN = TrainingPlan(noise_multiplier=1.0, delta=1e-4, steps=50, rounds=15, client_rate=0.5)
Q = np.array([0.0, 1e-4, 0.003, 0.02, 0.1, 0.4, 1.0])


def _brute(q, plan, adversary, participations=None):
    return rdp_to_epsilon(plan_rdp(q, plan, adversary, participations), DEFAULT_ORDERS, plan.delta)


@pytest.mark.parametrize(
    "plan",
    [
        PLAN,
        TrainingPlan(noise_multiplier=3.5, delta=1e-3, steps=5, rounds=20, client_rate=0.5),
        TrainingPlan(noise_multiplier=0.6, delta=1e-5, steps=10_000),
        TrainingPlan(noise_multiplier=8.0, delta=1e-6, steps=100, rounds=200, client_rate=0.05),
    ],
)
@pytest.mark.parametrize("adversary", ["third-party", "server"])
def test_plan_epsilon_equals_full_order_minimum(plan, adversary) -> None:
    # The order search skips provably irrelevant orders; without the continuous refinement it
    # must equal the brute-force minimum over the grid, and with it never exceed that minimum
    # while the reported (fractional) order really attains the reported ε.
    q = np.concatenate([Q, np.geomspace(1e-6, 1, 40)])
    eps, order = plan_epsilon(q, plan, adversary, refine=False)
    ref_eps, ref_order = _brute(q, plan, adversary)
    np.testing.assert_allclose(eps, ref_eps, rtol=1e-12, atol=0)
    assert np.all(order == ref_order)
    fine, fine_order = plan_epsilon(q, plan, adversary)
    assert np.all(fine <= ref_eps)
    live = fine > 0
    k = plan.rounds or 1
    at_order = _epsilon_at_order(q[live], plan, adversary, fine_order[live], k)
    np.testing.assert_allclose(fine[live], at_order, rtol=1e-12)


def _epsilon_at_order(q, plan, adversary, alpha, k):
    """ε of the plan at one given (possibly fractional) order per rate, from scratch."""
    from pdpfl.privacy.conversion import epsilon_per_order
    from pdpfl.privacy.rdp import poisson_gaussian_rdp_pairs

    rho = poisson_gaussian_rdp_pairs(q, plan.noise_multiplier, alpha)
    if plan.rounds is None or adversary == "server":
        total = k * (plan.steps * rho)
    else:
        x = (alpha - 1) * plan.steps * rho
        lam = plan.client_rate
        rnd = (
            np.where(
                x < 1,
                np.log1p(lam * np.expm1(np.minimum(x, 1))),
                np.logaddexp(np.log1p(-lam), np.log(lam) + x),
            )
            / (alpha - 1)
            if lam < 1
            else plan.steps * rho
        )
        total = k * rnd
    return epsilon_per_order(total, alpha, plan.delta)


def test_conversion_matches_dp_accounting() -> None:
    rdp = 50 * poisson_gaussian_rdp([1e-3, 0.05, 0.7], 1.1)
    for row in rdp:
        for delta in (1e-3, 1e-6, 0.3):
            eps, order = rdp_to_epsilon(row, DEFAULT_ORDERS, delta)
            ref_eps, ref_order = dpa.compute_epsilon(DEFAULT_ORDERS, row, delta)
            assert eps == pytest.approx(ref_eps, rel=1e-12) and order == ref_order
        for epsilon in (0.1, 1.0, 8.0):
            d, order = rdp_to_delta(row, DEFAULT_ORDERS, epsilon)
            ref_d, ref_order = dpa.compute_delta(DEFAULT_ORDERS, row, epsilon)
            assert d == pytest.approx(ref_d, rel=1e-12) and order == ref_order


def test_lambda_one_is_flat_composition() -> None:
    plan = TrainingPlan(noise_multiplier=1.3, delta=1e-5, steps=7, rounds=11, client_rate=1.0)
    flat = TrainingPlan(noise_multiplier=1.3, delta=1e-5, steps=77)
    np.testing.assert_allclose(plan_rdp(Q, plan), plan_rdp(Q, flat), rtol=1e-13)
    np.testing.assert_allclose(plan_epsilon(Q, plan)[0], plan_epsilon(Q, flat)[0], rtol=1e-12)


def test_round_rdp_is_stable_and_bounded() -> None:
    step = poisson_gaussian_rdp(np.geomspace(1e-8, 1, 30), 0.5)
    r = round_rdp(step, 100, 0.3, DEFAULT_ORDERS)
    assert np.all(np.isfinite(r))
    assert np.all(r <= 100 * step * (1 + 1e-12))  # λ < 1 never hurts
    assert np.all(r >= 0)
    tiny = round_rdp(np.full((1, DEFAULT_ORDERS.size), 1e-300), 1, 0.5, DEFAULT_ORDERS)
    assert np.all(tiny > 0)


@settings(max_examples=25, deadline=None)
@given(
    q=st.floats(1e-4, 0.9),
    sigma=st.floats(0.6, 5.0),
    steps=st.integers(1, 50),
    rounds=st.integers(1, 40),
    lam=st.floats(0.05, 0.95),
)
def test_monotonicity(q, sigma, steps, rounds, lam) -> None:
    """On a fixed order grid ε is monotone in every parameter. The default accountant refines
    the order continuously between grid points; its fractional-order bound is the minimum of
    several upper bounds (series, chord, Taylor) whose winner changes with q and α, so the
    refined value is an upper bound no looser than the grid's, but not exactly monotone (the
    certified calibration takes a running maximum over its grid)."""
    plan = TrainingPlan(sigma, 1e-5, steps, rounds, lam)

    def eps(refine=False, **kw):
        p = TrainingPlan(
            kw.get("sigma", sigma),
            1e-5,
            kw.get("steps", steps),
            kw.get("rounds", rounds),
            kw.get("lam", lam),
        )
        return float(plan_epsilon([kw.get("q", q)], p, refine=refine)[0][0])

    base = eps()
    assert eps(refine=True) <= base
    assert eps(q=min(1.0, q * 1.5)) >= base
    assert eps(steps=steps + 1) >= base
    assert eps(rounds=rounds + 1) >= base
    assert eps(lam=min(1.0, lam * 1.2)) >= base
    assert eps(sigma=sigma * 1.2) <= base
    # Type I (server, k = T) is never below Type II (third party).
    server = float(plan_epsilon([q], plan, Adversary.SERVER, refine=False)[0][0])
    assert server >= base
    both = float(plan_epsilon([q], plan, "both", refine=False)[0][0])
    assert both == max(server, base)


def test_server_participations() -> None:
    e_k, _ = plan_epsilon([0.05, 0.05], PLAN, "server", participations=[3, 15])
    e_t, _ = plan_epsilon([0.05], PLAN, "server")
    assert e_k[0] < e_k[1] == pytest.approx(e_t[0])
    assert plan_epsilon([0.05], PLAN, "server", participations=0)[0][0] == 0.0
    with pytest.raises(ValueError, match="participations"):
        plan_epsilon([0.05], PLAN, "server", participations=16)
    with pytest.raises(ValueError, match="adversary"):
        plan_rdp([0.05], PLAN, "both")
    with pytest.raises(ValueError, match="adversary"):
        plan_epsilon([0.05], PLAN, "eavesdropper")


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"delta": 1.0}, "delta"),
        ({"steps": 0}, "steps"),
        ({"rounds": 0}, "rounds"),
        ({"client_rate": 0.0}, "client_rate"),
        ({"client_rate": float("nan")}, "client_rate"),
    ],
)
def test_plan_validation(kwargs, field) -> None:
    base = {"noise_multiplier": 1.0, "delta": 1e-5, "steps": 1, "rounds": 2, "client_rate": 0.5}
    base.update(kwargs)
    with pytest.raises(ValueError, match=field):
        TrainingPlan(**base)


def test_find_noise_multiplier_meets_target_and_is_minimal() -> None:
    plan = TrainingPlan(noise_multiplier=1.0, delta=1e-5, steps=1000)

    def eps_of(sigma: float) -> float:
        p = TrainingPlan(sigma, plan.delta, plan.steps)
        return float(plan_epsilon([0.01], p)[0][0])

    for target in (0.3, 1.0, 8.0):
        sigma = find_noise_multiplier(target, eps_of, tol=1e-3)
        assert eps_of(sigma) <= target
        assert eps_of(sigma / (1 + 2e-3)) > target
    with pytest.raises(ValueError, match="target_epsilon"):
        find_noise_multiplier(-1.0, eps_of)


@settings(max_examples=15, deadline=None)
@given(
    sigma=st.floats(0.5, 20.0),
    steps=st.integers(1, 200),
    rounds=st.integers(1, 50),
    lam=st.sampled_from([1.0, 0.999, 0.5]),
)
def test_both_observers_is_the_max_of_each_computed_alone(sigma, steps, rounds, lam) -> None:
    # plan_epsilon(both) skips the server's evaluation where it equals the third parties'
    # bit for bit (λ = 1, every round charged): check against each observer computed alone
    plan = TrainingPlan(
        noise_multiplier=sigma, delta=1e-5, steps=steps, rounds=rounds, client_rate=lam
    )
    q = np.concatenate([np.geomspace(1e-6, 0.5, 40), [1.0]])
    e_tp, o_tp = plan_epsilon(q, plan, "third-party")
    e_sv, o_sv = plan_epsilon(q, plan, "server")
    e_both, o_both = plan_epsilon(q, plan, "both")
    assert np.array_equal(e_both, np.maximum(e_tp, e_sv))
    if lam == 1.0:
        assert np.array_equal(e_tp, e_sv) and np.array_equal(o_tp, o_sv)
        assert np.array_equal(o_both, o_sv)
    # with participations the server is charged k ≤ T rounds: computed separately
    e_k, _ = plan_epsilon(q, plan, "both", participations=max(rounds - 1, 0))
    e_sk, _ = plan_epsilon(q, plan, "server", participations=max(rounds - 1, 0))
    assert np.array_equal(e_k, np.maximum(e_tp, e_sk))
