"""Every algorithm's mechanism as data, interpreted by the accountant registry.

* PriFedSync's record-level :class:`LocalStepsPlan`: its rigorous ε is checked against
  dp-accounting's without-replacement RDP (Theorem 27, tighter) and the explicit-pair numerical
  lower bound (that it reproduces the first release's ``ClientMechanism`` numbers is checked in
  ``tests/test_prifedsync_ledger.py``);
* ULDP-FL's GROUP-k as a :class:`GroupPrivacy` event reproduces ``fl.uldp.group_epsilon``;
* the registry: ``supports``, ``approximate``, ``with_noise``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdpfl.privacy import (
    Composed,
    GaussianMechanism,
    GroupPlan,
    GroupPrivacy,
    LocalStepsPlan,
    PoissonSampled,
    SampledGaussianPlan,
    SampledWithoutReplacement,
    Sequence,
    TrainingPlan,
    TwoStageRound,
    UnitMechanism,
    UnsupportedEventError,
    make_accountant,
    mechanism_epsilon,
)
from pdpfl.privacy.accountant import RdpAccountant
from pdpfl.privacy.gdp_clt import GdpCltAccountant
from pdpfl.privacy.group import group_epsilon_dp, group_epsilon_from_rdp
from pdpfl.privacy.rdp import poisson_gaussian_rdp
from pdpfl.privacy.wor import wor_gaussian_epsilon_lower_bound


def test_every_observer_is_charged_per_participation() -> None:
    plan = LocalStepsPlan("wor", 1.0, 38, 1e-5, 93)
    assert plan.observers == ("third-party", "server")
    assert plan.charged_on("third-party") == plan.charged_on("server") == "participated"
    a = mechanism_epsilon(plan, [16 / 600], "third-party", 5)[0]
    b = mechanism_epsilon(plan, [16 / 600], "server", 5)[0]
    assert a == b and a[0] > 0
    assert mechanism_epsilon(plan, [16 / 600], "server", 0)[0][0] == 0.0


def test_rigorous_wor_against_dp_accounting_and_the_numerical_lower_bound() -> None:
    dpa = pytest.importorskip("dp_accounting")
    rdp_mod = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")
    n, b, sigma, k, rounds = 600, 16, 1.0, 38, 20
    orders = np.arange(2.0, 41.0)
    plan = LocalStepsPlan("wor", sigma, k, 1e-5, rounds)
    ours, _ = mechanism_epsilon(plan, [b / n], "third-party", rounds, orders=orders)
    # dp-accounting's Theorem 27 is the tighter Gaussian-specific bound: ours >= theirs, close
    acc = rdp_mod.RdpAccountant(list(orders), dpa.NeighboringRelation.REPLACE_ONE)
    event = dpa.SampledWithoutReplacementDpEvent(n, b, dpa.GaussianDpEvent(sigma / 2))
    acc.compose(event, k * rounds)
    ref = acc.get_epsilon(1e-5)
    assert ref * (1 - 1e-9) <= ours[0] <= ref * 1.01
    # an independent numerical computation: the explicit-pair lower bound of the true ε
    few = LocalStepsPlan("wor", 2.0, 10, 1e-5, 1)
    upper = mechanism_epsilon(few, [0.1], "third-party", 1)[0][0]
    lower = wor_gaussian_epsilon_lower_bound(0.1, 1.0, 10, 1e-5, cells=60_000)
    assert 0 < lower <= upper


def test_gdp_clt_declares_itself_approximate_and_rdp_pld_do_not() -> None:
    assert make_accountant("gdp-clt").approximate is True
    assert make_accountant("rdp").approximate is False
    assert make_accountant("pld").approximate is False
    # Bu et al.'s Poisson CLT through the same event as the rigorous accountant
    plan = LocalStepsPlan("poisson", 1.0, 10, 1e-5, 50)
    _, mu = mechanism_epsilon(plan, [0.05, 0.2], "server", accountant="gdp-clt")
    np.testing.assert_allclose(mu, np.array([0.05, 0.2]) * math.sqrt(500 * math.expm1(1.0)))


def test_unsupported_events_raise_a_named_error() -> None:
    wor = LocalStepsPlan("wor", 1.0, 5, 1e-5, 3)
    with pytest.raises(UnsupportedEventError, match="pld cannot interpret"):
        mechanism_epsilon(wor, [0.1], "third-party", accountant="pld")
    two_stage = TrainingPlan(1.0, 1e-5, 5, 3, client_rate=0.5)
    with pytest.raises(UnsupportedEventError, match="gdp-clt cannot interpret"):
        mechanism_epsilon(two_stage, [0.1], "third-party", accountant="gdp-clt")
    clt = GdpCltAccountant()
    step = PoissonSampled(0.1, GaussianMechanism(1.0))
    assert clt.supports(Sequence((step, SampledWithoutReplacement(0.2, GaussianMechanism(1.0)))))
    assert not clt.supports(TwoStageRound(0.5, step))
    assert not clt.supports(GroupPrivacy(step, 2))
    rdp = RdpAccountant()
    assert rdp.supports(GroupPrivacy(Composed(step, 3), 4))
    assert rdp.supports(Composed(GroupPrivacy(step, 4), 3))
    assert not rdp.supports(Sequence((GroupPrivacy(step, 2), step)))
    assert not rdp.supports(SampledWithoutReplacement(0.1, Composed(GaussianMechanism(1.0), 2)))


def test_with_noise_is_part_of_every_unit_mechanism() -> None:
    plans: list[UnitMechanism] = [
        TrainingPlan(1.0, 1e-5, 5, 10, 0.5),
        SampledGaussianPlan("client", 1.0, 1e-5, 10),  # type: ignore[arg-type]
        LocalStepsPlan("wor", 1.0, 5, 1e-5, 10),
        GroupPlan(1.0, 5, 1e-5, 10, group_size=4),
    ]
    for plan in plans:
        assert isinstance(plan, UnitMechanism)
        louder = plan.with_noise(2.0)
        assert type(louder) is type(plan) and louder.noise_multiplier == 2.0  # type: ignore[attr-defined]
        obs = plan.observers[0]
        quiet, _ = mechanism_epsilon(plan, [0.1], obs)
        loud, _ = mechanism_epsilon(louder, [0.1], obs)
        assert loud[0] < quiet[0]


# ------------------------------------------------------------------------- group privacy

SIGMA, Q, STEPS, DELTA = 5.0, 0.01, 2_000, 1e-5


def _event(k: int, route: str = "best") -> GroupPrivacy:
    step = PoissonSampled(Q, GaussianMechanism(SIGMA))
    return GroupPrivacy(Composed(step, STEPS), k, route)  # type: ignore[arg-type]


@pytest.mark.parametrize("k", [1, 3, 4, 9, 20])
def test_group_event_reproduces_uldp_group_epsilon(k: int) -> None:
    from pdpfl.fl.uldp import ORDERS, group_epsilon, group_orders

    def rdp_fn(orders: np.ndarray) -> np.ndarray:
        return STEPS * np.asarray(poisson_gaussian_rdp(np.array([Q]), SIGMA, orders))

    old = group_epsilon(rdp_fn, DELTA, k, "best")
    by_rdp = RdpAccountant(group_orders(k)).epsilon(_event(k, "rdp"), DELTA)[0][0]
    by_dp = RdpAccountant(ORDERS).epsilon(_event(k, "dp"), DELTA)[0][0]
    assert by_rdp == old["rdp"] and by_dp == old["dp"]
    best = RdpAccountant(group_orders(k)).epsilon(_event(k, "best"), DELTA)[0][0]
    assert best <= min(old["rdp"], old["dp"])  # a superset of orders can only help
    curve = rdp_fn(group_orders(k))
    ref = min(
        float(group_epsilon_from_rdp(curve, group_orders(k), DELTA, k)[0][0]),
        float(group_epsilon_dp(curve, group_orders(k), DELTA, k)[0][0]),
    )
    assert best == ref


def test_composed_group_event_is_the_group_of_the_composition() -> None:
    acc = RdpAccountant()
    step = PoissonSampled([0.01, 0.02], GaussianMechanism(SIGMA))
    outer = acc.epsilon(Composed(GroupPrivacy(Composed(step, 100), 6, "dp"), 20), DELTA)[0]
    inner = acc.epsilon(GroupPrivacy(Composed(step, 2_000), 6, "dp"), DELTA)[0]
    np.testing.assert_array_equal(outer, inner)
    counts = acc.composed_epsilon(GroupPrivacy(Composed(step, 100), 6), [0, 20], DELTA)[0]
    assert (
        counts[0] == 0.0
        and counts[1] == acc.epsilon(GroupPrivacy(Composed(step, 2_000), 6), DELTA)[0][1]
    )


def test_group_plan_charges_users_through_mechanism_epsilon() -> None:
    plan = GroupPlan(SIGMA, 20, DELTA, 100, group_size=5, conversion="dp")
    eps, _ = mechanism_epsilon(plan, [Q], "third-party")
    ref = RdpAccountant().epsilon(_event(5, "dp"), DELTA)[0][0]
    assert eps[0] == pytest.approx(ref, rel=1e-12)
    assert plan.unit.value == "user" and plan.charged_on("server") == "active"
    with pytest.raises(ValueError, match="group_conversion"):
        GroupPlan(SIGMA, 20, DELTA, 100, group_size=5, conversion="lemma")  # type: ignore[arg-type]


def test_gdp_clt_rejects_options_it_does_not_have() -> None:
    plan = LocalStepsPlan("wor", 1.0, 5, 1e-5, 3)
    with pytest.raises(ValueError, match="gdp-clt takes no options"):
        mechanism_epsilon(plan, [0.1], "server", accountant="gdp-clt", orders=[2.0, 3.0])
