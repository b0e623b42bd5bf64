"""IDP-FedAvg's privacy math: SAMPLE (Alg. 1) with verification, noise split, SCALE, clipping.

Accounting is checked against dp-accounting's RdpAccountant (the reference code's accountant)
and against the flidp σ test vectors of the spec (B.4).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdpfl.fl import idp_fedavg as idp

EMNIST_N = 3383
EMNIST_Q = 30 / EMNIST_N


def dp_accounting_epsilon(q: float, sigma: float, rounds: int = 420, delta: float = 1e-4) -> float:
    """ε of I Poisson(q)-subsampled Gaussian rounds with dp-accounting (flidp's accountant)."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), rounds
        )
    )
    return float(acc.get_epsilon(delta))


def dp_accounting_pld_epsilon(
    q: float, sigma: float, rounds: int = 420, delta: float = 1e-4
) -> float:
    """The same mechanism with dp-accounting's PLD accountant (tighter than any RDP bound)."""
    import dp_accounting

    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), rounds
    )
    return float(acc.get_epsilon(delta))


#: pdpfl refines the RDP order continuously (issue #15), so its bound -- and the σ it calibrates
#: -- can be slightly tighter than dp-accounting's fixed order grid: that grid may report up to
#: this much more for pdpfl's σ, while the (tighter) PLD accountant stays within the budget.
GRID_SLACK = 1e-3


@pytest.mark.parametrize(
    "epsilon, sigma_flidp", [(1.0, 1.0546077151806315), (3.0, 0.7082464208237876)]
)
def test_flidp_sigma_test_vectors_for_strict_and_relaxed(epsilon, sigma_flidp):
    """getNoise(ε, δ=1e-4, q=30/3383, I=420): EMNIST strict (ε=1) and relaxed (ε=3) runs."""
    sigma = idp.noise_for_rate(epsilon, EMNIST_Q, 1e-4, 420)
    assert abs(sigma - sigma_flidp) < 1e-3
    # Our σ spends at most ε under the reference accountant's tight PLD, and its RDP grid
    # differs from our refined order only by the grid's looseness.
    assert dp_accounting_pld_epsilon(EMNIST_Q, sigma) <= epsilon
    assert dp_accounting_epsilon(EMNIST_Q, sigma) <= epsilon * (1 + GRID_SLACK)


@pytest.fixture(scope="module")
def emnist_sample():
    return idp.sample_group_rates(
        [1.0, 2.0, 3.0], [0.54, 0.37, 0.09], EMNIST_Q, delta=1e-4, rounds=420
    )


@pytest.mark.slow
def test_sample_emnist_every_group_within_budget_and_mean_rate_on_target(emnist_sample):
    res = emnist_sample
    assert res.budgets == (1.0, 2.0, 3.0)
    assert res.rates[0] < EMNIST_Q < res.rates[1] < res.rates[2]
    mean = float(np.dot([0.54, 0.37, 0.09], res.rates))
    assert abs(mean - EMNIST_Q) <= 1e-3 * EMNIST_Q and mean <= EMNIST_Q * (1 + 1e-9)
    assert res.mean_rate == pytest.approx(mean)
    for budget, q, eps in zip(res.budgets, res.rates, res.epsilons, strict=True):
        assert eps <= budget  # our exact accountant
        assert dp_accounting_pld_epsilon(q, res.noise_multiplier) <= budget
        assert dp_accounting_epsilon(q, res.noise_multiplier) <= budget * (1 + GRID_SLACK)
        assert eps >= 0.99 * budget  # and the rates use the budget (not a loose bound)
    # Spec B.1 (flidp returns σ_high with mean slightly above c/N; we return the side below).
    assert res.noise_multiplier == pytest.approx(0.90122, abs=5e-3)


@pytest.mark.slow
def test_sample_never_keeps_the_searchs_rates(monkeypatch, emnist_sample):
    """The search's rates are discarded: a stale, overspending vector cannot leak through."""
    import pdpfl.calibration.noise as calibrate

    def stale(eps, sizes, target, plan, **kw):  # the right σ, rates as if from a larger σ
        return emnist_sample.noise_multiplier, np.full(len(eps), 0.5)

    monkeypatch.setattr(calibrate, "group_sampling_rates", stale)
    res = idp.sample_group_rates(
        [1.0, 2.0, 3.0], [0.54, 0.37, 0.09], EMNIST_Q, delta=1e-4, rounds=420, rate_tol=1.5e-3
    )  # not the cached call
    assert res.rates == pytest.approx(emnist_sample.rates, abs=1e-6)
    assert all(e <= b for e, b in zip(res.epsilons, res.budgets, strict=True))


def test_sample_refuses_a_sigma_that_misses_the_target(monkeypatch):
    """A search returning a too-large σ (mean rate above c/N) fails verification loudly."""
    import pdpfl.calibration.noise as calibrate

    monkeypatch.setattr(
        calibrate,
        "group_sampling_rates",
        lambda eps, sizes, target, plan, **kw: (50.0, np.zeros(len(eps))),
    )
    with pytest.raises(RuntimeError, match="mean rate"):
        idp.sample_group_rates(
            [1.0, 4.0], [0.5, 0.5], 0.2, delta=1e-3, rounds=5, rate_tol=2e-3
        )  # a fresh (uncached) call


def test_aldaghri_setting_nonprivate_clients_at_q_one():
    """ε = 0.6 / ∞ / ∞ at 95 / 0 / 5 %: the ∞ groups are sampled with q = 1, no constraint."""
    res = idp.sample_group_rates(
        [0.6, math.inf, 3.0], [0.95, 0.05, 0.0], EMNIST_Q, delta=1e-4, rounds=420
    )
    assert res.budgets[0] == 0.6
    assert res.rates[0] == pytest.approx(EMNIST_Q)
    assert res.epsilons[0] <= 0.6
    inf_groups = [i for i, b in enumerate(res.budgets) if math.isinf(b)]
    assert inf_groups and all(res.rates[i] == 1.0 for i in inf_groups)
    assert all(math.isinf(res.epsilons[i]) for i in inf_groups)
    assert res.noise_multiplier == pytest.approx(idp.noise_for_rate(0.6, EMNIST_Q, 1e-4, 420))
    # An empty private group still gets a verified rate at σ.
    assert res.budgets[1] == 3.0 and res.epsilons[1] <= 3.0 and res.rates[1] > res.rates[0]


def test_sample_refuses_budgets_that_act_as_nonprivate_beyond_the_target():
    """flidp's 1e20 stand-in for ∞ is a finite budget at q = 1 for any usable σ: if those
    clients alone exceed c/N the search cannot end -- refused at once, with the fix."""
    with pytest.raises(ValueError, match="non-private"):
        idp.sample_group_rates([0.6, 1e20], [0.95, 0.05], EMNIST_Q, delta=1e-4, rounds=420)


def test_sample_with_only_nonprivate_clients_needs_no_noise():
    res = idp.sample_group_rates([math.inf], [10], 0.3, delta=1e-5, rounds=3)
    assert res.noise_multiplier is None and res.rates == (1.0,)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(budgets=[1.0, -1.0], sizes=[1, 1]), "budgets"),
        (dict(budgets=[1.0], sizes=[-1.0]), "sizes"),
        (dict(budgets=[1.0, 2.0], sizes=[1.0]), "equal length"),
    ],
)
def test_sample_rejects_bad_inputs(bad, match):
    with pytest.raises(ValueError, match=match):
        idp.sample_group_rates(bad["budgets"], bad["sizes"], 0.1, delta=1e-5, rounds=3)


# ------------------------------------------------------------------- the σ → (σ_v, 2σ_b) split


def test_noise_split_matches_the_reference_logs():
    # flidp's history.csv: σ = 0.9027696 → noise_multiplier_after_adaptive_clipping 0.9466483
    assert idp.split_noise(0.9027696247613426, 0.05 * 30) == pytest.approx(0.9466483, abs=1e-6)


@given(st.floats(0.05, 20.0), st.floats(0.1, 50.0))
def test_noise_split_composes_to_sigma(sigma, count_std):
    if sigma >= 2 * count_std:
        with pytest.raises(ValueError, match="count_noise_ratio"):
            idp.split_noise(sigma, count_std)
        return
    sv = idp.split_noise(sigma, count_std)
    assert sv >= sigma
    # Gaussian RDP ρ(α) = α/(2σ²) adds up: value (σ_v) + count (sensitivity ½, std σ_b).
    alpha = np.array([1.5, 2.0, 8.0, 64.0])
    composed = alpha / (2 * sv**2) + alpha * 0.5**2 / (2 * count_std**2)
    np.testing.assert_allclose(composed, alpha / (2 * sigma**2), rtol=1e-9)


def test_noise_split_composes_to_sigma_in_the_accountant():
    """Value query (σ_v) ∘ count query (2σ_b) == one Gaussian of σ, with pdpfl's accountant."""
    from pdpfl.privacy.orders import DEFAULT_ORDERS
    from pdpfl.privacy.rdp import poisson_gaussian_rdp

    sigma, sb = 0.9, 1.5
    sv = idp.split_noise(sigma, sb)
    one = poisson_gaussian_rdp(np.array([1.0]), sigma, DEFAULT_ORDERS)
    both = poisson_gaussian_rdp(np.array([1.0]), sv, DEFAULT_ORDERS) + poisson_gaussian_rdp(
        np.array([1.0]), 2 * sb, DEFAULT_ORDERS
    )
    np.testing.assert_allclose(both, one, rtol=1e-9)


# ------------------------------------------------------------------------------- SCALE


def test_scale_reproduces_the_spec_values():
    # Spec B.2, EMNIST 1/2/3, .54/.37/.09: σ_p 1.054608 / 0.812393 / 0.708246, σ̄ 0.9338,
    # C_p/C 0.886 / 1.150 / 1.319 (fixed clipping: every group at exactly its σ_p).
    sig = [1.054608, 0.812393, 0.708246]
    bar, bar_v, factors, eff = idp.scale_noise(sig, [0.54, 0.37, 0.09], None)
    assert bar == pytest.approx(0.9338, abs=1e-4) and bar_v == bar
    np.testing.assert_allclose(factors, [0.886, 1.150, 1.319], atol=1e-3)
    np.testing.assert_allclose(eff, sig)


@given(st.lists(st.floats(0.3, 2.0), min_size=1, max_size=4), st.floats(1.2, 5.0))
def test_scale_with_adaptive_clipping_never_undercuts_a_groups_sigma(sigmas, count_std):
    fractions = np.linspace(1, 2, len(sigmas))
    bar, bar_v, factors, eff = idp.scale_noise(sigmas, fractions, count_std)
    s = np.asarray(sigmas)
    assert np.all(np.asarray(eff) >= s * (1 - 1e-12))
    assert max(eff) == pytest.approx(max(sigmas)) or np.argmax(s) != np.argmax(eff)
    # each group's value multiplier σ̄_v·σ_p/σ̄ and the count's 2σ_b compose to eff
    value = bar_v * s / bar
    np.testing.assert_allclose(
        1 / np.asarray(eff) ** 2, 1 / value**2 + 1 / (2 * count_std) ** 2, rtol=1e-9
    )
    np.testing.assert_allclose(factors, bar / s)


# ------------------------------------------------------------------- the geometric clip rule


def test_clip_norm_follows_the_geometric_rule_on_a_fixed_sequence():
    # C_1 = 0.1·e^{0.1} when nothing is unclipped (b̃_0 = 0), as in flidp's logs.
    assert idp.clip_update(0.1, 0.0, 0.5, 0.2) == pytest.approx(0.1105171, abs=1e-7)
    fractions = [0.0, 0.25, 1.0, 0.5, 1.3, -0.2]  # out-of-range values are clipped to [0, 1]
    c = 0.1
    for b in fractions:
        c = idp.clip_update(c, b, 0.5, 0.2)
    clipped = np.clip(fractions, 0, 1)
    assert c == pytest.approx(0.1 * math.exp(-0.2 * float(np.sum(clipped - 0.5))))
