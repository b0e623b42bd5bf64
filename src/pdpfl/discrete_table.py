"""The fast exact discrete Gaussian for a fixed σ²: an integer alias table, exact fallbacks.

:func:`pdpfl.discrete_noise.sample_discrete_gaussian` draws N_Z(0, s) (s = σ² = t·m/D, the
spec's exact rational) here whenever s ≤ 2^52. The law is exactly N_Z(0, s): the table is a fast
path of a rejection sampler whose every probability is either an exact integer ratio or decided
by comparing uniform bits with *rigorous* integer bounds, refined without limit on a tie. No
floating-point number lies between the random words and the released integer.

The sampler (magnitude a ≥ 0 and a sign; h(a) = exp(−a²/(2s)))
---------------------------------------------------------------
* **Proposal.** Buckets k = 0 … K−1 of width w = 2^e (w ≤ σ/90, K·w ≥ 40σ): a = k·w + r with r
  uniform on {0, …, w−1}; a tail outcome T for a ≥ A = K·w; a slack outcome (rejected).
  Outcome probabilities are integers over 2^62: H_k ≥ M·h_k with h_k = h(k·w) the largest
  target weight in bucket k (H_k = ⌈M·upper bound of h_k⌉), H_T ≥ M·h(A)/(w(1−ρ)) with
  ρ = exp(−A/s), the slack 2^62 − Σ. They are drawn exactly by Walker's alias method built in
  integers (2^α columns of capacity 2^(62−α)): one 64-bit word gives the column, the level
  compared with the column's integer threshold, and the sign.
* **Acceptance** of (k, r, sign): Bernoulli(c_k) · Bernoulli(exp(−Δ)), c_k = M·h_k/H_k ≤ 1,
  Δ = (a² − (kw)²)/(2s) = r(2kw + r)/(2s) ∈ [0, ½]; (a, sign) = (0, −) is rejected. The
  proposal has mass H_k/(2^63·w) on each (a, sign), so every integer x is output with mass
  M·h(x)/(2^63·w): proportional to exp(−x²/(2s)), the exact law. Accepted proposals are kept in
  index order (a choice that depends on the acceptance coins only), so the kept draws are i.i.d.
* **Tail** (probability below e^{−800}): a = A + G, G ~ Geometric(ρ) (P(G = g) = (1−ρ)ρ^g,
  counted Bernoulli(ρ) successes), accepted with Bernoulli(c_T)·Bernoulli(exp(−g²/(2s))),
  c_T = M·h(A)/(w(1−ρ)H_T): since a² = A² + 2Ag + g², again mass M·h(a)/(2^63·w).
* **Bernoulli(c) for an irrational c** (c_k, c_T, ρ, exp(−g²/(2s))): a lazy comparison of a
  uniform real V with c (:func:`lazy_less`). V's first B bits are a word's bits U; integers
  lo ≤ c·2^B ≤ hi decide V < c when U < lo and V ≥ c when U ≥ hi; otherwise further words
  extend V and c's bounds are recomputed at the new precision (:func:`exp_neg_bounds`: interval
  arithmetic on Python integers, Taylor partial sums that bracket e^{−f}) until decided. The
  table holds c_k's bounds at B = min(63, 64 − e) bits: a tie has probability ≤ 2^{2−B}.
* **Bernoulli(exp(−Δ))** by Canonne, Kamath & Steinke (NeurIPS 2020) Algorithm 1: A_j ~
  Bernoulli(Δ/j) for j = 1, 2, … until the first A_j = 0, accepted iff that j is odd. Each
  Bernoulli(Δ/j) is the same lazy comparison: with J = ⌊2^64/(2s)⌋, the integers ⌊J·n/j⌋ and
  ⌈(J+1)·n/j⌉ (n = r(2kw + r) < 2^52) bound Δ/j·2^64, and a tie is resolved with the exact
  rational Δ/j.

Every fast decision is one of these comparisons, and every tie continues the same comparison
(never restarts it: that would bias the law), so exactness never depends on luck; only speed
does. The tests force each fallback (lower ``_C_BITS``, ``_DELTA_BITS``, ``_TAIL_SCALES``) and
check the law by chi-square against the exact pmf; :func:`exp_neg_bounds` is checked against
mpmath at 300 digits.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import numpy as np

from pdpfl.randomness import RandomStream

__all__ = ["MAX_TABLE_VARIANCE", "AliasTable", "exp_neg_bounds", "lazy_less", "sample", "table"]

#: Largest s = σ² this sampler takes (J = ⌊2^64/(2s)⌋ ≥ 2^11; n = r(2kw + r) < 2^52).
MAX_TABLE_VARIANCE = 1 << 52
#: The buckets cover a < A with A ≥ this many σ (the tail beyond has mass below e^{−800}).
_TAIL_SCALES = 40
#: Fewest buckets.
_MIN_BUCKETS = 32
#: w² · this ≤ s (Δ ≤ ½ over the buckets).
_WIDTH_FACTOR = 8192
#: Bits of the precomputed bounds of c_k (at most 63; tests lower it to force the fallback).
_C_BITS = 63
#: Bits of the fast bounds of Δ/j (at most 64; tests lower it to force the fallback).
_DELTA_BITS = 64
#: Fixed-point precision of the table's interval arithmetic.
_PREC = 192
_TWO62 = 1 << 62


# ----------------------------------------------------------------------------- exact bounds


def _exp_neg_unit(f: Fraction, prec: int) -> tuple[int, int]:
    """lo ≤ e^{−f}·2^prec ≤ hi for rational 0 ≤ f ≤ 1, in integers: the Taylor terms
    T_k = ⌊T_{k−1}·f/k⌋ (T_0 = 2^prec) are each at most k units below f^k/k!·2^prec; the
    alternating sum to the first T_N = 0 is within Σ_k k + N units of e^{−f}·2^prec (the
    remainder of an alternating series with decreasing terms is below its first omitted
    term, ≤ N units)."""
    if f == 0:
        return 1 << prec, 1 << prec
    num, den = f.numerator, f.denominator
    term = 1 << prec
    total = term
    k = 0
    while term:
        k += 1
        term = term * num // (den * k)
        total += -term if k % 2 else term
    slack = k * (k + 1) // 2 + k + 1
    return max(total - slack, 0), total + slack


def _mul_bounds(a: tuple[int, int], b: tuple[int, int], prec: int) -> tuple[int, int]:
    """The product of two bounded numbers in [0, ∞) at scale 2^prec, rounded outward."""
    return (a[0] * b[0]) >> prec, -((-(a[1] * b[1])) >> prec)


@functools.lru_cache(maxsize=4096)
def exp_neg_bounds(x: Fraction, prec: int) -> tuple[int, int]:
    """Integers lo ≤ e^{−x}·2^prec ≤ hi for a rational x ≥ 0 (hi − lo ≤ 2 for x ≤ 1; the
    bound is rigorous, no floating point: e^{−x} = (e^{−1})^⌊x⌋ · e^{−(x−⌊x⌋)})."""
    x = Fraction(x)
    if x < 0:
        raise ValueError(f"x: must be >= 0, got {x}")
    guard = prec + 32 + 2 * int(x).bit_length()
    whole, rest = divmod(x.numerator, x.denominator)
    out = _exp_neg_unit(Fraction(rest, x.denominator), guard)
    if whole:
        base = _exp_neg_unit(Fraction(1), guard)
        power = (1 << guard, 1 << guard)
        while whole:
            if whole & 1:
                power = _mul_bounds(power, base, guard)
            whole >>= 1
            if whole:
                base = _mul_bounds(base, base, guard)
        out = _mul_bounds(out, power, guard)
    shift = guard - prec
    return out[0] >> shift, -((-out[1]) >> shift)


def _rational_bounds(p: Fraction) -> Callable[[int], tuple[int, int]]:
    return lambda prec: (
        (p.numerator << prec) // p.denominator,
        -((-(p.numerator << prec)) // p.denominator),
    )


class WordSource(Protocol):
    """Anything that hands out uniform 64-bit words (a :class:`~pdpfl.randomness.RandomStream`)."""

    def words(self, n: int) -> np.ndarray: ...


def lazy_less(
    prefix: int, bits: int, bounds: Callable[[int], tuple[int, int]], stream: WordSource
) -> bool:
    """V < c for a uniform real V on [0, 1) whose first ``bits`` bits are ``prefix`` (the rest
    fresh stream words), where ``bounds(B)`` gives integers lo ≤ c·2^B ≤ hi: decided when
    prefix + 1 ≤ lo (V < c) or prefix ≥ hi (V ≥ c), else V is extended by 64 bits."""
    while True:
        lo, hi = bounds(bits)
        if prefix + 1 <= lo:
            return True
        if prefix >= hi:
            return False
        prefix = (prefix << 64) | int(stream.words(1)[0])
        bits += 64


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True, eq=False)
class AliasTable:
    """The precomputed integers of one s (module docstring); build with :func:`table`."""

    s: Fraction
    e: int
    buckets: int
    alpha: int
    prob: np.ndarray  # uint64, 2^alpha alias thresholds (≤ 2^(62−alpha))
    alias: np.ndarray  # uint64, 2^alpha alias outcomes
    c_lo: np.ndarray  # uint64, K + 2 lower bounds of c_k·2^c_bits (tail: 0, slack: 0)
    c_hi: np.ndarray  # uint64, upper bounds (tail: 2^c_bits, slack: 0)
    c_bits: int
    delta_bits: int
    j_num: int  # J = ⌊2^delta_bits/(2s)⌋
    m: int
    weights: tuple[int, ...]  # H_0 … H_{K−1}, H_T
    #: Proposals per accepted draw, × 2^16 (sizing only).
    inv_accept_q16: int

    @property
    def width(self) -> int:
        return 1 << self.e

    @property
    def tail_start(self) -> int:
        return self.buckets << self.e

    def c_bounds(self, k: int) -> Callable[[int], tuple[int, int]]:
        """Bounds of c_k (k < K) or c_T (k = K) at any precision."""
        s, m, w, h = self.s, self.m, self.width, self.weights[k]
        if k == self.buckets:
            big_a = self.tail_start

            def tail(prec: int) -> tuple[int, int]:
                p = prec + 32
                hl, hh = exp_neg_bounds(Fraction(big_a * big_a) / (2 * s), p)
                rl, rh = exp_neg_bounds(Fraction(big_a) / s, p)
                one = 1 << p
                lo = (m * hl << prec) // (w * h * (one - rl))
                hi = -((-(m * hh << prec)) // (w * h * max(one - rh, 1)))
                return lo, min(hi, 1 << prec)

            return tail
        a0 = k * w

        def bucket(prec: int) -> tuple[int, int]:
            hl, hh = exp_neg_bounds(Fraction(a0 * a0) / (2 * s), prec + 32)
            lo = (m * hl) // (h << 32)
            hi = -((-(m * hh)) // (h << 32))
            return lo, min(hi, 1 << prec)

        return bucket


def _alias(weights: list[int], alpha: int) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table of integer weights summing to 2^62 exactly: 2^alpha columns of
    capacity C = 2^(62−alpha); outcome i has probability exactly weights[i]/2^62."""
    cols = 1 << alpha
    cap = _TWO62 >> alpha
    left = list(weights) + [0] * (cols - len(weights))
    assert sum(left) == cols * cap
    prob = [cap] * cols
    alias = list(range(cols))
    small = [i for i, v in enumerate(left) if v < cap]
    large = [i for i, v in enumerate(left) if v >= cap]
    while small and large:
        s, g = small.pop(), large.pop()
        prob[s], alias[s] = left[s], g
        left[g] -= cap - left[s]
        (small if left[g] < cap else large).append(g)
    for i in small + large:  # exact integers: what is left fills its column exactly
        assert left[i] == cap
    return np.array(prob, dtype=np.uint64), np.array(alias, dtype=np.uint64)


@functools.lru_cache(maxsize=32)
def _cached(num: int, den: int, tail_scales: int, c_bits: int, delta_bits: int) -> AliasTable:
    s = Fraction(num, den)
    sig = math.isqrt(-(-num // den)) + 1  # ≥ σ
    e = 0
    while (1 << (2 * e + 2)) * _WIDTH_FACTOR <= s:
        e += 1
    w = 1 << e
    buckets = max(_MIN_BUCKETS, -(-tail_scales * sig // w))
    big_a = buckets * w
    if (w - 1) * (2 * (buckets - 1) * w + w - 1) > s:  # Δ ≤ ½ (w = 1: Δ = 0)
        raise AssertionError("bucket width too large")  # pragma: no cover (by construction)
    p = _PREC
    q = exp_neg_bounds(Fraction(w * w) / (2 * s), p)  # exp(−w²/(2s))
    q2 = _mul_bounds(q, q, p)
    h = (1 << p, 1 << p)
    step = q  # q^(2k+1)
    hs = []
    for _ in range(buckets):
        hs.append(h)
        h = _mul_bounds(h, step, p)
        step = _mul_bounds(step, q2, p)
    rho = exp_neg_bounds(Fraction(big_a) / s, p)
    one = 1 << p
    tail_hi = -((-(h[1] << p)) // (w * max(one - rho[1], 1)))  # h(A)/(w(1−ρ)), upper
    total = sum(hh for _, hh in hs) + tail_hi
    m = ((_TWO62 - buckets - 2) << p) // total
    weights = [-((-(m * hh)) >> p) for _, hh in hs]
    weights.append(-((-(m * tail_hi)) >> p))
    slack = _TWO62 - sum(weights)
    assert slack >= 0
    alpha = (buckets + 1).bit_length()
    prob, alias = _alias([*weights, slack], alpha)
    c_bits = min(63, 64 - e, c_bits)
    c_lo, c_hi = [], []
    for (hl, hh), big_h in zip(hs, weights[:-1], strict=True):
        c_lo.append((m * hl << c_bits) // (big_h << p))
        c_hi.append(min(-((-(m * hh << c_bits)) // (big_h << p)), 1 << c_bits))
    c_lo += [0, 0]
    c_hi += [1 << c_bits, 0]
    return AliasTable(
        s=s,
        e=e,
        buckets=buckets,
        alpha=alpha,
        prob=prob,
        alias=alias,
        c_lo=np.array(c_lo, dtype=np.uint64),
        c_hi=np.array(c_hi, dtype=np.uint64),
        c_bits=c_bits,
        delta_bits=delta_bits,
        j_num=(1 << delta_bits) // (2 * s),
        m=m,
        weights=tuple(weights),
        inv_accept_q16=_inverse_acceptance(s, m, w, sig),
    )


def _inverse_acceptance(s: Fraction, m: int, w: int, sig: int) -> int:
    """⌈2^16 / P(accept)⌉ for the batch size, from P(accept) = M·Z/(2^63·w) with Z = Σ_x h(x)
    (a float estimate: it sizes the batches, it never touches a drawn value)."""
    var = float(s)
    if sig < 8:
        z = 1.0 + 2.0 * sum(math.exp(-(x * x) / (2.0 * var)) for x in range(1, 64))
    else:
        z = math.sqrt(2.0 * math.pi * var)
    accept = m * z / (2.0**63 * w)
    return math.ceil(65536.0 / min(max(accept, 0.05), 1.0))


def table(variance: Fraction) -> AliasTable:
    """The table of N_Z(0, s) for a rational 0 < s ≤ :data:`MAX_TABLE_VARIANCE` (cached)."""
    s = Fraction(variance)
    if not 0 < s <= MAX_TABLE_VARIANCE:
        raise ValueError(f"variance: must be in (0, 2^52], got {s}")
    return _cached(s.numerator, s.denominator, _TAIL_SCALES, _C_BITS, _DELTA_BITS)


# ----------------------------------------------------------------------------- sampling


def _delta_bounds(tab: AliasTable, n: int, j: int) -> Callable[[int], tuple[int, int]]:
    return _rational_bounds(Fraction(n, j) / (2 * tab.s))


def _chain_from(tab: AliasTable, n: int, j: int, prefix: int, stream: RandomStream) -> bool:
    """Algorithm 1 from level j, whose first ``delta_bits`` bits were ``prefix`` (a tie):
    True iff the first A_j = 0 falls on an odd j."""
    bits = tab.delta_bits
    while lazy_less(prefix, bits, _delta_bounds(tab, n, j), stream):
        j += 1
        prefix, bits = 0, 0
    return j % 2 == 1


def _tail(tab: AliasTable, stream: RandomStream) -> int | None:
    """A tail proposal's magnitude A + G, or None if rejected (module docstring)."""
    if not lazy_less(0, 0, tab.c_bounds(tab.buckets), stream):
        return None
    big_a = tab.tail_start
    rho = functools.partial(exp_neg_bounds, Fraction(big_a) / tab.s)
    g = 0
    while lazy_less(0, 0, rho, stream):
        g += 1
    if not lazy_less(
        0, 0, functools.partial(exp_neg_bounds, Fraction(g * g) / (2 * tab.s)), stream
    ):
        return None
    return big_a + g


def sample(count: int, tab: AliasTable, stream: RandomStream) -> np.ndarray:
    """``count`` independent draws of N_Z(0, s) (int64), exactly (module docstring)."""
    out = np.empty(count, dtype=np.int64)
    have = 0
    e = tab.e
    wide = e > 0
    col_shift = np.uint64(62 - tab.alpha)
    col_mask = np.uint64((1 << tab.alpha) - 1)
    lvl_mask = np.uint64((1 << (62 - tab.alpha)) - 1)
    sign_bit = np.uint64(1 << 62)
    c_shift = np.uint64(64 - tab.c_bits)
    d_shift = np.uint64(64 - tab.delta_bits)
    r_mask = np.uint64((1 << e) - 1)
    big_j = np.uint64(tab.j_num if wide else 0)
    tail_k = np.uint64(tab.buckets)
    while have < count:
        need = count - have
        n = ((need * tab.inv_accept_q16) >> 16) + 4 * math.isqrt(need) + 16  # sizing only
        words = stream.words((3 if wide else 2) * n)
        w1, w2 = words[:n], words[n : 2 * n]
        col = (w1 >> col_shift) & col_mask
        k = np.where((w1 & lvl_mask) < tab.prob[col], col, tab.alias[col])
        neg = (w1 & sign_bit) != 0
        uc = w2 >> c_shift
        c_ok = uc < tab.c_lo[k]
        odd = np.flatnonzero(~c_ok)  # rejected, tied, tail or slack: few
        c_tie = odd[uc[odd] < tab.c_hi[k[odd]]]  # the tail included (c_hi = 2^B), not the slack
        ties: dict[int, tuple[int, int]] = {}
        if wide:
            r = w2 & r_mask
            mag = (k << np.uint64(e)) + r
            nn = r * ((k << np.uint64(e + 1)) + r)
            u3 = words[2 * n :] >> d_shift
            thr = big_j * nn
            d_ok = u3 >= thr + nn  # A_1 = 0 for sure: accepted (K = 1)
            rest = np.flatnonzero(~d_ok)  # A_1 = 1 or a tie: about a fraction Δ
            keep = (c_ok[rest] | np.isin(rest, c_tie)) & (k[rest] != tail_k)
            rest = rest[keep]
            more = u3[rest] < thr[rest]  # A_1 = 1: the chain goes on
            for i, u in zip(rest[~more].tolist(), u3[rest[~more]].tolist(), strict=True):
                ties[i] = (1, u)
            active = rest[more]
            j = 2
            while active.size:
                uj = stream.words(active.size) >> d_shift
                na = nn[active]
                lo = (big_j * na) // np.uint64(j)
                hi = ((big_j + np.uint64(1)) * na + np.uint64(j - 1)) // np.uint64(j)
                stop = uj >= hi
                go = uj < lo
                d_ok[active[stop]] = j % 2 == 1
                for i, u in zip(
                    active[~stop & ~go].tolist(), uj[~stop & ~go].tolist(), strict=True
                ):
                    ties[i] = (j, u)
                active = active[go]
                j += 1
            accept = c_ok & d_ok
        else:
            mag = k
            nn = mag
            d_ok = np.ones(n, dtype=bool)  # no Δ test when w = 1
            accept = c_ok.copy()
        zero = np.flatnonzero(mag == 0)
        accept[zero[neg[zero]]] = False  # (0, −) is rejected
        values = mag.astype(np.int64)
        for i in sorted(set(c_tie.tolist()) | ties.keys()):  # rare: continue exactly
            accept[i] = _resolve(tab, i, k, uc, neg, mag, values, (ties, d_ok, nn), stream)
        np.negative(values, out=values, where=neg)
        kept = np.flatnonzero(accept)[:need]
        out[have : have + kept.size] = values[kept]
        have += kept.size
    return out


def _resolve(
    tab: AliasTable,
    i: int,
    k: np.ndarray,
    uc: np.ndarray,
    neg: np.ndarray,
    mag: np.ndarray,
    values: np.ndarray,
    delta: tuple[dict[int, tuple[int, int]], np.ndarray, np.ndarray],
    stream: RandomStream,
) -> bool:
    """Proposal i's acceptance when one of its comparisons tied (exact continuations); a tail
    proposal's magnitude is written to ``values[i]``."""
    ki = int(k[i])
    if ki == tab.buckets:
        a = _tail(tab, stream)
        if a is None:
            return False
        if a >= 1 << 63:
            raise OverflowError(f"discrete Gaussian draw {a} does not fit int64")
        values[i] = a
        return True
    if ki > tab.buckets or (bool(neg[i]) and int(mag[i]) == 0):
        return False
    u = int(uc[i])
    if u >= int(tab.c_lo[ki]) and not lazy_less(u, tab.c_bits, tab.c_bounds(ki), stream):
        return False
    ties, d_ok, nn = delta
    if i in ties:
        j, prefix = ties[i]
        return _chain_from(tab, int(nn[i]), j, prefix, stream)
    return bool(d_ok[i])
