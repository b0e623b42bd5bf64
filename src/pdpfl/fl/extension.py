"""Extending a finished run past the T its mechanism was published for (issue #34, item 2).

``pdpfl run CONFIG --resume --set rounds=N`` (and ``run_simulation(..., resume=True)`` with a
larger ``training.rounds``) keeps the mechanism published for the planned T (σ, the
calibration) and charges every extra round to the ledgers. Whether that stays within each
unit's budget depends on the algorithm, and the run says which, in the algorithm's own words:

* a party whose units sit out a round that would exceed their budget (the silo template's
  per-unit pre-check, ULDP-FL with personal budgets: ``enforces_budgets``): the extension runs,
  and the units stop at their budget -- true as stated;
* a party that cannot stop its units (ULDP-AVG/SGD without personal budgets: every round is
  charged to every user): :func:`check_extension` projects each unit's ε after the extra rounds
  and **refuses** the extension when any unit would exceed its budget, naming how many and the
  most rounds that stay within every budget -- unless the user opts in explicitly
  (``--allow-over-budget`` / ``allow_over_budget=True``); the run then says plainly, in its
  warnings and ``summary.json["extension"]``, that budgets are exceeded.

The projection is an upper bound: every remaining round charged to every unit against every
observer the party accounts (its ``adversary`` view).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pdpfl.ledger import PrivacyLedger, over_budget

__all__ = ["ExtensionRefused", "check_extension"]

#: How the CLI and the Python API spell the opt-in (for messages).
OPT_IN = "--allow-over-budget (Python: allow_over_budget=True)"


class ExtensionRefused(ValueError):
    """Extending the run would take units over their budget, and they cannot sit out."""


def _view(holder: object, ledger: PrivacyLedger) -> str:
    from pdpfl.ledger import observers_of

    view = str(getattr(holder, "adversary", "both"))
    if not any(o in ledger.observers for o in observers_of(view)):
        view = "both"
    return view


def _within(ledger: PrivacyLedger, view: str, usable: np.ndarray, remaining: int) -> int:
    """The most extra rounds (≤ remaining) after which no usable unit exceeds its budget."""
    lo, hi = 0, int(remaining)
    if over_budget(ledger.spent_epsilon(view), ledger.budgets)[usable].any():
        return 0
    while lo < hi:  # ε grows with the count: bisection on the first round that overspends
        mid = (lo + hi + 1) // 2
        spent = ledger.lifetime_spent(view, extra=mid)
        if over_budget(spent, ledger.budgets)[usable].any():
            hi = mid - 1
        else:
            lo = mid
    return lo


def check_extension(
    holders: list[Any],
    *,
    planned: int,
    rounds: int,
    start: int,
    allow_over_budget: bool = False,
    algorithm: str = "this algorithm",
) -> dict[str, Any] | None:
    """The extension report of a run resumed at round ``start`` from ``planned`` to ``rounds``
    (None when ``rounds`` ≤ ``planned``); raises :class:`ExtensionRefused` (module docstring).

    Returns ``{"planned_rounds", "rounds", "over_budget_allowed", "over_budget", "warnings"}``:
    ``over_budget`` counts the units the extension takes over budget (projected; 0 for parties
    whose units sit out)."""
    if int(rounds) <= int(planned):
        return None
    remaining = max(int(rounds) - int(start), 0)
    warnings: list[str] = []
    over_total = 0
    for holder in holders:
        ledger = getattr(holder, "ledger", None)
        if not isinstance(ledger, PrivacyLedger):
            continue
        unit = ledger.unit
        if getattr(holder, "enforces_budgets", False):
            sentence = (
                f"training.rounds: the run was extended from T = {planned} to {rounds} rounds "
                f"with the mechanism published for {planned}; every extra round is charged to "
                f"the ledgers, and {unit}s whose budget would be exceeded sit out"
            )
            if sentence not in warnings:
                warnings.append(sentence)
            continue
        usable = ledger.rates > 0
        view = _view(holder, ledger)
        projected = ledger.lifetime_spent(view, extra=remaining)
        over = usable & over_budget(projected, ledger.budgets)
        count = int(over.sum())
        if not count:
            warnings.append(
                f"training.rounds: the run was extended from T = {planned} to {rounds} rounds "
                f"with the mechanism published for {planned}; {algorithm} cannot make its "
                f"{unit}s sit out (every round is charged to each of them), and after the "
                f"extension none exceeds its budget"
            )
            continue
        ratio = float(np.max(projected[over] / ledger.budgets[over]))
        most = _within(ledger, view, usable, remaining)
        if not allow_over_budget:
            raise ExtensionRefused(
                f"training.rounds: extending this run from T = {planned} to {rounds} rounds "
                f"would take {count} of {int(usable.sum())} {unit}s over their budget (up to "
                f"{ratio:.0%} of it): {algorithm} cannot make its {unit}s sit out -- every round "
                f"is charged to each of them. At most {int(start) + most} rounds stay within "
                f"every budget; pass {OPT_IN} to extend anyway"
            )
        over_total += count
        warnings.append(
            f"budgets EXCEEDED: the run was extended from T = {planned} to {rounds} rounds with "
            f"{OPT_IN}; {algorithm} cannot make its {unit}s sit out, so {count} of "
            f"{int(usable.sum())} {unit}s are charged beyond their budget (up to {ratio:.0%} of "
            "it) -- their ε in this summary is above their budget"
        )
    return {
        "planned_rounds": int(planned),
        "rounds": int(rounds),
        "over_budget_allowed": bool(allow_over_budget),
        "over_budget": over_total,
        "warnings": warnings,
    }
