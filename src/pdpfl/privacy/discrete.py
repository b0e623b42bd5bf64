"""Rényi DP of the discrete Gaussian and of the distributed discrete Gaussian (sums of shares).

Units: everything here is in *integer units* -- the released vector is an integer vector
x + Z ∈ Z^d, neighbouring inputs differ by an integer vector k with ‖k‖₂² ≤ N (the accounted
squared L2 sensitivity, a real number) and optionally ‖k‖₁ ≤ Δ₁.

The discrete Gaussian (Canonne, Kamath & Steinke, NeurIPS 2020, Prop. 5 / Thm. 4)
    For Y ~ N_Z(0, σ²) and an integer shift k, completing the square gives

        Σ_x P[Y = x − k]^α P[Y = x]^{1−α} = e^{α(α−1)k²/(2σ²)} · θ(αk) / θ(0),
        θ(c) = Σ_{x∈Z} e^{−(x−c)²/(2σ²)},

    and θ(c) ≤ θ(0) by Poisson summation (θ(c) = √(2π)σ Σ_j e^{−2π²σ²j²} cos(2πjc)). Hence
    D_α(Y + k ‖ Y) ≤ αk²/(2σ²) for every α > 1, **with equality at integer α** (αk is then an
    integer and θ(αk) = θ(0)): the integer-order Rényi moments are exactly the continuous
    Gaussian's; fractional orders are at most them. Coordinates are independent, so in Z^d the
    bound is α‖k‖₂²/(2σ²), again exact at integer orders (:func:`discrete_gaussian_rdp`).

The distributed discrete Gaussian (Kairouz, Liu & Steinke, ICML 2021, Theorem 1 and its τ)
    Z = X_1 + … + X_n with X_i i.i.d. N_Z(0, σ²) per coordinate (n shares; a released sum with
    more than n survivors adds independent shares to the sum of n: post-processing) is not a
    discrete Gaussian, but close to Y ~ N_Z(0, nσ²) pointwise. KLS bound the gap by
    τ = 10·Σ_{k=1}^{n−1} e^{−2π²σ²·k/(k+1)}; we use the same argument with explicit constants,
    proved here so that every constant is checked:

    *Lemma.* For every z ∈ Z, |log(P[Z = z] / P[Y = z])| ≤ T with

        T = Σ_{k=1}^{n−1} log((1 + 2E(s_k)) / (1 − 2E(s_k))),  s_k² = σ²·k/(k+1),
        E(s) = Σ_{j≥1} e^{−2π²s²j²} ≤ x + x⁴/(1 − x⁴),  x = e^{−2π²s²}   (needs 2E(s_k) < 1).

    *Proof.* Write the unnormalised mass of X_1 + … + X_k as g_k(z) = e^{−z²/(2kσ²)}·h_k(z)
    (h_1 ≡ 1). Completing the square, g_{k+1}(z) = e^{−z²/(2(k+1)σ²)} Σ_x e^{−(x−c)²/(2s_k²)}
    h_k(x) with c = kz/(k+1), and by Poisson summation Σ_x e^{−(x−c)²/(2s²)} lies in
    √(2π)s·[1 − 2E(s), 1 + 2E(s)] for every c. By induction h_n(z) ∈ C·[Π(1 − 2E_k),
    Π(1 + 2E_k)] for one constant C. P[Z = z]/P[Y = z] = h_n(z)/E_Y[h_n] is a ratio of two
    values in that interval. ∎

    Then for an integer shift k ∈ Z^d, only the coordinates with k_j ≠ 0 contribute (product
    distributions), at most s = min(d, N, Δ₁) of them (|k_j| ≥ 1 there), and on each the
    pointwise bounds P ≤ e^T·P', Q ≥ e^{−T}·Q' give Σ P^α Q^{1−α} ≤ e^{(2α−1)T} Σ P'^α Q'^{1−α}:

        D_α(Z + k ‖ Z) ≤ α·N/(2nσ²) + s·T·(2α − 1)/(α − 1)      (every α > 1)

    (:func:`distributed_discrete_gaussian_rdp`), symmetric in the two directions (Z is
    symmetric). The right side is smallest at α* = 1 + √(s·T·2nσ²/N); since RDP is
    non-decreasing in α, orders below α* take its value at α* (a monotone curve).

    KLS's Theorem 1 states the same structure as ½ε²-concentrated DP with τ ≈ 2.5·T (their
    constant 10 against our 4 to first order). T is negligible once σ ≳ 2 (σ = 2: T ≈ 3·10^{−17}
    for any n; σ = 10: T underflows to 0), so the distributed discrete Gaussian is then
    accounted like the continuous Gaussian with noise multiplier √(nσ²/N); pdpfl's shares have
    σ_s in the thousands or more (:mod:`pdpfl.dp.discrete_params`).

Every value returned is rounded up (two ulps after the last operation); a T below the smallest
float (underflow to 0) is below that rounding.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.orders import check_orders

__all__ = [
    "discrete_gaussian_rdp",
    "distributed_discrete_gaussian_rdp",
    "sum_log_ratio_bound",
]

_TWO_PI_SQ = 2.0 * math.pi * math.pi
#: Relative slack added to T for the float error of its few exp/log1p evaluations.
_T_SLACK = 1e-12


def _round_up(x: np.ndarray) -> np.ndarray:
    result: np.ndarray = np.nextafter(np.nextafter(x, np.inf), np.inf)
    return result


def _check_positive_int(value: object, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_variance(value: object, name: str = "share_variance") -> float:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number > 0, got {value!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
    return v


def _check_sensitivity(value: object) -> float:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"l2_sensitivity_sq: expected a number >= 0, got {value!r}") from None
    if isinstance(value, bool) or not (math.isfinite(v) and v >= 0):
        raise ValueError(f"l2_sensitivity_sq: must be a finite number >= 0, got {value!r}")
    return v


def sum_log_ratio_bound(shares: int, share_variance: float) -> float:
    """T of the module docstring's Lemma: sup_z |log P[Σ of ``shares`` N_Z(0, σ²)] − log
    P[N_Z(0, shares·σ²)]| ≤ T (0 for one share; ``inf`` if 2E(s_k) ≥ 1, σ ≲ 0.3)."""
    n = _check_positive_int(shares, "shares")
    var = _check_variance(share_variance)
    if n == 1:
        return 0.0
    k = np.arange(1, n, dtype=np.float64)
    s2 = var * k / (k + 1.0)
    x = np.exp(-_TWO_PI_SQ * s2)
    x4 = x**4
    e = (x + x4 / (1.0 - x4)) * (1.0 + _T_SLACK)
    if np.any(2.0 * e >= 1.0):
        return math.inf
    t = np.log1p(2.0 * e) - np.log1p(-2.0 * e)
    return float(np.sum(t)) * (1.0 + _T_SLACK)


def discrete_gaussian_rdp(
    orders: ArrayLike, variance: float, l2_sensitivity_sq: float = 1.0
) -> np.ndarray:
    """RDP of x + N_Z(0, σ²)^d for integer neighbours at squared L2 distance ≤ N:
    α·N/(2σ²), exact at integer orders (module docstring), rounded up."""
    a = check_orders(orders)
    var = _check_variance(variance, "variance")
    n_sq = _check_sensitivity(l2_sensitivity_sq)
    return _round_up(a * n_sq / (2.0 * var))


def distributed_discrete_gaussian_rdp(
    orders: ArrayLike,
    share_variance: float,
    shares: int,
    l2_sensitivity_sq: float,
    dimension: int,
    l1_sensitivity: int | None = None,
) -> np.ndarray:
    """RDP of the sum of ``shares`` i.i.d. N_Z(0, σ²)^d shares added to an integer vector
    (module docstring): α·N/(2nσ²) + min(d, N, Δ₁)·T·(2α − 1)/(α − 1), rounded up.

    Parameters
    ----------
    orders
        Rényi orders α > 1.
    share_variance
        σ² of one share (integer units); a value below the share's true σ² is conservative.
    shares
        n ≥ 1: the fewest shares any released sum holds (the survivor threshold t).
    l2_sensitivity_sq
        N ≥ 0 (real): a bound on the squared L2 norm of any one unit's integer contribution.
    dimension
        d ≥ 1 coordinates.
    l1_sensitivity
        Optional Δ₁ (integer) bounding the L1 norm of a contribution (tightens the τ term).
    """
    a = check_orders(orders)
    var = _check_variance(share_variance)
    n = _check_positive_int(shares, "shares")
    n_sq = _check_sensitivity(l2_sensitivity_sq)
    d = _check_positive_int(dimension, "dimension")
    support = min(d, math.floor(n_sq))  # ‖k‖₀ ≤ ‖k‖₂² for integer k
    if l1_sensitivity is not None:
        support = min(support, _check_positive_int(l1_sensitivity, "l1_sensitivity", 0))
    slope = n_sq / (2.0 * n * var)
    t = sum_log_ratio_bound(n, var) if support > 0 else 0.0
    if t == 0.0:
        return _round_up(a * slope)
    if not math.isfinite(t):
        return np.full(a.size, np.inf)
    # The bound f(α) = α·slope + s·T·(2α − 1)/(α − 1) holds at every α; RDP is non-decreasing
    # in α, so f(max(α, α*)) with α* = 1 + √(s·T/slope) (the minimum of f) holds too.
    knee = 1.0 + math.sqrt(support * t / slope)
    b = np.maximum(a, knee)
    return _round_up(b * slope + support * t * (2.0 * b - 1.0) / (b - 1.0))
