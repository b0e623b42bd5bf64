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

#: Relative accuracy requested from the fractional-order series (on A_α − 1).
_FRAC_RTOL = 1e-12
#: Hard cap on series terms; the upper bracket is still a proven bound when it is hit.
_FRAC_MAX_TERMS = 3000
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
        np.exp(work, out=work)
        total = np.add.reduceat(work, starts, axis=1)
        log_am1 = mx + np.log(total) + af[None, :] * log_1mq[e, None]
        out[e] = np.logaddexp(0.0, log_am1) / (af - 1.0)[None, :]
    return out


def _fractional_log_a(q: np.ndarray, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """Upper bound on log A_α for fractional α (MTZ 2019 §3.3), shape ``(q.size, alphas.size)``.

    Evaluates both signed series for all (q, α) pairs at once; a pair leaves the loop once it is
    in the alternating region (i ≥ ⌈α⌉) and its next term is below the requested accuracy. The
    returned value is the upper Leibniz bracket. NaN marks a numerical failure (caller falls back).
    """
    nq, na = q.size, alphas.size
    al = np.tile(alphas, nq)
    lq = np.repeat(np.log(q), na)
    l1q = np.repeat(np.log1p(-q), na)
    z0 = sigma * sigma * (l1q - lq) + 0.5
    lg_a1 = special.gammaln(al + 1.0)
    ceil_a = np.ceil(al)
    inv2s2 = 1.0 / (2.0 * sigma * sigma)
    n = al.size
    pos = np.full(n, -np.inf)
    neg = np.full(n, -np.inf)
    result = np.full(n, np.nan)
    active = np.arange(n)
    log_rtol = math.log(_FRAC_RTOL)
    log_floor = math.log(4e-16)
    for i in range(_FRAC_MAX_TERMS):
        if active.size == 0:
            break
        a_i = al[active]
        j = a_i - i
        log_c = lg_a1[active] - special.gammaln(i + 1.0) - special.gammaln(j + 1.0)
        zi = z0[active]
        s0 = log_c + i * lq[active] + j * l1q[active] + (i * i - i) * inv2s2
        s0 += special.log_ndtr((zi - i) / sigma)
        s1 = log_c + j * lq[active] + i * l1q[active] + (j * j - j) * inv2s2
        s1 += special.log_ndtr((j - zi) / sigma)
        log_m = np.logaddexp(s0, s1)
        ci = ceil_a[active]
        positive = (i < ci) | (np.mod(i - ci, 2.0) == 0)
        p_old = pos[active]
        n_old = neg[active]
        p_new = np.where(positive, np.logaddexp(p_old, log_m), p_old)
        n_new = np.where(positive, n_old, np.logaddexp(n_old, log_m))
        pos[active] = p_new
        neg[active] = n_new
        if i < 2:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            log_s = p_new + np.log1p(-np.exp(n_new - p_new))
            thresh = np.maximum(log_rtol + np.log(np.expm1(log_s)), log_floor + log_s)
        bracketed = i >= ci
        stop = bracketed & ((log_m < thresh) | (i == _FRAC_MAX_TERMS - 1))
        if i == _FRAC_MAX_TERMS - 1:
            stop = bracketed | stop
        if stop.any():
            # Upper Leibniz bracket: drop the last term if it was negative.
            n_up = np.where(positive, n_new, n_old)[stop]
            p_up = p_new[stop]
            with np.errstate(divide="ignore", invalid="ignore"):
                val = p_up + np.log1p(-np.exp(n_up - p_up))
            result[active[stop]] = np.where(np.isfinite(val) & (val >= 0), val, np.nan)
            active = active[~stop]
    return result.reshape(nq, na)
