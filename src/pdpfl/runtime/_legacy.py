"""Transitional: read a first-release flat privacy summary as a typed PrivacySummary.

First-release algorithms return ``privacy_summary()`` as a flat dictionary (``n_records``,
``eps_third_party_max``, ``group.<label>.max_spent_third_party``, ...). This module turns one
into a :class:`~pdpfl.ledger.PrivacySummary` so the runtime reads one type; it goes once every
algorithm returns the typed summary itself.
"""

from __future__ import annotations

import math
from typing import Any

from pdpfl.ledger import OBSERVERS, GroupSummary, PrivacySummary

__all__ = ["as_summary"]

_TAGS = {"third-party": "third_party", "server": "server"}


def as_summary(value: Any, unit: str) -> PrivacySummary | None:
    """``value`` if it is already typed; a converted flat dictionary otherwise (None if empty)."""
    if value is None or isinstance(value, PrivacySummary):
        return value
    d = dict(value)
    if not d:
        return None
    private = bool(d.get("private", True))
    observers = tuple(
        o for o in OBSERVERS
        if f"eps_{_TAGS[o]}_max" in d and d[f"eps_{_TAGS[o]}_max"] is not None
    )
    groups: dict[str, dict[str, Any]] = {}
    for key, v in d.items():
        if key.startswith("group."):
            label, stat = key[len("group."):].rsplit(".", 1)
            groups.setdefault(label, {})[stat] = v
    rows = []
    for label, g in groups.items():
        count = int(g.get("count", 0))
        budget = float(g.get("budget", math.nan))
        info: dict[str, float] = {
            k: float(g[k]) for k in ("rate", "noise_multiplier", "mean_rate") if k in g
        }
        rows.append(GroupSummary(
            label=label, units=count, budget_min=budget, budget_max=budget,
            excluded=int(g.get("excluded", 0)), stopped=int(g.get("stopped", 0)),
            spent_max={o: float(g[f"max_spent_{_TAGS[o]}"]) for o in OBSERVERS
                       if f"max_spent_{_TAGS[o]}" in g},
            utilization_sum={o: float(g[f"sum_utilization_{_TAGS[o]}"]) for o in OBSERVERS
                             if f"sum_utilization_{_TAGS[o]}" in g},
            over_budget={o: int(g[f"over_budget_{_TAGS[o]}"]) for o in OBSERVERS
                         if f"over_budget_{_TAGS[o]}" in g},
            info=info,
        ))
    units = int(d.get("n_records") or d.get("users") or sum(r.units for r in rows))
    top: dict[str, float] = {
        k: float(d[k]) for k in ("noise_multiplier",) if d.get(k) is not None
    }
    if not rows and observers:
        # a summary without groups (e.g. a common planned ε for every unit): one group "all"
        rows.append(GroupSummary(
            label="all", units=units, budget_min=math.nan, budget_max=math.nan,
            stopped=int(d.get("stopped", 0)), excluded=int(d.get("excluded", 0)),
            spent_max={o: float(d[f"eps_{_TAGS[o]}_max"]) for o in observers},
            over_budget={o: int(d.get(f"over_budget_{_TAGS[o]}", 0)) for o in observers},
        ))
    finite = all(math.isfinite(v) for r in rows for v in r.spent_max.values())
    return PrivacySummary(
        unit=unit, units=units, observers=observers or OBSERVERS,
        groups=tuple(sorted(rows, key=lambda r: (r.budget_min, r.label))),
        private=private and finite,
        approximate={k: float(v) for k, v in d.items()
                     if k.startswith(("clt_", "approx")) and isinstance(v, int | float)},
        info=top,
    )
