"""rPDP-FL's own check of a federation before training: the budget mix can be kept.

A discrete budget scenario (e.g. ThreeLevels 70/20/10 %) is applied per silo, each silo rounding
the shares to whole records; in silos that are too small the realized mix drifts from the
configured one, which would change what the run's people were promised. That is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pdpfl.fl.common import BudgetSource, client_budgets

__all__ = ["MIX_TOLERANCE", "check_budget_mix"]


#: Largest tolerated gap between a level's configured and realized share of all records.
MIX_TOLERANCE = 0.05


def check_budget_mix(source: BudgetSource, clients: list[Any]) -> None:
    """Refuse a discrete budget scenario whose shares the silos are too small to keep."""
    from pdpfl import budgets as budgets_mod
    from pdpfl.seeding import numpy_generator

    if source.file is not None:
        return  # per-record budgets from a file: no configured shares
    # what the silos will draw (cheap: one draw per record), then the mix they should keep
    realized = np.concatenate([client_budgets(source, k, c) for k, c in enumerate(clients)])
    scenario = budgets_mod.make_scenario(source.scenario, **source.params)
    if isinstance(scenario, budgets_mod.PerLabel):
        return  # the labels decide: no configured shares to keep
    total = sum(len(c.y_train) for c in clients)
    reference = budgets_mod.assign_budgets(
        scenario, total, numpy_generator(source.seed, "budget-mix-check")
    )
    levels, want = np.unique(reference, return_counts=True)
    if len(levels) > 8:
        return  # a continuous scenario: no exact shares
    got = np.array([np.sum(np.isclose(realized, v)) for v in levels], dtype=float)
    want_share, got_share = want / total, got / max(len(realized), 1)
    if np.max(np.abs(want_share - got_share)) <= MIX_TOLERANCE:
        return
    sizes = [len(c.y_train) for c in clients]
    fmt = ", ".join
    raise ValueError(
        f"budgets: the {source.scenario} mix cannot be kept in silos this small: "
        f"configured {fmt(f'ε={v:g}: {w:.0%}' for v, w in zip(levels, want_share, strict=True))}"
        ", but the records got "
        f"{fmt(f'ε={v:g}: {g:.0%}' for v, g in zip(levels, got_share, strict=True))}"
        f" (each of the {len(clients)} silos, holding {min(sizes)}-{max(sizes)} training records, "
        "rounds the shares to whole records); use fewer silos (data.num_clients), a continuous "
        "scenario, or per-record budgets (budgets.file)"
    )
