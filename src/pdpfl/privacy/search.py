"""Noise-multiplier search: the smallest σ such that a mechanism spends at most a target ε."""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["find_noise_multiplier"]

_MAX_SIGMA = 1e6
_MIN_SIGMA = 1e-3


def find_noise_multiplier(
    target_epsilon: float,
    epsilon_of_sigma: Callable[[float], float],
    *,
    tol: float = 1e-3,
    lo: float = 0.1,
    hi: float = 100.0,
) -> float:
    """Smallest σ (to relative ``tol``) with ``epsilon_of_sigma(σ) <= target_epsilon``.

    Geometric bisection on σ, assuming ε is non-increasing in σ. The bracket is widened when
    needed (``hi`` up to 1e6, ``lo`` down to 1e-3). The returned σ always satisfies the target
    (it is the upper end of the final bracket), and ``σ/(1+tol)`` is either below ``lo`` or does
    not satisfy it.

    Raises
    ------
    ValueError
        If the target is not a positive finite number, ``tol``/``lo``/``hi`` are invalid, or no σ
        up to 1e6 reaches the target.
    """
    target = float(target_epsilon)
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"target_epsilon: must be a finite number > 0, got {target_epsilon!r}")
    if not (0 < tol < 1):
        raise ValueError(f"tol: must be in (0, 1), got {tol!r}")
    if not (0 < lo < hi and math.isfinite(hi)):
        raise ValueError(f"lo, hi: need 0 < lo < hi < inf, got lo={lo!r}, hi={hi!r}")

    def ok(sigma: float) -> bool:
        value = float(epsilon_of_sigma(sigma))
        return not math.isnan(value) and value <= target

    lo, hi = float(lo), float(hi)
    while not ok(hi):
        if hi >= _MAX_SIGMA:
            raise ValueError(
                f"target_epsilon: no noise multiplier up to {_MAX_SIGMA:g} reaches ε={target}"
            )
        lo, hi = hi, min(hi * 10.0, _MAX_SIGMA)
    while ok(lo):
        if lo <= _MIN_SIGMA:
            return lo
        hi, lo = lo, max(lo / 10.0, _MIN_SIGMA)
    # Invariant: ok(hi) and not ok(lo).
    while hi / lo - 1.0 > tol:
        mid = math.sqrt(lo * hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi
