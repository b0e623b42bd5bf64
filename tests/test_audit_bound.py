"""The one-run auditing bound (Steinke, Nasr & Jagielski 2023): exact tails and its properties."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.audit.bound import (
    audit_scores,
    candidate_ks,
    epsilon_lower_bound,
    guess_counts,
    p_value,
    perfect_guessing_epsilon,
)


def _reference_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """The theorem's right-hand side in exact rational/mpmath arithmetic (independent code)."""
    mpmath.mp.dps = 50
    p = mpmath.e**eps / (1 + mpmath.e**eps)

    def pmf(x: int) -> mpmath.mpf:
        return mpmath.binomial(r, x) * p**x * (1 - p) ** (r - x)

    beta = mpmath.fsum(pmf(x) for x in range(v, r + 1))
    alpha = max(
        (mpmath.fsum(pmf(x) for x in range(v - i, v)) / i for i in range(1, v + 1)),
        default=mpmath.mpf(0),
    )
    return float(min(beta + 2 * m * delta * alpha, 1))


def test_p_value_by_hand() -> None:
    # r = 4 guesses, all correct, at p = e^ε/(1+e^ε) = 3/4: β = (3/4)^4
    eps = math.log(3.0)
    assert p_value(10, 4, 4, eps, 0.0) == pytest.approx(0.75**4, rel=1e-12)
    # window sums below v = 4: P[B=3] = 4·(3/4)³·(1/4) = 27/64 is the largest average (i = 1)
    alpha = 27 / 64
    assert p_value(10, 4, 4, eps, 0.01) == pytest.approx(0.75**4 + 2 * 10 * 0.01 * alpha, rel=1e-12)
    # 3 of 4 correct at ε = 0: P[Bin(4, 1/2) >= 3] = 5/16
    assert p_value(10, 4, 3, 0.0, 0.0) == pytest.approx(5 / 16, rel=1e-12)
    assert p_value(10, 4, 0, 2.0, 0.1) == 1.0


@settings(max_examples=60, deadline=None)
@given(
    r=st.integers(1, 60),
    frac=st.floats(0.0, 1.0),
    eps=st.floats(0.0, 6.0),
    delta=st.sampled_from([0.0, 1e-6, 1e-3, 0.02]),
)
def test_p_value_matches_exact_arithmetic(r: int, frac: float, eps: float, delta: float) -> None:
    v = int(round(frac * r))
    m = 2 * r
    assert p_value(m, r, v, eps, delta) == pytest.approx(
        _reference_p_value(m, r, v, eps, delta), rel=1e-9, abs=1e-15
    )


@settings(max_examples=40, deadline=None)
@given(
    r=st.integers(2, 400),
    delta=st.sampled_from([0.0, 1e-5, 1e-3]),
    level=st.sampled_from([0.05, 0.01, 0.05 / 48]),
)
def test_zero_at_chance_and_never_above_perfect_guessing(
    r: int, delta: float, level: float
) -> None:
    m = r + 7
    for v in range(0, r // 2 + 1):  # at most half right: no evidence against ε = 0
        assert epsilon_lower_bound(m, r, v, delta, level) == 0.0
    top = perfect_guessing_epsilon(r, level)
    assert epsilon_lower_bound(m, r, r, delta, level) <= top + 1e-12
    if delta == 0.0:
        assert epsilon_lower_bound(m, r, r, 0.0, level) == pytest.approx(top, rel=1e-9)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(r=st.integers(4, 300), delta=st.sampled_from([0.0, 1e-6, 1e-4, 1e-3]))
def test_monotone_in_correct_guesses(r: int, delta: float) -> None:
    m = 3 * r
    counts = range(r // 2, r + 1, max(1, r // 60))
    bounds = [epsilon_lower_bound(m, r, v, delta, 0.05) for v in counts]
    assert all(b <= a + 1e-9 for b, a in zip(bounds, bounds[1:], strict=False)), bounds


@settings(max_examples=25, deadline=None)
@given(r=st.integers(10, 300), frac=st.floats(0.6, 1.0))
def test_more_delta_never_raises_the_bound(r: int, frac: float) -> None:
    v = int(frac * r)
    values = [epsilon_lower_bound(2 * r, r, v, d, 0.05) for d in (0.0, 1e-6, 1e-4, 1e-2)]
    assert all(b <= a + 1e-12 for a, b in zip(values, values[1:], strict=False)), values


@settings(max_examples=25, deadline=None)
@given(r=st.integers(10, 200), frac=st.floats(0.7, 1.0), delta=st.sampled_from([0.0, 1e-5, 1e-3]))
def test_the_bound_is_the_first_crossing(r: int, frac: float, delta: float) -> None:
    """Every ε below ε̂ is rejected at the level; at ε̂ the p-value reaches it."""
    m, v, level = 2 * r, int(frac * r), 0.05
    eps = epsilon_lower_bound(m, r, v, delta, level)
    if eps == 0.0:
        assert p_value(m, r, v, 0.0, delta) >= level
        return
    for e in np.linspace(0.0, eps, 50)[:-1]:
        assert p_value(m, r, v, float(e), delta) < level
    assert p_value(m, r, v, eps, delta) == pytest.approx(level, rel=1e-6)


def test_bound_validity_by_simulation() -> None:
    """Randomized response at ε (the worst case of the theorem): ε̂ > ε in at most ~5 % of
    trials at level 5 % (here: none of 200 above the level's binomial 99.9 % quantile)."""
    rng = np.random.default_rng(7)
    eps, r = 1.0, 200
    p = math.exp(eps) / (1 + math.exp(eps))
    over = sum(
        epsilon_lower_bound(r, r, int(rng.binomial(r, p)), 0.0, 0.05) > eps for _ in range(200)
    )
    assert over <= 20  # Binomial(200, 0.05): mean 10, P[> 20] < 0.2 %


def test_guess_counts_and_ties() -> None:
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    included = np.array([True, True, False, True, False, False])
    assert guess_counts(scores, included, 2) == (4, 4)  # top {0, 1} in, bottom {4, 5} out
    assert guess_counts(scores, included, 3) == (6, 4)  # top {0, 1, 2}: 2 in; bottom: 2 out
    ties = np.zeros(4)
    inc = np.array([True, True, False, False])
    assert guess_counts(ties, inc, 1, order=np.arange(4)) == (2, 2)  # index order
    assert guess_counts(ties, inc, 1, order=np.array([3, 2, 1, 0])) == (2, 0)
    with pytest.raises(ValueError, match="k"):
        guess_counts(scores, included, 4)


def test_candidate_ks() -> None:
    assert candidate_ks(1000) == [500, 250, 125, 62, 31, 15]
    assert candidate_ks(5) == [2, 1]
    assert candidate_ks(1) == []


def test_audit_scores_bonferroni_and_best_k() -> None:
    m = 400
    included = np.arange(m) % 2 == 0
    perfect = audit_scores(included.astype(float), included, 0.0, confidence=0.95)
    ks = candidate_ks(m)
    assert perfect.level == pytest.approx(0.05 / len(ks))
    assert perfect.k == ks[0] and perfect.v == perfect.r == m  # every guess right at k = m/2
    assert perfect.epsilon == pytest.approx(perfect_guessing_epsilon(m, 0.05 / len(ks)))
    rng = np.random.default_rng(3)
    chance = audit_scores(rng.normal(size=m), included, 1e-5)
    assert chance.epsilon == 0.0


@settings(max_examples=30, deadline=None)
@given(r=st.integers(1, 500), frac=st.floats(0.0, 1.0), delta=st.sampled_from([0.0, 1e-6, 1e-3]))
def test_grid_scan_equals_the_scalar_p_value(r: int, frac: float, delta: float) -> None:
    from pdpfl.audit.bound import _p_values

    v = int(round(frac * r))
    grid = np.linspace(0.0, 8.0, 17)
    scalar = [p_value(2 * r, r, v, float(e), delta) for e in grid]
    np.testing.assert_allclose(_p_values(2 * r, r, v, grid, delta), scalar, rtol=1e-9, atol=1e-300)
