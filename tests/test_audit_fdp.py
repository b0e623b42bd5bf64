"""The f-DP one-run audit (Mahloujifar, Melis & Chaudhuri 2025): an independent re-implementation
of its recursion, coverage by simulation, monotonicity, and the mechanism family."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.audit.bound import guess_counts
from pdpfl.audit.fdp import (
    GRID,
    FprTable,
    MechanismFamily,
    audit_family,
    gaussian_family,
    rejects,
)
from pdpfl.privacy.accountant import mechanism_epsilon
from pdpfl.privacy.risk import PrivacyCurve, privacy_curve
from pdpfl.privacy.unit import SampledGaussianPlan


def _reference_margin(mu: float, m: int, r: int, v: int, level: float) -> float:
    """The paper's Algorithm 3 (k = 2) written out independently: full arrays r_i, h_i for
    i = v..0 in 30-digit arithmetic, the GDP inverse blow-up Φ(Φ⁻¹(x) − μ) from mpmath, no early
    exit; returns r_0 + h_0 − r/m (reject when positive)."""
    mpmath.mp.dps = 30
    if v == 0:
        return -1.0
    tau = mpmath.mpf(level)

    def inverse(x: mpmath.mpf) -> mpmath.mpf:
        if x <= 0:
            return mpmath.mpf(0)
        if x >= 1:
            return mpmath.mpf(1)
        z = mpmath.sqrt(2) * mpmath.erfinv(2 * x - 1)  # Φ⁻¹(x)
        return mpmath.ncdf(z - mu)

    rr = [mpmath.mpf(0)] * (v + 1)
    hh = [mpmath.mpf(0)] * (v + 1)
    rr[v] = tau * v / m
    hh[v] = tau * (r - v) / m
    for i in range(v - 1, -1, -1):
        hh[i] = max(hh[i + 1], inverse(rr[i + 1]))
        rr[i] = min(rr[i + 1] + mpmath.mpf(i) / (r - i) * (hh[i] - hh[i + 1]), 1)
    return float(rr[0] + hh[0] - mpmath.mpf(r) / m)


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(20, 160),
    frac_r=st.floats(0.05, 1.0),
    frac_v=st.floats(0.5, 1.0),
    mu=st.floats(0.05, 4.0),
    level=st.sampled_from([0.05, 0.01, 0.001]),
)
def test_recursion_matches_an_independent_reimplementation(
    m: int, frac_r: float, frac_v: float, mu: float, level: float
) -> None:
    r = max(1, int(frac_r * m))
    v = int(round(frac_v * r))
    margin = _reference_margin(mu, m, r, v, level)
    if abs(margin) > 1e-12:  # away from the boundary, where float rounding cannot decide
        assert rejects(gaussian_family(mu), m, r, v, level) == (margin > 0)


def test_coverage_randomized_response() -> None:
    """The extremal (ε, 0)-DP mechanism (randomized response: every guess independently right
    with probability e^ε/(1+e^ε)) is rejected in at most ~level of the runs."""
    rng = np.random.default_rng(11)
    for eps in (0.5, 2.0):
        table = FprTable(PrivacyCurve(np.array([eps]), np.array([0.0]), "rr"))
        p = math.exp(eps) / (1 + math.exp(eps))
        v = rng.binomial(200, p, size=600)
        rejected = sum(rejects(table, 400, 200, int(x), 0.05) for x in v)
        assert rejected <= 0.05 * 600 + 3 * math.sqrt(0.05 * 600)  # mean 30, sd 5.3


def test_coverage_gaussian_canaries() -> None:
    """Canaries whose scores are exactly μ-GDP (N(μ, 1) in, N(0, 1) out): the claim μ is
    rejected in at most level of the runs, at every guess count."""
    rng = np.random.default_rng(12)
    for mu in (0.5, 2.0):
        inverse = gaussian_family(mu)
        rejected = 0
        for _ in range(150):
            inc = rng.random(400) < 0.5
            scores = rng.standard_normal(400) + mu * inc
            for k in (100, 25):
                r, v = guess_counts(scores, inc, k)
                rejected += rejects(inverse, 400, r, v, 0.05)
        assert rejected <= 0.05 * 300


@settings(max_examples=25, deadline=None)
@given(m=st.integers(50, 500), frac_r=st.floats(0.1, 1.0), mu=st.floats(0.1, 3.0))
def test_monotone_in_correct_guesses_and_in_the_hypothesis(
    m: int, frac_r: float, mu: float
) -> None:
    r = max(2, int(frac_r * m))
    decisions = [rejects(gaussian_family(mu), m, r, v, 0.05) for v in range(r // 2, r + 1)]
    assert decisions == sorted(decisions)  # once rejected, more correct guesses stay rejected
    for v in (r // 2, (3 * r) // 4, r):
        strong = rejects(gaussian_family(mu), m, r, v, 0.05)
        weak = rejects(gaussian_family(mu * 1.5), m, r, v, 0.05)
        assert weak <= strong  # a less private hypothesis is harder to reject


def test_at_chance_nothing_is_rejected() -> None:
    for r in (10, 100, 1000):
        assert not rejects(gaussian_family(1e-6), 2 * r, r, r // 2, 0.05)


def test_fpr_table_rounds_down() -> None:
    curve = privacy_curve(
        SampledGaussianPlan("client", noise_multiplier=2.0, delta=1e-5, rounds=20),
        0.3,
        "third-party",
        20,
        interval=None,
        max_pairs=2000,
    )
    table = FprTable(curve)
    y = np.linspace(0.001, 0.999, 301)
    exact = curve.fpr(y)
    assert all(table(float(a)) <= b + 1e-15 for a, b in zip(y, exact, strict=True))
    assert max(b - table(float(a)) for a, b in zip(y, exact, strict=True)) < 0.02


def _family(sigma: float, rounds: int) -> MechanismFamily:
    """ULDP-like users sampled every round: exactly μ-GDP with μ = √T/σ."""
    mech = SampledGaussianPlan("user", noise_multiplier=sigma, delta=1e-5, rounds=rounds)

    def epsilon(factor: float) -> float:
        e, _ = mechanism_epsilon(
            mech.with_noise(sigma * factor), [1.0], "third-party", [rounds], accountant="rdp"
        )
        return float(e[0])

    return MechanismFamily(mech, "third-party", 1.0, rounds, sigma, epsilon)


@pytest.mark.slow
def test_the_mechanism_family_catches_half_the_noise() -> None:
    """Scores of a mechanism run at half its claimed noise (μ doubled) make the f-DP ε̂ exceed
    the accountant's ε; the correct noise does not (4000 canaries, k = 500)."""
    sigma, rounds, m, level = 2.25, 10, 4000, 0.05 / 16
    family = _family(sigma, rounds)
    claimed = family.epsilon_at(0)
    mu = math.sqrt(rounds) / sigma
    rng = np.random.default_rng(5)
    inc = rng.random(m) < 0.5
    noise = rng.standard_normal(m)
    right = guess_counts(noise + mu * inc, inc, 500)
    broken = guess_counts(noise + 2 * mu * inc, inc, 500)
    ok = audit_family(family, m, *right, level)
    caught = audit_family(family, m, *broken, level)
    assert 0.0 < ok.epsilon <= claimed
    assert caught.epsilon > claimed and caught.parameter is not None and caught.parameter < 1.0
    # ε̂ is the ε of a grid member: the rejected one next to the last member not rejected
    j = round(math.log2(caught.parameter) * GRID)
    assert caught.epsilon == pytest.approx(family.epsilon_at(j))
    assert rejects(family.member(j), m, *broken, level)
    assert not rejects(family.member(j - 1), m, *broken, level)
