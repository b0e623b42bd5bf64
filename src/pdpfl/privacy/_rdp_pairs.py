"""Batched kernels of :mod:`pdpfl.privacy.rdp` for paired (q_i, α_i) with mixed orders.

The same float operations, element for element, as ``_integer_rdp`` (one order at a time) and
``_series_log_a_upper`` (one ⌈α⌉ at a time), but in one vectorized pass over every pair instead
of one Python-level call per distinct order: the rates × orders search and the continuous
order refinement (:mod:`pdpfl.privacy._search_orders`) visit hundreds of distinct orders with a
handful of rates each, so the per-call overhead dominated (the certified calibration's fit).

Bit-identical results (``tests/test_privacy_rdp.py`` checks pairs against the one-order path):
elementwise operations are evaluated in the same order on the same values; maxima are exact;
every sum over one pair's terms is computed as the one-order kernel computes it: an
``np.add.reduceat`` segment (sequential) for the integer orders, a row ``sum`` (numpy's pairwise
summation, which depends on the length: one call per distinct ⌈α⌉ over exactly that row
length) for the series; ``np.cumsum`` is sequential, so padding after a row leaves its prefix
sums unchanged. The error margins are those of the one-order kernels (their docstrings).
"""

from __future__ import annotations

import numpy as np
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

#: Padded terms per block of the batched series (a few arrays of this size stay in cache).
_BLOCK_ELEMENTS = 1 << 15


def _segments(lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start of each segment and, per element, the position inside its segment."""
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    pos = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(starts, lens)
    return starts, pos


def integer_rdp_pairs(q: np.ndarray, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """ρ_SGM(α_i, q_i) at integer orders α_i ≥ 2 (paired): shape ``(q.size,)``.

    The computation of ``pdpfl.privacy.rdp._integer_rdp`` (MTZ 2019 §3.2, its float-error
    margin included), one log-sum-exp segment of α_i − 1 terms per pair.
    """
    accuracy, unit, chunk_elements = FUNCTION_ACCURACY, _U, _CHUNK_ELEMENTS
    alphas = np.asarray(alphas, dtype=np.int64)
    uniq, inv = np.unique(alphas, return_inverse=True)
    inv = inv.reshape(-1)
    # per distinct order: the constants of its terms k = 2..α (as in _integer_rdp)
    ulens = uniq - 1
    ustarts = np.concatenate([[0], np.cumsum(ulens)[:-1]]).astype(np.int64)
    k = np.concatenate([np.arange(2, al + 1, dtype=np.float64) for al in uniq])
    al_rep = np.repeat(uniq.astype(np.float64), ulens)
    g_a = special.gammaln(al_rep + 1.0)
    g_k = special.gammaln(k + 1.0)
    g_ak = special.gammaln(al_rep - k + 1.0)
    lem = _log_expm1(k * (k - 1.0) / (2.0 * sigma * sigma))
    const = g_a - g_k - g_ak + lem
    parts = np.abs(g_a) + np.abs(g_k) + np.abs(g_ak) + np.abs(lem) + 4.0
    ucmax = np.maximum.reduceat(parts, ustarts)
    log_q = np.log(q)
    log_1mq = np.log1p(-q)
    logit = log_q - log_1mq
    out = np.empty(q.size, dtype=np.float64)
    plens = ulens[inv]
    ends = np.cumsum(plens)
    s = 0
    while s < q.size:
        # pairs [s, e): at most chunk_elements terms (at least one pair)
        e = max(s + 1, int(np.searchsorted(ends, ends[s] - plens[s] + chunk_elements, "right")))
        lens = plens[s:e]
        starts, pos = _segments(lens)
        flat = np.repeat(ustarts[inv[s:e]], lens) + pos
        work = k[flat] * np.repeat(logit[s:e], lens)
        work += const[flat]
        mx = np.maximum.reduceat(work, starts)
        work -= np.repeat(mx, lens)
        np.maximum(work, -700.0, out=work)
        np.exp(work, out=work)
        total = np.add.reduceat(work, starts)
        af = alphas[s:e].astype(np.float64)
        lq, l1q = log_q[s:e], log_1mq[s:e]
        log_am1 = mx + np.log(total) + af * l1q
        margin = (
            accuracy * (ucmax[inv[s:e]] + af * (np.abs(lq) + 2.0 * np.abs(l1q)) + np.abs(mx) + 4.0)
            + (af + 8.0) * unit
        )
        out[s:e] = np.logaddexp(0.0, log_am1 + margin) / (af - 1.0)
        s = e
    return out * (1.0 + 4.0 * unit)


def series_log_a_upper_pairs(
    q: np.ndarray, sigma: float, alpha: np.ndarray, n0: np.ndarray
) -> np.ndarray:
    """Upper bound on log A_α from the MTZ 2019 §3.3 series, paired (q_i, α_i), ⌈α_i⌉ = n0_i.

    The computation of ``pdpfl.privacy.rdp._series_log_a_upper`` (its docstring gives the
    bound and its error margin) for rows with different ⌈α⌉: rows are sorted by ⌈α⌉ and padded
    to the widest row of their chunk; maxima and sums only see each row's own n0_i + N terms.
    NaN marks a numerical failure (the caller then uses the other bounds).
    """
    out = np.empty(q.size, dtype=np.float64)
    n0 = np.asarray(n0, dtype=np.int64)
    order = np.argsort(n0, kind="stable")
    width = n0[order] + _CVZ_TERMS
    s = 0
    while s < order.size:
        # rows [s, e) of the sorted order: padded to at most 1.25× the narrowest row's width
        # (little wasted work) and at most _BLOCK_ELEMENTS padded terms (cache-sized arrays)
        w_cap = min(int(width[s] * 1.25) + 4, _BLOCK_ELEMENTS)
        e = max(s + 1, int(np.searchsorted(width, w_cap, side="right")))  # ≥ 1 row (wide ones)
        e = min(e, s + max(1, _BLOCK_ELEMENTS // int(width[e - 1])))
        sel = order[s:e]
        out[sel] = _series_rows(q[sel], sigma, alpha[sel], n0[sel])
        s = e
    return out


def _series_rows(q: np.ndarray, sigma: float, alpha: np.ndarray, n0: np.ndarray) -> np.ndarray:
    """One block of :func:`series_log_a_upper_pairs`; ``n0`` must be sorted (non-decreasing)."""
    unit, acc, n = _U, FUNCTION_ACCURACY, _CVZ_TERMS
    rows = np.arange(q.size)
    w_max = int(n0.max()) + n
    lq = np.log(q)[:, None]
    l1q = np.log1p(-q)[:, None]
    s2 = sigma * sigma
    z0 = s2 * (l1q - lq) + 0.5
    z0_err = (s2 * (np.abs(lq) + np.abs(l1q)) + np.abs(z0) + 1.0) / sigma
    inv2s2 = 1.0 / (2.0 * s2)
    a = alpha[:, None]
    i = np.arange(w_max, dtype=np.float64)[None, :]
    valid = i < (n0 + n)[:, None]
    with np.errstate(all="ignore"):  # padding terms only (never read)
        j = a - i
        num = np.log(np.abs(a - i[:, 1:] + 1.0))
        den = np.log(i[:, 1:])
        log_c = np.zeros((alpha.size, w_max))
        np.cumsum(num - den, axis=1, out=log_c[:, 1:])
        common = np.zeros((alpha.size, w_max))
        np.cumsum(np.abs(num) + den, axis=1, out=common[:, 1:])
        common *= 1.0 + 2.0 * i * unit / acc
        common += 8.0
        x = (z0 - i) / sigma
        t = special.log_ndtr(x)
        u = i * lq
        v = j * l1q
        quad = (i * i - i) * inv2s2
        s0 = log_c + u + v + quad + t
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
        s0 = np.where(valid, s0, -np.inf)
        s1 = np.where(valid, s1, -np.inf)
        top = np.maximum(s0.max(axis=1), s1.max(axis=1))[:, None]
        sums = ((2.0 * (n0 + n) + 10.0) * unit)[:, None]
        e0 = np.exp(s0 - top)
        e1 = np.exp(s1 - top)
        m = e0 + e1
        y0 = np.where(valid, acc * p0, 0.0)
        y1 = np.where(valid, acc * p1, 0.0)
        terms = e0 * (y0 * (1.0 + y0) + sums) + e1 * (y1 * (1.0 + y1) + sums)
        # row sums as numpy's pairwise ``sum`` of exactly the row's terms (one call per
        # distinct ⌈α⌉: rows are sorted by it), as in the one-order kernel
        err = np.empty(q.size)
        head = np.empty(q.size)
        bounds = np.flatnonzero(np.diff(n0)) + 1
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, q.size], strict=True):
            k0 = int(n0[lo])
            err[lo:hi] = terms[lo:hi, : k0 + n].sum(axis=1)
            head[lo:hi] = m[lo:hi, :k0].sum(axis=1)
        bad = (y0 > 1.0).any(axis=1) | (y1 > 1.0).any(axis=1)
        lead = m[rows, n0]
        tail_m = m[rows[:, None], n0[:, None] + np.arange(n)[None, :]]
        tail = np.maximum((tail_m * _W).sum(axis=1), 0.0)
        err += lead * _CVZ_REMAINDER
        out = top[:, 0] + np.log(head + tail + err)
        out = np.maximum(out, 0.0)
    out = out * (1.0 + 4.0 * unit)
    out[bad] = np.nan
    out[~np.isfinite(out)] = np.nan
    result: np.ndarray = out
    return result
