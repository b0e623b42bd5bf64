"""Attack risk from the accountant (pdpfl.privacy.risk, pdpfl.ledger.risk): the best membership
attack's TPR at a given FPR, against independent conversions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from pdpfl.ledger import PrivacyLedger
from pdpfl.ledger.risk import risk_cards, risk_section, unit_risk, worst_card
from pdpfl.privacy import TrainingPlan
from pdpfl.privacy.risk import FPRS, PrivacyCurve, _hockey_stick, privacy_curve, risk_card
from pdpfl.privacy.unit import LocalStepsPlan, SampledGaussianPlan

pl = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")

ALPHAS = np.array(FPRS)


def _neyman_pearson(pmf, alphas: np.ndarray) -> np.ndarray:
    """The exact ROC of one direction of a dp-accounting PLD (independent of pdpfl's (ε, δ)
    envelope): the most powerful test between its upper distribution (TPR) and its lower one
    (FPR, masses p·e^{−l}) rejects for large losses, randomizing between them."""
    d = pmf.to_dense_pmf()
    losses = (d._lower_loss + np.arange(d._probs.size)) * d._discretization
    p = np.asarray(d._probs, dtype=np.float64)
    down = np.argsort(-losses)
    tpr = np.concatenate([[0.0, d._infinity_mass], d._infinity_mass + np.cumsum(p[down])])
    fpr = np.concatenate([[0.0, 0.0], np.cumsum((p * np.exp(-losses))[down])])
    return np.interp(alphas, fpr, tpr)


def _reference(pld) -> np.ndarray:
    """The most powerful attack in either direction (add or remove one unit)."""
    return np.maximum(
        _neyman_pearson(pld._pmf_remove, ALPHAS), _neyman_pearson(pld._pmf_add, ALPHAS)
    )


@pytest.mark.parametrize(
    ("q", "sigma", "steps"),
    [(0.579, 11.994426629500673, 750), (0.15, 3.0, 200), (0.02, 1.0, 100), (1.0, 5.0, 50)],
    ids=["heart-budget-5", "mid", "small-rate", "no-sampling"],
)
def test_the_card_agrees_with_dp_accounting_neyman_pearson(
    q: float, sigma: float, steps: int
) -> None:
    """pdpfl's card (its PLD, the (ε, δ) envelope) against the exact ROC of dp-accounting's own
    PLD of the same composition: within 10⁻³, and never below it (an upper bound)."""
    mech = SampledGaussianPlan("client", noise_multiplier=sigma, delta=1e-5, rounds=steps)
    ours = privacy_curve(mech, q, "third-party", steps).tpr(ALPHAS)
    ref = _reference(
        pl.from_gaussian_mechanism(
            sigma, sampling_prob=q, value_discretization_interval=1e-3
        ).self_compose(steps)
    )
    assert np.all(ours >= ref - 1e-9), (ours, ref)
    np.testing.assert_allclose(ours, ref, atol=1e-3)


def test_the_gaussian_card_is_gdp_closed_form() -> None:
    """q = 1: T rounds of the Gaussian mechanism are exactly μ-GDP, μ = √T/σ (Dong, Roth & Su,
    Cor. 3.3): TPR(α) = Φ(Φ⁻¹(α) + μ)."""
    mech = SampledGaussianPlan("user", noise_multiplier=5.0, delta=1e-5, rounds=50)
    mu = math.sqrt(50) / 5.0
    exact = special.ndtr(special.ndtri(ALPHAS) + mu)
    ours = privacy_curve(mech, 1.0, "third-party", 50).tpr(ALPHAS)
    assert np.all(ours >= exact - 1e-12)
    np.testing.assert_allclose(ours, exact, atol=1e-3)


def test_two_stage_rounds_match_the_mixture() -> None:
    """rPDP-FL's third-party round (λ < 1) against dp-accounting's mixture PLD built by hand."""
    plan = TrainingPlan(noise_multiplier=2.0, delta=1e-5, steps=10, rounds=20, client_rate=0.4)
    local = pl.from_gaussian_mechanism(2.0, sampling_prob=0.3, value_discretization_interval=1e-3)
    one_round = local.self_compose(10).compute_mixture(pl.identity(1e-3), 0.4)
    ref = _reference(one_round.self_compose(20))
    ours = privacy_curve(plan, 0.3, "third-party", 20).tpr(ALPHAS)
    assert np.all(ours >= ref - 1e-9)
    np.testing.assert_allclose(ours, ref, atol=1e-3)


@settings(max_examples=8, deadline=None)
@given(
    q=st.floats(0.01, 1.0),
    sigma=st.floats(0.7, 6.0),
    steps=st.integers(1, 30),
    top=st.integers(10, 3000),
)
def test_hockey_stick_equals_dp_accounting(q: float, sigma: float, steps: int, top: int) -> None:
    pld = pl.from_gaussian_mechanism(
        sigma, sampling_prob=q, value_discretization_interval=1e-2
    ).self_compose(steps)
    for pmf in (pld._pmf_remove, pld._pmf_add):
        grid = np.arange(top + 1) * 1e-2
        np.testing.assert_allclose(
            _hockey_stick(pmf, top), pmf.get_delta_for_epsilon(grid), rtol=1e-9, atol=1e-14
        )


@settings(max_examples=40, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.floats(0.0, 12.0), st.floats(0.0, 0.5)), min_size=1, max_size=12),
    alpha=st.floats(0.0, 1.0),
)
def test_curve_properties(pairs: list[tuple[float, float]], alpha: float) -> None:
    """TPR bound ≥ FPR, non-decreasing; f̄⁻¹ inverts it from below; more pairs never raise it;
    each pair alone satisfies its own (ε, δ) inequality."""
    e, d = np.array(pairs).T
    curve = PrivacyCurve(e, d, "test")
    a = np.array([alpha])
    t = curve.tpr(a)[0]
    assert alpha - 1e-15 <= t <= 1.0
    assert curve.tpr(np.array([min(1.0, alpha + 0.01)]))[0] >= t - 1e-12
    assert curve.fpr(np.array([t]))[0] <= alpha + 1e-9
    for eps, delta in pairs:
        assert t <= delta + math.exp(eps) * alpha + 1e-12
    fewer = PrivacyCurve(e[:1], d[:1], "test")
    assert fewer.tpr(a)[0] >= t - 1e-12
    assert curve.pruned().tpr(a)[0] >= t - 1e-12


def test_without_replacement_falls_back_to_rdp_pairs() -> None:
    """The PLD cannot interpret sampling without replacement; the RDP accountant's ε at a grid
    of δ still bounds every attack, and agrees with its own (ε, δ)."""
    mech = LocalStepsPlan(
        noise_multiplier=1.5,
        delta=1e-5,
        local_steps=10,
        rounds=5,
        sampler="wor",
    )
    curve = privacy_curve(mech, 0.1, "third-party", 5)
    assert curve.source == "rdp"
    eps = curve.epsilon(1e-5)
    assert np.all(curve.tpr(ALPHAS) <= 1e-5 + np.exp(eps) * ALPHAS + 1e-12)
    assert np.all(curve.tpr(ALPHAS) > ALPHAS)  # it does leak something


def test_cards_per_budget_group_from_ledgers() -> None:
    """A group's card is that of its most exposed unit; ledgers of the same mechanism merge."""
    plan = TrainingPlan(noise_multiplier=3.0, delta=1e-5, steps=5, rounds=4, client_rate=1.0)
    a = PrivacyLedger(np.array([1.0, 1.0, 5.0]), np.array([0.1, 0.2, 0.6]), plan, ids=[1, 2, 3])
    b = PrivacyLedger(np.array([1.0, 5.0]), np.array([0.3, 0.5]), plan, ids=[4, 5])
    for ledger in (a, b):
        for _ in range(4):
            ledger.record_round(
                participated=np.ones(ledger.n, bool), active=np.ones(ledger.n, bool)
            )
    cards = risk_cards([a, b])
    assert set(cards) == {"1", "5"} and set(cards["1"]) == {"third-party", "server"}
    top = risk_card(privacy_curve(plan, 0.3, "server", 4), "server")  # group 1's largest q
    assert cards["1"]["server"].tprs == pytest.approx(top.tprs)
    assert cards["5"]["server"].tprs > cards["1"]["server"].tprs
    section = risk_section([a, b], "record")
    assert section["schema"] == "pdpfl.risk/1"
    assert "budget group 5" in section["headline"] and "1 % false-alarm" in section["headline"]
    assert worst_card(section) == ("5", "third-party", pytest.approx(cards["5"]["server"].tprs[1]))
    mine = unit_risk(a, "1")
    assert set(mine) == {"third-party", "server"}
    assert mine["server"].tprs == pytest.approx(
        risk_card(privacy_curve(plan, 0.1, "server", 4), "server").tprs
    )
    assert unit_risk(a, "no such id") == {}
