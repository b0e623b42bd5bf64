"""Rényi DP of the Gaussian and the Poisson-subsampled Gaussian mechanism, vectorized over rates.

References
----------
* Mironov, "Rényi Differential Privacy", CSF 2017 (Gaussian: ρ(α) = α / (2σ²)).
* Mironov, Talwar, Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism",
  arXiv:1908.10530, 2019 (§3.2 integer orders, §3.3 fractional orders).
* rPDP-FL, Lemma 4: the per-step RDP ρ_SGM(α, q_ij) of record-level Poisson sampling with
  personalized rate q_ij.

Every function works on a whole vector of rates at once (shape ``(n_rates, n_orders)``) in log
space. Guarantees: q = 0 gives 0; q = 1 gives α/(2σ²); every value is an upper bound on the true
RDP up to float rounding, and no order is ever dropped.

* Integer α: ``A_α − 1 = Σ_{k≥2} C(α,k) q^k (1−q)^{α−k} expm1(k(k−1)/(2σ²))`` — a sum of positive
  terms (the k = 0, 1 terms of ``A_α`` add up to the binomial mass that cancels the 1), evaluated
  with a segmented log-sum-exp, so even q = 1e-6 keeps full relative precision.
* Fractional α: the two signed series of Mironov–Talwar–Zhang §3.3 (as Opacus, keeping the
  signs). For ``i ≥ ⌈α⌉`` the combined terms alternate in sign and strictly decrease in magnitude
  (|C(α,i)| decreases, and each series' remaining factor is a decreasing Mills ratio), so the
  partial sums bracket the limit (Leibniz): we return the *upper* bracket, which is a proven
  upper bound however early the series is stopped. The result is finally clipped to
  ``[ρ(⌊α⌋), ρ(⌈α⌉)]`` (RDP is non-decreasing in α), and a numerical failure falls back to the
  proven upper bound ρ(⌈α⌉).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from pdpfl.privacy.orders import DEFAULT_ORDERS, check_orders

__all__ = ["gaussian_rdp", "poisson_gaussian_rdp", "check_rates", "check_noise_multiplier"]

#: Terms of the accelerated alternating tail: error ≤ 2·(3+√8)^−21 ≈ 1.7e-16 of its lead term.
_CVZ_TERMS = 21
#: Added to the normalized tail to cover that error and float rounding of the weighted sum.
_CVZ_MARGIN = 1e-13
#: Work-array budget (elements) for the integer-order segmented sum.
_INT_CHUNK_ELEMENTS = 1 << 21


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
    return a / (2.0 * sigma * sigma)


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
        Shape ``(n_rates, n_orders)`` (a scalar rate gives ``(1, n_orders)``).
    """
    sigma = check_noise_multiplier(noise_multiplier)
    a = check_orders(orders)
    q = check_rates(rates)
    out = np.zeros((q.size, a.size), dtype=np.float64)
    full = q == 1.0
    if full.any():
        out[full] = a / (2.0 * sigma * sigma)
    inner = (q > 0.0) & (q < 1.0)
    if inner.any():
        uq, inv = np.unique(q[inner], return_inverse=True)
        out[inner] = _subsampled_rdp(uq, sigma, a)[inv.reshape(-1)]
    return out


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
    if frac.size:
        hi = rho_int[:, [col[int(v)] for v in upper]]
        lo = np.zeros_like(hi)
        has_lo = lower >= 2
        if has_lo.any():
            lo[:, has_lo] = rho_int[:, [col[int(v)] for v in lower[has_lo]]]
        log_a = _fractional_log_a(q, sigma, frac)
        rho = log_a / (frac - 1.0)
        bad = ~np.isfinite(rho)
        rho = np.where(bad, hi, np.clip(rho, lo, hi))
        out[:, np.flatnonzero(~is_int)] = rho
    return out


def _log_expm1(x: np.ndarray) -> np.ndarray:
    """log(exp(x) − 1) for x > 0, without overflow."""
    x = np.asarray(x, dtype=np.float64)
    small = x <= 30.0
    out = np.empty_like(x)
    out[small] = np.log(np.expm1(x[small]))
    out[~small] = x[~small] + np.log1p(-np.exp(-x[~small]))
    return out


def _integer_rdp(q: np.ndarray, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """Exact ρ_SGM at integer orders ≥ 2 (MTZ 2019 §3.2), shape ``(q.size, alphas.size)``."""
    alphas = np.asarray(alphas, dtype=np.int64)
    lens = alphas - 1  # k = 2..α
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    k = np.concatenate([np.arange(2, al + 1, dtype=np.float64) for al in alphas])
    al_rep = np.repeat(alphas.astype(np.float64), lens)
    const = (
        special.gammaln(al_rep + 1.0)
        - special.gammaln(k + 1.0)
        - special.gammaln(al_rep - k + 1.0)
        + _log_expm1(k * (k - 1.0) / (2.0 * sigma * sigma))
    )
    log_q = np.log(q)
    log_1mq = np.log1p(-q)
    logit = log_q - log_1mq
    af = alphas.astype(np.float64)
    out = np.empty((q.size, alphas.size), dtype=np.float64)
    chunk = max(1, _INT_CHUNK_ELEMENTS // max(1, k.size))
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
        out[e] = np.logaddexp(0.0, log_am1) / (af - 1.0)[None, :]
    return out


def _cvz_weights(n: int) -> np.ndarray:
    """Weights w with Σ_k (−1)^k a_k ≈ Σ_k w_k a_k (Cohen, Rodriguez Villegas, Zagier 2000, Alg. 1).

    For a Hausdorff moment sequence a_k = ∫_0^1 x^k dμ the error is at most 2·S/(3+√8)^n ≤
    2·a_0/(3+√8)^n (their Proposition 1).
    """
    d = (3.0 + math.sqrt(8.0)) ** n
    d = (d + 1.0 / d) / 2.0
    b, c = -1.0, -d
    w = np.empty(n)
    for k in range(n):
        c = b - c
        w[k] = c / d
        b = (k + n) * (k - n) * b / ((k + 0.5) * (k + 1.0))
    return w


def _fractional_log_a(q: np.ndarray, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """Proven upper bound on log A_α for fractional α (MTZ 2019 §3.3), shape ``(nq, nα)``.

    A_α = Σ_i C(α,i)·(f_i + g_i) with both series of MTZ 2019 §3.3. For i < ⌈α⌉ every term is
    positive and is summed directly. For i ≥ ⌈α⌉ the terms alternate in sign and their
    magnitudes m_i = |C(α,i)|·(f_i + g_i) form a Hausdorff moment sequence: |C(α,i)| is a Beta
    integral ∫ t^{i−α−1}(1−t)^α dt / |Γ(−α)Γ(α+1)|, and f_i, g_i are, up to constants, Mills
    ratios R((i − z0)/σ), R((z0 − α + i)/σ) with R(x) = ∫_0^∞ e^{−xt−t²/2} dt — products and
    sums of moment sequences are moment sequences. So the alternating tail is summed with the
    CVZ acceleration, whose error is bounded by 2·m_{⌈α⌉}/(3+√8)^n; that bound (plus a float
    margin) is added, making the result an upper bound. NaN marks a numerical failure.
    """
    n = _CVZ_TERMS
    w = _cvz_weights(n)
    lq = np.log(q)[:, None]
    l1q = np.log1p(-q)[:, None]
    z0 = sigma * sigma * (l1q - lq) + 0.5
    inv2s2 = 1.0 / (2.0 * sigma * sigma)
    out = np.empty((q.size, alphas.size), dtype=np.float64)
    for c, alpha in enumerate(alphas):
        n0 = int(math.ceil(alpha))
        i = np.arange(n0 + n, dtype=np.float64)[None, :]
        j = alpha - i
        log_c = special.gammaln(alpha + 1.0) - special.gammaln(i + 1.0) - special.gammaln(j + 1.0)
        s0 = log_c + i * lq + j * l1q + (i * i - i) * inv2s2 + special.log_ndtr((z0 - i) / sigma)
        s1 = log_c + j * lq + i * l1q + (j * j - j) * inv2s2 + special.log_ndtr((j - z0) / sigma)
        log_m = np.logaddexp(s0, s1)
        head = special.logsumexp(log_m[:, :n0], axis=1)
        lead = log_m[:, n0]
        with np.errstate(invalid="ignore", over="ignore"):
            ratios = np.exp(log_m[:, n0:] - lead[:, None])
            tail = np.maximum(ratios @ w, 0.0) + _CVZ_MARGIN
            out[:, c] = np.logaddexp(head, lead + np.log(tail))
    out[~np.isfinite(out)] = np.nan
    return out
