"""Mechanisms as data and the RdpAccountant that interprets them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.privacy import (
    DEFAULT_ORDERS,
    TrainingPlan,
    plan_epsilon,
    plan_rdp,
    poisson_gaussian_rdp,
    rdp_to_epsilon,
)
from pdpfl.privacy.accountant import RdpAccountant
from pdpfl.privacy.mechanisms import (
    Composed,
    GaussianMechanism,
    PoissonSampled,
    Sequence,
    TwoStageRound,
    plan_event,
)

dpa = pytest.importorskip("dp_accounting")
dpa_rdp = pytest.importorskip("dp_accounting.rdp")

ACC = RdpAccountant()
Q = np.concatenate([[0.0, 1e-4, 0.003, 0.02, 0.1, 0.4, 1.0], np.geomspace(1e-6, 1, 15)])
PLANS = [
    TrainingPlan(noise_multiplier=1.0, delta=1e-4, steps=50, rounds=15, client_rate=0.5),
    TrainingPlan(noise_multiplier=3.5, delta=1e-3, steps=5, rounds=20, client_rate=0.5),
    TrainingPlan(noise_multiplier=0.6, delta=1e-5, steps=2000),
    TrainingPlan(noise_multiplier=8.0, delta=1e-6, steps=100, rounds=200, client_rate=0.05),
]


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("adversary", ["third-party", "server"])
def test_accountant_on_plan_event_equals_plan_epsilon_exactly(plan, adversary) -> None:
    event = plan_event(Q, plan, adversary)
    eps, order = ACC.epsilon(event, plan.delta)
    ref_eps, ref_order = plan_epsilon(Q, plan, adversary)
    np.testing.assert_array_equal(eps, ref_eps)
    np.testing.assert_array_equal(order, ref_order)
    np.testing.assert_array_equal(ACC.rdp(event), plan_rdp(Q, plan, adversary))


def test_server_participations_and_both() -> None:
    plan = PLANS[0]
    ev = plan_event(Q, plan, "server", participations=4)
    assert ev == Composed(Composed(PoissonSampled(Q, GaussianMechanism(1.0)), plan.steps), 4)
    ref, _ = plan_epsilon(Q, plan, "server", participations=4)
    np.testing.assert_array_equal(ACC.epsilon(ev, plan.delta)[0], ref)
    with pytest.raises(ValueError, match="adversary"):
        plan_event(Q, plan, "both")
    with pytest.raises(ValueError, match="participations"):
        plan_event(Q, plan, "server", participations=plan.rounds + 1)
    with pytest.raises(ValueError, match="participations"):
        plan_event(Q, PLANS[2], "server", participations=1)


def test_rate_array_evaluates_every_record_at_once() -> None:
    event = Composed(PoissonSampled(Q, GaussianMechanism(1.2)), 30)
    rdp = ACC.rdp(event)
    assert rdp.shape == (Q.size, DEFAULT_ORDERS.size)
    eps, order = ACC.epsilon(event, 1e-5)
    assert eps.shape == order.shape == (Q.size,)
    for i in (0, 3, 9, Q.size - 1):
        single = Composed(PoissonSampled(float(Q[i]), GaussianMechanism(1.2)), 30)
        # Batched vs single evaluation may differ in the last bits (BLAS summation order).
        np.testing.assert_allclose(ACC.rdp(single)[0], rdp[i], rtol=1e-13)
        assert ACC.epsilon(single, 1e-5)[0][0] == pytest.approx(eps[i], rel=1e-13)
    assert np.all(np.diff(eps[7:]) >= 0)  # geomspace part: ε grows with q


@settings(max_examples=25)
@given(
    q=st.floats(1e-5, 1.0),
    sigma=st.floats(0.5, 5.0),
    count=st.integers(1, 500),
)
def test_matches_dp_accounting_rdp(q, sigma, count) -> None:
    orders = [2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0]
    ref = dpa_rdp.RdpAccountant(orders)
    ref.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), count)
    acc = RdpAccountant(orders, refine=False)
    ev = Composed(PoissonSampled(q, GaussianMechanism(sigma)), count)
    eps, _ = acc.epsilon(ev, 1e-5)
    assert eps[0] == pytest.approx(ref.get_epsilon(1e-5), rel=1e-9)
    # the continuous refinement only ever lowers it
    assert RdpAccountant(orders).epsilon(ev, 1e-5)[0][0] <= eps[0]


def test_gaussian_alone_and_full_rate_agree() -> None:
    a = ACC.rdp(GaussianMechanism(2.0))
    np.testing.assert_allclose(a, ACC.rdp(PoissonSampled(1.0, GaussianMechanism(2.0))))
    np.testing.assert_allclose(a[0], DEFAULT_ORDERS / 8.0)
    e1, _ = RdpAccountant(refine=False).epsilon(Composed(GaussianMechanism(2.0), 10), 1e-5)
    e2, _ = rdp_to_epsilon(10 * a, DEFAULT_ORDERS, 1e-5)
    np.testing.assert_allclose(e1, e2, rtol=1e-12)


def test_two_stage_round_general_local_and_sequence() -> None:
    step = PoissonSampled(Q, GaussianMechanism(1.0))
    fast = ACC.rdp(TwoStageRound(0.3, Composed(step, 7)))
    general = ACC.rdp(TwoStageRound(0.3, Sequence([step] * 7)))
    np.testing.assert_allclose(general, fast, rtol=1e-12, atol=1e-300)
    # λ = 1: no amplification; λ < 1 never hurts.
    np.testing.assert_array_equal(ACC.rdp(TwoStageRound(1.0, Composed(step, 7))), 7 * ACC.rdp(step))
    assert np.all(fast <= 7 * ACC.rdp(step) * (1 + 1e-12))
    # Sequence of different mechanisms adds RDP; Gaussian rows broadcast over rates.
    seq = Sequence([Composed(step, 3), GaussianMechanism(5.0)])
    np.testing.assert_allclose(ACC.rdp(seq), 3 * ACC.rdp(step) + DEFAULT_ORDERS / 50.0)
    eps, _ = ACC.epsilon(seq, 1e-5)
    np.testing.assert_array_equal(eps, rdp_to_epsilon(ACC.rdp(seq), DEFAULT_ORDERS, 1e-5)[0])
    # Nested compositions multiply their counts.
    np.testing.assert_allclose(
        ACC.rdp(Composed(Composed(step, 4), 5)), ACC.rdp(Composed(step, 20)), rtol=1e-15
    )
    with pytest.raises(ValueError, match="different lengths"):
        ACC.rdp(Sequence([step, PoissonSampled([0.1, 0.2], GaussianMechanism(1.0))]))


def test_unsupported_structure_is_a_clear_value_error() -> None:
    ev = PoissonSampled(0.1, Composed(GaussianMechanism(1.0), 3))
    with pytest.raises(ValueError, match=r"cannot interpret PoissonSampled\(Composed\(\.\.\.\)\)"):
        ACC.rdp(ev)
    with pytest.raises(ValueError, match="cannot interpret"):
        ACC.epsilon(Composed(ev, 2), 1e-5)
    with pytest.raises(ValueError, match="event"):
        ACC.rdp("gaussian")  # type: ignore[arg-type]


def test_events_are_values() -> None:
    a = PoissonSampled(np.array([0.1, 0.2]), GaussianMechanism(1.0))
    b = PoissonSampled([0.1, 0.2], GaussianMechanism(1))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != PoissonSampled([0.1, 0.3], GaussianMechanism(1.0))
    assert PoissonSampled(0.1, GaussianMechanism(1.0)) != PoissonSampled(
        [0.1], GaussianMechanism(1.0)
    )
    with pytest.raises(ValueError):
        a.rate[0] = 0.5  # read-only copy
    src = np.array([0.1, 0.2])
    c = PoissonSampled(src, GaussianMechanism(1.0))
    src[0] = 0.9
    assert c.rate[0] == 0.1


G = GaussianMechanism(1.0)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: GaussianMechanism(0.0), "noise_multiplier"),
        (lambda: GaussianMechanism(float("nan")), "noise_multiplier"),
        (lambda: GaussianMechanism("x"), "noise_multiplier"),
        (lambda: PoissonSampled(1.5, G), "rate"),
        (lambda: PoissonSampled([0.1, -0.1], G), "rate"),
        (lambda: PoissonSampled(np.ones((2, 2)) / 2, G), "rate"),
        (lambda: PoissonSampled(0.1, "gauss"), "inner"),
        (lambda: Composed(G, -1), "count"),
        (lambda: Composed(G, 2.5), "count"),
        (lambda: Composed(G, True), "count"),
        (lambda: Composed(3, 2), "inner"),
        (lambda: TwoStageRound(0.0, G), "client_rate"),
        (lambda: TwoStageRound(1.5, G), "client_rate"),
        (lambda: TwoStageRound(0.5, None), "local"),
        (lambda: Sequence([]), "events"),
        (lambda: Sequence([G, 1]), r"events\[1\]"),
        (lambda: RdpAccountant([0.5, 2.0]), "orders"),
    ],
)
def test_bad_fields_raise_naming_the_field(make, field) -> None:
    with pytest.raises(ValueError, match=field):
        make()


def test_accountant_delta_and_custom_orders() -> None:
    acc = RdpAccountant([2.0, 4.0, 8.0, 16.0], refine=False)
    ev = Composed(PoissonSampled([0.01, 0.1], GaussianMechanism(1.0)), 100)
    d, order = acc.delta(ev, 1.0)
    assert d.shape == (2,) and d[0] < d[1] and set(order) <= {2.0, 4.0, 8.0, 16.0}
    eps, _ = acc.epsilon(ev, 1e-5)
    rdp = 100 * poisson_gaussian_rdp([0.01, 0.1], 1.0, acc.orders)
    np.testing.assert_array_equal(eps, rdp_to_epsilon(rdp, acc.orders, 1e-5)[0])
