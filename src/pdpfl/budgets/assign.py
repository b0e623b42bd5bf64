"""Scenarios by name, their public statistics, and seeded budget assignment
(:mod:`pdpfl.budgets`).
"""

from __future__ import annotations

import math

import numpy as np

from pdpfl.budgets.scenarios import (
    SCENARIOS,
    BoundedMixGauss,
    BoundedPareto,
    BudgetScenario,
    PerLabel,
    Relaxed,
    Strict,
    ThreeLevels,
    Uniform,
    UserStudyGroups,
    _check_n,
    _positive_values,
    _probabilities,
    validate_budgets,
)


def public_statistics(scenario: BudgetScenario) -> tuple[float | None, float | None]:
    """``(minimum, mean)`` of a scenario's budget *distribution*, from its public parameters.

    These are properties of the configured scenario, not of any silo's realized budgets, so a
    server may use them without learning anything about the records: the Minimum baseline's
    ε_min (a lower bound of every budget the scenario can produce) and the Dropout baseline's
    ε_mod (the scenario's expected budget). ``None`` where the scenario does not determine the
    value (e.g. the mean of data-dependent :class:`PerLabel` budgets).
    """
    if isinstance(scenario, ThreeLevels | UserStudyGroups):
        p = _probabilities(scenario.ratios, "ratios")
        v = _positive_values(scenario.values, "values")
        return float(v[p > 0].min()), float(np.dot(p, v))
    if isinstance(scenario, Uniform):
        return float(scenario.value), float(scenario.value)
    if isinstance(scenario, Strict):
        lowest = float(_positive_values(scenario.values, "values").min())
        return lowest, lowest
    if isinstance(scenario, Relaxed):
        highest = float(_positive_values(scenario.values, "values").max())
        return highest, highest
    if isinstance(scenario, BoundedPareto):
        lo, hi, a = float(scenario.lower), float(scenario.upper), float(scenario.shape)
        u = hi / lo - 1.0  # E[min(lower·(1+X), upper)] = lower·(1 + ∫_0^u (1+x)^-a dx)
        integral = math.log1p(u) if a == 1.0 else ((1.0 + u) ** (1.0 - a) - 1.0) / (1.0 - a)
        return lo, lo * (1.0 + integral)
    if isinstance(scenario, BoundedMixGauss):
        # scipy.special's Φ and the closed-form φ: scipy.stats costs ~0.5 s to import
        from scipy.special import ndtr

        def pdf(x: float) -> float:
            return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)

        lo, hi = (float(b) for b in scenario.bounds)
        p = _probabilities(scenario.weights, "weights")
        mean = 0.0
        for w, m, var in zip(p, scenario.means, scenario.variances, strict=True):
            s = math.sqrt(float(var))
            if s == 0.0:
                mean += w * min(max(float(m), lo), hi)
                continue
            a, b = (lo - m) / s, (hi - m) / s
            inside = m * (ndtr(b) - ndtr(a)) + s * (pdf(a) - pdf(b))
            mean += w * (lo * ndtr(a) + inside + hi * ndtr(-b))
        return lo, float(mean)
    if isinstance(scenario, PerLabel):
        return float(min(float(v) for v in scenario.budget_by_label.values())), None
    return None, None


def make_scenario(name: str, **params: object) -> BudgetScenario:
    """Build a scenario by name; ``params`` are the scenario's constructor arguments.

    Names: ``three-levels``, ``bounded-pareto``, ``bounded-mix-gauss``, ``user-study-1``,
    ``user-study-2``, ``strict``, ``relaxed``, ``per-label``, ``uniform``.
    """
    key = name.strip().lower().replace("_", "-")
    if key not in SCENARIOS:
        raise ValueError(f"scenario: unknown name {name!r}; choose one of {sorted(SCENARIOS)}")
    try:
        return SCENARIOS[key](**params)
    except TypeError as exc:
        raise ValueError(f"scenario {key!r}: bad parameters {sorted(params)} ({exc})") from None


def assign_budgets(
    scenario: BudgetScenario,
    n: int,
    rng: np.random.Generator,
    labels: np.ndarray | None = None,
) -> np.ndarray:
    """Budgets for records ``0..n-1``: draw from ``scenario`` and assign by a seeded permutation.

    Data-dependent scenarios (:class:`PerLabel`) use ``labels`` (one per record) instead; the
    assignment is then determined by the labels themselves.
    """
    n = _check_n(n)
    if isinstance(scenario, PerLabel):
        if labels is None:
            raise ValueError("labels: the per-label scenario needs one label per record")
        return validate_budgets(scenario.sample(n, rng, labels=labels))
    eps = validate_budgets(scenario.sample(n, rng))
    if eps.size != n:
        raise ValueError(f"scenario returned {eps.size} budgets, expected {n}")
    return eps[rng.permutation(n)]


# ----------------------------------------------------------------------------- files
