"""f-DP / Gaussian DP: trade-off functions, μ-GDP ↔ (ε, δ), CLT, PriFedSync anchors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.privacy.gdp import (
    alpha_grid,
    client_sampled_mu_clt,
    client_sampled_tradeoff,
    compose_gdp,
    federated_mu,
    gaussian_tradeoff,
    gdp_delta,
    gdp_epsilon,
    poisson_gaussian_mu_clt,
    prifedsync_mu,
    tradeoff_clt_functionals,
    tradeoff_to_delta,
    tradeoff_to_epsilon,
)

dpa = pytest.importorskip("dp_accounting")
pld = pytest.importorskip("dp_accounting.pld")

mus = st.floats(min_value=0.01, max_value=8.0)
deltas = st.floats(min_value=1e-10, max_value=0.5)


# PriFedSync Table 1 (MNIST: B = 16, n = 600, K = 38): (σ, R, μ_max as printed, 2 decimals).
TABLE_1 = [
    (1.0, 93, 2.71),
    (0.9, 83, 3.10),
    (0.75, 64, 3.96),
    (1.0, 194, 3.92),
    (0.9, 176, 4.51),
    (0.75, 127, 5.58),
    (1.0, 386, 5.52),
    (0.9, 325, 6.13),
    (0.75, 245, 7.75),
]


@pytest.mark.parametrize(("sigma", "rounds", "expected"), TABLE_1)
def test_prifedsync_theorem2_reproduces_table1(sigma, rounds, expected) -> None:
    mu = prifedsync_mu(sigma, batch_size=16, n_records=600, local_steps=38, rounds=rounds)
    assert abs(float(mu) - expected) <= 0.005 + 1e-9


# PriFedSync Table 2 (MNIST, p = 0.5, n = 600): (σ, B, K, R, μ_max as printed).
TABLE_2 = [
    (1.0, 8, 76, 266, 3.24),
    (1.0, 16, 38, 194, 3.92),
    (0.9, 8, 76, 229, 3.64),
    (0.9, 16, 38, 176, 4.51),
    (0.75, 8, 76, 191, 4.84),
    (0.75, 16, 38, 127, 5.58),
]
# PriFedSync Table 3 (CIFAR-10: B = 16, n = 500, K = 32): (σ, R, μ_max as printed).
TABLE_3 = [
    (1.0, 468, 6.70),
    (0.75, 321, 9.77),
    (0.5, 207, 26.81),
    (1.0, 904, 9.31),
    (0.75, 671, 14.13),
    (0.5, 405, 37.51),
]


@pytest.mark.parametrize(("sigma", "batch", "steps", "rounds", "expected"), TABLE_2)
def test_prifedsync_theorem2_reproduces_table2(sigma, batch, steps, rounds, expected) -> None:
    mu = prifedsync_mu(sigma, batch_size=batch, n_records=600, local_steps=steps, rounds=rounds)
    assert abs(float(mu) - expected) <= 0.005 + 1e-9


@pytest.mark.parametrize(("sigma", "rounds", "expected"), TABLE_3)
def test_prifedsync_theorem2_reproduces_table3(sigma, rounds, expected) -> None:
    mu = prifedsync_mu(sigma, batch_size=16, n_records=500, local_steps=32, rounds=rounds)
    assert abs(float(mu) - expected) <= 0.005 + 1e-9


@settings(max_examples=50)
@given(parts=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=20))
def test_strong_federated_mu_is_at_least_weak(parts) -> None:
    weak, strong = federated_mu(parts, "weak"), federated_mu(parts, "strong")
    assert weak == max(parts)
    assert strong == pytest.approx(math.sqrt(len(parts) - 1) * max(parts))
    if len(parts) >= 2:
        assert strong >= weak


def test_client_sampled_clt_functionals_match_numerical_integration() -> None:
    from scipy import integrate, special

    for mu in (0.4, 1.0, 2.7):
        for p in (1.0, 0.6, 0.3, 0.1):
            kl, k2 = tradeoff_clt_functionals(mu, p)

            def integrand(z, power, mu=mu, p=p):
                on_curve = special.ndtr(z - mu) >= special.ndtr(z) - p * p
                value = (mu * z - mu * mu / 2.0) if on_curve else 0.0
                return value**power * math.exp(-z * z / 2.0) / math.sqrt(2.0 * math.pi)

            num_kl = -integrate.quad(integrand, -40, 40, args=(1,), points=[mu / 2], limit=400)[0]
            num_k2 = integrate.quad(integrand, -40, 40, args=(2,), points=[mu / 2], limit=400)[0]
            assert kl == pytest.approx(num_kl, rel=2e-5, abs=1e-9)
            assert k2 == pytest.approx(num_k2, rel=2e-5, abs=1e-9)


def test_client_sampled_mu_clt_lemma_3_8() -> None:
    # p = 1: g = G_μ and R rounds compose to √R·μ exactly (Lemma 3.4).
    assert client_sampled_mu_clt(0.7, 1.0, 50) == pytest.approx(math.sqrt(50) * 0.7, rel=1e-12)
    values = [client_sampled_mu_clt(0.7, p, 50) for p in (1.0, 0.8, 0.5, 0.3, 0.1)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))
    assert values[-1] < values[0]
    assert client_sampled_mu_clt(0.0, 0.5, 50) == 0.0
    with pytest.raises(ValueError, match="client_rate"):
        client_sampled_mu_clt(1.0, 1.5, 10)
    with pytest.raises(ValueError, match="rounds"):
        client_sampled_mu_clt(1.0, 0.5, -1)


def test_prifedsync_mu_vectorized_over_clients_and_federated_notions() -> None:
    mu = prifedsync_mu([1.0, 0.75], [16, 8], [600, 600], 38, 93)
    assert mu.shape == (2,)
    assert mu[0] == pytest.approx(float(prifedsync_mu(1.0, 16, 600, 38, 93)), rel=1e-15)
    assert federated_mu(mu, "weak") == mu.max()
    assert federated_mu(mu, "strong") == pytest.approx(math.sqrt(1) * mu.max())
    assert federated_mu([1.0, 2.0, 0.5, 0.1, 2.0], "strong") == pytest.approx(4.0)
    with pytest.raises(ValueError, match="notion"):
        federated_mu(mu, "medium")


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 5.0])
def test_gaussian_mechanism_matches_exact_pld(sigma) -> None:
    # μ-GDP with μ = 1/σ is the exact privacy profile of the Gaussian mechanism.
    acc = pld.PLDAccountant()
    acc.compose(dpa.GaussianDpEvent(sigma))
    for eps in (0.0, 0.1, 0.5, 1.0, 2.0, 4.0):
        ref = acc.get_delta(eps)
        if ref < 1e-12:
            continue
        assert float(gdp_delta(1.0 / sigma, eps)) == pytest.approx(ref, rel=1e-3)
    for delta in (1e-3, 1e-6):
        ref = acc.get_epsilon(delta)
        assert float(gdp_epsilon(1.0 / sigma, delta)) == pytest.approx(ref, rel=1e-3, abs=1e-6)


@pytest.mark.slow
def test_clt_can_under_report_epsilon() -> None:
    # Bu et al.'s CLT is an approximation: few steps with a large rate under-report ε.
    q, sigma, steps, delta = 0.2, 0.8, 10, 1e-5
    acc = pld.PLDAccountant()
    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
    eps_clt = float(gdp_epsilon(poisson_gaussian_mu_clt(q, sigma, steps), delta)[0])
    assert eps_clt < acc.get_epsilon(delta)


def test_clt_mu_formula_and_vectorization() -> None:
    q = np.array([0.0, 0.01, 0.1])
    mu = poisson_gaussian_mu_clt(q, 1.0, 1000)
    assert mu.shape == (3,) and mu[0] == 0.0
    assert mu[1] == pytest.approx(0.01 * math.sqrt(1000 * (math.e - 1.0)), rel=1e-14)
    assert mu[2] == pytest.approx(10 * mu[1], rel=1e-14)
    with pytest.raises(ValueError, match="rates"):
        poisson_gaussian_mu_clt([1.5], 1.0, 10)
    with pytest.raises(ValueError, match="steps"):
        poisson_gaussian_mu_clt([0.1], 1.0, -1)


@settings(max_examples=60)
@given(mu=mus, e1=st.floats(0.0, 20.0), e2=st.floats(0.0, 20.0))
def test_delta_decreasing_in_epsilon(mu, e1, e2) -> None:
    lo, hi = sorted((e1, e2))
    assert gdp_delta(mu, hi) <= gdp_delta(mu, lo)


@settings(max_examples=60)
@given(m1=mus, m2=mus, eps=st.floats(0.0, 20.0))
def test_delta_increasing_in_mu(m1, m2, eps) -> None:
    lo, hi = sorted((m1, m2))
    assert gdp_delta(lo, eps) <= gdp_delta(hi, eps)


@settings(max_examples=60)
@given(mu=mus, delta=deltas)
def test_epsilon_inverse_round_trips_conservatively(mu, delta) -> None:
    eps = float(gdp_epsilon(mu, delta))
    assert eps >= 0
    assert gdp_delta(mu, eps) <= delta  # never under-reports ε
    if eps > 0:
        assert gdp_delta(mu, eps) == pytest.approx(delta, rel=1e-6)
        assert gdp_delta(mu, max(eps - 1e-6 * max(eps, 1.0), 0.0)) > delta


@settings(max_examples=40)
@given(parts=st.lists(mus, min_size=1, max_size=6), k=st.integers(1, 50))
def test_composition(parts, k) -> None:
    assert compose_gdp(parts) == pytest.approx(math.sqrt(sum(p * p for p in parts)), rel=1e-12)
    assert compose_gdp([parts[0]] * k) == pytest.approx(math.sqrt(k) * parts[0], rel=1e-12)
    assert compose_gdp([compose_gdp(parts), parts[0]]) == pytest.approx(
        compose_gdp([*parts, parts[0]]), rel=1e-12
    )


def test_gdp_epsilon_vectorized_over_mu() -> None:
    mu = np.array([0.0, 0.3, 1.0, 3.0, 1.0])
    eps = gdp_epsilon(mu, 1e-5)
    assert eps.shape == (5,) and eps[0] == 0.0 and eps[2] == eps[4]
    assert np.all(np.diff(eps[:4]) > 0)
    for m, e in zip(mu, eps, strict=True):
        assert e == float(gdp_epsilon(m, 1e-5))


def test_tradeoff_function_properties() -> None:
    a = np.linspace(0.0, 1.0, 101)
    np.testing.assert_allclose(gaussian_tradeoff(a, 0.0), 1.0 - a, atol=1e-15)
    g = gaussian_tradeoff(a, 1.5)
    assert np.all(np.diff(g) <= 0) and g[0] == 1.0 and g[-1] == 0.0
    # G_μ is symmetric: its own inverse.
    np.testing.assert_allclose(gaussian_tradeoff(g, 1.5), a, atol=1e-12)
    assert gaussian_tradeoff(a[:, None], np.array([0.5, 1.0])).shape == (101, 2)
    with pytest.raises(ValueError, match="alpha"):
        gaussian_tradeoff([1.5], 1.0)
    with pytest.raises(ValueError, match="mu"):
        gaussian_tradeoff([0.5], -1.0)


@pytest.mark.parametrize("mu", [0.5, 1.0, 3.0])
def test_grid_conversion_is_conservative_and_converges(mu) -> None:
    eps = np.array([0.0, 0.5, 1.0, 2.0, 4.0])
    exact = gdp_delta(mu, eps)
    coarse = tradeoff_to_delta(alpha_grid(500), gaussian_tradeoff(alpha_grid(500), mu), eps)
    fine_grid = alpha_grid(20_000)
    fine = tradeoff_to_delta(fine_grid, gaussian_tradeoff(fine_grid, mu), eps)
    assert np.all(coarse >= exact) and np.all(fine >= exact)
    assert np.all(fine <= coarse)
    np.testing.assert_allclose(fine, exact, rtol=2e-2, atol=1e-12)
    e_grid = tradeoff_to_epsilon(fine_grid, gaussian_tradeoff(fine_grid, mu), 1e-5)
    e_exact = float(gdp_epsilon(mu, 1e-5))
    assert e_exact <= e_grid <= e_exact * 1.01


def test_grid_conversion_reports_infinity_when_grid_too_coarse() -> None:
    a = np.linspace(0.0, 1.0, 11)
    assert tradeoff_to_epsilon(a, gaussian_tradeoff(a, 1.0), 1e-8) == math.inf


def test_client_sampling_lemma_3_8() -> None:
    a = alpha_grid(300)
    f = gaussian_tradeoff(a, 2.0)
    np.testing.assert_array_equal(client_sampled_tradeoff(a, f, 1.0), np.maximum(f, -a))
    np.testing.assert_allclose(client_sampled_tradeoff(a, f, 0.0), np.maximum(f, 1.0 - a))
    g = client_sampled_tradeoff(a, f, 0.6)
    assert np.all(g >= f) and np.all(g >= 1.0 - a - 0.36)
    # More privacy (larger curve) → no larger δ.
    eps = np.array([0.0, 1.0, 3.0])
    assert np.all(tradeoff_to_delta(a, g, eps) <= tradeoff_to_delta(a, f, eps))
    with pytest.raises(ValueError, match="client_rate"):
        client_sampled_tradeoff(a, f, 1.5)
    with pytest.raises(ValueError, match="f_values"):
        client_sampled_tradeoff(a, f[:-1], 0.5)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: gdp_delta(-1.0, 1.0), "mu"),
        (lambda: gdp_delta(1.0, -0.5), "epsilon"),
        (lambda: gdp_epsilon(1.0, 0.0), "delta"),
        (lambda: gdp_epsilon(float("nan"), 1e-5), "mu"),
        (lambda: prifedsync_mu(0.0, 16, 600, 38, 93), "noise_multiplier"),
        (lambda: prifedsync_mu(1.0, 700, 600, 38, 93), "batch_size"),
        (lambda: prifedsync_mu(1.0, 16, 600, 38.5, 93), "local_steps"),
        (lambda: federated_mu([], "weak"), "client_mus"),
        (lambda: tradeoff_to_delta([0.0, 0.5], [1.0, 0.0], 1.0), "alpha"),
        (lambda: tradeoff_to_delta([0.0, 1.0], [0.2, 0.5], 1.0), "f_values"),
        (lambda: tradeoff_to_epsilon([0.0, 1.0], [1.0, 0.0], 2.0), "delta"),
        (lambda: alpha_grid(1), "n"),
    ],
)
def test_bad_input_names_the_field(call, field) -> None:
    with pytest.raises(ValueError, match=field):
        call()
