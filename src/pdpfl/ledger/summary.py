"""The typed privacy summary every output reads: per budget group, per observer, in the unit's name.

A :class:`PrivacySummary` is what one ledger (or one party) says about the units it accounts:
how many there are, in which unit (record, client, user), against which observers, and for each
budget group the largest ε spent, the utilization and how many units are over budget, stopped
by the pre-check or excluded (sampling rate 0). Summaries of the same unit merge exactly
(:meth:`PrivacySummary.merge`: counts and utilization sums add, maxima take the max), so the
simulator can combine every silo's summary; a deployment keeps each silo's at the silo.

``summary.json``, the terminal headline, ``epsilon.png``, ``pdpfl compare`` and
``pdpfl privacy`` read this one type (through :meth:`to_dict` / :meth:`from_dict`; the JSON form
carries :data:`SCHEMA`).

Numbers labelled *approximate* (e.g. PriFedSync's CLT μ-GDP) live in ``approximate`` and are
never used for the headline ε, which is always an upper bound.

Two facts beyond this run's own ε are reported per group: ``floor`` -- units with a positive
rate whose ε after the planned T rounds is 0 (the δ-only floor: δ alone covers them, so they
contribute almost nothing to training at that budget) -- and, when the ledger charges a budget
store (:mod:`pdpfl.ledger.lifetime`), the **lifetime** ε (every earlier run on the same data
composed with this one: ``lifetime_max``, ``lifetime_over``, ``prior`` units that earlier runs
charged; ``lifetime`` says ``enforced`` or ``respend``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pdpfl.ledger.groups import budget_groups

__all__ = [
    "OBSERVERS",
    "SCHEMA",
    "GroupSummary",
    "PrivacySummary",
    "nonprivate_summary",
    "observers_of",
]

#: Version of the JSON form; bump on any incompatible change.
SCHEMA = "pdpfl.privacy-summary/1"

#: Every observer pdpfl accounts against, in report order.
OBSERVERS: tuple[str, ...] = ("third-party", "server")


def observers_of(adversary: str) -> tuple[str, ...]:
    """The observers an ``adversary`` setting names (``both`` = every observer)."""
    if adversary == "both":
        return OBSERVERS
    if adversary not in OBSERVERS:
        raise ValueError(f"adversary: expected third-party, server or both, got {adversary!r}")
    return (adversary,)


def _max(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


@dataclass(frozen=True)
class GroupSummary:
    """One budget group (all units whose budget falls in it).

    ``spent_max``/``utilization_sum``/``over_budget`` are keyed by observer; an observer the
    ledger does not account against is absent. ``info`` holds public per-group facts of the
    mechanism (e.g. IDP-FedAvg's group sampling rate and noise multiplier).
    """

    label: str
    units: int
    budget_min: float
    budget_max: float
    excluded: int = 0
    stopped: int = 0
    #: Units whose budget is above what the mechanism spends at the largest rate (they were
    #: trained at that rate and spend less than their budget; only with an explicit opt-in).
    capped: int = 0
    spent_max: Mapping[str, float] = field(default_factory=dict)
    utilization_sum: Mapping[str, float] = field(default_factory=dict)
    over_budget: Mapping[str, int] = field(default_factory=dict)
    info: Mapping[str, float] = field(default_factory=dict)
    #: Units with q > 0 whose ε after the planned rounds is 0 (the δ-only floor).
    floor: int = 0
    #: Units an earlier run on the same data had charged (budget store attached).
    prior: int = 0
    #: Largest lifetime ε per observer (empty without a budget store).
    lifetime_max: Mapping[str, float] = field(default_factory=dict)
    #: Units whose lifetime ε exceeds their budget, per observer.
    lifetime_over: Mapping[str, int] = field(default_factory=dict)

    def mean_utilization(self, observer: str) -> float | None:
        s = self.utilization_sum.get(observer)
        return None if s is None or not self.units else s / self.units

    def merge(self, other: GroupSummary) -> GroupSummary:
        if other.label != self.label:
            raise ValueError(f"cannot merge budget groups {self.label!r} and {other.label!r}")
        obs = [o for o in OBSERVERS if o in self.spent_max or o in other.spent_max]
        info = dict(self.info)
        for k, v in other.info.items():
            info[k] = max(info.get(k, v), v)
        return GroupSummary(
            label=self.label,
            units=self.units + other.units,
            budget_min=min(self.budget_min, other.budget_min),
            budget_max=max(self.budget_max, other.budget_max),
            excluded=self.excluded + other.excluded,
            stopped=self.stopped + other.stopped,
            capped=self.capped + other.capped,
            spent_max={
                o: float(_max(self.spent_max.get(o), other.spent_max.get(o)) or 0.0) for o in obs
            },
            utilization_sum={
                o: self.utilization_sum.get(o, 0.0) + other.utilization_sum.get(o, 0.0) for o in obs
            },
            over_budget={o: self.over_budget.get(o, 0) + other.over_budget.get(o, 0) for o in obs},
            info=info,
            floor=self.floor + other.floor,
            prior=self.prior + other.prior,
            lifetime_max={
                o: float(_max(self.lifetime_max.get(o), other.lifetime_max.get(o)) or 0.0)
                for o in OBSERVERS
                if o in self.lifetime_max or o in other.lifetime_max
            },
            lifetime_over={
                o: self.lifetime_over.get(o, 0) + other.lifetime_over.get(o, 0)
                for o in OBSERVERS
                if o in self.lifetime_over or o in other.lifetime_over
            },
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "units": self.units,
            "budget_min": self.budget_min,
            "budget_max": self.budget_max,
            "excluded": self.excluded,
            "stopped": self.stopped,
            "capped": self.capped,
            "spent_max": dict(self.spent_max),
            "mean_utilization": {o: self.mean_utilization(o) for o in self.spent_max},
            "utilization_sum": dict(self.utilization_sum),
            "over_budget": dict(self.over_budget),
            "info": dict(self.info),
            "floor": self.floor,
            "prior": self.prior,
            "lifetime_max": dict(self.lifetime_max),
            "lifetime_over": dict(self.lifetime_over),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GroupSummary:
        inf = math.inf  # JSON has no ∞: a missing spent value of a non-private run reads as ∞
        return cls(
            label=str(d["label"]),
            units=int(d["units"]),
            budget_min=math.nan if d.get("budget_min") is None else float(d["budget_min"]),
            budget_max=math.nan if d.get("budget_max") is None else float(d["budget_max"]),
            excluded=int(d.get("excluded", 0)),
            stopped=int(d.get("stopped", 0)),
            capped=int(d.get("capped", 0)),
            spent_max={
                str(k): inf if v is None else float(v)
                for k, v in dict(d.get("spent_max", {})).items()
            },
            utilization_sum={
                str(k): inf if v is None else float(v)
                for k, v in dict(d.get("utilization_sum", {})).items()
            },
            over_budget={str(k): int(v) for k, v in dict(d.get("over_budget", {})).items()},
            info={str(k): float(v) for k, v in dict(d.get("info", {})).items()},
            floor=int(d.get("floor", 0)),
            prior=int(d.get("prior", 0)),
            lifetime_max={
                str(k): inf if v is None else float(v)
                for k, v in dict(d.get("lifetime_max", {})).items()
            },
            lifetime_over={str(k): int(v) for k, v in dict(d.get("lifetime_over", {})).items()},
        )


@dataclass(frozen=True)
class PrivacySummary:
    """What a ledger says about its units (see the module docstring).

    Attributes
    ----------
    unit
        ``record``, ``client``, ``user``, or ``none`` (no differential privacy).
    units
        How many units this summary covers.
    observers
        Observers the ε are accounted against (``third-party``, ``server``).
    accountant
        ``rdp``, ``pld``, ... (the accountant of every ε here; all are upper bounds).
    groups
        One :class:`GroupSummary` per budget group, in increasing budget order.
    private
        False for a run without differential privacy (ε = ∞ for every unit).
    approximate
        Labelled approximations shown beside the rigorous numbers (never the headline), e.g.
        ``{"clt_epsilon_max": 3.1, "clt_mu_max": 0.9}``.
    info
        Public run-level facts of the mechanism (e.g. ``noise_multiplier``).
    lifetime
        ``""`` (no budget store), ``enforced`` (earlier runs limit this one) or ``respend``
        (``lifetime.allow_respend``: reported, not enforced).
    """

    unit: str
    units: int
    observers: tuple[str, ...] = OBSERVERS
    accountant: str = "rdp"
    groups: tuple[GroupSummary, ...] = ()
    private: bool = True
    approximate: Mapping[str, float] = field(default_factory=dict)
    info: Mapping[str, float] = field(default_factory=dict)
    lifetime: str = ""

    # -- derived numbers ------------------------------------------------------------------
    def spent_max(self, observer: str) -> float | None:
        """The largest ε any unit spent against ``observer`` (None: not accounted; ∞: no DP)."""
        if not self.private:
            return math.inf if self.units else 0.0
        if observer not in self.observers:
            return None
        values = [g.spent_max[observer] for g in self.groups if observer in g.spent_max]
        return max(values) if values else 0.0

    def over_budget(self, observer: str) -> int:
        return sum(int(g.over_budget.get(observer, 0)) for g in self.groups)

    def over_budget_any(self, adversary: str) -> int:
        """Units over budget against the observers ``adversary`` names (upper bound: a unit
        over against both is counted once per observer, so this is the larger count)."""
        return max((self.over_budget(o) for o in observers_of(adversary)), default=0)

    def headline_epsilon(self, adversary: str) -> float | None:
        """The largest ε spent against the observer(s) ``adversary`` names."""
        values = [self.spent_max(o) for o in observers_of(adversary)]
        known = [v for v in values if v is not None]
        return max(known) if known else None

    @property
    def stopped(self) -> int:
        return sum(g.stopped for g in self.groups)

    @property
    def excluded(self) -> int:
        return sum(g.excluded for g in self.groups)

    @property
    def capped(self) -> int:
        return sum(g.capped for g in self.groups)

    @property
    def floor(self) -> int:
        """Units at the δ-only floor (q > 0, ε = 0 after the planned rounds)."""
        return sum(g.floor for g in self.groups)

    @property
    def prior(self) -> int:
        """Units an earlier run on the same data had charged."""
        return sum(g.prior for g in self.groups)

    def lifetime_max(self, observer: str) -> float | None:
        """The largest lifetime ε against ``observer`` (None: no budget store, or not
        accounted; ∞ without DP)."""
        if not self.lifetime:
            return None
        if not self.private:
            return math.inf if self.units else 0.0
        values = [g.lifetime_max[observer] for g in self.groups if observer in g.lifetime_max]
        return max(values) if values else None

    def lifetime_over(self, observer: str) -> int:
        return sum(int(g.lifetime_over.get(observer, 0)) for g in self.groups)

    def lifetime_headline(self, adversary: str) -> float | None:
        """The largest lifetime ε against the observer(s) ``adversary`` names."""
        known = [
            v for v in (self.lifetime_max(o) for o in observers_of(adversary)) if v is not None
        ]
        return max(known) if known else None

    # -- combining ------------------------------------------------------------------------
    @classmethod
    def merge(cls, summaries: Iterable[PrivacySummary]) -> PrivacySummary:
        """One summary of the union of the units (all must share the unit and accountant)."""
        items = list(summaries)
        if not items:
            raise ValueError("nothing to merge")
        first = items[0]
        groups: dict[str, GroupSummary] = {}
        observers: list[str] = []
        approx: dict[str, float] = {}
        info: dict[str, float] = {}
        for s in items:
            if s.unit != first.unit:
                raise ValueError(f"cannot merge {first.unit}-level and {s.unit}-level summaries")
            for o in s.observers:
                if o not in observers:
                    observers.append(o)
            for g in s.groups:
                groups[g.label] = groups[g.label].merge(g) if g.label in groups else g
            for k, v in s.approximate.items():
                approx[k] = max(approx.get(k, v), v)
            for k, v in s.info.items():
                info[k] = max(info.get(k, v), v)
        accountants = {s.accountant for s in items}
        modes = {s.lifetime for s in items}
        return cls(
            unit=first.unit,
            units=sum(s.units for s in items),
            observers=tuple(o for o in OBSERVERS if o in observers),
            accountant=first.accountant if len(accountants) == 1 else "+".join(sorted(accountants)),
            groups=tuple(sorted(groups.values(), key=lambda g: (g.budget_min, g.label))),
            private=all(s.private for s in items),
            approximate=approx,
            info=info,
            lifetime="respend" if "respend" in modes else "enforced" if "enforced" in modes else "",
        )

    def with_info(self, **info: float) -> PrivacySummary:
        return replace(self, info={**self.info, **info})

    # -- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "unit": self.unit,
            "units": self.units,
            "observers": list(self.observers),
            "accountant": self.accountant,
            "private": self.private,
            "spent_max": {o: self.spent_max(o) for o in OBSERVERS},
            "over_budget": {o: self.over_budget(o) for o in self.observers},
            "stopped": self.stopped,
            "excluded": self.excluded,
            "capped": self.capped,
            "groups": [g.to_dict() for g in self.groups],
            "approximate": dict(self.approximate),
            "info": dict(self.info),
            "floor": self.floor,
            "lifetime": self.lifetime,
            "prior": self.prior,
            "lifetime_max": {o: self.lifetime_max(o) for o in OBSERVERS},
            "lifetime_over": {o: self.lifetime_over(o) for o in self.observers},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PrivacySummary:
        schema = d.get("schema")
        if schema != SCHEMA:
            raise ValueError(f"privacy summary: unsupported schema {schema!r} (expected {SCHEMA})")
        return cls(
            unit=str(d["unit"]),
            units=int(d["units"]),
            observers=tuple(str(o) for o in d.get("observers", OBSERVERS)),
            accountant=str(d.get("accountant", "rdp")),
            groups=tuple(GroupSummary.from_dict(g) for g in d.get("groups", [])),
            private=bool(d.get("private", True)),
            approximate={
                str(k): float(v) for k, v in dict(d.get("approximate", {})).items() if v is not None
            },
            info={str(k): float(v) for k, v in dict(d.get("info", {})).items() if v is not None},
            lifetime=str(d.get("lifetime", "")),
        )

    @classmethod
    def none(cls, unit: str, units: int) -> PrivacySummary:
        """The summary of ``units`` units trained without differential privacy (ε = ∞)."""
        return cls(unit=unit, units=int(units), observers=(), groups=(), private=False)


def nonprivate_summary(unit: str, budgets: np.ndarray) -> PrivacySummary:
    """Units with these budgets trained *without* differential privacy: ε = ∞ for each, so
    every unit is over its budget against every observer (reported as such, never hidden)."""
    budgets = np.asarray(budgets, dtype=np.float64)
    idx, labels = budget_groups(budgets) if budgets.size else (np.zeros(0, np.int64), [])
    groups = []
    for g, label in enumerate(labels):
        m = idx == g
        if not m.any():
            continue
        k = int(m.sum())
        groups.append(
            GroupSummary(
                label=label,
                units=k,
                budget_min=float(budgets[m].min()),
                budget_max=float(budgets[m].max()),
                spent_max={o: math.inf for o in OBSERVERS},
                utilization_sum={o: math.inf for o in OBSERVERS},
                over_budget={o: k for o in OBSERVERS},
            )
        )
    return PrivacySummary(
        unit=unit,
        units=int(budgets.size),
        observers=OBSERVERS,
        accountant="none",
        groups=tuple(groups),
        private=False,
    )
