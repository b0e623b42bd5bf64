"""Group privacy: from record-level guarantees to groups of k records.

* RDP (Mironov 2017, "Rényi Differential Privacy", Proposition 2): if a mechanism is (α, ρ)-RDP
  and α ≥ 2^{c+1}, then for datasets differing in 2^c records it is (α/2^c, 3^c·ρ)-RDP. A group
  size k that is not a power of two is rounded UP to 2^⌈log2 k⌉ (never down, never to 0).
* (ε, δ)-DP (Dwork & Roth 2014): groups of k records get (kε, k·e^{(k−1)ε}·δ).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.conversion import rdp_to_epsilon
from pdpfl.privacy.orders import check_orders

__all__ = ["group_rdp", "group_epsilon_from_rdp", "group_epsilon_delta"]


def _check_group(group_size: int) -> int:
    k = int(group_size)
    if k != group_size or k < 1:
        raise ValueError(f"group_size: must be an integer >= 1, got {group_size!r}")
    return k


def group_rdp(
    rdp: ArrayLike, orders: ArrayLike, group_size: int
) -> tuple[np.ndarray, np.ndarray]:
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
    """Group-level (ε, order) from a record-level RDP curve (never below the record-level ε)."""
    k = _check_group(group_size)
    eps_rec, ord_rec = rdp_to_epsilon(rdp, orders, delta)
    if k == 1:
        return eps_rec, ord_rec
    r_g, a_g = group_rdp(rdp, orders, k)
    eps_g, ord_g = rdp_to_epsilon(r_g, a_g, delta)
    # A guarantee for groups covers single records, so the group ε is at least the record ε.
    take = eps_g >= eps_rec
    return np.where(take, eps_g, eps_rec), np.where(take, ord_g, ord_rec)


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
