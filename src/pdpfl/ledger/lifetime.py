"""A ledger's lifetime account: earlier runs' charges as a prior, this run's charges written ahead.

Each :class:`~pdpfl.ledger.PrivacyLedger` accounts one run. Attached to a budget store
(:mod:`pdpfl.ledger.budget_store`), it also knows what every *earlier* run on the same dataset
charged its units (the **prior**), and writes its own counts to the store on every charge
(:meth:`LifetimeAccount.charge`, called by ``PrivacyLedger.record_round`` -- which the silo
template calls *before* the round's release): the store never under-counts what was released,
across runs, resumes and crashes.

* **Lifetime ε** of a unit against an observer (:meth:`LifetimeAccount.spent`): the
  composition of every run that charged it (:mod:`pdpfl.privacy.lifetime`) at this run's δ. A
  unit charged by one run only has exactly that run's ε (its own accountant), so a first run's
  lifetime equals its own report; a run without DP makes it ∞. A run whose threat model has no
  such observer (e.g. IDP-FedAvg's trusted central aggregator) adds nothing against it, as in
  its own report.
* **Enforced** (default): the ledger's pre-check (``would_exceed``) also refuses a round that
  would take a unit's lifetime ε over its budget. ``lifetime.allow_respend`` (public or
  synthetic data) keeps the prior for reporting only; the store still records the run.
* **Sealed search entries** (``pdpfl tune``, :func:`charge_search`): a unit's prior may hold
  a whole private hyper-parameter search as one entry of per-unit RDP curves; it composes with
  the runs by RDP addition (:class:`~pdpfl.privacy.lifetime.CurveCharges`).
* **Resume**: this run's own entry may hold more than the checkpoint restored (rounds charged
  after the last checkpoint, possibly released): that excess stays charged, as a part of the
  prior (:meth:`LifetimeAccount.rebase`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.ledger.budget_store import BudgetStore, StoredRun, find_stores
from pdpfl.ledger.describe import mechanism_from_dict, mechanism_to_dict
from pdpfl.ledger.groups import budget_groups
from pdpfl.privacy.accountant import mechanism_epsilon
from pdpfl.privacy.lifetime import (
    Charges,
    CurveCharges,
    LifetimeComposer,
    RunCharges,
    at_delta,
    convert_with_tail,
)

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.ledger.core import PrivacyLedger

__all__ = [
    "LifetimeAccount",
    "LifetimeOptions",
    "LifetimeTarget",
    "SearchOverBudget",
    "charge_search",
    "lifetime_table",
    "store_runs",
]

_OBSERVERS = ("third-party", "server")


@dataclass(frozen=True)
class LifetimeOptions:
    """What the configuration decides about budget stores (``lifetime:``)."""

    root: Path
    allow_respend: bool = False
    #: An explicit name for the dataset's id space (default: a content fingerprint).
    dataset: str | None = None
    #: Seconds a run waits for a store another run is charging before it is refused.
    wait_s: float = 0.0


@dataclass(frozen=True)
class LifetimeTarget:
    """Which store a ledger holder charges: the options, the party and the dataset key."""

    options: LifetimeOptions
    party: str
    key: str
    description: dict[str, Any] = field(default_factory=dict)

    def store(self) -> BudgetStore:
        return BudgetStore(self.options.root, self.party, self.key)


def _align(ids: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Position in ``other`` of each of ``ids`` (−1 where absent)."""
    if ids.size == 0 or other.size == 0 or (ids.dtype.kind in "iu") != (other.dtype.kind in "iu"):
        return np.full(ids.size, -1, dtype=np.int64)
    order = np.argsort(other, kind="stable")
    sorted_other = other[order]
    pos = np.searchsorted(sorted_other, ids)
    pos_c = np.minimum(pos, other.size - 1)
    found = (pos < other.size) & (sorted_other[pos_c] == ids)
    return np.where(found, order[pos_c], -1).astype(np.int64)


def _mechanism_of(run: StoredRun) -> Any:
    desc = run.meta.get("mechanism")
    return None if desc is None else mechanism_from_dict(desc)


class LifetimeAccount:
    """One ledger's link to its store for one run (module docstring)."""

    def __init__(
        self, store: BudgetStore, meta: dict[str, Any], *, enforce: bool, delta: float
    ) -> None:
        self.store = store
        self.meta = dict(meta)
        self.enforce = bool(enforce)
        self.delta = float(delta)
        self.run_id = str(meta["run"])
        self.closed = False
        #: Per observer: the prior runs' charges, aligned with the ledger's units.
        self.parts: dict[str, list[Charges]] = {}
        #: Units a run without DP trained on (lifetime ε = ∞).
        self.unbounded = np.zeros(0, dtype=bool)
        #: This run's charges beyond the restored counts (kept charged), per observer.
        self.offset: dict[str, np.ndarray] = {}
        self.prior_runs = 0
        self._single: dict[str, np.ndarray] = {}
        self._composers: dict[str, LifetimeComposer] = {}
        self._entry: StoredRun | None = None

    # ------------------------------------------------------------------ attach
    @classmethod
    def attach(
        cls,
        ledger: PrivacyLedger,
        store: BudgetStore,
        meta: dict[str, Any],
        *,
        enforce: bool,
        write: bool = True,
    ) -> LifetimeAccount:
        """Link ``ledger`` (its counts already restored, on a resume) to ``store`` (open and
        locked) and, with ``write``, write this run's entry (before anything is released; a
        caller that checks the run first writes it with :meth:`charge`)."""
        account = cls(store, meta, enforce=enforce, delta=float(ledger.mechanism.delta))
        ledger.lifetime = account
        account.rebase(ledger, write=write)
        return account

    def rebase(self, ledger: PrivacyLedger, *, write: bool = True) -> None:
        """(Re)build the prior from the store for the ledger's current counts (then charge)."""
        n = ledger.n
        self.parts = {o: [] for o in ledger.observers}
        self.unbounded = np.zeros(n, dtype=bool)
        self.offset = {o: np.zeros(n, dtype=np.int64) for o in ledger.observers}
        self.prior_runs = 0
        for run in self.store.runs.values():
            pos = _align(ledger.ids, run.ids)
            present = pos >= 0
            if not present.any():
                continue
            mine = run.run_id == self.run_id
            charged_any = any(
                np.any(c[np.maximum(pos, 0)][present] > 0) for c in run.counts.values()
            )
            self.prior_runs += int(not mine and charged_any)
            if run.sealed_curves:
                for obs in ledger.observers:
                    curve = _curve_part(run, obs, pos, present)
                    if curve is not None:
                        self.parts[obs].append(curve)
                continue
            if not run.meta.get("private", True):
                charged = np.zeros(n, dtype=bool)
                for c in run.counts.values():
                    charged |= present & (c[np.maximum(pos, 0)] > 0)
                self.unbounded |= charged
                continue
            mech = _mechanism_of(run)
            for obs in ledger.observers:
                stored = run.counts.get(obs)
                if stored is None:
                    continue  # that run's threat model has no such observer
                k = np.where(present, stored[np.maximum(pos, 0)], 0)
                if mine:  # charged after the last checkpoint: stays charged
                    k = np.maximum(k - ledger.counts[obs], 0)
                    self.offset[obs] = k.astype(np.int64)
                if not k.any():
                    continue
                self.parts[obs].append(
                    RunCharges(
                        mech,
                        np.where(present, run.rates[np.maximum(pos, 0)], 0.0),
                        np.where(present, run.noise_multipliers[np.maximum(pos, 0)], 1.0),
                        k,
                        str(run.meta.get("accountant", "rdp")),
                    )
                )
        self._single = {o: self._single_prior(o) for o in ledger.observers}
        self._composers = {o: LifetimeComposer(o, self.delta) for o in ledger.observers}
        self._entry = None
        if write:
            self.charge(ledger)

    def _single_prior(self, observer: str) -> np.ndarray:
        """Each unit's ε from the one prior run that charged it (its own accountant, at this
        run's δ); 0 elsewhere (units of several prior runs are composed in :meth:`spent`)."""
        parts = self.parts.get(observer, [])
        n = self.unbounded.size
        out = np.zeros(n)
        if not parts:
            return out
        touched = np.stack([p.counts > 0 for p in parts])
        only = touched.sum(axis=0) == 1
        for p, part in enumerate(parts):
            sel = np.flatnonzero(only & touched[p])
            if not sel.size:
                continue
            if isinstance(part, CurveCharges):
                out[sel] = convert_with_tail(part.rdp[sel], part.orders, self.delta, part.tail)
                continue
            mech = _at_delta(part.mechanism, self.delta)
            for sigma in np.unique(part.noise_multipliers[sel]):
                rows = sel[part.noise_multipliers[sel] == sigma]
                e, _ = mechanism_epsilon(
                    mech.with_noise(float(sigma)),
                    part.rates[rows],
                    observer,
                    part.counts[rows],
                    accountant=part.accountant,
                )
                out[rows] = e
        return out

    # ------------------------------------------------------------------ charging
    def charge(self, ledger: PrivacyLedger) -> None:
        """Write this run's counts (the restored ones, plus the kept excess) to the store.

        Called by ``PrivacyLedger.record_round`` right after the in-memory charge -- before the
        silo template lets the round's step run -- so the store is charged before a release."""
        if self.closed:
            raise ValueError(f"budget store {self.store.folder}: charged after the run closed it")
        if self._entry is None:
            described = {
                "mechanism": mechanism_to_dict(ledger.mechanism),
                "observers": list(ledger.observers),
                "delta": float(ledger.mechanism.delta),
                "private": True,
                "enforced": self.enforce,
                "started": time.time(),
            }
            self._entry = StoredRun(
                {**described, **self.meta, "accountant": ledger.accountant, "unit": ledger.unit},
                ledger.ids,
                ledger.budgets,
                ledger.rates,
                ledger.noise_multipliers,
            )
        self._entry.counts = {o: self.offset[o] + c for o, c in ledger.counts.items()}
        self.store.put(self._entry)

    def close(self) -> None:
        self.closed = True
        self.store.close()

    # ------------------------------------------------------------------ lifetime ε
    @property
    def prior_units(self) -> np.ndarray:
        """Units an earlier run (or this run's uncheckpointed rounds) already charged."""
        out = self.unbounded.copy()
        for parts in self.parts.values():
            for p in parts:
                out |= p.counts > 0
        return out

    def spent(self, ledger: PrivacyLedger, observer: str, counts: np.ndarray) -> np.ndarray:
        """(n,) lifetime ε against ``observer`` with this run at ``counts`` charged rounds."""
        parts = self.parts.get(observer, [])
        now = (np.asarray(counts) > 0) & (ledger.rates > 0)
        own = ledger._epsilon(observer, counts, ledger.accountant)  # noqa: SLF001 (its ε)
        if not parts:
            return np.where(self.unbounded, math.inf, own)
        touched = np.stack([p.counts > 0 for p in parts])
        prior_m = touched.sum(axis=0)
        out = np.where(now, own, self._single[observer])
        several = np.flatnonzero(prior_m + now > 1)
        if several.size:
            current = RunCharges(
                ledger.mechanism,
                ledger.rates[several],
                ledger.noise_multipliers[several],
                np.where(now[several], counts[several], 0),
                ledger.accountant,
            )
            sub = [p.take(several) for p in parts]
            out[several] = self._composers[observer].epsilon([*sub, current])
        return np.where(self.unbounded, math.inf, out)

    def report(self) -> dict[str, Any]:
        """What the run's summary says about this store."""
        return {
            "store": str(self.store.folder),
            "party": self.store.party,
            "dataset": self.store.key,
            "enforced": self.enforce,
            "earlier_runs": self.prior_runs,
        }


def _at_delta(mechanism: Any, delta: float) -> Any:
    shifted = at_delta(mechanism, delta)
    return mechanism if shifted is None else shifted


def _curve_part(
    run: StoredRun, observer: str, pos: np.ndarray, present: np.ndarray
) -> CurveCharges | None:
    """A sealed search entry's charges against ``observer``, aligned by ``pos``."""
    curve = run.curves.get(observer)
    if curve is None or run.orders is None:
        return None
    stored = run.counts.get(observer)
    k = np.where(present, 1 if stored is None else stored[np.maximum(pos, 0)], 0)
    if not np.any(k):
        return None
    rows = np.where(present[:, None], curve[np.maximum(pos, 0)], 0.0)
    tail = float(dict(run.meta.get("tail") or {}).get(observer, 0.0))
    return CurveCharges(rows, run.orders, tail, k)


# ---------------------------------------------------------------------- reading a store


def store_runs(store: BudgetStore) -> list[dict[str, Any]]:
    """The runs that charged ``store``, oldest first (their public description)."""
    runs = sorted(store.runs.values(), key=lambda r: (r.meta.get("started") or 0, r.run_id))
    return [
        {
            "run": r.run_id,
            "started": time.strftime(
                "%Y-%m-%d %H:%M:%S", time.localtime(float(r.meta.get("started") or 0))
            ),
            "algorithm": r.meta.get("algorithm"),
            "name": r.meta.get("name"),
            "private": bool(r.meta.get("private", True)),
            "accountant": r.meta.get("accountant"),
            "delta": r.meta.get("delta"),
            "enforced": bool(r.meta.get("enforced", True)),
            "units": int(r.ids.size),
            "rounds": {o: int(c.max(initial=0)) for o, c in r.counts.items()},
        }
        for r in runs
    ]


def _store_epsilon(
    store: BudgetStore, delta: float | None, extra: StoredRun | None = None
) -> dict[str, Any]:
    """Every unit of ``store`` with its lifetime ε per observer at δ (default: the smallest δ
    of its runs); ``extra``: an entry not written yet, composed as if it were."""
    listed = [*store.runs.values(), *([extra] if extra is not None else [])]
    runs = sorted(listed, key=lambda r: (r.meta.get("started") or 0, r.run_id))
    ids = np.unique(np.concatenate([r.ids for r in runs])) if runs else np.zeros(0, np.int64)
    n = ids.size
    deltas = [float(r.meta["delta"]) for r in runs if r.meta.get("delta")]
    d = float(delta) if delta is not None else (min(deltas) if deltas else 1e-5)
    budget = np.full(n, np.nan)
    unbounded = np.zeros(n, dtype=bool)
    charged_by: list[list[str]] = [[] for _ in range(n)]
    parts: dict[str, list[Charges]] = {o: [] for o in _OBSERVERS}
    for r in runs:
        pos = _align(ids, r.ids)
        present = pos >= 0
        budget = np.where(present, r.budgets[np.maximum(pos, 0)], budget)  # the latest budget
        touched = np.zeros(n, dtype=bool)
        for c in r.counts.values():
            touched |= present & (c[np.maximum(pos, 0)] > 0)
        for i in np.flatnonzero(touched):
            charged_by[i].append(r.run_id)
        if r.sealed_curves:
            for obs in _OBSERVERS:
                curve = _curve_part(r, obs, pos, present)
                if curve is not None:
                    parts[obs].append(curve)
            continue
        if not r.meta.get("private", True):
            unbounded |= touched
            continue
        mech = _at_delta(_mechanism_of(r), d)
        for obs, c in r.counts.items():
            k = np.where(present, c[np.maximum(pos, 0)], 0)
            if k.any():
                parts[obs].append(
                    RunCharges(
                        mech,
                        np.where(present, r.rates[np.maximum(pos, 0)], 0.0),
                        np.where(present, r.noise_multipliers[np.maximum(pos, 0)], 1.0),
                        k,
                        str(r.meta.get("accountant", "rdp")),
                    )
                )
    eps: dict[str, np.ndarray] = {}
    for obs in _OBSERVERS:
        eps[obs] = _compose_store(parts[obs], obs, d, n)
        eps[obs] = np.where(unbounded, math.inf, eps[obs])
    return {"ids": ids, "budget": budget, "epsilon": eps, "runs": charged_by, "delta": d}


def _compose_store(parts: list[Charges], observer: str, delta: float, n: int) -> np.ndarray:
    if not parts:
        return np.full(n, np.nan)
    out = np.zeros(n)
    touched = np.stack([p.counts > 0 for p in parts])
    m = touched.sum(axis=0)
    for p, part in enumerate(parts):  # one run: its own accountant
        sel = np.flatnonzero((m == 1) & touched[p])
        if isinstance(part, CurveCharges):
            if sel.size:
                out[sel] = convert_with_tail(part.rdp[sel], part.orders, delta, part.tail)
            continue
        for sigma in np.unique(part.noise_multipliers[sel]) if sel.size else ():
            rows = sel[part.noise_multipliers[sel] == sigma]
            e, _ = mechanism_epsilon(
                part.mechanism.with_noise(float(sigma)),
                part.rates[rows],
                observer,
                part.counts[rows],
                accountant=part.accountant,
            )
            out[rows] = e
    several = np.flatnonzero(m > 1)
    if several.size:
        sub = [p.take(several) for p in parts]
        out[several] = LifetimeComposer(observer, delta).epsilon(sub)
    return out


def lifetime_table(path: str | Path, *, delta: float | None = None) -> dict[str, np.ndarray]:
    """One row per unit of every store under ``path`` (a store root, a party's folder or one
    store): ``store``, ``party``, ``dataset``, ``unit``, ``id``, ``budget``, ``group``,
    ``epsilon_<observer>`` (lifetime, NaN where no run accounts that observer),
    ``remaining_<observer>`` (budget − lifetime ε, at least 0: a *next* run's cost is its
    composition with these, never a difference of ε's), ``runs`` (how many runs charged the
    unit), ``run_ids`` and ``delta``. Read-only: verifies every file, takes no lock."""
    stores = find_stores(path)
    if not stores:
        raise ValueError(f"{path}: no budget store here (expected an index.sealed below it)")
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "store",
            "party",
            "dataset",
            "unit",
            "id",
            "budget",
            "group",
            "epsilon_third_party",
            "epsilon_server",
            "remaining_third_party",
            "remaining_server",
            "runs",
            "run_ids",
            "delta",
        )
    }
    for root, party, key in stores:
        store = BudgetStore(root, party, key).open(lock=False)
        view: dict[str, Any] = _store_epsilon(store, delta)
        units = [str(r.meta.get("unit", "record")) for r in store.runs.values()]
        n = view["ids"].size
        idx: Any = np.zeros(0, dtype=np.int64)
        labels: list[str] = []
        if n:
            idx, labels = budget_groups(np.nan_to_num(view["budget"], nan=1.0))
        for i in range(n):
            cols["store"].append(str(store.folder))
            cols["party"].append(party)
            cols["dataset"].append(key)
            cols["unit"].append(units[0] if units else "record")
            cols["id"].append(view["ids"][i].item())
            cols["budget"].append(float(view["budget"][i]))
            cols["group"].append(labels[int(idx[i])])
            for obs in _OBSERVERS:
                tag = obs.replace("-", "_")
                e = float(view["epsilon"][obs][i])
                cols[f"epsilon_{tag}"].append(e)
                cols[f"remaining_{tag}"].append(
                    math.nan if math.isnan(e) else max(float(view["budget"][i]) - e, 0.0)
                )
            cols["runs"].append(len(view["runs"][i]))
            cols["run_ids"].append(";".join(view["runs"][i]))
            cols["delta"].append(view["delta"])
    out: dict[str, np.ndarray] = {}
    for k, v in cols.items():
        out[k] = np.array(v, dtype=object if k == "id" else None)
    return out


class SearchOverBudget(ValueError):
    """A sealed search entry would take some units over their lifetime budget."""


def charge_search(
    store: BudgetStore,
    meta: dict[str, Any],
    ids: np.ndarray,
    budgets: np.ndarray,
    curves: dict[str, np.ndarray],
    orders: np.ndarray,
    *,
    delta: float,
    tail: dict[str, float] | None = None,
    enforce: bool = True,
    check: tuple[str, ...] = _OBSERVERS,
    write: bool = True,
) -> dict[str, np.ndarray]:
    """Write a private hyper-parameter search to ``store`` (open and locked) as one sealed
    entry of per-unit RDP curves -- before the search releases anything -- and return each
    unit's lifetime ε per observer with it (in ``ids`` order).

    ``curves[observer]`` is (units, len(orders)): each unit's RDP curve of the *whole* search
    (Papernot & Steinke 2022, Thm. 2/3 for third parties; every trial for the server);
    ``tail[observer]`` the probability that the capped search departs from it. With
    ``enforce``, a search that would take a unit's lifetime ε over its budget against an
    observer in ``check`` raises :class:`SearchOverBudget` (naming the units and their budgets)
    and writes nothing; ``write=False`` checks only."""
    from pdpfl.ledger.budget_store import SEARCH_KIND

    ids = np.asarray(ids)
    n = ids.size
    budgets = np.asarray(budgets, dtype=np.float64).reshape(-1)
    if budgets.shape != (n,):
        raise ValueError("search: one budget per unit")
    tails = {o: float((tail or {}).get(o, 0.0)) for o in curves}
    entry = StoredRun(
        {
            **meta,
            "kind": SEARCH_KIND,
            "private": True,
            "mechanism": None,
            "accountant": "rdp",
            "observers": sorted(curves),
            "delta": float(delta),
            "enforced": bool(enforce),
            "tail": tails,
            "started": meta.get("started") or time.time(),
        },
        ids,
        budgets,
        np.ones(n),
        np.ones(n),
        {o: np.asarray((np.asarray(c) > 0).any(axis=1), dtype=np.int64) for o, c in curves.items()},
        curves={o: np.asarray(c, dtype=np.float64) for o, c in curves.items()},
        orders=np.asarray(orders, dtype=np.float64),
    )
    view = _store_epsilon(store, float(delta), extra=entry)
    pos = _align(ids, view["ids"])
    spent = {o: np.asarray(view["epsilon"][o])[pos] for o in _OBSERVERS}
    if enforce:
        over = np.zeros(n, dtype=bool)
        for obs in check:
            e = spent.get(obs)
            if e is not None:
                over |= ~np.isnan(e) & (e > budgets * (1 + 1e-12))
        if over.any():
            shown = ", ".join(
                f"{ids[i]} (budget {budgets[i]:g}, lifetime ε "
                + "/".join(f"{spent[o][i]:.4g}" for o in check if o in spent)
                + ")"
                for i in np.flatnonzero(over)[:5]
            )
            more = f" and {int(over.sum()) - 5} more" if over.sum() > 5 else ""
            raise SearchOverBudget(
                f"{int(over.sum())} of {n} {meta.get('unit', 'unit')}(s) of {store.party} would "
                f"exceed their lifetime budget with this search (budget store {store.folder}): "
                f"{shown}{more}"
            )
    if write:
        store.put(entry)
    return spent
