"""Lifetime composition (pdpfl.privacy.lifetime): several runs' charges of one unit composed --
against dp-accounting's RDP and PLD accountants composing the same events, and its laws."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.privacy import SampledGaussianPlan, TrainingPlan
from pdpfl.privacy.accountant import mechanism_epsilon
from pdpfl.privacy.lifetime import LifetimeComposer, RunCharges, compose_epsilon
from pdpfl.privacy.orders import DEFAULT_ORDERS
from pdpfl.privacy.unit import GroupPlan

dpa = pytest.importorskip("dp_accounting")

#: Two different record-level mechanisms (λ = 1: τ Poisson-sampled Gaussian steps per round).
RUN_A = TrainingPlan(noise_multiplier=2.5, delta=1e-3, steps=6, rounds=3, client_rate=1.0)
RUN_B = TrainingPlan(noise_multiplier=1.4, delta=1e-3, steps=4, rounds=2, client_rate=1.0)


def _dp_accounting(events: list[tuple[float, float, int]], orders) -> float:
    """dp-accounting's RDP accountant composing (q, σ, steps) Poisson-sampled Gaussians."""
    acc = dpa.rdp.RdpAccountant(orders=[float(o) for o in orders])
    for q, sigma, steps in events:
        if steps:
            event = dpa.PoissonSampledDpEvent(float(q), dpa.GaussianDpEvent(float(sigma)))
            acc.compose(event, int(steps))
    return float(acc.get_epsilon(1e-3))


def _parts(qa, ka, qb, kb, accountant="rdp"):
    n = len(qa)
    return [
        RunCharges(RUN_A, qa, np.full(n, 2.5), ka, accountant),
        RunCharges(RUN_B, qb, np.full(n, 1.4), kb, accountant),
    ]


def test_two_runs_compose_as_dp_accountings_rdp_accountant() -> None:
    qa, ka = np.array([0.02, 0.15, 0.6, 0.3]), np.array([3, 3, 3, 1])
    qb, kb = np.array([0.05, 0.05, 0.2, 0.0]), np.array([2, 1, 2, 0])
    orders = DEFAULT_ORDERS[DEFAULT_ORDERS == np.floor(DEFAULT_ORDERS)]  # exact in both libraries
    ours = compose_epsilon(_parts(qa, ka, qb, kb), "third-party", 1e-3, orders=orders)
    for i in range(4):
        ref = _dp_accounting([(qa[i], 2.5, 6 * ka[i]), (qb[i], 1.4, 4 * kb[i])], orders)
        assert ours[i] == pytest.approx(ref, rel=1e-9)
    # pdpfl's default grid adds fractional orders: never looser than the integer one
    default = compose_epsilon(_parts(qa, ka, qb, kb), "third-party", 1e-3)
    assert np.all(default <= ours * (1 + 1e-12))


def test_the_pld_composition_is_tighter_and_agrees_with_dp_accountings_pld() -> None:
    qa, ka, qb, kb = np.array([0.15]), np.array([3]), np.array([0.05]), np.array([2])
    rdp = compose_epsilon(_parts(qa, ka, qb, kb), "third-party", 1e-3)[0]
    pld = compose_epsilon(_parts(qa, ka, qb, kb, "pld"), "third-party", 1e-3)[0]
    acc = dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dpa.PoissonSampledDpEvent(0.15, dpa.GaussianDpEvent(2.5)), 18)
    acc.compose(dpa.PoissonSampledDpEvent(0.05, dpa.GaussianDpEvent(1.4)), 8)
    ref = float(acc.get_epsilon(1e-3))
    assert pld < rdp  # composed as PLDs, not as RDP curves
    assert ref * (1 - 2e-2) <= pld <= ref * 1.05  # both pessimistic, different intervals


def test_a_unit_one_run_charged_has_that_runs_epsilon() -> None:
    q, k = np.array([0.1, 0.4]), np.array([3, 2])
    part = RunCharges(RUN_A, q, np.full(2, 2.5), k)
    own, _ = mechanism_epsilon(RUN_A, q, "third-party", k)
    grid = compose_epsilon([part], "third-party", 1e-3)
    assert np.all(grid >= own * (1 - 1e-12))  # the grid bound; the ledger uses its own ε
    assert np.allclose(grid, own, rtol=2e-2)


def test_group_runs_compose_their_inner_curves_then_convert_once() -> None:
    plan = GroupPlan(2.0, 3, 1e-5, 4, group_size=3, conversion="rdp")
    part = RunCharges(plan, np.full(1, 0.1), np.full(1, 2.0), np.array([4]))
    twice = compose_epsilon([part, part], "third-party", 1e-5)[0]
    once_8, _ = mechanism_epsilon(plan, np.array([0.1]), "third-party", np.array([8]))
    assert twice == pytest.approx(float(once_8[0]), rel=1e-2)
    assert twice >= float(once_8[0]) * (1 - 1e-9)


def test_a_group_run_and_a_gaussian_run_fall_back_to_basic_composition() -> None:
    group = GroupPlan(2.0, 3, 1e-5, 4, group_size=3, conversion="rdp")
    user = SampledGaussianPlan("user", 3.0, 1e-5, 4, ("third-party", "server"))
    parts = [
        RunCharges(group, np.array([0.1]), np.array([2.0]), np.array([4])),
        RunCharges(user, np.array([1.0]), np.array([3.0]), np.array([4])),
    ]
    eps = compose_epsilon(parts, "third-party", 1e-5)[0]
    half = [
        float(mechanism_epsilon(p.mechanism.__class__(**{**vars(p.mechanism), "delta": 5e-6}),
                                p.rates, "third-party", p.counts)[0][0])
        for p in parts
    ]  # fmt: skip
    assert eps == pytest.approx(sum(half), rel=1e-9)  # each run at δ/2, summed


@settings(max_examples=12, deadline=None)
@given(
    qa=st.floats(0.001, 1.0),
    qb=st.floats(0.001, 1.0),
    ka=st.integers(0, 4),
    kb=st.integers(0, 4),
)
def test_composition_laws(qa: float, qb: float, ka: int, kb: int) -> None:
    """Symmetric in the runs, at least every run alone, at most the sum of the runs' RDP-grid ε
    at δ/2 (basic composition), monotone in each count."""
    parts = _parts(np.array([qa]), np.array([ka]), np.array([qb]), np.array([kb]))
    comp = LifetimeComposer("third-party", 1e-3, orders=DEFAULT_ORDERS)
    e = comp.epsilon(parts)[0]
    assert comp.epsilon(parts[::-1])[0] == pytest.approx(e, rel=1e-12)
    alone = [compose_epsilon([p], "third-party", 1e-3, orders=DEFAULT_ORDERS)[0] for p in parts]
    assert e >= max(alone) * (1 - 1e-12)
    if ka and kb:
        more = _parts(np.array([qa]), np.array([ka + 1]), np.array([qb]), np.array([kb]))
        assert comp.epsilon(more)[0] >= e
        assert math.isfinite(e)
    if not (ka or kb):
        assert e == 0.0
