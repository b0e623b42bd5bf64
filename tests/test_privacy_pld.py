"""PLD accountant for the rPDP-FL two-stage mechanism: against dp-accounting, RDP, Monte Carlo."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.privacy import TrainingPlan, make_accountant, plan_epsilon
from pdpfl.privacy.mechanisms import (
    Composed,
    GaussianMechanism,
    PoissonSampled,
    Sequence,
    TwoStageRound,
)
from pdpfl.privacy.unit import PrivacyUnit, SampledGaussianPlan

dpa = pytest.importorskip("dp_accounting")
pld_acc = pytest.importorskip("dp_accounting.pld.pld_privacy_accountant")

from pdpfl.privacy.pld import PldAccountant, rate_grid_up  # noqa: E402

EXACT = PldAccountant(rate_grid_rel_step=0)  # one PLD per exact rate (no rounding up)


def _pld(plan: TrainingPlan, q: float, observer: str = "third-party", k: int | None = None):
    ev = plan.round_event([q], observer)
    return float(EXACT.pld_epsilon(ev, plan.rounds if k is None else k, plan.delta)[0][0])


def test_lambda_one_equals_dp_accounting_flat_composition() -> None:
    plan = TrainingPlan(noise_multiplier=1.0, delta=1e-4, steps=10, rounds=6, client_rate=1.0)
    for q in (0.01, 0.2):
        ev = plan.round_event([q], "third-party")
        eps, interval = EXACT.pld_epsilon(ev, plan.rounds, plan.delta)
        ref = pld_acc.PLDAccountant(value_discretization_interval=float(interval[0]))
        ref.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(1.0)), 60)
        # same PLD; ours is evaluated at δ − η (η: FFT float-error slack), so at most a hair
        # above, and never below
        assert ref.get_epsilon(plan.delta) <= eps[0] <= ref.get_epsilon(plan.delta * (1 - 1e-3))


def test_server_view_is_k_tau_steps_without_lambda() -> None:
    plan = TrainingPlan(noise_multiplier=1.5, delta=1e-5, steps=5, rounds=8, client_rate=0.3)
    flat = TrainingPlan(noise_multiplier=1.5, delta=1e-5, steps=5, rounds=8, client_rate=1.0)
    assert _pld(plan, 0.1, "server", 3) == _pld(flat, 0.1, "third-party", 3)
    assert _pld(plan, 0.1, "server", 3) > _pld(plan, 0.1, "third-party", 3)


def _loss_samples(q, sigma, tau, rounds, lam, n, rng, direction):
    """Privacy-loss samples of the revealed-participation two-stage mechanism (both directions)."""
    total = np.zeros(n)
    for _ in range(rounds):
        part = rng.random(n) < lam
        for _ in range(tau):
            z = rng.standard_normal(n) * sigma
            if direction == "remove":  # o ~ (1-q)N(0,σ²) + qN(1,σ²), loss log(P/Q)
                z = z + (rng.random(n) < q)
                loss = np.log1p(q * np.expm1((2 * z - 1) / (2 * sigma**2)))
            else:  # o ~ N(0, σ²), loss log(Q/P) with the roles swapped
                loss = -np.log1p(q * np.expm1((2 * z - 1) / (2 * sigma**2)))
            total += np.where(part, loss, 0.0)
    return total


@pytest.mark.slow
def test_monte_carlo_small_case() -> None:
    q, sigma, tau, rounds, lam, delta = 0.3, 1.5, 3, 4, 0.5, 1e-2
    plan = TrainingPlan(
        noise_multiplier=sigma, delta=delta, steps=tau, rounds=rounds, client_rate=lam
    )
    eps = _pld(plan, q)
    rng = np.random.default_rng(0)
    n = 200_000
    worst_at_eps, worst_below = 0.0, 0.0
    for direction in ("remove", "add"):
        loss = _loss_samples(q, sigma, tau, rounds, lam, n, rng, direction)
        hs = np.maximum(0.0, -np.expm1(eps - loss))
        est, se = hs.mean(), hs.std() / math.sqrt(n)
        # the PLD ε is an upper bound: the Monte-Carlo δ at it is ≤ δ within its 4-σ interval
        assert est <= delta + 4 * se, (direction, est, se)
        worst_at_eps = max(worst_at_eps, est)
        below = np.maximum(0.0, -np.expm1(0.9 * eps - loss)).mean()
        worst_below = max(worst_below, below)
    # and it is tight: at 0.9·ε the hockey-stick divergence is already above δ
    assert worst_below > delta
    assert worst_at_eps > 0.8 * delta


@settings(max_examples=6, deadline=None)
@given(
    q=st.floats(0.01, 1.0),
    sigma=st.floats(0.8, 4.0),
    tau=st.integers(1, 8),
    rounds=st.integers(1, 8),
    lam=st.floats(0.05, 1.0),
    delta=st.sampled_from([1e-7, 1e-5, 1e-3]),
)
def test_pld_never_above_rdp(q, sigma, tau, rounds, lam, delta) -> None:
    plan = TrainingPlan(
        noise_multiplier=sigma, delta=delta, steps=tau, rounds=rounds, client_rate=lam
    )
    rdp = plan_epsilon([q], plan)[0][0]
    pld = _pld(plan, q)
    assert pld <= rdp * (1 + 1e-9) + 1e-9
    # the reported value is the smaller of the two bounds
    rep = plan_epsilon([q], plan, accountant="pld", rate_grid_rel_step=0)[0][0]
    assert rep == min(rdp, pld)


def test_monotone_in_q_rounds_and_lambda() -> None:
    base = dict(noise_multiplier=1.2, delta=1e-5, steps=4)
    plan = TrainingPlan(rounds=6, client_rate=0.5, **base)
    by_q = [_pld(plan, q) for q in (0.02, 0.05, 0.2)]
    by_t = [_pld(TrainingPlan(rounds=t, client_rate=0.5, **base), 0.05) for t in (2, 6, 12)]
    by_l = [_pld(TrainingPlan(rounds=6, client_rate=lam, **base), 0.05) for lam in (0.2, 0.5, 1.0)]
    for seq in (by_q, by_t, by_l):
        assert all(a < b for a, b in zip(seq, seq[1:], strict=False)), seq


def test_rate_grid_rounds_up_and_bounds_the_exact_rate() -> None:
    q = np.array([0.0, 1e-7, 0.0123, 0.5, 1.0])
    up = rate_grid_up(q, 0.01, 1e-5)
    assert np.all(up >= q) and up[0] == 0.0 and up[-1] == 1.0 and up[1] == 1e-5
    assert np.all(up[2:4] <= q[2:4] * 1.01 * (1 + 1e-12))
    plan = TrainingPlan(noise_multiplier=1.0, delta=1e-5, steps=5, rounds=5, client_rate=0.5)
    grid = PldAccountant(rate_grid_rel_step=0.05, rate_grid_min=1e-5)
    ev = plan.round_event([0.0123], "third-party")
    rounded = grid.pld_epsilon(ev, 5, plan.delta)[0][0]
    assert rounded >= _pld(plan, 0.0123)
    assert rounded == _pld(plan, float(rate_grid_up([0.0123], 0.05, 1e-5)[0]))


def test_registry_and_supports() -> None:
    pld = make_accountant("pld")
    rdp = make_accountant("rdp")
    assert make_accountant("pld") is pld and pld.name == "pld" and rdp.name == "rdp"
    step = PoissonSampled([0.1, 0.2], GaussianMechanism(1.0))
    ok = Composed(TwoStageRound(0.5, Composed(step, 3)), 4)
    assert pld.supports(ok) and rdp.supports(ok)
    assert not pld.supports(Sequence([step, step]))
    assert rdp.supports(Sequence([step, step]))
    bad = PoissonSampled(0.1, Composed(GaussianMechanism(1.0), 2))
    assert not pld.supports(bad) and not rdp.supports(bad)
    with pytest.raises(ValueError, match="PldAccountant cannot interpret"):
        pld.epsilon(bad, 1e-5)
    with pytest.raises(ValueError, match="accountant"):
        make_accountant("moments")


def test_client_level_unit_mechanism_through_the_same_path() -> None:
    mech = SampledGaussianPlan(PrivacyUnit.CLIENT, 1.1, 1e-5, 20)
    from pdpfl.privacy import mechanism_epsilon

    e_rdp, _ = mechanism_epsilon(mech, [0.05, 0.3], "third-party")
    e_pld, _ = mechanism_epsilon(mech, [0.05, 0.3], "third-party", accountant="pld")
    ref = pld_acc.PLDAccountant(value_discretization_interval=1e-3)
    ref.compose(dpa.PoissonSampledDpEvent(0.3, dpa.GaussianDpEvent(1.1)), 20)
    assert np.all(e_pld <= e_rdp) and e_pld[1] >= ref.get_epsilon(1e-5) * (1 - 1e-3)
    with pytest.raises(ValueError, match="server"):
        mechanism_epsilon(mech, [0.05], "server")
