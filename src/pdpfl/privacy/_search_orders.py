"""Exact minimum-over-orders ε without evaluating every order (branch and bound over α).

The ε of a mechanism is min_α ε(α). Only the orders near the optimum need an exact RDP value;
for the others any certified *bounds* suffice. With g(α) = (α−1)·ρ(α) = log A_α (a log moment
generating function, hence convex in α, with g(1) = 0) and ρ non-decreasing in α:

* upper bounds: the chord of g between the nearest known orders a < α < b, and ρ(b); beyond the
  largest known order, ρ(α) ≤ α/(2σ²) (subsampling never hurts);
* lower bounds: ρ(a), and the secant extensions of g from (a', a) and from (b, b').

Starting from a cheap skeleton of small integer orders, each record repeatedly evaluates exactly
the unknown order with the smallest lower-bound ε, until no unknown order's lower bound is below
the best certified ε. The result equals the minimum of the exact per-order ε over all orders
(every composition used here — τ·ρ, k·τ·ρ, T·ρ^{τ,λ} — and the conversion are monotone in ρ).

Continuous refinement (``refine=True``, the default). Any order α > 1 gives a valid bound, so the
best grid order a_c is then refined inside [a_{c−1}, a_{c+1}] by Brent's method, vectorized
over rates (parabolic interpolation safeguarded by golden-section steps), evaluating ρ at each
rate's own fractional order (:func:`~pdpfl.privacy.rdp.poisson_gaussian_rdp_pairs`, a proven upper
bound at every order). A candidate only replaces the best point when its ε is smaller, so the
refined ε is never above the grid minimum; the order reported is the one that attains it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pdpfl.privacy._rdp_pairs import integer_rdp_pairs
from pdpfl.privacy.conversion import epsilon_per_order
from pdpfl.privacy.rdp import (
    _subsampled_pairs,
    gaussian_rdp_upper,
    poisson_gaussian_rdp,
    poisson_gaussian_rdp_pairs,
)

__all__ = ["min_epsilon"]

_SKELETON = (2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)

#: Orders evaluated exactly per record and per round of the search.
_PER_ROUND = 6

#: Maximum Brent iterations of the continuous refinement (rows stop on convergence).
_REFINE_STEPS = 16
#: Relative tolerance in α of the refinement.
_REFINE_XTOL = 1e-5
#: A parabolic step improving ε by less than this (relative) ends a row's refinement.
_REFINE_FTOL = 1e-9
_GOLD = 0.3819660112501051

Compose = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _bounds(
    a: np.ndarray, known: np.ndarray, g: np.ndarray, sigma: float
) -> tuple[np.ndarray, np.ndarray]:
    """Certified (ρ_lo, ρ_hi) of shape known.shape; exact where known."""
    n, m = known.shape
    col = np.arange(m)
    ext_a = np.concatenate([[1.0], a])  # index 0 is the virtual order α = 1 with g = 0
    ext_g = np.concatenate([np.zeros((n, 1)), np.where(known, g, 0.0)], axis=1)
    kidx = np.where(known, col + 1, 0)  # extended indices of known orders (0 = virtual)
    left_incl = np.maximum.accumulate(kidx, axis=1)  # last known at or before c (ext index)
    left = np.concatenate([np.zeros((n, 1), int), left_incl[:, :-1]], axis=1)  # strictly before
    # previous known before `left`: left_incl evaluated at column left-2 (ext index left-1 → col)
    prev_col = left - 2
    left2 = np.where(
        prev_col >= 0,
        np.take_along_axis(left_incl, np.maximum(prev_col, 0), axis=1),
        0,
    )
    has_left2 = left > 0  # a real known order with something (possibly virtual) before it
    big = m + 1
    ridx = np.where(known, col + 1, big)
    right_incl = np.minimum.accumulate(ridx[:, ::-1], axis=1)[:, ::-1]
    right = np.concatenate([right_incl[:, 1:], np.full((n, 1), big)], axis=1)
    has_right = right < big
    nxt_col = np.minimum(right, m)  # column right (ext) → next col index = right
    right2 = np.where(
        has_right & (nxt_col < m),
        np.take_along_axis(right_incl, np.minimum(nxt_col, m - 1), axis=1),
        big,
    )
    right2 = np.where(has_right & (nxt_col < m), right2, big)
    has_right2 = right2 < big

    al = a[None, :]
    ga = np.take_along_axis(ext_g, left, axis=1)
    aa = ext_a[left]
    safe_r = np.minimum(right, m)
    gb = np.take_along_axis(ext_g, safe_r, axis=1)
    ab = ext_a[safe_r]
    safe_r2 = np.minimum(right2, m)
    gb2 = np.take_along_axis(ext_g, safe_r2, axis=1)
    ab2 = ext_a[safe_r2]
    ga2 = np.take_along_axis(ext_g, left2, axis=1)
    aa2 = ext_a[left2]

    with np.errstate(divide="ignore", invalid="ignore"):
        chord = ga + (al - aa) * (gb - ga) / (ab - aa)
        g_hi = np.where(has_right, np.minimum(chord, (al - 1.0) * gb / (ab - 1.0)), np.inf)
        trivial = (al - 1.0) * al / (2.0 * sigma * sigma)
        g_hi = np.minimum(g_hi, trivial)
        mono_lo = np.where(left > 0, (al - 1.0) * ga / (aa - 1.0), 0.0)
        ext_left = np.where(has_left2, ga + (al - aa) * (ga - ga2) / (aa - aa2), 0.0)
        ext_right = np.where(has_right2, gb - (ab - al) * (gb2 - gb) / (ab2 - ab), 0.0)
        g_lo = np.maximum(np.maximum(mono_lo, ext_left), np.maximum(ext_right, 0.0))
    g_lo = np.where(np.isfinite(g_lo), g_lo, 0.0)
    g_lo = np.minimum(g_lo, g_hi)
    rho_lo = np.where(known, g, g_lo) / (al - 1.0)
    rho_hi = np.where(known, g, g_hi) / (al - 1.0)
    return rho_lo, rho_hi


def min_epsilon(
    q: np.ndarray,
    sigma: float,
    orders: np.ndarray,
    delta: float,
    compose: Compose,
    refine: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """min_α ε(α) per rate, computing ρ_SGM exactly only where needed.

    ``compose(rho_step, rows, alphas)`` maps per-step RDP of the records ``rows`` at the orders
    ``alphas`` (broadcastable against ``rho_step``: a row of orders during the grid search, one
    order per record during the refinement) to total RDP; it must be non-decreasing in
    ``rho_step`` elementwise. With ``refine`` the best grid order is refined continuously (see
    the module docstring): the result is then at most the grid minimum.
    """
    order_sort = np.argsort(orders, kind="stable")
    a = orders[order_sort]
    n, m = q.size, a.size
    g = np.zeros((n, m))  # holds ρ (not g) where known
    known = np.zeros((n, m), dtype=bool)
    # The smallest order is always exact: below the first known order the only lower bound
    # would be ρ ≥ 0, whose ε is 0 through the KL shortcut (so every such order stays open).
    skel = np.union1d(np.flatnonzero(np.isin(a, _SKELETON)), [0])
    g[:, skel] = poisson_gaussian_rdp(q, sigma, a[skel])
    known[:, skel] = True
    eps_out = np.empty(n)
    ord_out = np.empty(n)
    active = np.arange(n)
    cols = np.arange(m)
    while active.size:
        sub = np.ix_(active, cols)
        kn = known[sub]
        rho = g[sub]
        ac = a[cols]
        lo, hi = _bounds(ac, kn, rho * (ac - 1.0)[None, :], sigma)
        e_hi = epsilon_per_order(compose(hi, active, ac[None, :]), ac, delta)
        e_lo = np.where(kn, e_hi, epsilon_per_order(compose(lo, active, ac[None, :]), ac, delta))
        best_col = np.argmin(e_hi, axis=1)
        best = e_hi[np.arange(active.size), best_col]
        cand = (e_lo < best[:, None]) & ~kn
        pending = cand.any(axis=1)
        done = ~pending
        eps_out[active[done]] = np.maximum(best[done], 0.0)
        ord_out[active[done]] = ac[best_col[done]]
        if not pending.any():
            break
        # Orders that are neither known nor candidates can never become candidates again
        # (bounds only tighten and the best ε only decreases), so drop those columns.
        keep = kn.any(axis=0) | cand.any(axis=0)
        rows = active[pending]
        score = np.where(cand[pending], e_lo[pending], np.inf)
        picks = np.argsort(score, axis=1)[:, :_PER_ROUND]
        ok = np.take_along_axis(score, picks, axis=1) < np.inf
        # one paired evaluation for every (record, order) picked this round
        pr = np.repeat(rows, picks.shape[1])[ok.reshape(-1)]
        pc = cols[picks[ok]]
        g[pr, pc] = poisson_gaussian_rdp_pairs(q[pr], sigma, a[pc])
        known[pr, pc] = True
        active = rows
        cols = cols[keep]
    if refine:
        eps_out, ord_out = _refine(q, sigma, a, delta, compose, eps_out, ord_out, g, known)
    return eps_out, ord_out


def _refine(
    q: np.ndarray,
    sigma: float,
    a: np.ndarray,
    delta: float,
    compose: Compose,
    eps: np.ndarray,
    order: np.ndarray,
    rho_grid: np.ndarray,
    known: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Brent's minimization of ε(α) inside [a_{c−1}, a_{c+1}], vectorized over rates.

    The classical algorithm (Brent 1973, ch. 5; ``scipy.optimize.brent``): parabolic
    interpolation through the three best points, replaced by a golden-section step whenever the
    parabola is unusable or its step is not less than half the step before last (which
    guarantees convergence). Rows stop independently when the bracket is below the tolerance.
    """
    eps, order = eps.copy(), order.copy()
    col = np.searchsorted(a, order)
    rows = np.flatnonzero(
        (col > 0)
        & (col < a.size - 1)
        & (a[np.minimum(col, a.size - 1)] == order)
        & np.isfinite(eps)
        & (eps > 0)
    )
    if rows.size == 0:
        return eps, order

    exact = _IntegerMemo(q, sigma)
    # the grid search's exact values at integer orders are the same bits (the one-order and
    # the paired kernels agree bit for bit: tests/test_privacy_rdp.py)
    inner = (q > 0.0) & (q < 1.0)
    for c in np.flatnonzero(a == np.floor(a)):
        have = np.flatnonzero(known[:, c] & inner)
        if have.size:
            exact.values.setdefault(int(a[c]), np.full(q.size, np.nan))[have] = rho_grid[have, c]

    def at(r: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        # poisson_gaussian_rdp_pairs(q[r], sigma, alpha), with the exact values at the
        # integer orders around α (a few per rate over all the steps) computed once
        rho = np.zeros(r.size)
        qr = q[r]
        full = qr == 1.0
        rho[full] = gaussian_rdp_upper(alpha[full], sigma)
        inner = np.flatnonzero((qr > 0.0) & (qr < 1.0))
        if inner.size:
            rows = r[inner]
            rho[inner] = _subsampled_pairs(
                qr[inner], sigma, alpha[inner], integer=lambda i, k: exact(rows[i], k)
            )
        total = compose(rho[:, None], r, alpha[:, None])
        return epsilon_per_order(np.maximum(total, 0.0), alpha[:, None], delta)[:, 0]

    x = order[rows].copy()
    fx = eps[rows].copy()
    lo, hi = a[col[rows] - 1], a[col[rows] + 1]
    w, v, fw, fv = x.copy(), x.copy(), fx.copy(), fx.copy()
    d = np.zeros(rows.size)
    e = np.zeros(rows.size)
    # Warm start: where the grid search already evaluated both neighbours exactly, they are
    # Brent's w and v, so the first step can already be parabolic.
    both = known[rows, col[rows] - 1] & known[rows, col[rows] + 1]
    if both.any():
        r2 = rows[both]

        def grid_eps(c: np.ndarray) -> np.ndarray:
            al = a[c][:, None]
            total = compose(rho_grid[r2, c][:, None], r2, al)
            return epsilon_per_order(np.maximum(total, 0.0), al, delta)[:, 0]

        f_lo, f_hi = grid_eps(col[r2] - 1), grid_eps(col[r2] + 1)
        w[both], fw[both] = lo[both], f_lo
        v[both], fv[both] = hi[both], f_hi
        e[both] = hi[both] - lo[both]
        d[both] = 0.5 * e[both]
    live = np.ones(rows.size, dtype=bool)
    for _ in range(_REFINE_STEPS):
        xm = 0.5 * (lo + hi)
        tol1 = _REFINE_XTOL * np.abs(x) + 1e-12
        tol2 = 2.0 * tol1
        live &= np.abs(x - xm) > tol2 - 0.5 * (hi - lo)
        if not live.any():
            break
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            r_ = (x - w) * (fx - fv)
            q_ = (x - v) * (fx - fw)
            p_ = (x - v) * q_ - (x - w) * r_
            q_ = 2.0 * (q_ - r_)
            p_ = np.where(q_ > 0, -p_, p_)
            q_ = np.abs(q_)
            # successive parabolic interpolation through the three best points; Brent's
            # extra "step < half the step before last" test is dropped (ε is smooth and
            # unimodal here, and every row ends after _REFINE_STEPS anyway).
            parab = (
                (w != x)
                & (v != x)
                & (v != w)
                & np.isfinite(p_)
                & np.isfinite(q_)
                & (q_ > 0)
                & (p_ > q_ * (lo - x))
                & (p_ < q_ * (hi - x))
            )
            d_par = p_ / q_
        u_par = x + d_par
        near_end = (u_par - lo < tol2) | (hi - u_par < tol2)
        d_par = np.where(near_end, np.where(xm >= x, tol1, -tol1), d_par)
        e_gold = np.where(x >= xm, lo - x, hi - x)
        e = np.where(live, np.where(parab, d, e_gold), e)
        d = np.where(live, np.where(parab, d_par, _GOLD * e_gold), d)
        u = x + np.where(np.abs(d) >= tol1, d, np.where(d >= 0, tol1, -tol1))
        idx = np.flatnonzero(live)
        fu = np.full(rows.size, np.inf)
        fu[idx] = at(rows[idx], u[idx])
        better = live & (fu <= fx)
        worse = live & ~better
        # a parabolic step that no longer improves ε by more than _REFINE_FTOL: converged.
        # (A merely *short* parabolic step is no sign of convergence: near a strongly
        # asymmetric minimum the parabola points the wrong way by a few tol1 -- that rule
        # stopped at α = 4.6992 instead of 4.7024, 5e-6 looser than Opacus' α = 4.7.)
        settled = parab & better & (fx - fu <= _REFINE_FTOL * fx)
        # better: the old x becomes a bracket end, u the new best
        lo = np.where(better & (u >= x), x, lo)
        hi = np.where(better & (u < x), x, hi)
        v, fv = np.where(better, w, v), np.where(better, fw, fv)
        w, fw = np.where(better, x, w), np.where(better, fx, fw)
        x, fx = np.where(better, u, x), np.where(better, fu, fx)
        # worse: u becomes a bracket end; it may replace w or v
        lo = np.where(worse & (u < x), u, lo)
        hi = np.where(worse & (u >= x), u, hi)
        to_w = worse & ((fu <= fw) | (w == x))
        to_v = worse & ~to_w & ((fu <= fv) | (v == x) | (v == w))
        v, fv = np.where(to_w, w, v), np.where(to_w, fw, fv)
        w, fw = np.where(to_w, u, w), np.where(to_w, fu, fw)
        v, fv = np.where(to_v, u, v), np.where(to_v, fu, fv)
        live &= ~settled
    improved = fx < eps[rows]
    eps[rows] = np.where(improved, np.maximum(fx, 0.0), eps[rows])
    order[rows] = np.where(improved, x, order[rows])
    return eps, order


class _IntegerMemo:
    """Exact ρ_SGM(q_i, k) at integer orders k ≥ 2 for rows i of ``q``, each computed once.

    The same bits as computing them anew: :func:`~pdpfl.privacy._rdp_pairs.integer_rdp_pairs`
    evaluates every pair with the same float operations whatever the other pairs of its call
    (per-order constants, then one segment per pair). Brent's steps stay between two grid
    orders, so a rate needs only the few integers around its optimum over all steps.
    """

    def __init__(self, q: np.ndarray, sigma: float) -> None:
        self.q, self.sigma = q, sigma
        self.values: dict[int, np.ndarray] = {}  # k -> ρ per row, NaN where not computed yet

    def __call__(self, rows: np.ndarray, k: np.ndarray) -> np.ndarray:
        out = np.full(rows.size, np.nan)
        for kv in np.unique(k):
            known = self.values.get(int(kv))
            if known is not None:
                sel = k == kv
                out[sel] = known[rows[sel]]
        miss = np.flatnonzero(np.isnan(out))
        if miss.size:
            out[miss] = integer_rdp_pairs(self.q[rows[miss]], self.sigma, k[miss])
            for kv in np.unique(k[miss]):
                sel = miss[k[miss] == kv]
                slot = self.values.setdefault(int(kv), np.full(self.q.size, np.nan))
                slot[rows[sel]] = out[sel]
        return out
