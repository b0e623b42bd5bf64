"""``pdpfl tune``: private hyper-parameter search whose privacy cost is accounted.

Papernot & Steinke, "Hyperparameter Tuning with Renyi Differential Privacy", ICLR 2022: run a
*random* number K of trials (truncated negative binomial, Theorem 2, or Poisson, Theorem 3), each
a real run of a candidate drawn from the grid, and release only the best. Every unit's ε for the
whole search is computed per observer before any trial runs -- third parties see only the
released result (the theorems), the coordinating server sees every trial (a random number of
compositions) -- and a search that would exceed any unit's budget is refused.

* :func:`tune` -- the search (the ``pdpfl tune`` command), returning a :class:`TuneResult`;
* :func:`plan_search` -- the candidates and every unit's ε, without training anything;
* :mod:`pdpfl.tune.accounting` -- per-unit RDP curves from a configuration's ledgers and the
  search's cost; :mod:`pdpfl.privacy.tuning` -- the paper's closed forms.

See docs/tune.md.
"""

from pdpfl.tune.accounting import SearchCost, UnitCurves, ledger_curves, search_cost
from pdpfl.tune.search import (
    SearchPlan,
    TuneRefused,
    TuneResult,
    candidates_from_grid,
    make_distribution,
    parse_grid,
    plan_search,
    tune,
)

__all__ = [
    "SearchCost",
    "SearchPlan",
    "TuneRefused",
    "TuneResult",
    "UnitCurves",
    "candidates_from_grid",
    "ledger_curves",
    "make_distribution",
    "parse_grid",
    "plan_search",
    "search_cost",
    "tune",
]
