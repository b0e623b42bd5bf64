"""One privacy ledger for every privacy unit, its files, and the typed summary outputs read.

* :class:`PrivacyLedger` -- one row per unit (record, client or user) with its id, budget,
  mechanism parameters and charged rounds per observer (:mod:`pdpfl.ledger.core`);
* :func:`save_ledger` / :func:`load_ledger` -- pickle-free ``.npz`` files
  (:mod:`pdpfl.ledger.store`);
* :class:`PrivacySummary` -- per budget group and observer, mergeable across silos
  (:mod:`pdpfl.ledger.summary`); :func:`budget_groups` is the one grouping policy;
* a person's budget for life: :class:`~pdpfl.ledger.budget_store.BudgetStore` (every run that
  charged a dataset's units, sealed and locked) and
  :class:`~pdpfl.ledger.lifetime.LifetimeAccount` (a ledger's earlier-runs prior and its
  written-ahead charges).
"""

from pdpfl.ledger.budget_store import BudgetStore, StoreBusy
from pdpfl.ledger.core import PrivacyLedger
from pdpfl.ledger.groups import BUDGET_TOLERANCE, budget_groups, over_budget
from pdpfl.ledger.store import load_ledger, save_ledger
from pdpfl.ledger.summary import (
    OBSERVERS,
    SCHEMA,
    GroupSummary,
    PrivacySummary,
    nonprivate_summary,
    observers_of,
)

__all__ = [
    "BUDGET_TOLERANCE",
    "BudgetStore",
    "StoreBusy",
    "OBSERVERS",
    "SCHEMA",
    "GroupSummary",
    "PrivacyLedger",
    "PrivacySummary",
    "budget_groups",
    "load_ledger",
    "nonprivate_summary",
    "observers_of",
    "over_budget",
    "save_ledger",
]
