"""Monotone searches with written-down invariants: the σ (or steps, rates) that meets a target ε.

Every search here looks for the boundary of a *monotone* feasibility predicate ``ok`` and
returns a point where ``ok`` holds, so a caller that asks "which σ keeps ε ≤ target?" always
gets an answer that meets the target (it is rounded to the safe side):

* :func:`monotone_search` -- continuous, positive parameters, geometric bisection;
* :func:`integer_search` -- integer parameters, binary search;
* :func:`find_noise_multiplier` -- the smallest σ with ε(σ) ≤ target (ε non-increasing in σ).

The calibration entry point built on them is :func:`pdpfl.calibration.calibrate_parameter`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["NoFeasibleValueError", "find_noise_multiplier", "integer_search", "monotone_search"]

_MAX_SIGMA = 1e6
_MIN_SIGMA = 1e-3


class NoFeasibleValueError(ValueError):
    """No value in the (widened) bracket satisfies the predicate."""


def monotone_search(
    ok: Callable[[float], bool],
    lo: float,
    hi: float,
    *,
    tol: float,
    feasible_above: bool = True,
    limits: tuple[float, float] | None = None,
) -> float:
    """Boundary of a monotone predicate on (0, ∞), to relative ``tol``, on the feasible side.

    ``feasible_above=True``: ``ok(x)`` implies ``ok(y)`` for every y ≥ x (e.g. ε ≤ target with
    ε non-increasing in σ); returns the smallest feasible x to relative ``tol``.
    ``feasible_above=False``: ``ok(x)`` implies ``ok(y)`` for every y ≤ x (e.g. ε increasing in
    a rate); returns the largest feasible x.

    Bracket. ``[lo, hi]`` is widened by factors of 10 within ``limits`` (none: never widened):
    towards the feasible side until a feasible end is found (else :class:`NoFeasibleValueError`),
    and towards the infeasible side until an infeasible end is found (else the limit itself is
    returned: it is feasible).

    Invariant of the bisection: ``ok(feasible end)`` and ``not ok(infeasible end)``; each step
    evaluates the geometric midpoint and replaces the end of the same verdict, until
    ``max/min − 1 ≤ tol``. The feasible end is returned, so ``ok(result)`` holds and the other
    side of the boundary lies within a factor ``1 + tol``.
    """
    if not (0 < tol < 1):
        raise ValueError(f"tol: must be in (0, 1), got {tol!r}")
    if not (0 < lo < hi and math.isfinite(hi)):
        raise ValueError(f"bracket: need 0 < lo < hi < inf, got lo={lo!r}, hi={hi!r}")
    lo, hi = float(lo), float(hi)
    low_limit, high_limit = (lo, hi) if limits is None else (float(limits[0]), float(limits[1]))
    if feasible_above:
        while not ok(hi):
            if hi >= high_limit:
                raise NoFeasibleValueError(f"no value up to {high_limit:g} is feasible")
            lo, hi = hi, min(hi * 10.0, high_limit)
        while ok(lo):
            if lo <= low_limit:
                return lo
            hi, lo = lo, max(lo / 10.0, low_limit)
        feasible, infeasible = hi, lo
    else:
        while not ok(lo):
            if lo <= low_limit:
                raise NoFeasibleValueError(f"no value down to {low_limit:g} is feasible")
            hi, lo = lo, max(lo / 10.0, low_limit)
        while ok(hi):
            if hi >= high_limit:
                return hi
            lo, hi = hi, min(hi * 10.0, high_limit)
        feasible, infeasible = lo, hi
    # Invariant: ok(feasible) and not ok(infeasible).
    while max(feasible, infeasible) / min(feasible, infeasible) - 1.0 > tol:
        mid = math.sqrt(infeasible * feasible)
        if ok(mid):
            feasible = mid
        else:
            infeasible = mid
    return feasible


def integer_search(
    ok: Callable[[int], bool], lo: int, hi: int, *, feasible_above: bool = False
) -> int:
    """The extreme feasible integer in ``[lo, hi]`` of a monotone predicate.

    ``feasible_above=False`` (``ok(x)`` implies ``ok(y)`` for y ≤ x, e.g. ε increasing in the
    number of steps): the largest feasible x; ``ok(lo)`` must hold. ``feasible_above=True``: the
    smallest feasible x; ``ok(hi)`` must hold. Otherwise :class:`NoFeasibleValueError`.

    Invariant of the binary search: the feasible end is feasible and every integer beyond the
    other end is infeasible; the interval shrinks to one point, which is returned.
    """
    lo, hi = int(lo), int(hi)
    if lo > hi:
        raise ValueError(f"bracket: need lo <= hi, got lo={lo}, hi={hi}")
    if feasible_above:
        if not ok(hi):
            raise NoFeasibleValueError(f"no value up to {hi} is feasible")
        while lo < hi:  # ok(hi); every x < lo is infeasible
            mid = (lo + hi) // 2
            if ok(mid):
                hi = mid
            else:
                lo = mid + 1
        return hi
    if not ok(lo):
        raise NoFeasibleValueError(f"no value down to {lo} is feasible")
    while lo < hi:  # ok(lo); every x > hi is infeasible
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def find_noise_multiplier(
    target_epsilon: float,
    epsilon_of_sigma: Callable[[float], float],
    *,
    tol: float = 1e-3,
    lo: float = 0.1,
    hi: float = 100.0,
) -> float:
    """Smallest σ (to relative ``tol``) with ``epsilon_of_sigma(σ) <= target_epsilon``.

    Geometric bisection on σ (:func:`monotone_search`), assuming ε is non-increasing in σ. The
    bracket is widened when needed (``hi`` up to 1e6, ``lo`` down to 1e-3). The returned σ always
    satisfies the target (it is the upper end of the final bracket), and ``σ/(1+tol)`` is either
    below ``lo`` or does not satisfy it.

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

    try:
        return monotone_search(ok, lo, hi, tol=tol, limits=(_MIN_SIGMA, _MAX_SIGMA))
    except NoFeasibleValueError:
        raise ValueError(
            f"target_epsilon: no noise multiplier up to {_MAX_SIGMA:g} reaches ε={target}"
        ) from None
