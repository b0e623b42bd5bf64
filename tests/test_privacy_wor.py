"""The WOR-subsampled Gaussian: Wang et al. Theorem 9 upper bound, explicit-pair lower bound.

Independent references: dp-accounting's ``SampledWithoutReplacementDpEvent`` (their Theorem 27
strengthening, identical to Theorem 9 above order 256), pdpfl's Poisson RDP (Mironov, Talwar,
Zhang: the WOR mechanism contains the Poisson pair, so its RDP is at least that), dp-accounting's
PLD accountant for the Poisson pair, and the paper's Theorem 2 CLT.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.privacy.gdp import gdp_epsilon, prifedsync_mu
from pdpfl.privacy.rdp import poisson_gaussian_rdp
from pdpfl.privacy.wor import (
    wor_gaussian_delta,
    wor_gaussian_delta_lower_bound,
    wor_gaussian_epsilon,
    wor_gaussian_epsilon_lower_bound,
    wor_gaussian_rdp,
)

dpa = pytest.importorskip("dp_accounting")
pld = pytest.importorskip("dp_accounting.pld")
rdp_mod = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")

ratios = st.floats(min_value=1e-5, max_value=0.99)
sigmas = st.floats(min_value=0.3, max_value=8.0)


#: dp-accounting's Theorem 27 costs O(α²) per order up to 256: check a spread of orders.
CHECK_ORDERS = np.array([2.0, 3.0, 4.0, 6.0, 9.0, 16.0, 24.0, 40.0, 320.0, 512.0])


@pytest.mark.parametrize(
    ("gamma", "sigma"), [(16 / 600, 1.0), (0.01, 2.0), (0.3, 0.3), (1e-6, 0.5)]
)
def test_theorem9_is_at_least_dp_accounting_theorem27_and_equal_above_256(gamma, sigma) -> None:
    ours = wor_gaussian_rdp(gamma, sigma, CHECK_ORDERS)
    ref = rdp_mod._compute_rdp_sample_wor_gaussian(gamma, sigma, CHECK_ORDERS)
    assert np.all(ours >= ref * (1 - 1e-12))
    big = CHECK_ORDERS > 256  # dp-accounting uses exactly Theorem 9 there
    np.testing.assert_allclose(ours[big], ref[big], rtol=1e-10)


def test_accountant_event_agrees_on_composed_epsilon() -> None:
    n, b, sigma, steps = 600, 16, 1.0, 38 * 93
    orders = list(range(2, 41))
    acc = rdp_mod.RdpAccountant(orders, dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.SampledWithoutReplacementDpEvent(n, b, dpa.GaussianDpEvent(sigma)), steps)
    ours, order = wor_gaussian_epsilon(b / n, sigma, steps, 1e-5, orders)
    assert ours >= acc.get_epsilon(1e-5) * (1 - 1e-9)
    assert ours == pytest.approx(acc.get_epsilon(1e-5), rel=1e-3)
    assert 2 <= order <= 40
    # The default integer grid can only do better than this sub-grid.
    assert wor_gaussian_epsilon(b / n, sigma, steps, 1e-5)[0] <= ours


@settings(max_examples=40)
@given(gamma=ratios, sigma=sigmas)
def test_wor_contains_the_poisson_pair(gamma, sigma) -> None:
    # One explicit WOR neighbour pair is exactly the Poisson-subsampled Gaussian's (module doc),
    # so no valid WOR bound may fall below Mironov–Talwar–Zhang's Poisson RDP.
    orders = np.arange(2.0, 41.0)
    ours = wor_gaussian_rdp(gamma, sigma, orders)
    poisson = poisson_gaussian_rdp(gamma, sigma, orders)[0]
    assert np.all(ours >= poisson * (1 - 1e-9) - 1e-15)


@settings(max_examples=40)
@given(g1=ratios, g2=ratios, s1=sigmas, s2=sigmas)
def test_monotone_in_ratio_and_noise(g1, g2, s1, s2) -> None:
    orders = np.array([2.0, 3.0, 8.0, 32.0, 128.0])
    lo_g, hi_g = sorted((g1, g2))
    lo_s, hi_s = sorted((s1, s2))
    assert np.all(wor_gaussian_rdp(lo_g, s1, orders) <= wor_gaussian_rdp(hi_g, s1, orders) + 1e-12)
    assert np.all(wor_gaussian_rdp(g1, hi_s, orders) <= wor_gaussian_rdp(g1, lo_s, orders) + 1e-12)
    full = orders / (2 * s1 * s1)
    assert np.all(wor_gaussian_rdp(g1, s1, orders) <= full * (1 + 1e-12))


def test_edge_ratios_and_composition() -> None:
    orders = np.array([2.0, 5.0, 64.0])
    assert np.all(wor_gaussian_rdp(0.0, 1.0, orders) == 0.0)
    np.testing.assert_allclose(wor_gaussian_rdp(1.0, 2.0, orders), orders / 8.0)
    e1, _ = wor_gaussian_epsilon(0.05, 1.0, 100, 1e-5)
    e2, _ = wor_gaussian_epsilon(0.05, 1.0, 400, 1e-5)
    assert 0 < e1 < e2
    assert wor_gaussian_epsilon(0.05, 1.0, 0, 1e-5)[0] == 0.0
    d = wor_gaussian_delta(0.05, 1.0, 100, e1)
    assert d <= 1e-5 * (1 + 1e-6)


def test_lower_bound_matches_the_poisson_pair_pld() -> None:
    gamma, sigma, steps = 0.1, 1.0, 10
    acc = pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dpa.PoissonSampledDpEvent(gamma, dpa.GaussianDpEvent(sigma)), steps)
    eps = np.array([0.5, 1.0, 2.0])
    ours = wor_gaussian_delta_lower_bound(gamma, sigma, steps, eps, cells=60_000)
    ref = np.array([acc.get_delta(float(e)) for e in eps])
    assert np.all(ours <= ref * (1 + 1e-6))  # a lower bound never exceeds the exact pair
    np.testing.assert_allclose(ours, ref, rtol=0.05)
    upper = np.array([wor_gaussian_delta(gamma, sigma, steps, float(e)) for e in eps])
    assert np.all(ours <= upper)


@pytest.mark.parametrize(
    ("gamma", "sigma", "steps"),
    [(16 / 600, 1.0, 1), (16 / 600, 1.0, 10), (0.1, 1.0, 10), (0.1, 2.0, 10), (16 / 600, 0.75, 10)],
)
def test_clt_under_reports_where_the_rigorous_bound_does_not(gamma, sigma, steps) -> None:
    # Few steps: Theorem 2's CLT ε is below what one explicit pair of neighbouring datasets
    # already forces, while the RDP bound stays above it.
    delta = 1e-5
    mu = float(prifedsync_mu(sigma, gamma * 600, 600, steps, 1))
    clt = float(gdp_epsilon(mu, delta))
    lower = wor_gaussian_epsilon_lower_bound(gamma, sigma, steps, delta, cells=60_000)
    rigorous, _ = wor_gaussian_epsilon(gamma, sigma, steps, delta)
    assert clt < lower <= rigorous


TABLE_1 = [
    (1.0, 93),
    (0.9, 83),
    (0.75, 64),
    (1.0, 194),
    (0.9, 176),
    (0.75, 127),
    (1.0, 386),
    (0.9, 325),
    (0.75, 245),
]


@pytest.mark.parametrize(("sigma", "rounds"), TABLE_1)
def test_rigorous_epsilon_beside_table1_clt(sigma, rounds) -> None:
    mu = float(prifedsync_mu(sigma, 16, 600, 38, rounds))
    clt = float(gdp_epsilon(mu, 1e-5))
    rigorous, _ = wor_gaussian_epsilon(16 / 600, sigma, 38 * rounds, 1e-5)
    assert rigorous >= clt
    assert rigorous < 3 * clt  # same order of magnitude: a bound, not a blow-up


def test_full_batch_lower_bound_is_exact_gdp() -> None:
    eps = gdp_epsilon(math.sqrt(5) / 2.0, 1e-6)
    assert wor_gaussian_epsilon_lower_bound(1.0, 2.0, 5, 1e-6) == pytest.approx(float(eps))


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: wor_gaussian_rdp(1.5, 1.0), "sampling_ratio"),
        (lambda: wor_gaussian_rdp(0.1, 0.0), "noise_multiplier"),
        (lambda: wor_gaussian_rdp(0.1, 1.0, [2.5]), "orders"),
        (lambda: wor_gaussian_rdp(0.1, 1.0, [1.0]), "orders"),
        (lambda: wor_gaussian_epsilon(0.1, 1.0, -1, 1e-5), "steps"),
        (lambda: wor_gaussian_epsilon(0.1, 1.0, 10, 0.0), "delta"),
        (lambda: wor_gaussian_delta_lower_bound(0.1, 1.0, 2, -1.0), "epsilon"),
        (lambda: wor_gaussian_delta_lower_bound(0.1, 1.0, 2, 1.0, bin_width=0), "bin_width"),
        (lambda: wor_gaussian_epsilon_lower_bound(0.1, 1.0, 2, 1.5), "delta"),
    ],
)
def test_bad_input_names_the_field(call, field) -> None:
    with pytest.raises(ValueError, match=field):
        call()


@pytest.mark.slow
def test_lower_bound_is_never_a_false_zero_issue_case() -> None:
    # Issue #24 (5): n = 60000, B = 256, σ = 1.1, T = 2000 returned 0.0 where a valid lower
    # bound is >= 0.85: rounding each step's privacy loss down by up to bin_width swallowed
    # T·bin_width = 2 nats. The function now says so instead of reporting a false 0.
    with pytest.raises(ValueError, match="bin_width"):
        wor_gaussian_epsilon_lower_bound(256 / 60000, 1.1, 2000, 1e-5)


def test_lower_bound_is_never_a_false_zero() -> None:
    # The same failure, cheaper: 100 steps at bin_width 2e-2 return 0.0 on main, while a finer
    # discretization certifies ε >= 0.16.
    gamma = 256 / 60000
    with pytest.raises(ValueError, match="bin_width"):
        wor_gaussian_epsilon_lower_bound(gamma, 1.1, 100, 1e-5, bin_width=2e-2, cells=10_000)
    fine = wor_gaussian_epsilon_lower_bound(gamma, 1.1, 100, 1e-5, bin_width=1e-3, cells=10_000)
    assert fine > 0.16
    # a true 0 stays 0: no sampling, no steps, or δ above the mechanism's δ(0)
    assert wor_gaussian_epsilon_lower_bound(0.0, 1.1, 2000, 1e-5) == 0.0
    assert wor_gaussian_epsilon_lower_bound(0.1, 1.1, 0, 1e-5) == 0.0
    assert wor_gaussian_delta(0.01, 50.0, 1, 0.0) <= 0.5
    assert wor_gaussian_epsilon_lower_bound(0.01, 50.0, 1, 0.5, cells=20_000) == 0.0
