"""Choosing the noise multiplier σ for personalized budgets.

All three take a *template* :class:`~pdpfl.privacy.plan.TrainingPlan` whose
``noise_multiplier`` is ignored (δ, τ, T, λ are used) and return σ such that the exact
accountant's ε is at most the target (:func:`pdpfl.calibration.parameter.calibrate_parameter`,
which re-checks its result before returning).

(a) :func:`noise_for_max_budget` -- rPDP-FL: σ such that a record sampled with q = 1 spends
    exactly ε_max, so the least private record is used at every step.
(b) :func:`noise_for_uniform_rate` -- σ for one uniform rate q at one ε (the DP-FedAvg
    baselines "Minimum" and "Dropout").
(c) :func:`group_sampling_rates` -- IDP-FedAvg Algorithm 1 (GetGroupSamplingRates, after
    Boenisch et al. Alg. 2): start from σ of the strictest group at q = c/N, lower σ until the
    group-size-weighted mean rate ≈ c/N, return σ and one rate per group.
"""

from __future__ import annotations

import math

import numpy as np

from pdpfl.calibration._accounting import as_adversary, as_training_plan, exact_epsilon
from pdpfl.calibration.binary_search import bisect_rates
from pdpfl.calibration.parameter import (
    NOISE_BRACKET,
    NOISE_LIMITS,
    NOISE_TOLERANCE,
    calibrate_parameter,
)
from pdpfl.privacy.plan import TrainingPlan


def _check_eps(value: float, name: str) -> float:
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name}: must be a finite ε > 0, got {value!r}")
    return v


def _check_rate(value: float, name: str) -> float:
    v = float(value)
    if not (0 < v <= 1):
        raise ValueError(f"{name}: sampling rate must be in (0, 1], got {value!r}")
    return v


def noise_for_uniform_rate(
    epsilon: float,
    rate: float,
    plan: TrainingPlan,
    adversary: str = "third-party",
    *,
    accountant: str = "rdp",
) -> float:
    """(b) Smallest σ (to relative 1e-4, rounded up) with ε(plan, q = ``rate``) ≤ ``epsilon``.

    :func:`pdpfl.calibration.parameter.calibrate_parameter` on σ (bracket [0.1, 100], widened
    within [1e-3, 1e6]); the result always meets the target.
    """
    eps_target = _check_eps(epsilon, "epsilon")
    q = np.array([_check_rate(rate, "rate")])
    adv = as_adversary(adversary).value
    plan = as_training_plan(plan, adv)

    def eps_of_sigma(sigma: float) -> float:
        return float(exact_epsilon(q, plan.with_noise(sigma), adv, accountant=accountant)[0])

    return calibrate_parameter(
        eps_of_sigma,
        eps_target,
        bracket=NOISE_BRACKET,
        limits=NOISE_LIMITS,
        tolerance=NOISE_TOLERANCE,
    )


def noise_for_max_budget(
    epsilon_max: float,
    plan: TrainingPlan,
    adversary: str = "third-party",
    *,
    accountant: str = "rdp",
) -> float:
    """(a) rPDP-FL: σ such that q = 1 spends ``epsilon_max`` (all records then have q ≤ 1)."""
    return noise_for_uniform_rate(
        _check_eps(epsilon_max, "epsilon_max"), 1.0, plan, adversary, accountant=accountant
    )


def group_sampling_rates(
    group_budgets: np.ndarray,
    group_sizes: np.ndarray,
    target_rate: float,
    plan: TrainingPlan,
    adversary: str = "third-party",
    *,
    scale: float = 0.95,
    rate_tol: float = 1e-3,
    q_tol: float = 1e-6,
    accountant: str = "rdp",
) -> tuple[float, np.ndarray]:
    """(c) IDP-FedAvg Algorithm 1 (GetGroupSamplingRates).

    Parameters
    ----------
    group_budgets : ε of each privacy group (any order).
    group_sizes : number of units (clients) in each group.
    target_rate : c / N, the intended expected fraction of units per round.
    plan : template plan (σ ignored). For client-level IDP-FedAvg use a centralized plan
        (``rounds=None``, ``steps`` = number of rounds I): each round samples clients once; or
        a :class:`~pdpfl.privacy.unit.SampledGaussianPlan` (its equivalent plan).
    accountant : ``rdp`` (default) or ``pld``.
    scale : the step factor s < 1 of Algorithm 1 (σ ← s·σ); the last step is refined by
        regula falsi so the mean rate lands just below the target.
    rate_tol : stop when the weighted mean rate is within ``rate_tol`` (relative) of the
        target, never above it.

    Returns
    -------
    (sigma, rates) : rates[p] is the largest feasible rate of group p at sigma (bisection with
    the exact accountant, so every group is within its budget).
    """
    eps = np.asarray(group_budgets, dtype=np.float64)
    sizes = np.asarray(group_sizes, dtype=np.float64)
    if eps.ndim != 1 or eps.size == 0 or eps.shape != sizes.shape:
        raise ValueError("group_budgets/group_sizes: need two 1-D arrays of equal, non-zero length")
    for i, e in enumerate(eps):
        _check_eps(e, f"group_budgets[{i}]")
    if np.any(sizes < 0) or sizes.sum() <= 0:
        raise ValueError("group_sizes: must be >= 0 and not all zero")
    target = _check_rate(target_rate, "target_rate")
    if not (0 < scale < 1):
        raise ValueError(f"scale: must be in (0, 1), got {scale!r}")
    adv = as_adversary(adversary).value
    plan = as_training_plan(plan, adv)
    weights = sizes / sizes.sum()

    cache: dict[float, np.ndarray] = {}

    def rates_at(sigma: float) -> np.ndarray:
        if sigma not in cache:
            p = plan.with_noise(sigma)
            cache[sigma] = bisect_rates(
                eps, lambda q: exact_epsilon(q, p, adv, accountant=accountant), q_tol=q_tol
            )
        return cache[sigma]

    def mean_rate(sigma: float) -> float:
        return float(weights @ rates_at(sigma))

    sigma_hi = noise_for_uniform_rate(float(eps.min()), target, plan, adv, accountant=accountant)
    if mean_rate(sigma_hi) <= target:  # only the strictest group (or rounding): done
        return sigma_hi, rates_at(sigma_hi)
    sigma_lo = sigma_hi
    while True:  # Algorithm 1's loop: σ ← s·σ until the mean rate is at most the target
        sigma_lo *= scale
        if mean_rate(sigma_lo) <= target:
            break
        sigma_hi = sigma_lo
        if sigma_lo < 1e-6:
            raise RuntimeError("group_sampling_rates: σ collapsed without reaching target_rate")
    # Refine inside [sigma_lo, sigma_hi] (mean(sigma_lo) <= target < mean(sigma_hi)) by
    # regula falsi (Illinois variant) on mean_rate(σ) − target, keeping the bracket.
    f_lo, f_hi = mean_rate(sigma_lo) - target, mean_rate(sigma_hi) - target
    side = 0
    for _ in range(100):
        if (
            target - mean_rate(sigma_lo) <= rate_tol * target
            or sigma_hi - sigma_lo <= 1e-12 * sigma_hi
        ):
            break
        mid = sigma_lo - f_lo * (sigma_hi - sigma_lo) / (f_hi - f_lo)
        if not (sigma_lo < mid < sigma_hi):
            mid = 0.5 * (sigma_lo + sigma_hi)
        f_mid = mean_rate(mid) - target
        if f_mid <= 0:
            sigma_lo, f_lo = mid, f_mid
            if side == -1:
                f_hi *= 0.5
            side = -1
        else:
            sigma_hi, f_hi = mid, f_mid
            if side == 1:
                f_lo *= 0.5
            side = 1
    return sigma_lo, rates_at(sigma_lo).copy()
