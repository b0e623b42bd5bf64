"""The exact discrete Gaussian sampler (Canonne, Kamath & Steinke 2020, Algorithms 1-3).

Every draw must have exactly the N_Z(0, σ²_used) law: chi-square against the exact pmf from
σ = 0.5 to 10^6 and in the tails, on the vectorized int64 path and on the Python-int
continuations (forced by lowering their thresholds), and against OpenDP's sampler when it is
installed. No floating-point operation lies on the path from the random words to the integer
(checked on the module's syntax tree). Streams are seeded so every test is deterministic.
"""

from __future__ import annotations

import ast
import inspect
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

import pdpfl.discrete_noise as dn
from pdpfl.discrete_noise import (
    DiscreteGaussianSpec,
    discrete_gaussian_pmf,
    discrete_gaussian_spec,
    sample_discrete_gaussian,
    sample_discrete_gaussian_exact,
    uniform_below,
)
from pdpfl.randomness import SeededRandomness


def _stream(*indices: int):
    return SeededRandomness(2026).stream("discrete-test", *indices)


def _chi_square_p(samples: np.ndarray, variance: object, bins: int = 40) -> float:
    """Chi-square p-value of ``samples`` against the exact pmf: integer bins (merged where σ is
    large) over ±7σ plus the two tails, expected counts ≥ 5."""
    spec = discrete_gaussian_spec(variance)
    sigma = math.sqrt(float(spec.variance))
    lo, hi = -math.ceil(7 * sigma) - 1, math.ceil(7 * sigma) + 1
    if hi - lo <= bins:
        edges = np.arange(lo, hi + 1)
    else:
        edges = np.unique(np.linspace(lo, hi, bins + 1).round().astype(np.int64))
    probs = _bin_probs(edges, spec)
    obs = np.histogram(samples, bins=edges)[0]
    obs = np.concatenate([[np.sum(samples < edges[0])], obs, [np.sum(samples >= edges[-1])]])
    exp = np.concatenate([[probs[0]], probs[1:-1], [probs[-1]]]) * samples.size
    keep = exp >= 5
    # merge the sparse bins into one
    o = np.append(obs[keep], obs[~keep].sum())
    e = np.append(exp[keep], exp[~keep].sum())
    if e[-1] < 5:
        o, e = o[:-1], e[:-1]
    return float(stats.chisquare(o, e * o.sum() / e.sum()).pvalue)


def _bin_probs(edges: np.ndarray, spec: DiscreteGaussianSpec) -> np.ndarray:
    """[P(X < e_0), P(e_0 ≤ X < e_1), …, P(X ≥ e_last)] from the exact pmf (the two tails by
    symmetry, the middle by summation, or by the Gaussian CDF when σ is large)."""
    sigma = math.sqrt(float(spec.variance))
    if sigma < 2000:
        xs = np.arange(edges[0], edges[-1])
        pm = discrete_gaussian_pmf(xs, spec)
        mid = np.add.reduceat(pm, edges[:-1] - edges[0])
    else:  # σ ≥ 2000: the discrete pmf equals the sampled normal density to 1e-10 relative
        cdf = stats.norm.cdf((edges - 0.5) / sigma)
        mid = np.diff(cdf)
    tail = (1.0 - mid.sum()) / 2.0
    return np.concatenate([[tail], mid, [tail]])


@pytest.mark.parametrize(
    "variance", [Fraction(1, 4), 1, Fraction(5, 2), 100, 10**6, 10**12], ids=lambda v: str(v)
)
def test_samples_follow_the_exact_pmf(variance):
    """σ from 0.5 to 10^6: chi-square against the exact pmf of σ²_used."""
    x = sample_discrete_gaussian(40_000, variance, _stream(1))
    assert x.dtype == np.int64
    assert _chi_square_p(x, variance) > 1e-3


def test_tails_have_the_exact_mass():
    """Beyond 3σ and 4σ (σ = 3): binomial tests of the tail mass against the exact pmf."""
    spec = discrete_gaussian_spec(9)
    x = sample_discrete_gaussian(200_000, spec, _stream(2))
    for k in (10, 13):  # P(|X| ≥ 10) ≈ 1e-3, P(|X| ≥ 13) ≈ 1.5e-5 ... both sides
        support = np.arange(k, 200)
        p = 2 * float(discrete_gaussian_pmf(support, spec).sum())
        hits = int(np.sum(np.abs(x) >= k))
        assert stats.binomtest(hits, x.size, p).pvalue > 1e-3


def test_small_sigma_point_probabilities():
    """σ = 0.5: P(0), P(±1), P(±2) individually (binomial tests)."""
    x = sample_discrete_gaussian(60_000, Fraction(1, 4), _stream(3))
    for v in (0, 1, -1, 2, -2):
        p = float(discrete_gaussian_pmf(np.array([v]), Fraction(1, 4))[0])
        assert stats.binomtest(int(np.sum(x == v)), x.size, p).pvalue > 1e-3


def test_python_int_continuations_keep_the_law(monkeypatch):
    """Force the rare branches: a Laplace counter beyond its vectorized bound (every V ≥ 1) and
    proposals beyond the int64 headroom (|Y| > 3) continue exactly in Python ints (CKS path,
    which serves σ² > 2^52; σ² = 9 otherwise takes the alias table)."""
    monkeypatch.setattr(dn, "_MAX_VECTOR_V", 1)
    x = dn._sample_cks(4000, discrete_gaussian_spec(9), _stream(4))
    assert _chi_square_p(x, 9) > 1e-3

    class Tight(DiscreteGaussianSpec):
        @property
        def y_safe(self) -> int:
            return 3

    base = discrete_gaussian_spec(9)
    tight = Tight(t=base.t, m=base.m, log2_den=base.log2_den, requested=base.requested)
    x = dn._sample_cks(4000, tight, _stream(5))
    assert np.mean(np.abs(x) > 3) > 0.1  # the continuation ran for many draws
    assert _chi_square_p(x, 9) > 1e-3


def test_the_scalar_reference_sampler_has_the_same_law():
    s = _stream(7)
    x = np.array([sample_discrete_gaussian_exact(Fraction(7, 3), s) for _ in range(2000)])
    assert _chi_square_p(x, Fraction(7, 3)) > 1e-3


def test_huge_sigma_takes_the_exact_python_path():
    """σ = 10^10: beyond the int64 path; the draws are exact Python-int draws (spread checked)."""
    spec = discrete_gaussian_spec(10**20)
    assert not spec.vectorized
    x = sample_discrete_gaussian(400, spec, _stream(8))
    assert x.dtype == np.int64
    assert 0.8 < float(np.std(x.astype(np.float64))) / 1e10 < 1.2


def test_spec_rounds_the_variance_up_and_records_it():
    for v in (Fraction(1, 4), Fraction(10, 3), 2.5, 10**6 + 1, Fraction(10**12, 7), 3.3e15):
        spec = discrete_gaussian_spec(v)
        asked = Fraction(v)
        assert spec.variance >= asked and spec.requested == asked
        assert spec.variance <= asked * (1 + Fraction(1, 10**6)) + Fraction(1, 2**20)
        assert spec.t == math.isqrt(asked.numerator // asked.denominator) + 1
        assert spec.t * spec.m * 1 == spec.variance * spec.den_d  # σ² = t·m/D exactly
        if spec.vectorized:
            assert spec.acceptance_den < 2**62 and spec.m <= math.isqrt(2**63 - 1)
            assert (spec.den_d * spec.y_safe - spec.m) ** 2 < 2**63
        d = spec.to_dict()
        assert Fraction(str(d["variance_used"])) == spec.variance


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "3", None])
def test_spec_refuses_bad_variances(bad):
    with pytest.raises(ValueError, match="variance"):
        discrete_gaussian_spec(bad)


@pytest.mark.parametrize("bound", [2, 3, 1000, 2**40 + 3])
def test_uniform_below_is_uniform(bound):
    u = uniform_below(bound, 30_000, _stream(9, bound % 1000))
    assert u.min() >= 0 and u.max() < bound
    if bound <= 1000:
        counts = np.bincount(u, minlength=bound)
    else:  # 50 equal-width classes
        counts = np.bincount((u * 50) // bound, minlength=50)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_uniform_below_refuses_out_of_range_bounds():
    with pytest.raises(ValueError, match="bound"):
        uniform_below(0, 3, _stream(10))
    with pytest.raises(ValueError, match="bound"):
        uniform_below(2**62 + 1, 3, _stream(10))


@pytest.mark.parametrize("num,den", [(1, 3), (5, 2), (7, 1)])
def test_bernoulli_exp_has_probability_exp_minus_gamma(num, den):
    """CKS Algorithm 1 (γ = 1/3, 5/2, 7) on the vectorized path and in Python ints."""
    n = 40_000
    v = dn._bernoulli_exp(np.full(n, num, dtype=np.int64), den, _stream(11, num))
    p = math.exp(-num / den)
    assert stats.binomtest(int(v.sum()), n, p).pvalue > 1e-3
    s = _stream(12, num)
    w = sum(dn._py_bernoulli_exp(num, den, s) for _ in range(4000))
    assert stats.binomtest(int(w), 4000, p).pvalue > 1e-3


#: The functions on the path from random words to the released integer.
_EXACT_PATH = (
    "uniform_below",
    "_bernoulli_ratio",
    "_bernoulli_inverse",
    "_bernoulli_exp_fraction",
    "_bernoulli_exp_minus_one",
    "_bernoulli_exp",
    "_py_uniform_below",
    "_py_bernoulli_exp_fraction",
    "_py_bernoulli_exp",
    "_py_laplace_tail",
    "_py_discrete_laplace",
    "_py_accept",
    "sample_discrete_gaussian_exact",
    "_laplace_counter",
    "_discrete_laplace",
    "sample_discrete_gaussian",
    "_checked_int64",
)


def test_no_floating_point_on_the_sampling_path():
    """Review, mechanised: the sampling functions contain no float literal, no true division,
    no float()/math call and no float dtype (integer arithmetic from words to integers)."""
    tree = ast.parse(inspect.getsource(dn))
    funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert set(_EXACT_PATH) <= set(funcs)
    for name in _EXACT_PATH:
        for node in ast.walk(funcs[name]):
            assert not (isinstance(node, ast.Constant) and isinstance(node.value, float)), name
            assert not isinstance(node, ast.Div), f"{name}: true division"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in {"float", "round"}, f"{name}: {node.func.id}()"
            if isinstance(node, ast.Attribute):
                assert node.attr not in {"float64", "float32", "exp", "log", "sqrt"}, name
                assert not (isinstance(node.value, ast.Name) and node.value.id == "math"), name


@pytest.mark.slow
def test_opendp_cross_check():
    """An independent exact sampler (OpenDP) and ours draw the same law (σ = 3): two-sample
    chi-square on |x| ≤ 8 and the tail."""
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    meas = dp.m.make_gaussian(
        dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int), scale=3.0
    )
    theirs = np.asarray(meas([0] * 10_000), dtype=np.int64)
    ours = sample_discrete_gaussian(10_000, 9, _stream(13))
    a = np.histogram(np.clip(ours, -9, 9), bins=np.arange(-9, 11))[0]
    b = np.histogram(np.clip(theirs, -9, 9), bins=np.arange(-9, 11))[0]
    assert stats.chi2_contingency(np.vstack([a, b]))[1] > 1e-3
