"""Default Rényi orders α used by every pdpfl accountant.

The grid (:data:`DEFAULT_ORDERS`, 127 orders, sorted, all > 1):

* fractional orders in (1, 2): 1.05, 1.1, 1.2, …, 1.9, 1.95 — needed for large ε;
* 2 … 8 in steps of 0.25 and 8.5 … 12 in steps of 0.5 — the usual optimum for ε ≈ 1–10;
* every integer 13 … 64, then 72, 80, …, 256 (steps of 8) — small ε and many compositions;
* a few very large orders, 320, 512 and 1024 — tiny ε (ε ≲ 0.05 at δ = 1e-5).

Fractional orders are computed exactly (signed series of Mironov, Talwar & Zhang 2019, §3.3, with
a certified alternating-series remainder), integer orders by the exact binomial sum.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DEFAULT_ORDERS", "check_orders"]

DEFAULT_ORDERS: np.ndarray = np.unique(
    np.concatenate(
        [
            [1.05, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 1.95],
            np.arange(2.0, 8.0001, 0.25),
            np.arange(8.5, 12.0001, 0.5),
            np.arange(13.0, 65.0),
            np.arange(72.0, 257.0, 8.0),
            [320.0, 512.0, 1024.0],
        ]
    ).round(6)
)
DEFAULT_ORDERS.setflags(write=False)


def check_orders(orders: object) -> np.ndarray:
    """Validate Rényi orders: a non-empty 1-d array of finite floats, each > 1.

    Raises
    ------
    ValueError
        Naming ``orders`` and the allowed range.
    """
    a = np.asarray(orders, dtype=np.float64)
    if a.ndim == 0:
        a = a.reshape(1)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"orders: expected a non-empty 1-d array, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a <= 1.0):
        raise ValueError("orders: every Rényi order must be a finite number > 1")
    return a
