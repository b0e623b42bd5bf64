"""Per-unit privacy budget accountant (rPDP-FL §6.2, "budget accountant").

A *unit* is whatever a budget protects: a record (rPDP-FL), a client (IDP-FedAvg) or a user
(ULDP-FL). The ledger is driven by the algorithm's one mechanism description, a
:class:`~pdpfl.privacy.unit.UnitMechanism` (``TrainingPlan``, ``SampledGaussianPlan``): for each
observer it accounts against (``mechanism.observers``) it keeps one integer counter per unit,
incremented by :meth:`PrivacyLedger.record_round` according to ``mechanism.charged_on(observer)``:

* ``active`` -- every round the unit was not stopped (third parties, who do not see the client
  sampling: rPDP-FL Theorem 1 / Lemma 6, every active unit adds ρ^{τ,λ}(α, q));
* ``participated`` -- only rounds its silo took part in (the server, Type I: τ·ρ_SGM(α, q));
* an inactive (sat-out) unit adds nothing: its rate is 0 that round;
* with hidden participation (``server_sees_participation=False``: secure summation where every
  silo sends a masked contribution every round and draws its own λ-coin) the server's view
  equals a third party's, so the server observer is charged and converted exactly like the
  third-party one.

A unit's ε against an observer is that of ``count`` charged rounds of the mechanism's round event
at its rate, computed by :func:`pdpfl.privacy.accountant.mechanism_epsilon` -- the same function
:func:`~pdpfl.privacy.two_stage.plan_epsilon` and the calibration call, so a unit that is charged
T rounds has exactly the ε the calibration certified. Before a round,
:meth:`PrivacyLedger.would_exceed` pre-checks which units would go over budget if charged once
more (those sit the round out).

Accountants: ``rdp`` (default; RDP with the optimal order) or ``pld`` (privacy-loss
distributions, tighter; rates rounded up to the PLD rate grid, see :mod:`pdpfl.privacy.pld`).

Scale: the state is one integer counter per unit and observer (plus sat-out rounds), never a
units × orders matrix. ε is computed once per distinct (rate, count) pair, so 10⁶ records with a
few thousand distinct rates cost a few thousand conversions (cached between rounds). Counters are
integers, so a saved and reloaded ledger resumes exactly (no double or under counting).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl.budgets import validate_budgets
from pdpfl.io import save_npz
from pdpfl.privacy.accountant import as_accountant_name, mechanism_epsilon
from pdpfl.privacy.adversary import Adversary, as_adversary
from pdpfl.privacy.orders import DEFAULT_ORDERS, check_orders
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.unit import SampledGaussianPlan, UnitMechanism

__all__ = ["PrivacyLedger"]

_FORMAT = "pdpfl-ledger-v1"
_CHUNK = 65_536
#: Summaries group by budget value when there are at most this many distinct budgets.
_MAX_BUDGET_GROUPS = 32
#: (rate index, count) → ε results kept per observer between calls.
_CACHE_LIMIT = 1_000_000


def _counter_key(observer: str) -> str:
    return observer.replace("-", "_") + "_rounds"


#: Observer → the ledger attribute holding its counters.
_OBSERVER_ATTR = {"third-party": "third_party_rounds", "server": "server_rounds"}


def _mask(mask: object, n: int, name: str) -> np.ndarray:
    arr = np.asarray(mask)
    if arr.shape != (n,):
        raise ValueError(f"{name}: expected a boolean array of shape ({n},), got {arr.shape}")
    if arr.dtype != np.bool_:
        if not np.isin(arr, (0, 1)).all():
            raise ValueError(f"{name}: expected booleans (or 0/1)")
        arr = arr.astype(bool)
    return arr


class PrivacyLedger:
    """Budget accountant for ``n`` units with budgets ε_i and sampling rates q_i.

    Parameters
    ----------
    budgets : (n,) ε per unit, finite and > 0.
    rates : (n,) sampling probability per unit in [0, 1] (0 = never sampled).
    plan : the mechanism: a :class:`~pdpfl.privacy.plan.TrainingPlan` (record level, rPDP-FL),
        a :class:`~pdpfl.privacy.unit.SampledGaussianPlan` (client / user level) or any
        :class:`~pdpfl.privacy.unit.UnitMechanism`.
    orders : RDP orders α (the RDP accountant's grid; also the PLD accountant's RDP fallback).
    groups : optional (n,) group label per unit for :meth:`summary` (e.g. budget level,
        client id). Default: the budget value when there are few distinct budgets.
    accountant : ``rdp`` (default) or ``pld``.
    server_sees_participation : False under hidden participation: the server observer is then
        accounted like the third party (λ-amplified), see the module docstring.
    """

    def __init__(
        self,
        budgets: np.ndarray,
        rates: np.ndarray,
        plan: UnitMechanism,
        orders: np.ndarray = DEFAULT_ORDERS,
        groups: np.ndarray | None = None,
        *,
        accountant: str = "rdp",
        server_sees_participation: bool = True,
    ) -> None:
        if not isinstance(plan, UnitMechanism):
            raise ValueError(
                f"plan: expected a TrainingPlan or a UnitMechanism, got {type(plan).__name__}"
            )
        self.mechanism = plan
        self.server_sees_participation = bool(server_sees_participation)
        self.budgets = validate_budgets(budgets)
        n = self.budgets.size
        q = np.asarray(rates, dtype=np.float64)
        if q.shape != (n,):
            raise ValueError(f"rates: expected shape ({n},) like budgets, got {q.shape}")
        if not np.all((q >= 0) & (q <= 1)):
            raise ValueError("rates: every sampling rate must be in [0, 1]")
        self.rates = q
        self.orders = check_orders(orders).copy()
        self.accountant = as_accountant_name(accountant)
        if groups is not None:
            groups = np.asarray(groups)
            if groups.shape != (n,):
                raise ValueError(f"groups: expected shape ({n},), got {groups.shape}")
        self.groups = groups
        self.distinct_rates, inverse = np.unique(q, return_inverse=True)
        self.rate_index = inverse.reshape(-1).astype(np.int64)
        #: Charged rounds per unit against each observer (plain attributes: zeros for an
        #: observer the mechanism is not accounted against).
        self.third_party_rounds = np.zeros(n, dtype=np.int64)
        self.server_rounds = np.zeros(n, dtype=np.int64)
        unknown = set(self.observers) - set(_OBSERVER_ATTR)
        if unknown:
            raise ValueError(f"plan: unknown observers {sorted(unknown)}")
        #: The observer whose view (event and charge rule) accounts each observer: under hidden
        #: participation the server sees only what a third party sees.
        self.view = {
            obs: "third-party"
            if obs == "server" and not self.server_sees_participation
            and "third-party" in self.observers else obs
            for obs in self.observers
        }
        self.charge_rule = {obs: plan.charged_on(self.view[obs]) for obs in self.observers}
        self.sat_out_rounds = np.zeros(n, dtype=np.int64)
        self.rounds_recorded = 0
        self._cache: dict[str, dict[int, float]] = {obs: {} for obs in self.observers}

    # ------------------------------------------------------------------ accounting

    @property
    def plan(self) -> UnitMechanism:
        """The mechanism description (kept under its historical name)."""
        return self.mechanism

    @property
    def unit(self) -> str:
        return str(getattr(self.mechanism.unit, "value", self.mechanism.unit))

    @property
    def observers(self) -> tuple[str, ...]:
        """Observers this ledger accounts against (from the mechanism description)."""
        return tuple(self.mechanism.observers)

    @property
    def counts(self) -> dict[str, np.ndarray]:
        """Charged rounds per unit, one integer array per observer of the mechanism."""
        return {obs: getattr(self, _OBSERVER_ATTR[obs]) for obs in self.observers}

    def _options(self) -> dict[str, Any]:
        if self.accountant == "rdp":
            return {"orders": self.orders}
        return {"rdp_orders": self.orders}

    def _epsilon(self, observer: str, counts: np.ndarray) -> np.ndarray:
        """ε for units charged ``counts`` rounds, one conversion per distinct (rate, count)."""
        counts = np.asarray(counts, dtype=np.int64)
        out = np.zeros(counts.size, dtype=np.float64)
        live = counts > 0
        if not live.any():
            return out
        width = int(counts.max()) + 1
        keys = self.rate_index[live] * width + counts[live]
        uniq, inv = np.unique(keys, return_inverse=True)
        observer = self.view[observer]
        cache = self._cache[observer]
        # the cache key must not depend on `width`: use (rate index, count) packed with a
        # fixed stride.
        ri, cnt = np.divmod(uniq, width)
        fixed = ri * (1 << 32) + cnt
        eps = np.array([cache.get(int(k), np.nan) for k in fixed]) if cache else np.full(
            uniq.size, np.nan
        )
        todo = np.flatnonzero(np.isnan(eps))
        for s in range(0, todo.size, _CHUNK):
            sel = todo[s : s + _CHUNK]
            e, _ = mechanism_epsilon(
                self.mechanism,
                self.distinct_rates[ri[sel]],
                observer,
                cnt[sel],
                accountant=self.accountant,
                **self._options(),
            )
            eps[sel] = e
        if todo.size and len(cache) + todo.size <= _CACHE_LIMIT:
            cache.update(zip(fixed[todo].tolist(), eps[todo].tolist(), strict=True))
        out[live] = eps[inv.reshape(-1)]
        return out

    def _spent(self, adversary: Adversary, extra: int = 0) -> np.ndarray:
        wanted = ("third-party", "server") if adversary.value == "both" else (adversary.value,)
        present = [o for o in wanted if o in self.observers]
        if not present:
            raise ValueError(
                f"adversary: this {self.unit}-level ledger accounts against "
                f"{', '.join(self.observers)}, not {adversary.value}"
            )
        out = None
        for obs in present:
            e = self._epsilon(obs, self.counts[obs] + extra)
            out = e if out is None else np.maximum(out, e)
        return out

    # ------------------------------------------------------------------ public API

    @property
    def n(self) -> int:
        return int(self.budgets.size)

    def spent_epsilon(self, adversary: str = "third-party") -> np.ndarray:
        """ε spent so far by each unit (``both`` = the larger over the observers)."""
        return self._spent(as_adversary(adversary))

    def would_exceed(self, mask: np.ndarray | None = None, adversary: str = "both") -> np.ndarray:
        """Pre-check for the next round: True where being charged once more (against every
        requested observer) would overspend the budget.

        ``mask`` (per unit, optional) restricts the check to units that could take part in the
        next round; others are reported False. The server side assumes the unit's client
        participates (worst case).
        """
        adv = as_adversary(adversary)
        exceed = self._spent(adv, extra=1) > self.budgets
        if mask is not None:
            exceed &= _mask(mask, self.n, "mask")
        return exceed

    def record_round(self, participated: np.ndarray, active: np.ndarray) -> None:
        """Add one round: ``active`` = unit was not stopped; ``participated`` = it was active
        and its client was sampled (so the server saw its contribution). Each observer's
        counter adds ``active`` or ``participated`` per ``mechanism.charged_on(observer)``."""
        act = _mask(active, self.n, "active")
        part = _mask(participated, self.n, "participated")
        if np.any(part & ~act):
            raise ValueError("participated: a unit cannot participate in a round it sat out")
        for obs, rule in self.charge_rule.items():
            attr = _OBSERVER_ATTR[obs]
            setattr(self, attr, getattr(self, attr) + (act if rule == "active" else part))
        self.sat_out_rounds += ~act
        self.rounds_recorded += 1

    def summary(self) -> dict[str, Any]:
        """Per-group max spent vs budget, utilization quantiles, count of stopped units."""
        zero = np.zeros(self.n)
        tp = self.spent_epsilon("third-party") if "third-party" in self.observers else zero
        srv = self.spent_epsilon("server") if "server" in self.observers else zero
        worst = np.maximum(tp, srv)
        util = worst / self.budgets
        stopped = self.sat_out_rounds > 0
        if self.groups is not None:
            labels = self.groups
        elif np.unique(self.budgets).size <= _MAX_BUDGET_GROUPS:
            labels = self.budgets
        else:
            labels = np.zeros(self.n, dtype=np.int64)
        keys, inv = np.unique(labels, return_inverse=True)
        inv = inv.reshape(-1)
        groups = []
        for g, key in enumerate(keys.tolist()):
            sel = inv == g
            b = self.budgets[sel]
            groups.append(
                {
                    "group": key if self.groups is not None or b.min() == b.max() else "all",
                    "units": int(sel.sum()),
                    "budget_min": float(b.min()),
                    "budget_max": float(b.max()),
                    "max_spent_third_party": float(tp[sel].max()),
                    "max_spent_server": float(srv[sel].max()),
                    "max_utilization": float(util[sel].max()),
                    "mean_utilization": float(util[sel].mean()),
                    "stopped": int(stopped[sel].sum()),
                }
            )
        qs = (0.0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)
        return {
            "unit": self.unit,
            "accountant": self.accountant,
            "observers": list(self.observers),
            "units": self.n,
            "rounds_recorded": self.rounds_recorded,
            # against the stricter of the observers; then per observer (zero where the
            # mechanism is not accounted against that observer)
            "over_budget": int(np.count_nonzero(worst > self.budgets)),
            "over_budget_third_party": int(np.count_nonzero(tp > self.budgets)),
            "over_budget_server": int(np.count_nonzero(srv > self.budgets)),
            "stopped": int(stopped.sum()),
            "utilization_quantiles": {
                str(q): float(v) for q, v in zip(qs, np.quantile(util, qs), strict=True)
            },
            "groups": groups,
        }

    # ------------------------------------------------------------------ persistence

    def state_dict(self) -> dict[str, Any]:
        """The counters (integers) that, with the same budgets, rates and plan, resume exactly.

        One ``<observer>_rounds`` array per observer (``third_party_rounds``,
        ``server_rounds``), ``sat_out_rounds`` and ``rounds_recorded``.
        """
        state: dict[str, Any] = {_counter_key(o): c.copy() for o, c in self.counts.items()}
        state["sat_out_rounds"] = self.sat_out_rounds.copy()
        state["rounds_recorded"] = int(self.rounds_recorded)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        keys = [_counter_key(o) for o in self.observers] + ["sat_out_rounds"]
        loaded = {}
        for key in keys:
            if key not in state:
                raise ValueError(f"ledger state: missing {key}")
            try:
                arr = np.asarray(state[key], dtype=np.float64)
            except (TypeError, ValueError):
                arr = np.zeros(0)
            if (
                arr.shape != (self.n,)
                or not np.all(np.isfinite(arr))
                or np.any(arr != np.floor(arr))
                or np.any(arr < 0)
            ):
                raise ValueError(f"ledger state: {key} must be {self.n} non-negative integers")
            loaded[key] = arr.astype(np.int64)
        rounds = state.get("rounds_recorded")
        if isinstance(rounds, bool) or not isinstance(rounds, int | np.integer) or rounds < 0:
            raise ValueError("ledger state: rounds_recorded must be an integer >= 0")
        for obs in self.observers:
            setattr(self, _OBSERVER_ATTR[obs], loaded[_counter_key(obs)].copy())
        self.sat_out_rounds = loaded["sat_out_rounds"].copy()
        self.rounds_recorded = int(rounds)

    def save(self, path: str | Path) -> None:
        """Write the full state atomically (``.npz``); :meth:`load` resumes exactly."""
        meta = {
            "format": _FORMAT,
            "mechanism": _mechanism_to_meta(self.mechanism),
            "accountant": self.accountant,
            "rounds_recorded": self.rounds_recorded,
            "server_sees_participation": self.server_sees_participation,
        }
        if isinstance(self.mechanism, TrainingPlan):
            meta["plan"] = _plan_dict(self.mechanism)
        arrays: dict[str, np.ndarray] = {
            "meta": np.array(json.dumps(meta)),
            "budgets": self.budgets,
            "rates": self.rates,
            "orders": self.orders,
            "sat_out_rounds": self.sat_out_rounds,
        }
        for obs, c in self.counts.items():
            arrays[_counter_key(obs)] = c
        if self.groups is not None:
            g = self.groups
            arrays["groups"] = g if g.dtype.kind in "biuf" else g.astype(str)
        save_npz(path, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> PrivacyLedger:
        with np.load(Path(path), allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("format") != _FORMAT:
                raise ValueError(f"{path}: not a pdpfl ledger file ({meta.get('format')!r})")
            ledger = cls(
                z["budgets"],
                z["rates"],
                _mechanism_from_meta(meta),
                orders=z["orders"],
                groups=z["groups"] if "groups" in z.files else None,
                accountant=meta.get("accountant", "rdp"),
                server_sees_participation=bool(meta.get("server_sees_participation", True)),
            )
            state = {k: z[k] for k in z.files if k.endswith("_rounds")}
        state["rounds_recorded"] = int(meta["rounds_recorded"])
        ledger.load_state_dict(state)
        return ledger


def _plan_dict(plan: TrainingPlan) -> dict[str, Any]:
    return {
        "noise_multiplier": plan.noise_multiplier,
        "delta": plan.delta,
        "steps": plan.steps,
        "rounds": plan.rounds,
        "client_rate": plan.client_rate,
    }


def _mechanism_to_meta(mech: UnitMechanism) -> dict[str, Any]:
    if isinstance(mech, SampledGaussianPlan):
        return {
            "kind": "sampled-gaussian",
            "unit": mech.unit.value,
            "noise_multiplier": mech.noise_multiplier,
            "delta": mech.delta,
            "rounds": mech.rounds,
            "observers": list(mech.observers),
        }
    if isinstance(mech, TrainingPlan):
        return {"kind": "training-plan"}
    raise ValueError(
        f"plan: cannot save a ledger for {type(mech).__name__} (TrainingPlan or "
        "SampledGaussianPlan only)"
    )


def _mechanism_from_meta(meta: dict[str, Any]) -> TrainingPlan | SampledGaussianPlan:
    mech = meta.get("mechanism") or {"kind": "training-plan"}
    if mech.get("kind") == "sampled-gaussian":
        return SampledGaussianPlan(
            mech["unit"],
            float(mech["noise_multiplier"]),
            float(mech["delta"]),
            int(mech["rounds"]),
            tuple(mech["observers"]),
        )
    return TrainingPlan(**meta["plan"])
