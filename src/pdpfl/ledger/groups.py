"""Budget groups for reporting, and the one tolerance for "over budget".

Every report groups units by budget the same way (:func:`budget_groups`): a discrete budget
mix (at most :data:`MAX_LEVELS` distinct values, e.g. ThreeLevels 0.1/1/5) gets one group per
level, labelled by the value; a continuous one gets fixed public bins. Labels depend only on the
budgets of the units being grouped and on these public constants, so per-silo summaries merge by
label.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "BIN_EDGES",
    "BIN_LABELS",
    "BUDGET_TOLERANCE",
    "UnitFacts",
    "MAX_LEVELS",
    "budget_groups",
    "over_budget",
]

#: Relative (and absolute) slack when *reporting* ε against a budget: floating-point noise only.
#: The pre-check that stops a unit compares without slack (it never lets a unit overspend).
BUDGET_TOLERANCE = 1e-9

#: A budget mix with at most this many distinct values is reported one group per value.
MAX_LEVELS = 8

#: Upper edges of the public bins for continuous budget distributions.
BIN_EDGES = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
BIN_LABELS = ("(0,0.2]", "(0.2,0.5]", "(0.5,1]", "(1,2]", "(2,5]", "(5,10]", "(10,inf)")


def over_budget(spent: np.ndarray, budgets: np.ndarray) -> np.ndarray:
    """True where ``spent`` exceeds ``budgets`` by more than floating-point noise."""
    b = np.asarray(budgets, dtype=np.float64)
    return np.asarray(spent, dtype=np.float64) > b * (1 + BUDGET_TOLERANCE) + BUDGET_TOLERANCE


def budget_groups(budgets: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """``(group index per unit, group labels)`` under pdpfl's one grouping policy."""
    budgets = np.asarray(budgets, dtype=np.float64)
    if budgets.shape == (1,):  # one unit (e.g. a client's own ledger): its own level
        return np.zeros(1, dtype=np.int64), [f"{float(budgets.reshape(-1)[0]):g}"]
    levels = np.unique(budgets)
    if levels.size <= MAX_LEVELS:
        return np.searchsorted(levels, budgets).astype(np.int64), [f"{v:g}" for v in levels]
    idx = np.searchsorted(np.asarray(BIN_EDGES), budgets, side="left").astype(np.int64)
    return idx, list(BIN_LABELS)


class UnitFacts:
    """Per-unit δ-floor and lifetime facts, reduced per budget group
    (:class:`~pdpfl.ledger.summary.GroupSummary`'s ``floor``, ``prior``, ``lifetime_*``)."""

    def __init__(
        self,
        floor: np.ndarray,
        prior: np.ndarray,
        lifetime: dict[str, np.ndarray],
        budgets: np.ndarray,
    ) -> None:
        self.floor, self.prior, self.lifetime = floor, prior, lifetime
        self.over = {o: over_budget(e, budgets) for o, e in lifetime.items()}

    def group(self, m: np.ndarray) -> dict[str, Any]:
        return {
            "floor": int(self.floor[m].sum()),
            "prior": int(self.prior[m].sum()),
            "lifetime_max": {o: float(e[m].max()) for o, e in self.lifetime.items()},
            "lifetime_over": {o: int(v[m].sum()) for o, v in self.over.items()},
        }
