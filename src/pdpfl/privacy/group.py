"""Group privacy: from record-level guarantees to groups of k records (ULDP-FL GROUP-k).

* RDP (Mironov 2017, "Rényi Differential Privacy", Proposition 2; ULDP-FL Lemma 9): if a
  mechanism is (α, ρ)-RDP and α ≥ 2^{c+1}, then for datasets differing in 2^c records it is
  (α/2^c, 3^c·ρ)-RDP. A group size k that is not a power of two is rounded UP to 2^⌈log2 k⌉
  (never down, never to 0).
* (ε, δ)-DP (Dwork & Roth 2014; Kamath 2020; ULDP-FL Lemma 8): groups of k records get
  (kε, k·e^{(k−1)ε}·δ). From an RDP curve, :func:`group_epsilon_dp` chooses the record-level δ'
  optimally over the whole range that can matter (proof in its docstring).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.conversion import rdp_to_epsilon
from pdpfl.privacy.orders import DEFAULT_ORDERS, check_orders

__all__ = [
    "group_epsilon_delta",
    "group_epsilon_dp",
    "group_epsilon_from_rdp",
    "group_orders",
    "group_rdp",
]

#: Orders at or below this are skipped by the conversion (as dp-accounting does).
_MIN_ORDER = 1.01


def _check_group(group_size: int) -> int:
    k = int(group_size)
    if k != group_size or k < 1:
        raise ValueError(f"group_size: must be an integer >= 1, got {group_size!r}")
    return k


def group_orders(group_size: int, base: ArrayLike = DEFAULT_ORDERS) -> np.ndarray:
    """``base`` plus orders that both group routes need for groups of ``group_size``.

    Lemma 9 uses orders α ≥ 2^{c+1} (c = ⌈log2 k⌉); Lemma 8 needs orders α > k (see
    :func:`group_epsilon_dp`). Added: 2^{c+1} + j/10 (j < 100) and 2^{c+1}·{1.25, 1.5, 2, 3,
    4, 6, 8, 12, 16, 24, 32} (more orders only lower the minimum over orders).
    """
    k = _check_group(group_size)
    c = math.ceil(math.log2(k)) if k > 1 else 0
    lo = 2.0 ** (c + 1)
    extra = np.concatenate(
        [lo + np.arange(100) / 10.0, lo * np.array([1.25, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32])]
    )
    return np.union1d(check_orders(base), extra)


def group_rdp(rdp: ArrayLike, orders: ArrayLike, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """RDP curve for groups of ``group_size`` records (Mironov 2017, Prop. 2).

    Returns ``(rdp_group (..., n_kept), orders_group (n_kept,))``: orders α ≥ 2^{c+1} become
    α/2^c with RDP 3^c·ρ(α), c = ⌈log2 group_size⌉. ValueError if no order is large enough.
    """
    k = _check_group(group_size)
    a = check_orders(orders)
    r = np.asarray(rdp, dtype=np.float64)
    if r.ndim == 0 or r.shape[-1] != a.size:
        raise ValueError(f"rdp: last axis must have {a.size} orders, got shape {r.shape}")
    c = math.ceil(math.log2(k)) if k > 1 else 0
    if c == 0:
        return r.copy(), a.copy()
    keep = a >= 2.0 ** (c + 1)
    if not keep.any():
        raise ValueError(
            f"group_size: {k} needs orders >= {2 ** (c + 1)}; the largest order is {a.max():g}"
        )
    return (3.0**c) * r[..., keep], a[keep] / 2.0**c


def group_epsilon_from_rdp(
    rdp: ArrayLike, orders: ArrayLike, delta: float, group_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Group-level (ε, order) by Lemma 9 (never below the record-level ε)."""
    k = _check_group(group_size)
    eps_rec, ord_rec = rdp_to_epsilon(rdp, orders, delta)
    if k == 1:
        return eps_rec, ord_rec
    r_g, a_g = group_rdp(rdp, orders, k)
    eps_g, ord_g = rdp_to_epsilon(r_g, a_g, delta)
    # A guarantee for groups covers single records, so the group ε is at least the record ε.
    take = eps_g >= eps_rec
    return np.where(take, eps_g, eps_rec), np.where(take, ord_g, ord_rec)


def group_epsilon_dp(
    rdp: ArrayLike, orders: ArrayLike, delta: float, group_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group-level ε by Lemma 4 then Lemma 8, with the record-level δ' chosen optimally.

    For an RDP curve ρ at the orders A, the record-level mechanism is (ε(δ'), δ')-DP for every
    δ' in (0, 1) (Balle et al. 2020, Prop. 12, as :func:`~pdpfl.privacy.conversion.rdp_to_epsilon`):
    with L = log δ',

        ε(L) = max(0, min_α e_α(L)),   e_α(L) = ρ_α + c_α − L/(α − 1),
        c_α = log(1 − 1/α) − log(α)/(α − 1)      (α ∈ A, α > 1.01),

    and Lemma 8 makes it (k·ε(L), k·e^{(k−1)ε(L)}·e^L)-DP for groups of k. We want the smallest
    k·ε(L) subject to log k + (k − 1)·ε(L) + L ≤ log δ. ε is non-increasing in L, so the best L
    is the *largest* feasible one.

    **The bracket (the whole range that can matter), proof.**

    1. Upper end. ε ≥ 0, so feasibility needs L ≤ t := log(δ/k).
    2. If ε(t) = 0, then δ' = δ/k is feasible with group ε = 0: return 0.
    3. Otherwise ε(L) ≥ ε(t) > 0 for every L ≤ t, so the clip at 0 and the KL shortcut (which
       would hold at t too, δ' being larger there) are inactive, and the constraint is
       min_α h_α(L) ≤ t with the affine h_α(L) = (k − 1)(ρ_α + c_α) + s_α·L,
       s_α = 1 − (k − 1)/(α − 1). The feasible set is the union over α of {L ≤ t: h_α(L) ≤ t}.
       For α ≤ k (s_α ≤ 0) h_α is non-increasing, so a feasible L would make L = t feasible,
       i.e. e_α(t) ≤ 0 and ε(t) = 0 — excluded. For α > k (s_α > 0) the set is
       L ≤ L_α := (t − (k − 1)(ρ_α + c_α))/s_α, and L_α < t by the same argument.
    4. Hence the optimum is L* = max_{α ∈ A, α > k} L_α, searched over all of (−∞, t) at once
       (in log space: δ' = e^{L*} may be far below the smallest float, e.g. δ·e^{−900} in
       ULDP-FL's Figure 2 at k = 61), and the group ε is k·min_α e_α(L*). With no order above
       k no δ' satisfies the constraint with these orders: ε = ∞ (add larger orders,
       :func:`group_orders`).

    The result is exact for the given orders (no grid on δ'), and every value is an upper bound:
    the constraint is re-checked in floating point and L* stepped down (to larger ε) until it
    holds, so the returned group δ never exceeds ``delta``.

    Parameters
    ----------
    rdp
        Record-level RDP, shape ``(..., n_orders)``.
    orders
        The orders of the last axis (> 1).
    delta
        The group-level δ in (0, 1).
    group_size
        k ≥ 1 (any integer: Lemma 8 needs no power of two).

    Returns
    -------
    (epsilon, order, log_inner_delta)
        Shape ``rdp.shape[:-1]`` each: the group ε (inf if unattainable), the RDP order of the
        record-level ε at δ' and log δ' (NaN where ε is 0 or inf).
    """
    k = _check_group(group_size)
    a = check_orders(orders)
    r = np.asarray(rdp, dtype=np.float64)
    if r.ndim == 0 or r.shape[-1] != a.size:
        raise ValueError(f"rdp: last axis must have {a.size} orders, got shape {r.shape}")
    d = float(delta)
    if not (0.0 < d < 1.0):
        raise ValueError(f"delta: must be in (0, 1), got {delta!r}")
    shape = r.shape[:-1]
    rows = r.reshape(-1, a.size)
    if k == 1:
        eps1, ord1 = rdp_to_epsilon(rows, a, d)
        log_d = np.full(eps1.shape, math.log(d))
        return eps1.reshape(shape), ord1.reshape(shape), log_d.reshape(shape)
    t = math.log(d) - math.log(k)
    eps_t, ord_t = rdp_to_epsilon(rows, a, d / k)
    n = rows.shape[0]
    eps = np.zeros(n)
    order = np.where(eps_t == 0.0, ord_t, np.nan)
    log_inner = np.where(eps_t == 0.0, t, np.nan)
    valid = a > _MIN_ORDER
    av, rv = a[valid], rows[:, valid]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        c = np.log1p(-1.0 / av) - np.log(av) / (av - 1.0)
        slope = 1.0 - (k - 1.0) / (av - 1.0)
        crossing = np.where(slope > 0, (t - (k - 1.0) * (rv + c)) / slope, -np.inf)
    for i in np.flatnonzero(eps_t > 0.0):
        cross = crossing[i]
        cross = cross[np.isfinite(cross)]
        if cross.size == 0:
            eps[i] = math.inf
            continue
        lstar = min(float(cross.max()), t)
        for _ in range(64):  # float rounding only: step towards smaller δ' (larger ε)
            e_rec, col = _epsilon_at_log_delta(rv[i], av, c, lstar)
            if math.log(k) + (k - 1.0) * e_rec + lstar <= math.log(d):
                break
            lstar -= 1e-12 * max(1.0, abs(lstar))
        else:  # pragma: no cover - rounding never needs 64 steps
            eps[i] = math.inf
            continue
        eps[i] = k * e_rec
        order[i] = av[col]
        log_inner[i] = lstar
    return eps.reshape(shape), order.reshape(shape), log_inner.reshape(shape)


def _epsilon_at_log_delta(
    rho: np.ndarray, a: np.ndarray, c: np.ndarray, log_delta: float
) -> tuple[float, int]:
    """(min_α max(0, ρ_α + c_α − log δ'/(α − 1)), argmin) -- the conversion in log space."""
    with np.errstate(invalid="ignore", over="ignore"):
        e = rho + c - log_delta / (a - 1.0)
    e = np.where(np.isnan(e), np.inf, e)
    col = int(np.argmin(e))
    return max(float(e[col]), 0.0), col


def group_epsilon_delta(epsilon: float, delta: float, group_size: int) -> tuple[float, float]:
    """(kε, k·e^{(k−1)ε}·δ) for groups of k records (δ capped at 1)."""
    k = _check_group(group_size)
    eps = float(epsilon)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"epsilon: must be a finite number >= 0, got {epsilon!r}")
    d = float(delta)
    if not (0.0 <= d <= 1.0):
        raise ValueError(f"delta: must be in [0, 1], got {delta!r}")
    with np.errstate(over="ignore"):
        new_delta = min(1.0, k * math.exp(min((k - 1) * eps, 700.0)) * d)
    return k * eps, new_delta
