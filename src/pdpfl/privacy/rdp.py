"""Rényi DP of the Gaussian and the Poisson-subsampled Gaussian mechanism, vectorized over rates.

References
----------
* Mironov, "Rényi Differential Privacy", CSF 2017 (Gaussian: ρ(α) = α / (2σ²)).
* Mironov, Talwar, Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism",
  arXiv:1908.10530, 2019 (§3.2 integer orders, §3.3 fractional orders).
* rPDP-FL, Lemma 4: the per-step RDP ρ_SGM(α, q_ij) of record-level Poisson sampling with
  personalized rate q_ij.

Every function works on a whole vector of rates at once (shape ``(n_rates, n_orders)``, or paired
``(q_i, α_i)`` with :func:`poisson_gaussian_rdp_pairs`) in log space. Guarantees: q = 0 gives 0;
q = 1 gives α/(2σ²); **every value is a proven upper bound on the true RDP at every q**, and no
order is ever dropped. The proofs assume that each elementary or special function value used
(``exp``, ``log``, ``log1p``, ``expm1``, ``gammaln``, ``log_ndtr``) is accurate to
:data:`FUNCTION_ACCURACY` (16 ulp) relative to its magnitude; the float error this can cause is
bounded and added before the logarithm.

* Integer α: ``A_α − 1 = Σ_{k≥2} C(α,k) q^k (1−q)^{α−k} expm1(k(k−1)/(2σ²))`` — a sum of positive
  terms (the k = 0, 1 terms of ``A_α`` add up to the binomial mass that cancels the 1), evaluated
  with a segmented log-sum-exp, so even q = 1e-12 keeps full relative precision. The float error
  of each log-term (bounded by the accuracy above times the magnitudes of its parts) is added.
* Fractional α: the minimum of three upper bounds on g(α) = log A_α = (α−1)·ρ(α):

  1. the two signed series of Mironov–Talwar–Zhang §3.3 (as Opacus, keeping the signs), whose
     alternating tail is summed with the Cohen–Villegas–Zagier acceleration plus its proven
     remainder bound, **plus a rigorous absolute error margin on A_α** (float error of every term
     and of the sums). A_α ≈ 1 + O(q²) is a sum of terms of size ≈ 1, so at tiny q this margin
     swamps A_α − 1 and the bound becomes useless — which is why the next two exist;
  2. the chord of the convex function g between the integer orders ⌊α⌋ and ⌈α⌉ (g(1) = 0):
     g(α) ≤ g(⌊α⌋) + (α − ⌊α⌋)·(g(⌈α⌉) − g(⌊α⌋));
  3. a Taylor bound, tight (relative error O(q)) at tiny q: with r = μ₁/μ₀, h = r − 1,
     x = q·h ≥ −q > −1 and n = ⌈α⌉, Taylor's theorem with the Lagrange remainder gives, for
     some ξ between 0 and x (so 1 + ξ ≥ 1 − q > 0),
     (1 + x)^α = Σ_{k≤m} C(α,k) x^k + C(α,m+1)(1+ξ)^{α−m−1} x^{m+1}. For non-integer α the
     sign of C(α,k) is (−1)^{k−n} for k ≥ n (the factors α − j of k!·C(α,k) are negative
     exactly for n ≤ j ≤ k − 1), so C(α,k) > 0 for k ≤ n and C(α,n+1) < 0. Two cases:

     * n odd: take m = n. The remainder has C(α,n+1) < 0, (1+ξ)^{α−n−1} > 0 and an even
       power x^{n+1} ≥ 0, so it is ≤ 0: (1 + x)^α ≤ Σ_{k≤n} C(α,k) x^k for every x > −1;
     * n even: take m = n − 1. C(α,n) > 0, (1+ξ)^{α−n} ≤ (1−q)^{α−n} (α − n < 0) and
       x^n = |x|^n, so (1 + x)^α ≤ Σ_{k<n} C(α,k) x^k + C(α,n)(1−q)^{α−n} x^n.

     Taking E_{μ₀} (A_α = E_{μ₀}[(1 + q·h)^α]) with the moments
     M_k = E_{μ₀}[h^k] = Σ_j C(k,j)(−1)^{k−j} e^{j(j−1)/(2σ²)} (M_0 = 1, M_1 = 0):
     A_α − 1 ≤ Σ_{2≤k<n} C(α,k) q^k M_k + C(α,n)·c_n·q^n M_n with c_n = 1 (n odd) or
     (1−q)^{α−n} (n even). Every term is exact up to the rounding of M_k, so the bound exceeds
     A_α − 1 only by the series' tail beyond q^n (relative O(q) at tiny q). The moments cancel
     catastrophically in floats, so they are computed once per σ in decimal arithmetic with an
     explicit error bound and rounded up (an upper bound on M_k with C(α,k) > 0 keeps an upper
     bound; orders ⌈α⌉ ≤ 16; above, the chord is within 0.1 % at tiny q).

  The result is finally clipped to ``[ρ(⌊α⌋), ρ(⌈α⌉)]`` (RDP is non-decreasing in α).

Tightness (checked against mpmath quadrature in ``tests/test_privacy_rdp.py``). Integer orders
are exact up to the float margin. A fractional order is within 1 % of the true ρ(α) whenever
Λ = (⌈α⌉ + 1)/(2σ²) ≤ 15 (0.22 % at most on a scan of Λ = 15, σ ≥ 0.5, 1e-15 ≤ q ≤ 1e-2): at
tiny q the Taylor bound's top term C(α,n)q^n·M_n ≈ q^n·e^{n(n−1)/(2σ²)} is negligible beside
C(α,2)q²·M_2 once log(1/q) ≫ Λ (q^{n−2}·M_n/M_2 ≈ e^{(n−2)(Λ − log(1/q))}), and above that q the
series' margin is small. With small σ and large fractional α (Λ > 15, e.g. σ = 0.5 and
α > 7) there is a band of q where neither holds -- the true ρ(α) is dominated by the lognormal
tail of μ₁/μ₀, far below the chord -- and the bound, still an upper bound, can be loose by large
factors (×1000 at σ = 0.5, α = 11.5, q = 10^{−10.5}); an ε minimized over the orders then
takes a neighbouring integer order (exact) instead, and stays an upper bound.
"""

from __future__ import annotations

import decimal
import functools
import math
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from pdpfl.privacy._rdp_constants import (
    _CHUNK_ELEMENTS,
    _CVZ_REMAINDER,
    _CVZ_TERMS,
    _U,
    _W,
    FUNCTION_ACCURACY,
    _log_expm1,
)
from pdpfl.privacy._rdp_pairs import integer_rdp_pairs, series_log_a_upper_pairs
from pdpfl.privacy.orders import DEFAULT_ORDERS, check_orders

#: ``(positions, integer orders) -> exact ρ`` for a fixed vector of rates (see _subsampled_pairs).
IntegerRho = Callable[[np.ndarray, np.ndarray], np.ndarray]

__all__ = [
    "gaussian_rdp",
    "poisson_gaussian_rdp",
    "poisson_gaussian_rdp_pairs",
    "two_stage_rdp",
    "check_rates",
    "check_noise_multiplier",
    "FUNCTION_ACCURACY",
]

#: Largest ⌈α⌉ for which the Taylor bound (exact moments) is used.
_TAYLOR_MAX_ORDER = 16


def check_noise_multiplier(noise_multiplier: float, name: str = "noise_multiplier") -> float:
    """Return σ as a float; ValueError naming ``name`` unless finite and > 0."""
    try:
        sigma = float(noise_multiplier)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number > 0, got {noise_multiplier!r}") from None
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"{name}: must be a finite number > 0, got {noise_multiplier!r}")
    return sigma


def check_rates(rates: ArrayLike, name: str = "rates") -> np.ndarray:
    """Return rates as a 1-d float array; ValueError naming ``name`` unless all in [0, 1]."""
    q = np.asarray(rates, dtype=np.float64).reshape(-1)
    if q.size == 0:
        raise ValueError(f"{name}: expected at least one sampling rate")
    if np.any(np.isnan(q)) or np.any(q < 0) or np.any(q > 1):
        raise ValueError(f"{name}: every sampling rate must be a number in [0, 1]")
    return q


def gaussian_rdp(noise_multiplier: float, orders: ArrayLike = DEFAULT_ORDERS) -> np.ndarray:
    """RDP of the Gaussian mechanism with sensitivity 1: ``α / (2σ²)`` (Mironov 2017, Prop. 7).

    Returns
    -------
    numpy.ndarray
        Shape ``(n_orders,)``.
    """
    sigma = check_noise_multiplier(noise_multiplier)
    a = check_orders(orders)
    return gaussian_rdp_upper(a, sigma)


def gaussian_rdp_upper(orders: np.ndarray, sigma: float) -> np.ndarray:
    """α/(2σ²) rounded up: three correctly rounded float operations can land a couple of ulps
    below the real value, so step two ulps up to keep an upper bound."""
    return np.nextafter(np.nextafter(orders / (2.0 * sigma * sigma), np.inf), np.inf)


def poisson_gaussian_rdp(
    rates: ArrayLike, noise_multiplier: float, orders: ArrayLike = DEFAULT_ORDERS
) -> np.ndarray:
    """RDP of ONE step of the Poisson-subsampled Gaussian (rPDP-FL Lemma 4; MTZ 2019).

    Parameters
    ----------
    rates
        Sampling rate(s) q in [0, 1]: a scalar or a 1-d array (one rate per record).
    noise_multiplier
        σ > 0.
    orders
        Rényi orders α > 1 (integer and fractional).

    Returns
    -------
    numpy.ndarray
        Shape ``(n_rates, n_orders)`` (a scalar rate gives ``(1, n_orders)``); every value is an
        upper bound on the true RDP.
    """
    sigma = check_noise_multiplier(noise_multiplier)
    a = check_orders(orders)
    q = check_rates(rates)
    out = np.zeros((q.size, a.size), dtype=np.float64)
    full = q == 1.0
    if full.any():
        out[full] = gaussian_rdp_upper(a, sigma)
    inner = (q > 0.0) & (q < 1.0)
    if inner.any():
        uq, inv = np.unique(q[inner], return_inverse=True)
        out[inner] = _subsampled_rdp(uq, sigma, a)[inv.reshape(-1)]
    return out


def poisson_gaussian_rdp_pairs(
    rates: ArrayLike, noise_multiplier: float, orders: ArrayLike
) -> np.ndarray:
    """ρ_SGM(α_i, q_i) for paired rates and orders (same length): shape ``(n,)``.

    The same values (bit for bit) as :func:`poisson_gaussian_rdp` at those (q, α) pairs; used by
    the continuous order refinement, where every rate has its own order.
    """
    sigma = check_noise_multiplier(noise_multiplier)
    q = check_rates(rates)
    a = check_orders(orders)
    if a.size != q.size:
        raise ValueError(f"orders: expected one order per rate ({q.size}), got {a.size}")
    out = np.zeros(q.size, dtype=np.float64)
    full = q == 1.0
    out[full] = gaussian_rdp_upper(a[full], sigma)
    inner = np.flatnonzero((q > 0.0) & (q < 1.0))
    if inner.size:
        out[inner] = _subsampled_pairs(q[inner], sigma, a[inner])
    return out


# ------------------------------------------------------------------------------ internals


def _subsampled_rdp(q: np.ndarray, sigma: float, a: np.ndarray) -> np.ndarray:
    """ρ_SGM for distinct q in (0, 1) at orders ``a``: shape ``(q.size, a.size)``."""
    is_int = a == np.floor(a)
    frac = a[~is_int]
    lower = np.floor(frac)
    upper = np.ceil(frac)
    needed = np.unique(np.concatenate([a[is_int], lower[lower >= 2], upper])).astype(np.int64)
    rho_int = _integer_rdp(q, sigma, needed)
    col = {int(v): c for c, v in enumerate(needed)}
    out = np.empty((q.size, a.size), dtype=np.float64)
    int_pos = np.flatnonzero(is_int)
    if int_pos.size:
        out[:, int_pos] = rho_int[:, [col[int(v)] for v in a[is_int]]]
    for c, alpha in zip(np.flatnonzero(~is_int), frac, strict=True):
        lo_k, hi_k = math.floor(alpha), math.ceil(alpha)
        rho_hi = rho_int[:, col[hi_k]]
        rho_lo = rho_int[:, col[lo_k]] if lo_k >= 2 else np.zeros(q.size)
        out[:, c] = _fractional_rho(q, sigma, np.full(q.size, alpha), rho_lo, rho_hi)
    return out


def _subsampled_pairs(
    q: np.ndarray, sigma: float, a: np.ndarray, integer: IntegerRho | None = None
) -> np.ndarray:
    """ρ_SGM(α_i, q_i) for q in (0, 1), paired, grouped by the integer orders involved.

    ``integer(idx, k)``, if given, returns the exact ρ at integer orders ``k`` for the rates
    ``q[idx]`` (a memo of :func:`integer_rdp_pairs`, whose value for a pair does not depend on
    the other pairs of its call), instead of computing them here.
    """
    out = np.empty(q.size, dtype=np.float64)
    is_int = a == np.floor(a)
    lo = np.floor(a).astype(np.int64)
    hi = np.ceil(a).astype(np.int64)
    # exact integer-order values needed: the order itself, or ⌊α⌋ (≥ 2) and ⌈α⌉.
    # one batched pass (:mod:`pdpfl.privacy._rdp_pairs`) over every (q_i, ⌈α_i⌉) and
    # (q_i, ⌊α_i⌋ ≥ 2) pair instead of one call per distinct integer order.
    need_lo = np.flatnonzero(~is_int & (lo >= 2))
    k = np.concatenate([hi, lo[need_lo]])
    vals = (
        integer_rdp_pairs(np.concatenate([q, q[need_lo]]), sigma, k)
        if integer is None
        else integer(np.concatenate([np.arange(q.size), need_lo]), k)
    )
    rho_hi = vals[: q.size]
    rho_lo = np.zeros(q.size)
    rho_lo[need_lo] = vals[q.size :]
    out[is_int] = rho_hi[is_int]
    f = np.flatnonzero(~is_int)
    if f.size:
        out[f] = _fractional_rho(q[f], sigma, a[f], rho_lo[f], rho_hi[f])
    return out


def _integer_rdp(q: np.ndarray, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """ρ_SGM at integer orders ≥ 2 (MTZ 2019 §3.2), shape ``(q.size, alphas.size)``.

    ``log(A_α − 1)`` is a log-sum-exp of positive terms; each log-term is a sum of a few float
    values (gammaln, k·logit, log(expm1), α·log1p(−q)) whose error is at most
    :data:`FUNCTION_ACCURACY` times their magnitudes (plus one unit each), and the sum of ≤ α
    terms in (0, 1] adds at most (α + 2) round-offs: that bound is added to ``log(A_α − 1)``.
    """
    alphas = np.asarray(alphas, dtype=np.int64)
    lens = alphas - 1  # k = 2..α
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    k = np.concatenate([np.arange(2, al + 1, dtype=np.float64) for al in alphas])
    al_rep = np.repeat(alphas.astype(np.float64), lens)
    g_a = special.gammaln(al_rep + 1.0)
    g_k = special.gammaln(k + 1.0)
    g_ak = special.gammaln(al_rep - k + 1.0)
    lem = _log_expm1(k * (k - 1.0) / (2.0 * sigma * sigma))
    const = g_a - g_k - g_ak + lem
    # magnitude of the parts of each constant (for the float-error margin), max per order
    parts = np.abs(g_a) + np.abs(g_k) + np.abs(g_ak) + np.abs(lem) + 4.0
    cmax = np.maximum.reduceat(parts, starts)
    log_q = np.log(q)
    log_1mq = np.log1p(-q)
    logit = log_q - log_1mq
    af = alphas.astype(np.float64)
    out = np.empty((q.size, alphas.size), dtype=np.float64)
    chunk = max(1, _CHUNK_ELEMENTS // max(1, k.size))
    for s in range(0, q.size, chunk):
        e = slice(s, s + chunk)
        lg = logit[e, None]
        work = k[None, :] * lg
        work += const[None, :]
        mx = np.maximum.reduceat(work, starts, axis=1)
        work -= np.repeat(mx, lens, axis=1)
        np.maximum(work, -700.0, out=work)  # rounds negligible terms UP; avoids slow underflow
        np.exp(work, out=work)
        total = np.add.reduceat(work, starts, axis=1)
        log_am1 = mx + np.log(total) + af[None, :] * log_1mq[e, None]
        margin = (
            FUNCTION_ACCURACY
            * (
                cmax[None, :]
                + af[None, :] * (np.abs(log_q[e, None]) + 2.0 * np.abs(log_1mq[e, None]))
                + np.abs(mx)
                + 4.0
            )
            + (af[None, :] + 8.0) * _U
        )
        out[e] = np.logaddexp(0.0, log_am1 + margin) / (af - 1.0)[None, :]
    return out * (1.0 + 4.0 * _U)


def _fractional_rho(
    q: np.ndarray, sigma: float, alpha: np.ndarray, rho_lo: np.ndarray, rho_hi: np.ndarray
) -> np.ndarray:
    """Upper bound on ρ(α) for fractional α (paired with q), given exact ρ(⌊α⌋), ρ(⌈α⌉).

    ``rho_lo`` is 0 where ⌊α⌋ = 1. Minimum of the series, chord and (α < 2) Taylor bounds on
    g(α) = log A_α, divided by α − 1 and clipped to [ρ(⌊α⌋), ρ(⌈α⌉)].
    """
    lo_k = np.floor(alpha)
    hi_k = np.ceil(alpha)
    t = alpha - lo_k
    # 2. chord of the convex g between the integer neighbours (g(1) = 0).
    g_lo = (lo_k - 1.0) * rho_lo
    g_hi = (hi_k - 1.0) * rho_hi
    g = (g_lo + t * (g_hi - g_lo)) * (1.0 + 8.0 * _U)
    # 3. Taylor bound (orders up to _TAYLOR_MAX_ORDER).
    small = hi_k <= _TAYLOR_MAX_ORDER
    if small.any():
        g[small] = np.minimum(g[small], _taylor_log_a_upper(q[small], sigma, alpha[small]))
    # 1. the signed MTZ series with its error margin (grouped by ⌈α⌉: one term count each).
    g_series = series_log_a_upper_pairs(q, sigma, alpha, hi_k.astype(np.int64))
    g = np.minimum(g, np.where(np.isnan(g_series), np.inf, g_series))
    rho = g / (alpha - 1.0)
    result: np.ndarray = np.clip(rho, rho_lo, rho_hi)
    return result


def _series_log_a_upper(q: np.ndarray, sigma: float, alpha: np.ndarray, n0: int) -> np.ndarray:
    """Upper bound on log A_α from the MTZ 2019 §3.3 series (paired q, α with ⌈α⌉ = n0).

    One ⌈α⌉ at a time: the readable reference of the batched kernel that the accountant runs
    (:func:`pdpfl.privacy._rdp_pairs.series_log_a_upper_pairs`, the same bits).

    A_α = Σ_i C(α,i)·(f_i + g_i) with both series of MTZ 2019 §3.3. For i < ⌈α⌉ every term is
    positive and is summed directly. For i ≥ ⌈α⌉ the terms alternate in sign and their
    magnitudes m_i = |C(α,i)|·(f_i + g_i) form a Hausdorff moment sequence: |C(α,i)| is a Beta
    integral ∫ t^{i−α−1}(1−t)^α dt / |Γ(−α)Γ(α+1)|, and f_i, g_i are, up to constants, Mills
    ratios R((i − z0)/σ), R((z0 − α + i)/σ) with R(x) = ∫_0^∞ e^{−xt−t²/2} dt — products and
    sums of moment sequences are moment sequences. So the alternating tail is summed with the
    CVZ acceleration, whose error is bounded by 2·m_{⌈α⌉}/(3+√8)^n.

    Error margin added to A_α before the log: every log-term s is a sum of parts p_k whose float
    error is at most ``FUNCTION_ACCURACY·(Σ|p_k| + count)`` (the argument of ``log_ndtr`` carries
    the error of z0, amplified by |d log_ndtr/dx| ≤ |x| + 1), so m_i is within a relative
    ``expm1`` of that; the sums add (2N + 10) round-offs of Σ m_i; plus the CVZ remainder.
    NaN marks a numerical failure (the caller then uses the other bounds).
    """
    n = _CVZ_TERMS
    lq = np.log(q)[:, None]
    l1q = np.log1p(-q)[:, None]
    s2 = sigma * sigma
    z0 = s2 * (l1q - lq) + 0.5
    z0_err = (s2 * (np.abs(lq) + np.abs(l1q)) + np.abs(z0) + 1.0) / sigma
    inv2s2 = 1.0 / (2.0 * s2)
    a = alpha[:, None]
    i = np.arange(n0 + n, dtype=np.float64)[None, :]
    j = a - i
    # log|C(α, i)| by the recurrence C(α, i) = C(α, i−1)·(α − i + 1)/i (a cumulative sum of
    # logs); its float error is at most (FUNCTION_ACCURACY + 2·i·u) times the cumulative sum of
    # the magnitudes of the added logs.
    num = np.log(np.abs(a - i[:, 1:] + 1.0))
    den = np.log(i[:, 1:])
    log_c = np.zeros((alpha.size, i.size))
    np.cumsum(num - den, axis=1, out=log_c[:, 1:])
    common = np.zeros((alpha.size, i.size))
    np.cumsum(np.abs(num) + den, axis=1, out=common[:, 1:])
    common *= 1.0 + 2.0 * i * _U / FUNCTION_ACCURACY
    common += 8.0
    x = (z0 - i) / sigma
    t = special.log_ndtr(x)
    u = i * lq
    v = j * l1q
    quad = (i * i - i) * inv2s2
    s0 = log_c + u + v + quad + t
    # |d log_ndtr(x)/dx| = φ(x)/Φ(x) ≤ max(−x, 0) + 1
    p0 = common + np.abs(u) + np.abs(v) + quad + np.abs(t)
    p0 += (np.maximum(-x, 0.0) + 1.0) * (z0_err + i / sigma)
    x = (j - z0) / sigma
    t = special.log_ndtr(x)
    u = j * lq
    v = i * l1q
    quad = (j * j - j) * inv2s2
    s1 = log_c + u + v + quad + t
    p1 = common + np.abs(u) + np.abs(v) + np.abs(quad) + np.abs(t)
    p1 += (np.maximum(-x, 0.0) + 1.0) * (z0_err + np.abs(j) / sigma)
    top = np.maximum(s0.max(axis=1), s1.max(axis=1))[:, None]
    sums = (2.0 * (n0 + n) + 10.0) * _U
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e0 = np.exp(s0 - top)
        e1 = np.exp(s1 - top)
        m = e0 + e1
        # expm1(y) ≤ y(1 + y) for 0 ≤ y ≤ 1 (larger y never occur for finite terms)
        y0 = FUNCTION_ACCURACY * p0
        y1 = FUNCTION_ACCURACY * p1
        err = (e0 * (y0 * (1.0 + y0) + sums) + e1 * (y1 * (1.0 + y1) + sums)).sum(axis=1)
        bad = (y0 > 1.0).any(axis=1) | (y1 > 1.0).any(axis=1)
        head = m[:, :n0].sum(axis=1)
        lead = m[:, n0]
        tail = np.maximum((m[:, n0:] * _W).sum(axis=1), 0.0)  # no BLAS: batch-independent
        err += lead * _CVZ_REMAINDER
        out = top[:, 0] + np.log(head + tail + err)
        out = np.maximum(out, 0.0)  # A_α ≥ 1
    out = out * (1.0 + 4.0 * _U)
    out[bad] = np.nan
    out[~np.isfinite(out)] = np.nan
    result: np.ndarray = out
    return result


@functools.lru_cache(maxsize=64)
def _moments_upper(sigma: float, kmax: int) -> tuple[float, ...]:
    """Upper bounds (floats) on M_k = E_{μ₀}[(r − 1)^k], k = 0..kmax, for noise multiplier σ.

    M_k = Σ_j C(k,j)(−1)^{k−j} exp(j(j−1)/(2σ²)) is computed in decimal arithmetic at a
    precision P that makes the rounding error bound err ≤ 10^{2−P}·Σ_j C(k,j)·e_j·(1 + |arg_j|)
    (every decimal operation is correctly rounded to P digits) at most 1e-25·|M_k|; M_k + err is
    rounded up to a float. ``inf`` where it overflows a float or P would exceed 4000 digits.
    """
    out = [1.0, 0.0]
    sig = decimal.Decimal(sigma)
    for k in range(2, kmax + 1):
        prec = 40
        value = math.inf
        while prec <= 4000:
            with decimal.localcontext() as ctx:
                ctx.prec = prec
                ctx.Emax = 10**9
                ctx.Emin = -(10**9)
                a = 1 / (sig * sig)
                total = decimal.Decimal(0)
                size = decimal.Decimal(0)
                try:
                    for j in range(k + 1):
                        arg = a * j * (j - 1) / 2
                        term = math.comb(k, j) * arg.exp()
                        total += term if (k - j) % 2 == 0 else -term
                        size += term * (1 + arg)
                except decimal.Overflow:  # exp beyond 10^(10^9): M_k is no float either
                    break
                err = size * decimal.Decimal(10) ** (2 - prec)
                if total > 0 and err <= total * decimal.Decimal("1e-25"):
                    upper = total + err
                    try:
                        f = float(upper)
                    except OverflowError:  # pragma: no cover - float() saturates to inf
                        f = math.inf
                    if math.isfinite(f) and decimal.Decimal(f) < upper:
                        f = math.nextafter(f, math.inf)
                    value = f
                    break
            prec *= 2
        out.append(value)
    return tuple(out)


def _taylor_log_a_upper(q: np.ndarray, sigma: float, alpha: np.ndarray) -> np.ndarray:
    """Upper bound on log A_α from the order-⌈α⌉ Taylor expansion (module docstring, bound 3)."""
    out = np.full(q.size, np.inf)
    n_all = np.ceil(alpha).astype(np.int64)
    for n in np.unique(n_all):
        sel = np.flatnonzero(n_all == n)
        m = _moments_upper(float(sigma), int(n))
        if not all(math.isfinite(v) for v in m[: n + 1]):
            continue
        qa, aa = q[sel], alpha[sel]
        lq = np.log(qa)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            total = np.zeros(sel.size)
            coef = np.ones(sel.size)  # C(α, k), built up as a product
            for k in range(1, int(n)):
                coef = coef * (aa - k + 1.0) / k
                if k >= 2:
                    total += coef * np.exp(k * lq) * m[k]
            coef = coef * (aa - n + 1.0) / n  # C(α, n) > 0
            # n odd: the order-(n+1) remainder is ≤ 0; n even: (1+ξ)^{α−n} ≤ (1−q)^{α−n}
            log_c_n = 0.0 if n % 2 == 1 else (aa - n) * np.log1p(-qa)
            total += coef * np.exp(log_c_n + n * lq) * m[n]
            bound = np.log1p(total * (1.0 + FUNCTION_ACCURACY * (4.0 * n + 8.0)))
        out[sel] = np.where(np.isfinite(bound) & (total >= 0), bound * (1.0 + 4.0 * _U), np.inf)
    return out


def two_stage_rdp(
    step_rdp: np.ndarray, steps: int, client_rate: float, orders: ArrayLike
) -> np.ndarray:
    """RDP of one rPDP-FL round, ρ^{τ,λ}(α) = ln(1 − λ + λ·e^{(α−1)τρ})/(α−1) (Lemma 6).

    No input checks (internal fast path; :func:`pdpfl.privacy.two_stage.round_rdp` validates).
    ``orders`` broadcasts against ``step_rdp`` (a row of orders, or one order per record).
    Computed in log space: ``log1p(λ·expm1(x))`` for small x = (α−1)·τ·ρ and
    ``logaddexp(log(1−λ), log λ + x)`` otherwise; λ = 1 gives exactly τ·ρ.
    """
    a = np.asarray(orders, dtype=np.float64)
    rho = np.asarray(step_rdp, dtype=np.float64)
    tau = int(steps)
    lam = float(client_rate)
    if lam == 1.0:
        return tau * rho
    x = (a - 1.0) * tau * rho
    with np.errstate(over="ignore"):
        small = x < 1.0
        out = np.where(
            small,
            np.log1p(lam * np.expm1(np.minimum(x, 1.0))),
            np.logaddexp(np.log1p(-lam), np.log(lam) + x),
        )
    return out / (a - 1.0)
