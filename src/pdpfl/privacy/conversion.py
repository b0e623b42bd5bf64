"""RDP → (ε, δ) conversions, vectorized over any leading shape.

Balle, Barthe, Gaboardi, Hsu, Sato, "Hypothesis testing interpretations and Rényi differential
privacy", AISTATS 2020, Proposition 12 (arXiv:2004.00010 v4), with the KL shortcut
δ ≤ √(1 − e^{−ρ}) — the same rules, order by order, as dp-accounting's ``compute_epsilon`` /
``compute_delta``; the minimum over orders is reported together with the optimal order.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.orders import check_orders

__all__ = ["rdp_to_epsilon", "rdp_to_delta", "epsilon_per_order"]


def _prepare(rdp: ArrayLike, orders: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    a = check_orders(orders)
    r = np.asarray(rdp, dtype=np.float64)
    if r.ndim == 0 or r.shape[-1] != a.size:
        raise ValueError(f"rdp: last axis must have one value per order ({a.size}), got {r.shape}")
    if np.any(np.isnan(r)):
        raise ValueError("rdp: must not contain NaN")
    if np.any(r < 0):
        raise ValueError("rdp: Rényi divergences must be >= 0")
    return r, a


def rdp_to_epsilon(
    rdp: ArrayLike, orders: ArrayLike, delta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Smallest ε over the orders such that the RDP curve implies (ε, δ)-DP.

    Per order: ε(α) = ρ + log1p(−1/α) − log(δ·α)/(α − 1) (Balle et al. 2020, Prop. 12); ε = 0
    when δ² + expm1(−ρ) > 0 (KL shortcut); orders α ≤ 1.01 are skipped as numerically
    unstable (ε = ∞ there), exactly as dp-accounting.

    Parameters
    ----------
    rdp
        Shape ``(..., n_orders)``.
    orders
        Shape ``(n_orders,)``, all > 1.
    delta
        δ in (0, 1).

    Returns
    -------
    (epsilon, order)
        Both of shape ``rdp.shape[:-1]``: the ε (≥ 0, may be inf) and the order that attains it.
    """
    r, a = _prepare(rdp, orders)
    eps = epsilon_per_order(r, a, delta)
    idx = np.argmin(eps, axis=-1)
    best = np.take_along_axis(eps, idx[..., None], axis=-1)[..., 0]
    return np.maximum(best, 0.0), a[idx]


def epsilon_per_order(rdp: np.ndarray, orders: np.ndarray, delta: float) -> np.ndarray:
    """ε(α) for every order (same shape as ``rdp``), before the minimum over orders.

    No input checks beyond δ (internal fast path; ``rdp`` must be >= 0 and ``orders`` > 1).
    """
    d = float(delta)
    if not (0.0 < d < 1.0):
        raise ValueError(f"delta: must be in (0, 1), got {delta!r}")
    r = np.asarray(rdp, dtype=np.float64)
    a = np.asarray(orders, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        eps = r + np.log1p(-1.0 / a) - (math.log(d) + np.log(a)) / (a - 1.0)
        eps = np.where(a > 1.01, eps, np.inf)
        eps = np.where(d * d + np.expm1(-r) > 0, 0.0, eps)
    return np.where(np.isnan(eps), np.inf, eps)


def rdp_to_delta(
    rdp: ArrayLike, orders: ArrayLike, epsilon: float
) -> tuple[np.ndarray, np.ndarray]:
    """Smallest δ over the orders such that the RDP curve implies (ε, δ)-DP.

    Per order: log δ(α) = min(½·log1p(−e^{−ρ}), (α−1)(ρ − ε + log1p(−1/α)) − log α) (the second
    only for α > 1.01), as dp-accounting's ``compute_delta`` (Balle et al. 2020, Prop. 12).

    Returns
    -------
    (delta, order)
        Both of shape ``rdp.shape[:-1]``; δ is capped at 1.
    """
    r, a = _prepare(rdp, orders)
    e = float(epsilon)
    if not (math.isfinite(e) and e >= 0):
        raise ValueError(f"epsilon: must be a finite number >= 0, got {epsilon!r}")
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        kl = np.where(r == 0, -np.inf, 0.5 * np.log1p(-np.exp(-r)))
        bound = (a - 1.0) * (r - e + np.log1p(-1.0 / a)) - np.log(a)
        logd = np.where(a > 1.01, np.minimum(kl, bound), kl)
    logd = np.where(np.isnan(logd), np.inf, logd)
    idx = np.argmin(logd, axis=-1)
    best = np.take_along_axis(logd, idx[..., None], axis=-1)[..., 0]
    return np.minimum(np.exp(best), 1.0), a[idx]
