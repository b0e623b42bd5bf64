"""The budget scenarios of the papers (see :mod:`pdpfl.budgets`) and the check every budget
array passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class BudgetScenario(Protocol):
    """A seeded distribution of personal privacy budgets ε."""

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Draw ``n`` budgets (float64, > 0) using ``rng``."""
        ...


# ----------------------------------------------------------------------------- validation


#: The smallest budget a person can choose: below it no mechanism here gives a usable rate
#: (the calibrated rate sits at the δ-only floor), so a smaller ε (1e-300, a unit typo) is an
#: input error, not a choice. To keep someone's data out of training, leave their record out.
MIN_BUDGET = 1e-3


def below_minimum(value: float) -> str | None:
    """The message for a budget below :data:`MIN_BUDGET` (None if it is allowed)."""
    if value < MIN_BUDGET:
        return (
            f"ε = {value!r} is below the smallest budget pdpfl accepts, {MIN_BUDGET:g} (a "
            "smaller ε gives no usable sampling rate); to keep this record out of training, "
            "remove it from the data"
        )
    return None


def validate_budgets(
    budgets: object, name: str = "budgets", *, minimum: float | None = None
) -> np.ndarray:
    """Return ``budgets`` as a 1-D float64 array, or raise ``ValueError`` naming the problem.

    Requirements: non-empty, one-dimensional, every value finite and strictly positive (and at
    least ``minimum`` when given: :data:`MIN_BUDGET` for budgets a person chose).
    """
    try:
        arr = np.asarray(budgets, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: values must be numbers ({exc})") from None
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of shape (n,), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name}: no budgets given (empty array)")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(
            f"{name}: {int(bad.sum())} value(s) are NaN or infinite (first at index "
            f"{int(np.argmax(bad))}); every ε must be a finite number > 0"
        )
    nonpos = arr <= 0
    if nonpos.any():
        i = int(np.argmax(nonpos))
        raise ValueError(
            f"{name}: {int(nonpos.sum())} value(s) are <= 0 (first: {arr[i]!r} at index {i}); "
            "every ε must be > 0"
        )
    if minimum is not None and (arr < minimum).any():
        i = int(np.argmax(arr < minimum))
        raise ValueError(
            f"{name}: {int((arr < minimum).sum())} value(s) are below the minimum "
            f"{minimum:g} (first: index {i}: {below_minimum(float(arr[i]))})"
        )
    return arr


def _check_n(n: int) -> int:
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n: number of budgets must be an integer >= 1, got {n!r}")
    return int(n)


def _probabilities(ratios: Sequence[float], name: str) -> np.ndarray:
    p = np.asarray(ratios, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(
            f"{name}: expected a non-empty list of non-negative shares, got {ratios!r}"
        )
    if p.sum() <= 0:
        raise ValueError(f"{name}: shares must not all be zero")
    if not math.isclose(float(p.sum()), 1.0, rel_tol=0, abs_tol=1e-6):
        raise ValueError(f"{name}: shares must sum to 1, got {float(p.sum()):.6g}")
    shares: np.ndarray = p / p.sum()
    return shares


def _positive_values(values: Sequence[float], name: str, size: int | None = None) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size == 0 or not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise ValueError(f"{name}: expected a non-empty list of finite ε > 0, got {values!r}")
    if size is not None and v.size != size:
        raise ValueError(f"{name}: expected {size} values (one per share), got {v.size}")
    return v


def _exact_counts(p: np.ndarray, n: int) -> np.ndarray:
    """Largest-remainder rounding of ``p * n`` to integers summing to ``n``."""
    raw = p * n
    counts: np.ndarray = np.floor(raw).astype(np.int64)
    short = n - int(counts.sum())
    if short > 0:
        order = np.argsort(-(raw - counts), kind="stable")
        counts[order[:short]] += 1
    return counts


def _sample_levels(
    values: tuple[float, ...], ratios: tuple[float, ...], n: int, rng: np.random.Generator
) -> np.ndarray:
    """``n`` budgets, level ``values[k]`` with probability ``ratios[k]`` (validated here)."""
    n = _check_n(n)
    p = _probabilities(ratios, "ratios")
    return _levels(_positive_values(values, "values"), p, n, rng)


def _levels(values: np.ndarray, p: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    out = np.repeat(values, _exact_counts(p, n))
    return rng.permutation(out)


# ----------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class ThreeLevels:
    """Discrete privacy categories with exact shares (rPDP-FL §7 "ThreeLevels").

    Parameters
    ----------
    ratios : shares of the categories, summing to 1 (default 0.7 / 0.2 / 0.1).
    values : ε of each category (default 0.1 / 1.0 / 5.0).
    """

    ratios: tuple[float, ...] = (0.7, 0.2, 0.1)
    values: tuple[float, ...] = (0.1, 1.0, 5.0)

    def __post_init__(self) -> None:
        p = _probabilities(self.ratios, "ratios")
        _positive_values(self.values, "values", size=p.size)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return _sample_levels(self.values, self.ratios, n, rng)


@dataclass(frozen=True)
class BoundedPareto:
    """Pareto-distributed budgets clipped to ``[lower, upper]`` (rPDP-FL §7 "BoundedPareto").

    ε = lower · (1 + X) with X ~ Lomax(shape) (i.e. a type-I Pareto with scale ``lower``),
    then clipped at ``upper``. Most records get ε close to ``lower`` (strict privacy); a heavy
    tail opts for weaker protection.
    """

    shape: float = 1.0
    lower: float = 0.1
    upper: float = 10.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.shape) and self.shape > 0):
            raise ValueError(f"shape: must be a finite number > 0, got {self.shape!r}")
        if not (math.isfinite(self.lower) and self.lower > 0):
            raise ValueError(f"lower: must be a finite number > 0, got {self.lower!r}")
        if not (math.isfinite(self.upper) and self.upper >= self.lower):
            raise ValueError(
                f"upper: must be finite and >= lower ({self.lower}), got {self.upper!r}"
            )

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        n = _check_n(n)
        eps = self.lower * (1.0 + rng.pareto(self.shape, size=n))
        return np.clip(eps, self.lower, self.upper)


@dataclass(frozen=True)
class BoundedMixGauss:
    """Gaussian-mixture budgets clipped to ``bounds`` (rPDP-FL §7 "BoundedMixGauss").

    Component k is chosen with probability ``weights[k]`` and ε ~ N(means[k], variances[k]):
    the second parameter is the **variance** (paper notation N(μ, σ²)), so the standard
    deviation is ``sqrt(variances[k])``. Samples are clipped to ``bounds``.
    """

    weights: tuple[float, ...] = (0.7, 0.2, 0.1)
    means: tuple[float, ...] = (0.1, 1.0, 5.0)
    variances: tuple[float, ...] = (0.01, 0.05, 0.5)
    bounds: tuple[float, float] = (0.1, 10.0)

    def __post_init__(self) -> None:
        p = _probabilities(self.weights, "weights")
        m = np.asarray(self.means, dtype=np.float64)
        v = np.asarray(self.variances, dtype=np.float64)
        if m.shape != p.shape or not np.all(np.isfinite(m)):
            raise ValueError(f"means: expected {p.size} finite values, got {self.means!r}")
        if v.shape != p.shape or not np.all(np.isfinite(v)) or np.any(v < 0):
            raise ValueError(
                f"variances: expected {p.size} finite values >= 0, got {self.variances!r}"
            )
        lo, hi = (float(b) for b in self.bounds)
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
            raise ValueError(
                f"bounds: expected (lower, upper) with 0 < lower <= upper, got {self.bounds!r}"
            )

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        n = _check_n(n)
        p = _probabilities(self.weights, "weights")
        comp = rng.choice(p.size, size=n, p=p)
        means = np.asarray(self.means, dtype=np.float64)[comp]
        stds = np.sqrt(np.asarray(self.variances, dtype=np.float64))[comp]
        eps = rng.normal(means, stds)
        return np.clip(eps, float(self.bounds[0]), float(self.bounds[1]))


#: User-study shares used by Boenisch et al. and IDP-FedAvg §V.
USER_STUDY_1 = (0.34, 0.43, 0.23)
USER_STUDY_2 = (0.54, 0.37, 0.09)


@dataclass(frozen=True)
class UserStudyGroups:
    """Client-level privacy groups with user-study shares (IDP-FedAvg §V, ε: 1-2-3 by default).

    ``UserStudyGroups.study_1()`` = 34 % / 43 % / 23 %, ``study_2()`` = 54 % / 37 % / 9 %.
    """

    ratios: tuple[float, ...] = USER_STUDY_1
    values: tuple[float, ...] = (1.0, 2.0, 3.0)

    def __post_init__(self) -> None:
        p = _probabilities(self.ratios, "ratios")
        _positive_values(self.values, "values", size=p.size)

    @classmethod
    def study_1(cls, values: tuple[float, ...] = (1.0, 2.0, 3.0)) -> UserStudyGroups:
        return cls(USER_STUDY_1, tuple(values))

    @classmethod
    def study_2(cls, values: tuple[float, ...] = (1.0, 2.0, 3.0)) -> UserStudyGroups:
        return cls(USER_STUDY_2, tuple(values))

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return _sample_levels(self.values, self.ratios, n, rng)


@dataclass(frozen=True)
class Uniform:
    """Everyone has the same budget ``value``."""

    value: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.value) and self.value > 0):
            raise ValueError(f"value: ε must be a finite number > 0, got {self.value!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(_check_n(n), float(self.value))


@dataclass(frozen=True)
class Strict:
    """IDP-FedAvg "100 %-0 %-0 %": everyone at the strictest (smallest) of ``values``."""

    values: tuple[float, ...] = (1.0, 2.0, 3.0)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(_check_n(n), float(_positive_values(self.values, "values").min()))


@dataclass(frozen=True)
class Relaxed:
    """IDP-FedAvg "0 %-0 %-100 %": everyone at the most relaxed (largest) of ``values``."""

    values: tuple[float, ...] = (1.0, 2.0, 3.0)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(_check_n(n), float(_positive_values(self.values, "values").max()))


#: rPDP-FL Appendix A, Heart-Disease: label 0 = normal (ε = 0.5), label 1 = abnormal (ε = 0.05).
HEART_DISEASE_BUDGETS: dict[int, float] = {0: 0.5, 1: 0.05}


@dataclass(frozen=True)
class PerLabel:
    """Data-dependent budgets: ε chosen by each record's class label (rPDP-FL Appendix A).

    This scenario needs the labels: use :func:`assign_budgets` with ``labels=`` or
    :meth:`for_labels`. :meth:`sample` without labels raises a ``ValueError``.
    """

    budget_by_label: Mapping[int, float] = field(
        default_factory=lambda: dict(HEART_DISEASE_BUDGETS)
    )

    def __post_init__(self) -> None:
        if not self.budget_by_label:
            raise ValueError("budget_by_label: needs at least one label -> ε entry")
        for label, eps in self.budget_by_label.items():
            if not (math.isfinite(float(eps)) and float(eps) > 0):
                raise ValueError(
                    f"budget_by_label[{label!r}]: ε must be finite and > 0, got {eps!r}"
                )

    def for_labels(self, labels: np.ndarray) -> np.ndarray:
        """The budget of each record given its label; unknown labels raise ``ValueError``."""
        lab = np.asarray(labels)
        if lab.ndim != 1 or lab.size == 0:
            raise ValueError(f"labels: expected a non-empty 1-D array, got shape {lab.shape}")
        keys = np.array(sorted(int(k) for k in self.budget_by_label), dtype=np.int64)
        vals = np.array([float(self.budget_by_label[k]) for k in keys.tolist()])
        lab_int = lab.astype(np.int64)
        if not np.array_equal(lab_int, lab):
            raise ValueError("labels: must be integers")
        pos = np.clip(np.searchsorted(keys, lab_int), 0, keys.size - 1)
        unknown = keys[pos] != lab_int
        if unknown.any():
            missing = sorted(set(lab_int[unknown].tolist()))[:10]
            raise ValueError(f"labels: no budget given for label(s) {missing}")
        return vals[pos]

    def sample(
        self, n: int, rng: np.random.Generator, labels: np.ndarray | None = None
    ) -> np.ndarray:
        if labels is None:
            raise ValueError(
                "PerLabel budgets are data-dependent: pass labels (assign_budgets(..., labels=y))"
            )
        out = self.for_labels(labels)
        if out.size != _check_n(n):
            raise ValueError(f"labels: expected {n} labels, got {out.size}")
        return out


# ----------------------------------------------------------------------------- registry


def _user_study(idx: int) -> Callable[..., BudgetScenario]:
    def make(
        values: Sequence[float] = (1.0, 2.0, 3.0), ratios: Sequence[float] | None = None
    ) -> UserStudyGroups:
        shares = ratios if ratios is not None else (USER_STUDY_1 if idx == 1 else USER_STUDY_2)
        return UserStudyGroups(tuple(shares), tuple(values))

    return make


def _tuples(cls: Callable[..., BudgetScenario]) -> Callable[..., BudgetScenario]:
    def make(**params: object) -> BudgetScenario:
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in params.items()})

    return make


def _per_label(budget_by_label: Mapping[int | str, float] | None = None) -> PerLabel:
    if budget_by_label is None:
        return PerLabel()
    return PerLabel({int(k): float(v) for k, v in budget_by_label.items()})


SCENARIOS: dict[str, Callable[..., BudgetScenario]] = {
    "three-levels": _tuples(ThreeLevels),
    "bounded-pareto": _tuples(BoundedPareto),
    "bounded-mix-gauss": _tuples(BoundedMixGauss),
    "user-study-1": _user_study(1),
    "user-study-2": _user_study(2),
    "strict": _tuples(Strict),
    "relaxed": _tuples(Relaxed),
    "per-label": _per_label,
    "uniform": _tuples(Uniform),
}
