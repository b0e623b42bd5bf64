"""Accounting of (distributed) discrete Gaussian noise, against numerical divergences computed
from the exact pmf (issue #33 item 3).

* the discrete Gaussian with integer shifts: integer-order Rényi divergences equal the
  continuous Gaussian's α·k²/(2σ²); fractional orders are at most it (CKS 2020);
* sums of t shares: pointwise within e^{±T} of N_Z(0, tσ²) (the τ lemma), and the distributed
  bound dominates D_α of the shifted vs unshifted sums computed by convolution (d = 1 and 2);
* Poisson sub-sampling: the bound dominates both directions of the mixture, numerically; with a
  Gaussian base it is ≥ pdpfl's exact sub-sampled Gaussian (and equal at integer orders for the
  symmetric bound); monotone in σ, q and α, and q = 1 gives the base (hypothesis);
* the event in the accountants (rdp interprets it, pld and gdp-clt refuse it) and the unit
  mechanism in a ledger (saved and loaded).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp

from pdpfl.ledger import PrivacyLedger
from pdpfl.ledger.store import load_ledger, mechanism_from_dict, mechanism_to_dict, save_ledger
from pdpfl.privacy import (
    Composed,
    DistributedDiscreteGaussian,
    PoissonSampled,
    RdpAccountant,
    SampledDiscreteGaussianPlan,
    SampledGaussianPlan,
    UnsupportedEventError,
    make_accountant,
    mechanism_epsilon,
)
from pdpfl.privacy.discrete import (
    discrete_gaussian_rdp,
    distributed_discrete_gaussian_rdp,
    sum_log_ratio_bound,
)
from pdpfl.privacy.rdp import poisson_gaussian_rdp
from pdpfl.privacy.subsampled import poisson_subsampled_rdp

ORDERS = np.array([1.5, 2.0, 3.0, 4.5, 8.0, 16.0])
INTEGER = ORDERS == np.floor(ORDERS)


# ----------------------------------------------------------------------------- exact pmfs


def _log_pmf_sum(variance: float, shares: int) -> tuple[np.ndarray, int]:
    """log P[X_1 + … + X_shares = z] for z = −M..M (X_i ~ N_Z(0, σ²)), by exact convolution
    in log space (accurate deep into the tails, where the Rényi sums of high orders live)."""
    half = int(math.ceil(math.sqrt(variance) * 30)) + 12
    x = np.arange(-half, half + 1, dtype=np.float64)
    lw = -x * x / (2.0 * variance)
    one = lw - logsumexp(lw)
    out = one
    for _ in range(shares - 1):
        n = out.size + one.size - 1
        grid = np.full((out.size, n), -np.inf)
        for i in range(out.size):
            grid[i, i : i + one.size] = out[i] + one
        out = logsumexp(grid, axis=0)
    return out, shares * half


def _shift(logp: np.ndarray, k: int) -> np.ndarray:
    """log P[Z + k = z] on the same support (−inf outside)."""
    out = np.full_like(logp, -np.inf)
    if k >= 0:
        out[k:] = logp[: logp.size - k]
    else:
        out[:k] = logp[-k:]
    return out


def _renyi(lp: np.ndarray, lq: np.ndarray, alpha: float) -> float:
    """D_α(P‖Q) from log-pmfs on a common grid (terms where P is negligible dropped)."""
    keep = np.isfinite(lp) & np.isfinite(lq)
    return float(logsumexp(alpha * lp[keep] + (1 - alpha) * lq[keep]) / (alpha - 1))


def _grid_2d(logp: np.ndarray, k: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Product log-pmfs of Z ∈ Z² and Z + k (flattened)."""
    base = logp[:, None] + logp[None, :]
    shifted = _shift(logp, k[0])[:, None] + _shift(logp, k[1])[None, :]
    return shifted.ravel(), base.ravel()


# ----------------------------------------------------------------------------- discrete Gaussian


@pytest.mark.parametrize("variance", [0.3, 1.0, 2.5])
def test_integer_orders_equal_the_continuous_gaussian(variance):
    """CKS 2020: D_α(N_Z(k, σ²) ‖ N_Z(0, σ²)) = αk²/(2σ²) at integer α, ≤ at fractional α."""
    lp, _ = _log_pmf_sum(variance, 1)
    for k in (1, 2, 3):
        for alpha in (2.0, 3.0, 5.0, 8.0):
            exact = _renyi(_shift(lp, k), lp, alpha)
            assert exact == pytest.approx(alpha * k * k / (2 * variance), rel=1e-9)
            assert discrete_gaussian_rdp([alpha], variance, k * k)[0] >= exact * (1 - 1e-12)
        for alpha in (1.5, 2.5, 4.3):
            exact = _renyi(_shift(lp, k), lp, alpha)
            assert exact <= alpha * k * k / (2 * variance) * (1 + 1e-12)
    # at small σ a fractional order is strictly below the Gaussian value (θ(αk) < θ(0))
    lp, _ = _log_pmf_sum(0.3, 1)
    assert _renyi(_shift(lp, 1), lp, 1.5) < 1.5 / (2 * 0.3) * (1 - 1e-3)


@pytest.mark.parametrize("variance,shares", [(0.1, 2), (0.25, 3), (0.5, 4), (1.0, 3)])
def test_sum_of_shares_is_pointwise_within_the_tau_bound(variance, shares):
    """|log P[Σ shares = z] − log P[N_Z(0, tσ²) = z]| ≤ T for every z (the τ lemma)."""
    lp, half = _log_pmf_sum(variance, shares)
    z = np.arange(-half, half + 1, dtype=np.float64)
    lw = -z * z / (2 * shares * variance)
    ly = lw - logsumexp(lw)
    keep = np.abs(z) <= half // shares  # away from the truncated shares' edge
    worst = float(np.max(np.abs(lp[keep] - ly[keep])))
    bound = sum_log_ratio_bound(shares, variance)
    assert worst <= bound
    assert sum_log_ratio_bound(1, variance) == 0.0


@pytest.mark.parametrize("variance,shares", [(0.25, 3), (0.5, 2), (1.0, 3), (2.0, 4)])
def test_distributed_bound_dominates_the_exact_divergence(variance, shares):
    """d = 1 (shifts k, N = k²) and d = 2 (every integer k with ‖k‖² ≤ N): the bound is ≥ the
    numerical D_α of the shifted vs unshifted sum, and within 1 % of it once σ ≥ 1."""
    lp, _ = _log_pmf_sum(variance, shares)
    for k in (1, 2):
        bound = distributed_discrete_gaussian_rdp(ORDERS, variance, shares, k * k, 1)
        exact = np.array([_renyi(_shift(lp, k), lp, a) for a in ORDERS])
        assert np.all(bound >= exact * (1 - 1e-9))
        if variance >= 1.0:
            assert np.all(bound[INTEGER] <= exact[INTEGER] * 1.01)
    if variance > 1.0:
        return  # d = 2 on the smaller grids only (the 2-d sums are the slow part)
    for n_sq in (2, 5):
        bound = distributed_discrete_gaussian_rdp(ORDERS, variance, shares, n_sq, 2)
        worst = np.zeros(ORDERS.size)
        for k in itertools.product(range(-2, 3), repeat=2):
            if 0 < k[0] ** 2 + k[1] ** 2 <= n_sq:
                shifted, base = _grid_2d(lp, k)
                worst = np.maximum(worst, [_renyi(shifted, base, a) for a in ORDERS])
        assert np.all(bound >= worst * (1 - 1e-9))


@pytest.mark.parametrize("variance,shares", [(0.25, 3), (0.5, 2), (1.0, 3)])
@pytest.mark.parametrize("rate", [0.05, 0.3, 0.8])
def test_subsampled_bound_dominates_both_directions(variance, shares, rate):
    """Poisson mixture p = (1 − γ)·Z + γ·(Z + k) against q = Z: the bound (as the accountant
    uses it, and the general one) is ≥ D_α(p‖q) and D_α(q‖p) computed from the exact pmf."""
    lp, _ = _log_pmf_sum(variance, shares)
    for k in (1, 2):
        mix = np.logaddexp(math.log1p(-rate) + lp, math.log(rate) + _shift(lp, k))
        add = np.array([_renyi(mix, lp, a) for a in ORDERS])
        rem = np.array([_renyi(lp, mix, a) for a in ORDERS])
        exact = np.maximum(add, rem)
        assert np.all(rem <= add * (1 + 1e-9))  # the symmetry lemma, numerically

        def curve(a, k=k):
            return distributed_discrete_gaussian_rdp(a, variance, shares, k * k, 1)

        for symmetric in (True, False):
            bound = poisson_subsampled_rdp(rate, curve, ORDERS, symmetric=symmetric)[0]
            assert np.all(bound >= exact * (1 - 1e-9))
        if variance >= 1.0:  # not absurdly loose: the integer orders are within 1 %
            bound = poisson_subsampled_rdp(rate, curve, ORDERS, symmetric=True)[0]
            assert np.all(bound[INTEGER] <= exact[INTEGER] * 1.01)


@pytest.mark.parametrize("sigma", [0.7, 1.0, 2.0, 5.0])
def test_general_bound_dominates_the_exact_subsampled_gaussian(sigma):
    """With the Gaussian's own curve α/(2σ²) as the base, the general bound is ≥ the exact
    sub-sampled Gaussian RDP (both variants), and the symmetric one equals it at integer
    orders (the binomial expansion is exact for the Gaussian)."""
    orders = np.concatenate([np.arange(1.25, 8, 0.25), np.arange(8.0, 65.0), [128.0, 256.0]])
    rates = [1e-4, 1e-2, 0.1, 0.5, 0.9]
    exact = poisson_gaussian_rdp(rates, sigma, orders)

    def curve(a):
        return a / (2.0 * sigma * sigma)

    for symmetric in (True, False):
        bound = poisson_subsampled_rdp(rates, curve, orders, symmetric=symmetric)
        assert np.all(bound >= exact * (1 - 1e-12))
    sym = poisson_subsampled_rdp(rates, curve, orders, symmetric=True)
    whole = orders == np.floor(orders)
    np.testing.assert_allclose(sym[:, whole], exact[:, whole], rtol=1e-9)


@settings(max_examples=30, deadline=None)
@given(
    variance=st.floats(0.5, 1e4),
    shares=st.integers(1, 20),
    n_sq=st.floats(0.5, 50.0),
    rate=st.floats(1e-4, 0.99),
    factor=st.floats(1.01, 4.0),
)
def test_bounds_are_monotone_and_rate_one_is_the_base(variance, shares, n_sq, rate, factor):
    orders = np.concatenate([np.arange(1.1, 3.0, 0.3), np.arange(3.0, 40.0)])

    def curve(var):
        return lambda a: distributed_discrete_gaussian_rdp(a, var, shares, n_sq, 1000)

    base = curve(variance)(orders)
    more_noise = curve(variance * factor)(orders)
    assert np.all(np.diff(base) >= 0) and np.all(more_noise <= base)
    sub = poisson_subsampled_rdp(rate, curve(variance), orders, symmetric=True)[0]
    assert np.all(np.diff(sub) >= 0)  # non-decreasing in α
    assert np.all(sub <= base * (1 + 1e-12))
    higher = min(1.0, rate * factor)
    assert np.all(poisson_subsampled_rdp(higher, curve(variance), orders, symmetric=True)[0] >= sub)
    quieter = poisson_subsampled_rdp(rate, curve(variance * factor), orders, symmetric=True)[0]
    assert np.all(quieter <= sub)
    np.testing.assert_array_equal(poisson_subsampled_rdp(1.0, curve(variance), orders)[0], base)
    assert np.all(poisson_subsampled_rdp(0.0, curve(variance), orders) == 0)


# ----------------------------------------------------------------------------- accountants


def _plan(**kw) -> SampledDiscreteGaussianPlan:
    args = dict(
        unit="client",
        noise_multiplier=1.2,
        shares=7,
        l2_sensitivity_sq=2.0**40,
        dimension=2**17,
        delta=1e-5,
        rounds=50,
    )
    args.update(kw)
    return SampledDiscreteGaussianPlan.for_multiplier(**args)  # type: ignore[arg-type]


def test_rdp_accountant_interprets_the_event_and_matches_the_gaussian():
    """With large shares the τ term is negligible: ε is never below the continuous Gaussian's at
    the same noise multiplier and within 5 % of it (integer orders are exact; fractional orders
    take the chord between them, the Gaussian its exact fractional values: measured 0.002 %,
    3.0 % and 0.05 % at q = 1, 0.3, 0.05)."""
    plan = _plan()
    gauss = SampledGaussianPlan(
        "client", plan.noise_multiplier, 1e-5, 50, ("third-party", "server")
    )
    rates = np.array([1.0, 0.3, 0.05])
    e_d, _ = mechanism_epsilon(plan, rates, "server")
    e_g, _ = mechanism_epsilon(gauss, rates, "server")
    assert np.all(e_d >= e_g * (1 - 1e-9)) and np.all(e_d <= e_g * 1.05)
    event = plan.total_event(rates, "server")
    acc = RdpAccountant()
    assert acc.supports(event) and acc.supports(plan.base_event())
    assert acc.rdp(event).shape == (3, acc.orders.size)
    assert plan.share_variance == pytest.approx(1.2**2 * 2.0**40 / 7, rel=1e-15)
    assert plan.share_variance <= 1.2**2 * 2.0**40 / 7  # rounded down: conservative


@pytest.mark.parametrize("name", ["pld", "gdp-clt"])
def test_accountants_that_cannot_interpret_it_refuse(name):
    acc = make_accountant(name)
    plan = _plan()
    assert not acc.supports(plan.round_event([0.5], "server"))
    with pytest.raises(UnsupportedEventError, match=name):
        mechanism_epsilon(plan, [0.5], "server", accountant=name)


def test_sampling_around_a_composition_stays_unsupported():
    ev = PoissonSampled(0.5, Composed(DistributedDiscreteGaussian(100.0, 3, 4.0, 10), 2))
    assert not RdpAccountant().supports(ev)
    with pytest.raises(ValueError, match="DistributedDiscreteGaussian"):
        RdpAccountant().rdp(ev)


def test_one_share_is_the_discrete_gaussian_mechanism():
    """t = 1 (central discrete noise): no τ term; RDP α·N/(2σ²) exactly as the Gaussian's."""
    ev = DistributedDiscreteGaussian(
        share_variance=9.0, shares=1, l2_sensitivity_sq=4.0, dimension=50
    )
    a = RdpAccountant().orders
    np.testing.assert_allclose(RdpAccountant().rdp(ev)[0], a * 4.0 / 18.0, rtol=1e-15)
    assert ev.noise_multiplier == pytest.approx(1.5)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(share_variance=0.0), "share_variance"),
        (dict(shares=0), "shares"),
        (dict(l2_sensitivity_sq=-1.0), "l2_sensitivity_sq"),
        (dict(dimension=0), "dimension"),
        (dict(l1_sensitivity=-2), "l1_sensitivity"),
        (dict(shares=True), "shares"),
    ],
)
def test_the_event_refuses_bad_fields(kwargs, field):
    args = dict(share_variance=1.0, shares=2, l2_sensitivity_sq=1.0, dimension=3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        DistributedDiscreteGaussian(**args)  # type: ignore[arg-type]


def test_with_noise_keeps_the_shares_and_rescales_the_sensitivity():
    plan = _plan()
    assert plan.with_noise(plan.noise_multiplier) is plan
    doubled = plan.with_noise(2 * plan.noise_multiplier)
    assert doubled.share_variance == plan.share_variance
    assert doubled.l2_sensitivity_sq >= plan.l2_sensitivity_sq / 4
    assert doubled.l2_sensitivity_sq == pytest.approx(plan.l2_sensitivity_sq / 4, rel=1e-14)
    e1, _ = mechanism_epsilon(doubled, [0.3], "third-party")
    e2, _ = mechanism_epsilon(
        _plan(noise_multiplier=2.4, l2_sensitivity_sq=2.0**38), [0.3], "third-party"
    )
    assert e1[0] == pytest.approx(e2[0], rel=1e-9)


def test_ledger_charges_and_round_trips_the_plan(tmp_path):
    plan = _plan(rounds=20)
    assert mechanism_from_dict(mechanism_to_dict(plan)) == plan
    ledger = PrivacyLedger(np.array([2.0, 8.0, 8.0]), np.array([0.2, 0.5, 1.0]), plan)
    for _ in range(3):  # "active" charging: every active unit, every round
        ledger.record_round(
            participated=np.array([1, 0, 0], bool), active=np.array([1, 1, 0], bool)
        )
    before = ledger.spent_epsilon("third-party")
    e, _ = mechanism_epsilon(plan, [0.2, 0.5], "third-party", [3, 3])
    np.testing.assert_allclose(before[:2], e, rtol=1e-12)
    assert before[2] == 0.0
    save_ledger(ledger, tmp_path / "ledger.npz")
    again = load_ledger(tmp_path / "ledger.npz")
    assert again.mechanism == plan
    np.testing.assert_array_equal(again.spent_epsilon("third-party"), before)
