"""What a private hyper-parameter search costs each unit, per observer, before it runs.

Papernot & Steinke (ICLR 2022) bound the Rényi DP of releasing the best of K runs from the RDP
curve of one run (:mod:`pdpfl.privacy.tuning`). A pdpfl run's per-unit RDP curve is read off
the ledgers that the run's algorithm builds at assembly (:meth:`pdpfl.fl.algorithm.Algorithm.
assemble`: the calibration is done, nothing is trained): unit u's curve against an observer is
that of T charged rounds of the ledger's mechanism at u's own sampling rate q_u and noise
multiplier σ_u -- the most any run of that configuration can charge it (the ledger's pre-check
only ever charges fewer rounds).

Per unit (keyed by the ledger that holds it and its id), per observer:

* one *trial* draws its candidate uniformly from the grid and releases it with its output:
  ρ_Q(λ) = (1/(λ−1)) log mean_c exp((λ−1) ρ_c(λ)) (:func:`~pdpfl.privacy.tuning.mixture_rdp`);
* **third parties** see only the released best trial: ρ'(λ) of Theorem 2 (truncated negative
  binomial K) or Theorem 3 (Poisson K); the search stops after ``cap`` trials, which costs
  (1 + e^ε)·P[K > cap] of δ (:mod:`pdpfl.privacy.tuning`), so ε is converted at
  δ_u − (1 + e^{b_u})·P[K > cap] (b_u: the unit's budget, which ε must not exceed anyway);
* **the server** coordinates every trial and sees all of them (and their number): ρ_srv(λ) =
  (1/(λ−1)) log Σ_k P[min(K, cap) = k] exp((λ−1) k ρ_Q(λ))
  (:func:`~pdpfl.privacy.tuning.random_composition_rdp`), converted at δ_u.

Every ε is an RDP → (ε, δ) conversion (Balle et al. 2020) on :data:`ORDERS`; the search is
accounted in RDP whatever accountant the units' own ledgers use (the theorems are RDP
statements).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.ledger import GroupSummary, PrivacyLedger, PrivacySummary
from pdpfl.ledger.groups import budget_groups, over_budget
from pdpfl.ledger.summary import OBSERVERS
from pdpfl.privacy.accountant import RdpAccountant
from pdpfl.privacy.conversion import rdp_to_epsilon
from pdpfl.privacy.mechanisms import Composed, GroupPrivacy, Mechanism
from pdpfl.privacy.mechanisms import Sequence as SeqEvent
from pdpfl.privacy.orders import DEFAULT_ORDERS
from pdpfl.privacy.tuning import (
    TrialDistribution,
    capped_pmf,
    mixture_rdp,
    random_composition_rdp,
    search_rdp,
)
from pdpfl.privacy.unit import UnitMechanism

if TYPE_CHECKING:
    from pdpfl.fl.api import ClientAlgorithm, ServerAlgorithm

__all__ = [
    "ORDERS",
    "SearchCost",
    "UnitCurves",
    "default_cap",
    "ledger_curves",
    "party_ledgers",
    "search_cost",
]

#: The Rényi orders every curve of a search is evaluated on.
ORDERS = np.asarray(DEFAULT_ORDERS, dtype=np.float64)


@dataclass
class UnitCurves:
    """The units of one configuration: who they are, their budgets and one RDP curve per
    observer (shape ``(units, len(ORDERS))``)."""

    unit: str
    party: np.ndarray
    ids: np.ndarray
    budgets: np.ndarray
    delta: np.ndarray
    rdp: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def keys(self) -> list[tuple[str, str]]:
        return [(str(p), str(i)) for p, i in zip(self.party, self.ids, strict=True)]

    @property
    def observers(self) -> tuple[str, ...]:
        return tuple(o for o in OBSERVERS if o in self.rdp)


def party_ledgers(
    server: ServerAlgorithm, clients: Mapping[int, ClientAlgorithm]
) -> dict[str, PrivacyLedger]:
    """Every ledger of an assembled run, named as in a run's ``ledgers/`` folder."""
    out: dict[str, PrivacyLedger] = {}
    for name, holder in [
        *((f"client_{i}", c) for i, c in sorted(clients.items())),
        ("server", server),
    ]:
        ledger = getattr(holder, "ledger", None)
        if isinstance(ledger, PrivacyLedger):
            out[name] = ledger
    return out


def _contains_group(event: Mechanism) -> bool:
    if isinstance(event, GroupPrivacy):
        return True
    inner = getattr(event, "inner", None) or getattr(event, "local", None)
    if inner is not None and _contains_group(inner):
        return True
    return isinstance(event, SeqEvent) and any(_contains_group(e) for e in event.events)


def ledger_curves(ledgers: dict[str, PrivacyLedger]) -> UnitCurves:
    """Per-unit RDP curves of a configuration's ledgers (T planned rounds, each unit at its own
    rate and σ), per observer."""
    if not ledgers:
        raise ValueError("tune: the configuration accounts no unit (is it differentially private?)")
    acc = RdpAccountant(orders=ORDERS, refine=False)
    units = {str(led.unit) for led in ledgers.values()}
    if len(units) != 1:
        raise ValueError(f"tune: the ledgers protect different units {sorted(units)}")
    parties, ids, budgets, deltas = [], [], [], []
    curves: dict[str, list[np.ndarray]] = {}
    observers = set.intersection(*(set(led.observers) for led in ledgers.values()))
    memo: dict[tuple[Any, ...], np.ndarray] = {}  # ledgers of one mechanism share their rates

    def rows(mech: UnitMechanism, obs: str, rounds: int, rates: np.ndarray) -> np.ndarray:
        uq, inv = np.unique(rates, return_inverse=True)
        key = (repr(mech), obs, rounds, uq.tobytes())
        if key not in memo:
            event = mech.round_event(uq, obs)
            if _contains_group(event):
                raise ValueError(
                    "tune: group-privacy accounting (GROUP-k) has no RDP curve on a common "
                    "order grid; tune the other ULDP-FL methods instead"
                )
            rdp = acc.rdp(Composed(event, rounds))
            memo[key] = np.broadcast_to(rdp, (uq.size, ORDERS.size))
        return memo[key][inv.reshape(-1)]

    for name, led in ledgers.items():
        mech = led.plan
        rounds = int(mech.planned_rounds)
        n = led.n
        parties.append(np.full(n, name, dtype=object))
        ids.append(np.asarray(led.ids).astype(str))
        budgets.append(np.asarray(led.budgets, dtype=np.float64))
        deltas.append(np.full(n, float(mech.delta)))
        for obs in observers:
            out = np.zeros((n, ORDERS.size))
            for sigma in np.unique(led.noise_multipliers):
                idx = np.flatnonzero(led.noise_multipliers == sigma)
                m = mech if sigma == mech.noise_multiplier else mech.with_noise(float(sigma))
                out[idx] = rows(m, obs, rounds, led.rates[idx])
            curves.setdefault(obs, []).append(out)
    return UnitCurves(
        unit=units.pop(),
        party=np.concatenate(parties).astype(str),
        ids=np.concatenate(ids),
        budgets=np.concatenate(budgets),
        delta=np.concatenate(deltas),
        rdp={o: np.concatenate(v) for o, v in curves.items()},
    )


def default_cap(distribution: TrialDistribution, budgets: np.ndarray, delta: np.ndarray) -> int:
    """The smallest number of trials m whose δ slack (1 + e^{b})·P[K > m] is at most 1 % of
    every unit's δ (b its budget, capped at 50 for the exponential)."""
    b = float(min(np.max(budgets), 50.0))
    target = 0.01 * float(np.min(delta)) / (1.0 + math.exp(b))
    m = max(1, int(math.ceil(distribution.mean)))
    while distribution.tail(m) > target:
        m = m * 2 if m < 1024 else m + 1024
        if m > 10_000_000:
            raise ValueError("tune: the trial distribution's tail is too heavy to cap")
    lo, hi = max(1, m // 2), m
    while lo < hi:  # smallest m with tail(m) <= target
        mid = (lo + hi) // 2
        if distribution.tail(mid) <= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass
class SearchCost:
    """Per unit and observer: the search's RDP curve, one trial's curve and the ε; the typed
    summary of the search and the units it would put over budget (refused if any)."""

    curves: UnitCurves
    trial_rdp: dict[str, np.ndarray]
    search_rdp: dict[str, np.ndarray]
    epsilon: dict[str, np.ndarray]
    cap: int
    tail: float

    @property
    def over_budget(self) -> dict[str, np.ndarray]:
        return {o: over_budget(e, self.curves.budgets) for o, e in self.epsilon.items()}

    @property
    def extra_rdp(self) -> dict[str, np.ndarray]:
        """What the search adds to one trial's curve (the hook for a lifetime budget store that
        has charged one trial: charging this curve too gives the search's total)."""
        return {o: np.maximum(self.search_rdp[o] - self.trial_rdp[o], 0.0) for o in self.search_rdp}

    def summary(self) -> PrivacySummary:
        """The typed per-group, per-observer summary of the search's ε."""
        c = self.curves
        idx, labels = budget_groups(c.budgets)
        over = self.over_budget
        groups = []
        for g, label in enumerate(labels):
            m = idx == g
            if not m.any():
                continue
            b = c.budgets[m]
            groups.append(
                GroupSummary(
                    label=label,
                    units=int(m.sum()),
                    budget_min=float(b.min()),
                    budget_max=float(b.max()),
                    spent_max={o: float(self.epsilon[o][m].max()) for o in c.observers},
                    utilization_sum={o: float((self.epsilon[o][m] / b).sum()) for o in c.observers},
                    over_budget={o: int(over[o][m].sum()) for o in c.observers},
                )
            )
        return PrivacySummary(
            unit=c.unit,
            units=int(c.budgets.size),
            observers=c.observers,
            accountant="rdp",
            groups=tuple(groups),
            info={"max_trials": float(self.cap), "tail_probability": float(self.tail)},
        )


def _aligned(base: UnitCurves, other: UnitCurves, what: str) -> UnitCurves:
    """``other``'s curves in ``base``'s unit order (the same units, or a ValueError)."""
    if other.unit != base.unit or sorted(other.keys) != sorted(base.keys):
        raise ValueError(
            f"--grid: {what} protects other units than the configuration (the grid may not "
            "change the data, the budgets' owners or the algorithm's privacy unit)"
        )
    pos = {k: i for i, k in enumerate(other.keys)}
    order = np.array([pos[k] for k in base.keys], dtype=np.int64)
    missing = set(base.observers) - set(other.observers)
    if missing:
        raise ValueError(f"--grid: {what} is not accounted against {sorted(missing)}")
    return UnitCurves(
        base.unit,
        base.party,
        base.ids,
        base.budgets,
        base.delta,
        {o: other.rdp[o][order] for o in base.observers},
    )


def search_cost(
    base: UnitCurves,
    candidates: Sequence[UnitCurves],
    distribution: TrialDistribution,
    cap: int | None = None,
) -> SearchCost:
    """Every unit's ε for the search of ``candidates`` (budgets from ``base``), per observer."""
    if not candidates:
        raise ValueError("--grid: no candidate configuration")
    aligned = [_aligned(base, c, f"candidate {i + 1}") for i, c in enumerate(candidates)]
    m = default_cap(distribution, base.budgets, base.delta) if cap is None else int(cap)
    if m < 1:
        raise ValueError(f"--max-trials: must be >= 1, got {m}")
    tail = float(distribution.tail(m))
    pmf = capped_pmf(distribution, m)
    slack = (1.0 + np.exp(np.minimum(base.budgets, 700.0))) * tail
    delta_tp = base.delta - slack
    if np.any(delta_tp <= 0):
        raise ValueError(
            f"--max-trials: P[K > {m}] = {tail:.3g} leaves no δ for the released result of "
            "some unit; allow more trials (or fewer expected trials)"
        )
    trial, search, eps = {}, {}, {}
    for obs in base.observers:
        trial[obs] = mixture_rdp(np.stack([a.rdp[obs] for a in aligned]), ORDERS)
        if obs == "server":
            search[obs] = random_composition_rdp(trial[obs], ORDERS, pmf)
            delta = base.delta
        else:
            search[obs] = search_rdp(trial[obs], ORDERS, distribution)
            delta = delta_tp
        e = np.empty(base.budgets.size)
        for d in np.unique(delta):
            sel = delta == d
            e[sel], _ = rdp_to_epsilon(search[obs][sel], ORDERS, float(d))
        eps[obs] = e
    return SearchCost(base, trial, search, eps, m, tail)
