"""Exact discrete Gaussian noise from a stream's random words, in integer arithmetic only.

The discrete Gaussian N_Z(0, σ²) puts mass ∝ exp(−x²/(2σ²)) on every integer x. It is sampled
here exactly -- every output has exactly the discrete Gaussian law, with no approximation and no
floating-point number between the random bits and the integer -- by the rejection samplers of
Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020):

* Algorithm 1, Bernoulli(exp(−γ)) for rational γ: for γ ∈ [0, 1], draw A_k ~ Bernoulli(γ/k)
  for k = 1, 2, … until the first A_k = 0; the index K of that failure is odd with probability
  exactly e^{−γ}; for γ > 1, ⌊γ⌋ draws of Bernoulli(e^{−1}) (all must be 1) and one of
  Bernoulli(e^{−(γ−⌊γ⌋)}).
* Algorithm 2, the discrete Laplace with integer scale t: U uniform on {0, …, t−1} accepted with
  probability e^{−U/t}, V ≥ 0 the number of Bernoulli(e^{−1}) successes before the first
  failure, X = U + t·V, a uniform sign (−0 rejected).
* Algorithm 3, the discrete Gaussian by rejection: Y ~ DLap(t), accepted with probability
  exp(−(|Y| − σ²/t)²/(2σ²)); the accepted Y ~ N_Z(0, σ²) for any integer t ≥ 1 (t = ⌊σ⌋ + 1
  makes the expected number of proposals small).

Every Bernoulli(a/b) is "a uniform integer below b is < a"; a uniform integer below b is drawn by
masked rejection from 64-bit words (``stream.words``, :mod:`pdpfl.randomness`): the low
``bit_length(b − 1)`` bits of a word, redrawn while ≥ b. Algorithm 1's Bernoulli(a/(b·k)) is one
such draw below b·k while b·k ≤ 2^62, else Bernoulli(a/b) ∧ Bernoulli(1/k) (two independent
draws), so no denominator ever leaves the int64 range.

Representation of σ² (:class:`DiscreteGaussianSpec`). A requested σ² (an int, a
:class:`fractions.Fraction`, or a float taken as the exact rational it is) is rounded **up** to
σ²_used = t·m/D with t = ⌊σ⌋ + 1, D = 2^k and m = ⌈σ²·D/t⌉ -- never less noise than asked; the
spec records σ²_used. Then σ²/t = m/D and the acceptance exponent of Algorithm 3 is the rational

    γ(Y) = (D·|Y| − m)² / (2·t·m·D)     (numerator and denominator integers).

k is chosen (:func:`discrete_gaussian_spec`) so that the denominator stays below 2^62 and the
numerator fits int64 for every |Y| ≤ ``y_safe`` (at least 64·t when σ ≲ 4.8·10^7; then
P(|Y| > y_safe) ≤ e^{−64} per proposal): the vectorized path runs in numpy int64, drawing
proposals in batches and keeping the accepted ones in index order (a choice that depends only on
the acceptance coins, so the kept draws are i.i.d. from the target law). A draw whose
intermediate values could leave int64 -- |Y| > y_safe, a Laplace counter V beyond its bound, or
any σ so large that even D = 1 overflows -- is continued (from the same state, never restarted:
restarting would bias the law) by the exact Python-int transcription of the same algorithm.
Exactness therefore never depends on luck; only speed does.

Speed: for σ²_used ≤ 2^52 :func:`sample_discrete_gaussian` draws from the exact alias-table
sampler of :mod:`pdpfl.discrete_table` (same law, ≈ 10× faster: one 64-bit word chooses a bucket
of the table, and the rejection tests compare words with precomputed integer bounds, continued
exactly on a tie); the CKS implementation below serves larger σ and is the readable reference.
See ``benchmarks/discrete_noise.py`` (samples/s against the secure float normals).

Intended call sites (the wiring phase of issue #33): a silo's distributed noise share
(:mod:`pdpfl.dp.discrete_encoding` calls :func:`sample_discrete_gaussian` with the
share's spec and the silo's ``noise-share`` stream), the private weighting noise on the signal's
grid, and the optional exact central noise (``noise: discrete``) of the DP-SGD step.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from numbers import Rational

import numpy as np

from pdpfl import discrete_table
from pdpfl.randomness import RandomStream

__all__ = [
    "DiscreteGaussianSpec",
    "discrete_gaussian_pmf",
    "discrete_gaussian_spec",
    "sample_discrete_gaussian",
    "sample_discrete_gaussian_exact",
    "uniform_below",
]

#: Largest denominator b of a vectorized Bernoulli(a/b) (a uniform integer below b < 2^62).
_MAX_DEN = 1 << 62
#: Largest acceptance numerator (D·|Y| − m)² in int64.
_MAX_NUM = (1 << 63) - 1
_ISQRT_MAX_NUM = math.isqrt(_MAX_NUM)
#: The vectorized path keeps |Y| ≤ y_safe with y_safe ≥ this many Laplace scales t if it can.
_TAIL_SCALES = 64
#: Largest power of two used as the denominator D of σ²/t = m/D.
_MAX_LOG2_DEN = 40
#: Largest Laplace counter V the vectorized loop runs to before handing a draw to the exact
#: Python-int continuation (P(V ≥ v) = e^{−v}; module constant so tests can lower it).
_MAX_VECTOR_V = 4096
#: Laplace scales t at or above this take the exact Python-int path (then t·_MAX_VECTOR_V might
#: leave int64; only σ ≳ 10^15, far beyond what the int64 acceptance test allows anyway).
_MAX_VECTOR_T = 1 << 50


# ----------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class DiscreteGaussianSpec:
    """σ² = t·m/D exactly, with the integers the samplers use (build with
    :func:`discrete_gaussian_spec`)."""

    #: Scale of the discrete Laplace proposal, ⌊σ⌋ + 1.
    t: int
    #: σ²/t = m/D.
    m: int
    #: D = 2^log2_den.
    log2_den: int
    #: The σ² that was asked for (σ²_used ≥ it).
    requested: Fraction

    @property
    def den_d(self) -> int:
        """D."""
        return 1 << self.log2_den

    @property
    def variance(self) -> Fraction:
        """σ²_used = t·m/D (exact)."""
        return Fraction(self.t * self.m, self.den_d)

    @property
    def acceptance_den(self) -> int:
        """2·t·m·D: the denominator of the acceptance exponent γ(Y)."""
        return 2 * self.t * self.m * self.den_d

    @property
    def y_safe(self) -> int:
        """Largest |Y| whose acceptance numerator (D·|Y| − m)² fits int64."""
        return (self.m + _ISQRT_MAX_NUM) // self.den_d

    @property
    def vectorized(self) -> bool:
        """True if the numpy int64 path applies (denominator below 2^62)."""
        return self.acceptance_den < _MAX_DEN and self.t < _MAX_DEN and self.m <= _ISQRT_MAX_NUM

    def to_dict(self) -> dict[str, object]:
        """JSON-able: σ² asked and used (exact ``num/den`` strings and floats), t, m, D."""
        v = self.variance
        return {
            "variance_requested": f"{self.requested.numerator}/{self.requested.denominator}",
            "variance_used": f"{v.numerator}/{v.denominator}",
            "variance_used_float": float(v),
            "laplace_scale_t": self.t,
            "m": self.m,
            "denominator_D": self.den_d,
        }


def _as_fraction(value: object, name: str) -> Fraction:
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a number > 0, got a bool")
    if isinstance(value, Fraction):
        frac = value
    elif isinstance(value, Rational):
        frac = Fraction(int(value.numerator), int(value.denominator))
    elif isinstance(value, float | np.floating):
        if not math.isfinite(float(value)):
            raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
        frac = Fraction(float(value))
    elif isinstance(value, np.integer):
        frac = Fraction(int(value))
    else:
        raise ValueError(f"{name}: expected an int, a Fraction or a float > 0, got {value!r}")
    if frac <= 0:
        raise ValueError(f"{name}: must be > 0, got {value!r}")
    return frac


def discrete_gaussian_spec(variance: object) -> DiscreteGaussianSpec:
    """The spec of N_Z(0, σ²) for a requested σ² > 0 (module docstring): σ²_used ≥ σ².

    D = 2^k with the largest k ≤ 40 such that the int64 path applies (2·t·m·D < 2^62) and
    y_safe ≥ 64·t (σ²_used then exceeds σ² by at most t/D ≈ σ/D). If no k satisfies both
    (σ ≳ 4.8·10^7), the vectorized spec with the largest y_safe (k = 0; draws with
    |Y| > y_safe take the exact Python-int path); if none is vectorized (σ ≳ 10^9), every draw
    takes that path (slow, exact).
    """
    if isinstance(variance, DiscreteGaussianSpec):
        return variance
    return _spec_of(_as_fraction(variance, "variance"))


@functools.lru_cache(maxsize=256)
def _spec_of(s2: Fraction) -> DiscreteGaussianSpec:
    """:func:`discrete_gaussian_spec` of an exact σ² (cached: a share's σ² repeats every round)."""
    t = math.isqrt(s2.numerator // s2.denominator) + 1  # ⌊σ⌋ + 1 = isqrt(⌊σ²⌋) + 1
    fallback: DiscreteGaussianSpec | None = None
    for k in range(_MAX_LOG2_DEN, -1, -1):
        d = 1 << k
        num = s2.numerator * d
        den = s2.denominator * t
        m = -(-num // den)  # ⌈σ²·D/t⌉
        spec = DiscreteGaussianSpec(t=t, m=m, log2_den=k, requested=s2)
        if not spec.vectorized:
            continue
        if fallback is None or spec.y_safe > fallback.y_safe:
            fallback = spec
        if spec.y_safe >= _TAIL_SCALES * t:
            return spec
    if fallback is not None:
        return fallback
    m = -(-s2.numerator // (s2.denominator * t))
    return DiscreteGaussianSpec(t=t, m=m, log2_den=0, requested=s2)


def discrete_gaussian_pmf(support: np.ndarray, variance: object) -> np.ndarray:
    """P[N_Z(0, σ²) = x] for integers ``support`` (float64; for tests and accounting checks).

    The normaliser Σ_x exp(−x²/(2σ²)) is summed directly over |x| ≤ 40⌈σ⌉ + 40 for σ < 1 (the
    rest is below e^{−800} of it) and by Poisson summation, √(2π)σ·(1 + 2Σ_{k=1}^{3}
    e^{−2π²σ²k²}), for σ ≥ 1 (the omitted terms are below e^{−300}). A
    :class:`DiscreteGaussianSpec` means its σ²_used."""
    if isinstance(variance, DiscreteGaussianSpec):
        variance = variance.variance
    s2 = float(_as_fraction(variance, "variance"))
    if s2 < 1.0:
        half = math.ceil(math.sqrt(s2)) * 40 + 40
        xs = np.arange(-half, half + 1, dtype=np.float64)
        z = float(np.exp(-(xs * xs) / (2.0 * s2)).sum())
    else:
        k = np.arange(1, 4, dtype=np.float64)
        z = math.sqrt(2.0 * math.pi * s2) * (
            1.0 + 2.0 * float(np.exp(-2 * math.pi**2 * s2 * k * k).sum())
        )
    x = np.asarray(support, dtype=np.float64)
    return np.exp(-(x * x) / (2.0 * s2)) / z


# ----------------------------------------------------------------------------- uniform bits


#: (bits, dtype, values per 64-bit word): a uniform word splits into independent uniform lanes.
_LANES = ((8, np.uint8, 8), (16, np.uint16, 4), (32, np.uint32, 2), (64, np.uint64, 1))


def uniform_below(bound: int, count: int, stream: RandomStream) -> np.ndarray:
    """``count`` independent uniform integers on {0, …, bound − 1} (int64), 1 ≤ bound ≤ 2^62.

    Masked rejection: the low bit_length(bound − 1) bits of a uniform lane (8, 16, 32 or 64
    bits of a stream word: the lanes of a uniform word are independent and uniform) are kept
    when < bound (probability > 1/2) and the accepted values are taken in order; a shortfall is
    drawn again. Integer operations only.
    """
    bound = int(bound)
    count = int(count)
    if not 1 <= bound <= _MAX_DEN:
        raise ValueError(f"bound: must be in [1, 2^62], got {bound}")
    out = np.empty(count, dtype=np.int64)
    if bound == 1:
        out.fill(0)
        return out
    bits = (bound - 1).bit_length()
    lane_bits, dtype, per_word = next(lane for lane in _LANES if bits <= lane[0])
    del lane_bits
    mask = dtype((1 << bits) - 1)
    lim = dtype(bound)
    filled = 0
    while filled < count:
        need = count - filled
        # expected draws need·2^bits/bound, plus a margin (sizing only: never on the values)
        draws = (need << bits) // bound + (need >> 4) + 16
        lanes = stream.words(-(-draws // per_word)).view(dtype)
        np.bitwise_and(lanes, mask, out=lanes)
        accepted = lanes[lanes < lim]
        take = min(accepted.size, need)
        out[filled : filled + take] = accepted[:take]
        filled += take
    return out


def _bernoulli_ratio(a: np.ndarray, b: int, stream: RandomStream) -> np.ndarray:
    """Independent Bernoulli(a_i / b) (0 ≤ a_i ≤ b; b ≤ 2^62; b = 1 needs no draw)."""
    if b == 1:
        return a >= 1
    return uniform_below(b, a.size, stream) < a


def _bernoulli_inverse(k: int, count: int, stream: RandomStream) -> np.ndarray:
    """``count`` independent Bernoulli(1/k)."""
    out: np.ndarray = uniform_below(k, count, stream) == 0
    return out


def _bernoulli_exp_fraction(a: np.ndarray, b: int, stream: RandomStream) -> np.ndarray:
    """Bernoulli(exp(−a_i/b)) for 0 ≤ a_i ≤ b (CKS Algorithm 1, γ ∈ [0, 1])."""
    result = np.zeros(a.size, dtype=bool)
    active = np.arange(a.size)
    k = 1
    while active.size:
        if b * k <= _MAX_DEN:  # Bernoulli(a/(b·k)) in one draw
            keep = _bernoulli_ratio(a[active], b * k, stream)
        else:  # Bernoulli(a/b) ∧ Bernoulli(1/k)
            keep = _bernoulli_ratio(a[active], b, stream)
            keep &= _bernoulli_inverse(k, active.size, stream)
        if k % 2 == 1:  # stopping at an odd K returns 1
            result[active[~keep]] = True
        active = active[keep]
        k += 1
    return result


def _bernoulli_exp_minus_one(count: int, stream: RandomStream) -> np.ndarray:
    """``count`` independent Bernoulli(e^{−1}) (Algorithm 1 with γ = 1)."""
    return _bernoulli_exp_fraction(np.ones(count, dtype=np.int64), 1, stream)


def _bernoulli_exp(num: np.ndarray, den: int, stream: RandomStream) -> np.ndarray:
    """Bernoulli(exp(−num_i/den)) for int64 num_i ≥ 0 (Algorithm 1 with γ > 1 split)."""
    whole = num // den
    result = _bernoulli_exp_fraction(num - whole * den, den, stream)
    live = np.flatnonzero(result & (whole > 0))
    left = whole[live]
    while live.size:  # ⌊γ⌋ Bernoulli(e^{−1}) draws; the first failure decides 0
        ok = _bernoulli_exp_minus_one(live.size, stream)
        result[live[~ok]] = False
        left = left[ok] - 1
        live = live[ok]
        more = left > 0
        live, left = live[more], left[more]
    return result


# ----------------------------------------------------------------------------- exact Python ints


def _py_uniform_below(bound: int, stream: RandomStream) -> int:
    """One uniform integer on {0, …, bound − 1}, any bound ≥ 1 (words concatenated)."""
    if bound == 1:
        return 0
    bits = (bound - 1).bit_length()
    nwords = -(-bits // 64)
    mask = (1 << bits) - 1
    while True:
        value = 0
        for w in stream.words(nwords).tolist():
            value = (value << 64) | int(w)
        value &= mask
        if value < bound:
            return value


def _py_bernoulli_exp_fraction(a: int, b: int, stream: RandomStream) -> bool:
    """Bernoulli(exp(−a/b)), 0 ≤ a ≤ b (CKS Algorithm 1: Bernoulli(a/(b·k)) at level k)."""
    k = 1
    while True:
        keep = _py_uniform_below(b * k, stream) < a
        if not keep:
            return k % 2 == 1
        k += 1


def _py_bernoulli_exp(num: int, den: int, stream: RandomStream) -> bool:
    """Bernoulli(exp(−num/den)) for integers num ≥ 0, den ≥ 1."""
    whole, rest = divmod(num, den)
    if not _py_bernoulli_exp_fraction(rest, den, stream):
        return False
    for _ in range(whole):
        if not _py_bernoulli_exp_fraction(1, 1, stream):
            return False
    return True


def _py_laplace_tail(v: int, stream: RandomStream) -> int:
    """Continue Algorithm 2's counter: from V = v, count Bernoulli(e^{−1}) successes."""
    while _py_bernoulli_exp_fraction(1, 1, stream):
        v += 1
    return v


def _py_discrete_laplace(t: int, stream: RandomStream) -> int:
    """One draw of the discrete Laplace with scale t (CKS Algorithm 2 with s = 1)."""
    while True:
        u = _py_uniform_below(t, stream)
        if not _py_bernoulli_exp_fraction(u, t, stream):
            continue
        x = u + t * _py_laplace_tail(0, stream)
        negative = _py_uniform_below(2, stream) == 1
        if negative and x == 0:
            continue
        return -x if negative else x


def _py_accept(y: int, spec: DiscreteGaussianSpec, stream: RandomStream) -> bool:
    """Algorithm 3's acceptance of the proposal y: Bernoulli(exp(−(D|y| − m)²/(2tmD)))."""
    e = spec.den_d * abs(y) - spec.m
    return _py_bernoulli_exp(e * e, spec.acceptance_den, stream)


def sample_discrete_gaussian_exact(variance: object, stream: RandomStream) -> int:
    """One draw of N_Z(0, σ²_used) in Python integers (CKS Algorithm 3), any σ.

    The readable reference of :func:`sample_discrete_gaussian` (same spec, same law)."""
    spec = discrete_gaussian_spec(variance)
    while True:
        y = _py_discrete_laplace(spec.t, stream)
        if _py_accept(y, spec, stream):
            return y


# ----------------------------------------------------------------------------- vectorized


def _laplace_counter(count: int, stream: RandomStream) -> tuple[np.ndarray, dict[int, int]]:
    """Algorithm 2's V for ``count`` draws: Bernoulli(e^{−1}) successes before the first failure.

    Vectorized up to :data:`_MAX_VECTOR_V`; a counter that reaches it is finished in Python ints
    and returned in the dict (index → V; its array entry is then :data:`_MAX_VECTOR_V`).
    """
    v = np.zeros(count, dtype=np.int64)
    live = np.arange(count)
    level = 0
    while live.size and level < _MAX_VECTOR_V:
        live = live[_bernoulli_exp_minus_one(live.size, stream)]
        v[live] += 1
        level += 1
    return v, {i: _py_laplace_tail(int(v[i]), stream) for i in live.tolist()}


def _discrete_laplace(m: int, t: int, stream: RandomStream) -> tuple[np.ndarray, dict[int, int]]:
    """``m`` independent discrete Laplace(t) draws (Algorithm 2, vectorized): an int64 array,
    and {index: value} for the draws whose counter was finished in Python ints (array entry 0).

    Proposals are drawn in batches (U is accepted with probability ≥ 1 − e^{−1}); the accepted
    ones are taken in index order -- a choice that depends on the acceptance coins only, never
    on the values, so the kept draws are i.i.d. from the target law.
    """
    out = np.empty(m, dtype=np.int64)
    big: dict[int, int] = {}
    have = 0
    while have < m:
        need = m - have
        u = uniform_below(t, need + (need >> 1) + (need >> 3) + 16, stream)
        u = u[_bernoulli_exp_fraction(u, t, stream)]
        v, over = _laplace_counter(u.size, stream)
        x = u + t * v  # t·V ≤ t·_MAX_VECTOR_V < 2^62 (t < 2^50 on this path)
        negative = uniform_below(2, u.size, stream) == 1
        keep = ~(negative & (x == 0))  # −0 is rejected (a counter in ``over`` has x > 0)
        np.negative(x, out=x, where=negative)
        kept = np.flatnonzero(keep)[:need]
        out[have : have + kept.size] = x[kept]
        for i, vv in over.items():
            j = int(np.count_nonzero(keep[:i]))
            if j < kept.size:
                value = int(u[i]) + t * vv
                big[have + j] = -value if negative[i] else value
                out[have + j] = 0
        have += kept.size
    return out, big


def sample_discrete_gaussian(count: int, variance: object, stream: RandomStream) -> np.ndarray:
    """``count`` independent draws of N_Z(0, σ²_used) (int64), exactly (module docstring).

    ``variance`` is σ² (int, Fraction or float; rounded up to σ²_used, see
    :func:`discrete_gaussian_spec`) or a :class:`DiscreteGaussianSpec`. Raises OverflowError if
    a draw does not fit int64 (|x| ≥ 2^63: σ ≳ 10^17; the probability is then astronomically
    small, but it is checked, not assumed). For σ²_used ≤ 2^52 (every share and central
    noise pdpfl builds) the draws come from the integer alias table of
    :mod:`pdpfl.discrete_table` (≈ 10× faster, exact by the same standard), beyond it from CKS
    Algorithm 3 vectorized; both draw proposals in batches and keep the accepted ones in
    index order.
    """
    spec = discrete_gaussian_spec(variance)
    count = int(count)
    if count < 0:
        raise ValueError(f"count: must be >= 0, got {count}")
    if spec.variance <= discrete_table.MAX_TABLE_VARIANCE:
        return discrete_table.sample(count, discrete_table.table(spec.variance), stream)
    return _sample_cks(count, spec, stream)


def _sample_cks(count: int, spec: DiscreteGaussianSpec, stream: RandomStream) -> np.ndarray:
    """:func:`sample_discrete_gaussian` by CKS Algorithm 3 vectorized (σ² > 2^52, and the
    reference the tests compare the table sampler's law with)."""
    out = np.empty(count, dtype=np.int64)
    if not spec.vectorized or spec.t >= _MAX_VECTOR_T:
        for i in range(count):
            out[i] = _checked_int64(sample_discrete_gaussian_exact(spec, stream))
        return out
    t, den, d, m = spec.t, spec.acceptance_den, spec.den_d, spec.m
    y_safe = spec.y_safe
    have = 0
    while have < count:
        need = count - have
        # Algorithm 3 accepts ≈ 76 % of proposals for σ ≳ 1 and ≥ 50 % for smaller σ
        batch = 2 * need + 16 if t == 1 else need + (need >> 1) + 16
        y, big = _discrete_laplace(batch, t, stream)
        fits = np.abs(y) <= y_safe
        for i in big:
            fits[i] = False
        accept = np.zeros(batch, dtype=bool)
        idx = np.flatnonzero(fits)
        e = d * np.abs(y[idx]) - m
        accept[idx] = _bernoulli_exp(e * e, den, stream)
        for j in np.flatnonzero(~fits).tolist():  # |Y| beyond int64 headroom: Python ints
            value = big.get(j, int(y[j]))
            if _py_accept(value, spec, stream):
                accept[j] = True
                y[j] = _checked_int64(value)
        taken = np.flatnonzero(accept)[:need]
        out[have : have + taken.size] = y[taken]
        have += taken.size
    return out


def _checked_int64(value: int) -> int:
    if not -(1 << 63) <= value < (1 << 63):
        raise OverflowError(f"discrete Gaussian draw {value} does not fit int64")
    return value
