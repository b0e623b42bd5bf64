"""The fast exact discrete Gaussian (pdpfl.discrete_table): same law as the exact pmf and as the
CKS reference, on the fast path and on every exact fallback (forced by lowering the precision of
the fast bounds and the table's reach); its integer bounds checked against mpmath at 300 digits;
its alias table exact in integers; no floating point on the sampling path."""

from __future__ import annotations

import ast
import inspect
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import pdpfl.discrete_noise as dn
import pdpfl.discrete_table as dt
from pdpfl.discrete_noise import discrete_gaussian_spec, sample_discrete_gaussian
from pdpfl.randomness import SeededRandomness
from test_discrete_noise import _chi_square_p


def _stream(*indices: int):
    return SeededRandomness(2027).stream("discrete-table-test", *indices)


@settings(max_examples=60, deadline=None)
@given(
    num=st.integers(0, 2**64),
    den=st.integers(1, 2**62),
    prec=st.sampled_from([1, 8, 64, 200]),
)
def test_exp_neg_bounds_bracket_the_true_value(num, den, prec):
    """lo ≤ e^{−x}·2^prec ≤ hi (mpmath at 300 digits), and tight (≤ 2 units) for x ≤ 1."""
    x = Fraction(num, den)
    if x > 2000:
        x = x / (int(x) // 1000)
    lo, hi = dt.exp_neg_bounds(x, prec)
    with mpmath.workdps(300):
        true = mpmath.exp(-mpmath.mpf(x.numerator) / x.denominator) * mpmath.mpf(2) ** prec
        assert lo <= true <= hi
    if x <= 1:
        assert hi - lo <= 2


class _Words:
    """A stream that hands out given words."""

    def __init__(self, words: list[int]) -> None:
        self.left = list(words)

    def words(self, n: int) -> np.ndarray:
        out, self.left = self.left[:n], self.left[n:]
        return np.array(out, dtype=np.uint64)


@settings(max_examples=200, deadline=None)
@given(
    p_num=st.integers(0, 2**70),
    p_den=st.integers(1, 2**70),
    words=st.lists(st.integers(0, 2**64 - 1), min_size=4, max_size=4),
    split=st.integers(0, 64),
)
def test_lazy_comparison_equals_the_exact_comparison(p_num, p_den, words, split):
    """V < c decided lazily (first ``split`` bits, then whole words) equals the exact rational
    comparison of the same V (the 4 words' bits) with c, whenever it decides within them."""
    c = Fraction(min(p_num, p_den), p_den)
    prefix = words[0] >> (64 - split)
    stream = _Words(words[1:])

    def bounds(b: int) -> tuple[int, int]:
        return (c.numerator << b) // c.denominator, -((-(c.numerator << b)) // c.denominator)

    try:
        got = dt.lazy_less(prefix, split, bounds, stream)
    except (IndexError, ValueError):  # undecided within 3 more words: probability ≤ 2^-190
        return
    used = 3 - len(stream.left)
    v = Fraction(prefix, 1 << split)
    for i in range(used):
        v += Fraction(words[1 + i], 1 << (split + 64 * (i + 1)))
    width = Fraction(1, 1 << (split + 64 * used))
    # the decision holds for every V that starts with the consumed bits
    assert (v + width <= c) if got else (v >= c)


@pytest.mark.parametrize("variance", [Fraction(1, 4), 9, 200**2, 10**12, Fraction(15 * 10**6) ** 2])
def test_alias_table_is_exact_and_bounds_hold(variance):
    """Each outcome's probability rebuilt from the alias columns is exactly H_k/2^62; the
    precomputed bounds of c_k hold (mpmath); every H_k ≥ M·h_k (proposal dominates)."""
    tab = dt.table(discrete_gaussian_spec(variance).variance)
    cap = (1 << 62) >> tab.alpha
    got = [0] * (1 << tab.alpha)
    for col, (p, a) in enumerate(zip(tab.prob.tolist(), tab.alias.tolist(), strict=True)):
        got[col] += p
        got[a] += cap - p
    weights = [*tab.weights, (1 << 62) - sum(tab.weights)]
    assert got[: len(weights)] == weights and not any(got[len(weights) :])
    s, w = tab.s, tab.width
    with mpmath.workdps(300):
        for k in sorted({0, 1, 2, tab.buckets // 3, tab.buckets - 1}):
            h = mpmath.exp(
                -mpmath.mpf((k * w) ** 2) / (2 * mpmath.mpf(s.numerator) / s.denominator)
            )
            assert tab.m * h <= tab.weights[k]
            c = tab.m * h / tab.weights[k] * mpmath.mpf(2) ** tab.c_bits
            assert int(tab.c_lo[k]) <= c <= int(tab.c_hi[k])


@pytest.mark.parametrize("sigma", [200, 15 * 10**6])
def test_wide_buckets_follow_the_exact_pmf(sigma):
    """σ = 200 (the first buckets of width 2) and σ = 1.5·10^7 (an IDP-FedAvg share)."""
    x = sample_discrete_gaussian(40_000, sigma * sigma, _stream(1, sigma))
    assert _chi_square_p(x, sigma * sigma) > 1e-3


@pytest.mark.parametrize(
    ("variance", "patch"),
    [
        (9, {"_C_BITS": 3}),  # c_k decided past 3 bits for ~1/8 of the proposals
        (300**2, {"_C_BITS": 3, "_DELTA_BITS": 22}),  # and Δ/j past J = 2^22/(2s) ≈ 23
        (9, {"_TAIL_SCALES": 1, "_MIN_BUCKETS": 1}),  # the tail from |x| ≥ 4 (σ = 3)
        (190**2, {"_TAIL_SCALES": 2, "_MIN_BUCKETS": 1}),  # the tail with w = 2
    ],
    ids=["c-ties", "delta-ties", "tail", "wide-tail"],
)
def test_exact_fallbacks_keep_the_law(monkeypatch, variance, patch):
    """The exact continuations (ties of the fast bounds, the tail) run often and keep the law."""
    for name, value in patch.items():
        monkeypatch.setattr(dt, name, value)
    calls = []
    real = dt.lazy_less
    monkeypatch.setattr(dt, "lazy_less", lambda *a: calls.append(1) or real(*a))
    n = 4000 if "wide" in str(patch) or variance > 9 and "_TAIL_SCALES" in patch else 20_000
    x = sample_discrete_gaussian(n, variance, _stream(2, variance))
    assert len(calls) > 50
    assert _chi_square_p(x, variance) > 1e-3


def test_same_law_as_the_cks_reference():
    """Table sampler vs CKS Algorithm 3 (σ = 3, different consumption): two-sample test."""
    spec = discrete_gaussian_spec(9)
    ours = sample_discrete_gaussian(40_000, spec, _stream(3))
    ref = dn._sample_cks(40_000, spec, _stream(4))
    a = np.histogram(np.clip(ours, -10, 10), bins=np.arange(-10, 12))[0]
    b = np.histogram(np.clip(ref, -10, 10), bins=np.arange(-10, 12))[0]
    assert stats.chi2_contingency(np.vstack([a, b]))[1] > 1e-3
    assert _chi_square_p(ref, spec) > 1e-3


def test_variance_beyond_the_table_takes_cks():
    spec = discrete_gaussian_spec(2**53)
    assert spec.variance > dt.MAX_TABLE_VARIANCE
    x = sample_discrete_gaussian(2000, spec, _stream(5))
    assert 0.9 < float(np.std(x.astype(np.float64))) / math.sqrt(2**53) < 1.1
    with pytest.raises(ValueError, match="variance"):
        dt.table(Fraction(2**53))


_EXACT_PATH = (
    "_exp_neg_unit",
    "_mul_bounds",
    "exp_neg_bounds",
    "_rational_bounds",
    "lazy_less",
    "_alias",
    "_delta_bounds",
    "_chain_from",
    "_tail",
    "sample",
    "_resolve",
    "c_bounds",
)


def test_no_floating_point_on_the_sampling_path():
    """The sampling path and the table's bounds: no float literal, no true division but of
    exact Fractions, no float(), no math call but the integer math.isqrt, no float dtype (the
    batch-size estimate is the one float, outside the path)."""
    tree = ast.parse(inspect.getsource(dt))
    funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert set(_EXACT_PATH) <= set(funcs)
    for name in _EXACT_PATH:
        for node in ast.walk(funcs[name]):
            assert not (isinstance(node, ast.Constant) and isinstance(node.value, float)), name
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                # only Fraction division (exact rationals) is allowed
                assert name in {"_delta_bounds", "_tail", "c_bounds"}, f"{name}: division"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in {"float", "round"}, f"{name}: {node.func.id}()"
            if isinstance(node, ast.Attribute):
                assert node.attr not in {"float64", "float32", "exp", "log", "sqrt"}, name
                if isinstance(node.value, ast.Name) and node.value.id == "math":
                    assert node.attr == "isqrt", f"{name}: math.{node.attr}"  # integer root
