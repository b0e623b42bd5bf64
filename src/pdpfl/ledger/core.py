"""One privacy ledger for every privacy unit (rPDP-FL §6.2, "budget accountant").

A *unit* is whatever a budget protects: a record (rPDP-FL, PriFedSync), a client (IDP-FedAvg)
or a user (ULDP-FL). Each row of a :class:`PrivacyLedger` is one unit: its id (from the data:
record ids, client names, user ids), its budget ε, the mechanism parameters it is charged under
(its sampling rate q and, where units differ, its noise multiplier σ) and one integer counter of
charged rounds per observer. The mechanism itself is described once, as a
:class:`~pdpfl.privacy.unit.UnitMechanism` (``TrainingPlan``, ``SampledGaussianPlan``, ...):

* :meth:`PrivacyLedger.record_round` adds one round to each observer's counter according to
  ``mechanism.charged_on(observer)``: ``active`` -- every round the unit was not stopped (third
  parties, who do not see client sampling: rPDP-FL Theorem 1 / Lemma 6); ``participated`` --
  only rounds its silo took part in (the server, Type I). A unit that sat out adds nothing.
  The server is always accounted with participation revealed: on a real network it can tell
  who took part (reply timing), whatever the messages say.
* ε of a unit against an observer is that of ``count`` charged rounds of the mechanism's round
  event at its own (q, σ), computed by :func:`pdpfl.privacy.accountant.mechanism_epsilon` -- the
  same function the calibration calls, so a unit charged T rounds has exactly the ε the
  calibration certified -- for any registered accountant (``rdp``, ``pld``, ...).
* :meth:`PrivacyLedger.would_exceed` is the pre-check before a round: which units would go over
  budget if charged once more (those sit the round out) -- with a lifetime account attached
  (:mod:`pdpfl.ledger.lifetime`), also over their budget for life: earlier runs on the same
  data composed with this one.

Scale: the state is integer counters per unit and observer, never a units × orders matrix. ε is
computed once per distinct (q, σ, count) and cached, so 10⁶ records sharing a few thousand rates
cost a few thousand conversions. Counters are integers, so a saved ledger resumes exactly.
Persistence: :func:`pdpfl.ledger.store.save_ledger` / ``load_ledger``. Reports:
:meth:`PrivacyLedger.summary` (a typed :class:`~pdpfl.ledger.summary.PrivacySummary`) and
:meth:`PrivacyLedger.table` (one row per unit).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Protocol

import numpy as np

from pdpfl.budgets import validate_budgets
from pdpfl.ledger.groups import UnitFacts, budget_groups, over_budget
from pdpfl.ledger.summary import OBSERVERS, GroupSummary, PrivacySummary, observers_of
from pdpfl.privacy.accountant import as_accountant_name, mechanism_epsilon
from pdpfl.privacy.orders import DEFAULT_ORDERS, check_orders
from pdpfl.privacy.unit import UnitMechanism

__all__ = ["LifetimeLink", "PrivacyLedger"]


class LifetimeLink(Protocol):
    """What a ledger asks of its budget store (:class:`pdpfl.ledger.lifetime.LifetimeAccount`)."""

    #: Earlier runs limit this one (False: ``lifetime.allow_respend``, reported only).
    enforce: bool

    @property
    def prior_units(self) -> np.ndarray: ...

    def spent(self, ledger: PrivacyLedger, observer: str, counts: np.ndarray) -> np.ndarray: ...

    def charge(self, ledger: PrivacyLedger) -> None: ...

    def rebase(self, ledger: PrivacyLedger, *, write: bool = True) -> None: ...


_CHUNK = 65_536
#: (row, count) → ε results kept per (accountant, observer) between calls.
_CACHE_LIMIT = 1_000_000

#: Observer → the ledger attribute holding its counters.
_OBSERVER_ATTR = {"third-party": "third_party_rounds", "server": "server_rounds"}


@lru_cache(maxsize=65_536)
def _shared_epsilon(
    mechanism: UnitMechanism,
    rate: float,
    view: str,
    count: int,
    accountant: str,
    orders: bytes | None,
) -> float:
    """ε of ``count`` charged rounds of ``mechanism`` at rate q = ``rate`` (a pure function of
    public numbers, memoized across ledgers: many one-unit ledgers of the same mechanism, e.g.
    IDP-FedAvg's clients of one privacy group, convert each (q, σ, count) once per process).
    ``orders``: the RDP grid as float64 bytes (None: the accountant's own)."""
    options: dict[str, Any] = {}
    if orders is not None:
        grid = np.frombuffer(orders, dtype=np.float64)
        options = (
            {"orders": grid}
            if accountant == "rdp"
            else {"rdp_orders": grid}
            if accountant == "pld"
            else {}
        )
    e, _ = mechanism_epsilon(
        mechanism,
        np.array([rate], dtype=np.float64),
        view,
        np.array([count], dtype=np.int64),
        accountant=accountant,
        **options,
    )
    return float(np.asarray(e, dtype=np.float64).reshape(-1)[0])


def counter_key(observer: str) -> str:
    """Name of an observer's counter array in a ledger's state (``third_party_rounds``, ...)."""
    return _OBSERVER_ATTR[observer]


def _mask(mask: object, n: int, name: str) -> np.ndarray:
    arr = np.asarray(mask)
    if arr.shape != (n,):
        raise ValueError(f"{name}: expected a boolean array of shape ({n},), got {arr.shape}")
    if arr.dtype != np.bool_:
        if not np.isin(arr, (0, 1)).all():
            raise ValueError(f"{name}: expected booleans (or 0/1)")
        arr = arr.astype(bool)
    return arr


def _ids(ids: object, n: int) -> np.ndarray:
    if ids is None:
        return np.arange(n, dtype=np.int64)
    arr = np.asarray(ids)
    if arr.shape != (n,):
        raise ValueError(f"ids: expected one id per unit, shape ({n},), got {arr.shape}")
    if arr.dtype.kind in "iu":
        arr = arr.astype(np.int64)
    elif arr.dtype.kind in "OUS":
        arr = arr.astype(str)
    else:
        raise ValueError(f"ids: expected integers or strings, got dtype {arr.dtype}")
    if np.unique(arr).size != n:
        raise ValueError("ids: every unit needs its own id (duplicates found)")
    return arr


class PrivacyLedger:
    """Budget accountant for ``n`` units (see the module docstring).

    Parameters
    ----------
    budgets
        (n,) ε per unit, finite and > 0.
    rates
        (n,) sampling probability per unit in [0, 1] (0 = never sampled: *excluded*).
    mechanism
        The algorithm's :class:`~pdpfl.privacy.unit.UnitMechanism`.
    ids
        (n,) unit ids (integers or strings), unique; default ``0..n-1``.
    noise_multipliers
        Optional (n,) σ per unit when units are charged under different noise (IDP-FedAvg's
        SCALE, ULDP-FL's personal budgets); default the mechanism's own σ for every unit.
    orders
        RDP orders α (the RDP accountant's grid; the PLD accountant's RDP fallback); None lets
        each accountant use its own grid for each event (e.g. the group-privacy event's orders
        α ≥ 2k, the without-replacement event's integer grid).
    accountant
        ``rdp`` (default), ``pld``, or another registered accountant.
    """

    def __init__(
        self,
        budgets: np.ndarray,
        rates: np.ndarray,
        mechanism: UnitMechanism,
        *,
        ids: np.ndarray | None = None,
        noise_multipliers: np.ndarray | None = None,
        orders: np.ndarray | None = DEFAULT_ORDERS,
        accountant: str = "rdp",
    ) -> None:
        if not isinstance(mechanism, UnitMechanism):
            raise ValueError(
                f"mechanism: expected a UnitMechanism (TrainingPlan, SampledGaussianPlan, ...), "
                f"got {type(mechanism).__name__}"
            )
        self.mechanism = mechanism
        self._observers = tuple(mechanism.observers)  # a frozen description: read it once
        self.budgets = validate_budgets(budgets)
        n = self.budgets.size
        q = np.asarray(rates, dtype=np.float64)
        if q.shape != (n,):
            raise ValueError(f"rates: expected shape ({n},) like budgets, got {q.shape}")
        if not np.all((q >= 0) & (q <= 1)):
            raise ValueError("rates: every sampling rate must be in [0, 1]")
        self.rates = q
        self.ids = _ids(ids, n)
        sigma0 = float(getattr(mechanism, "noise_multiplier"))  # noqa: B009 (protocol attr)
        if noise_multipliers is None:
            sig = np.full(n, sigma0)
        else:
            sig = np.asarray(noise_multipliers, dtype=np.float64)
            if sig.shape != (n,) or not np.all(np.isfinite(sig) & (sig > 0)):
                raise ValueError(f"noise_multipliers: expected ({n},) finite values > 0")
        self.noise_multipliers = sig
        self.orders = None if orders is None else check_orders(orders).copy()
        self._orders_key: bytes | None = (
            None
            if self.orders is None
            else np.ascontiguousarray(self.orders, dtype=np.float64).tobytes()
        )
        self.accountant = as_accountant_name(accountant)
        unknown = set(self.observers) - set(_OBSERVER_ATTR)
        if unknown:
            raise ValueError(f"mechanism: unknown observers {sorted(unknown)}")
        pairs = np.stack([q, sig], axis=1)
        distinct, inverse = np.unique(pairs, axis=0, return_inverse=True)
        self._row_rate, self._row_sigma = distinct[:, 0], distinct[:, 1]
        self._row = inverse.reshape(-1).astype(np.int64)
        #: Charged rounds per unit against each observer (zeros for an observer the mechanism
        #: is not accounted against).
        self.third_party_rounds = np.zeros(n, dtype=np.int64)
        self.server_rounds = np.zeros(n, dtype=np.int64)
        self.charge_rule = {obs: mechanism.charged_on(obs) for obs in self.observers}
        self.sat_out_rounds = np.zeros(n, dtype=np.int64)
        self.rounds_recorded = 0
        self._cache: dict[tuple[str, str], dict[int, float]] = {}
        self._mechanisms: dict[float, UnitMechanism] = {sigma0: mechanism}
        #: The link to this data's budget store (:mod:`pdpfl.ledger.lifetime`): earlier runs'
        #: charges and this run's written-ahead ones. None: this run alone is accounted.
        self.lifetime: LifetimeLink | None = None

    # ------------------------------------------------------------------ description

    @property
    def n(self) -> int:
        return int(self.budgets.size)

    @property
    def unit(self) -> str:
        return str(getattr(self.mechanism.unit, "value", self.mechanism.unit))

    @property
    def observers(self) -> tuple[str, ...]:
        """Observers this ledger accounts against (from the mechanism description)."""
        return self._observers

    @property
    def counts(self) -> dict[str, np.ndarray]:
        """Charged rounds per unit, one integer array per observer of the mechanism."""
        return {obs: getattr(self, _OBSERVER_ATTR[obs]) for obs in self.observers}

    @property
    def distinct_rows(self) -> int:
        """Distinct (q, σ) pairs: the ledger converts once per pair and count."""
        return int(self._row_rate.size)

    @property
    def excluded(self) -> np.ndarray:
        """Units with sampling rate 0 (never used: budget below the smallest achievable ε)."""
        return self.rates <= 0

    @property
    def stopped(self) -> np.ndarray:
        """Units the pre-check made sit out at least one round (rate > 0)."""
        out: np.ndarray = (self.sat_out_rounds > 0) & ~self.excluded
        return out

    # ------------------------------------------------------------------ accounting

    def _mechanism(self, sigma: float) -> UnitMechanism:
        mech = self._mechanisms.get(sigma)
        if mech is None:
            mech = self.mechanism.with_noise(sigma)
            self._mechanisms[sigma] = mech
        return mech

    def _options(self, accountant: str) -> dict[str, Any]:
        if accountant == "rdp":
            return {} if self.orders is None else {"orders": self.orders}
        if accountant == "pld":
            return {} if self.orders is None else {"rdp_orders": self.orders}
        return {}

    def _convert_one(self, row: int, count: int, view: str, accountant: str) -> float:
        """ε of one (q, σ, count): the same one-element accountant call as a batch of one,
        shared by every ledger of the same mechanism (:func:`_shared_epsilon`)."""
        mech = self._mechanism(float(self._row_sigma[row]))
        rate = float(self._row_rate[row])
        shared: Any = mech  # frozen dataclasses of pdpfl.privacy are hashable
        try:
            return _shared_epsilon(shared, rate, view, count, accountant, self._orders_key)
        except TypeError:  # an unhashable mechanism description: not shared
            e, _ = mechanism_epsilon(
                mech,
                np.array([rate]),
                view,
                np.array([count], dtype=np.int64),
                accountant=accountant,
                **self._options(accountant),
            )
            return float(np.asarray(e, dtype=np.float64).reshape(-1)[0])

    def _one_epsilon(self, observer: str, count: int, accountant: str) -> float:
        """ε of a one-unit ledger after ``count`` rounds (the fast path: no grouping)."""
        view = observer
        cache = self._cache.setdefault((accountant, view), {})
        row = int(self._row[0])
        key = row * (1 << 32) + count
        hit = cache.get(key)
        if hit is None:
            hit = self._convert_one(row, count, view, accountant)
            if len(cache) < _CACHE_LIMIT:
                cache[key] = hit
        return hit

    def _epsilon(self, observer: str, counts: np.ndarray, accountant: str) -> np.ndarray:
        """ε for units charged ``counts`` rounds, one conversion per distinct (q, σ, count)."""
        counts = np.asarray(counts, dtype=np.int64)
        if counts.size == 1 and counts[0] > 0 and self.rates[0] > 0:
            return np.array([self._one_epsilon(observer, int(counts[0]), accountant)])
        return self._epsilon_many(observer, counts, accountant)

    def _epsilon_many(self, observer: str, counts: np.ndarray, accountant: str) -> np.ndarray:
        """ε for units charged ``counts`` rounds, one conversion per distinct (q, σ, count)."""
        counts = np.asarray(counts, dtype=np.int64)
        out = np.zeros(counts.size, dtype=np.float64)
        live = (counts > 0) & (self.rates > 0)
        if not live.any():
            return out
        width = int(counts.max()) + 1
        keys = self._row[live] * width + counts[live]
        uniq, inv = np.unique(keys, return_inverse=True)
        row, cnt = np.divmod(uniq, width)
        view = observer
        cache = self._cache.setdefault((accountant, view), {})
        fixed = row * (1 << 32) + cnt  # a cache key independent of `width`
        eps = np.array([cache.get(int(k), np.nan) for k in fixed], dtype=np.float64)
        todo = np.flatnonzero(np.isnan(eps))
        if todo.size == 1:  # one conversion: shared by ledgers of the same mechanism
            j = int(todo[0])
            eps[j] = self._convert_one(int(row[j]), int(cnt[j]), view, accountant)
        for sigma in np.unique(self._row_sigma[row[todo]]) if todo.size > 1 else ():
            sel_all = todo[self._row_sigma[row[todo]] == sigma]
            mech = self._mechanism(float(sigma))
            for s in range(0, sel_all.size, _CHUNK):
                sel = sel_all[s : s + _CHUNK]
                e, _ = mechanism_epsilon(
                    mech,
                    self._row_rate[row[sel]],
                    view,
                    cnt[sel],
                    accountant=accountant,
                    **self._options(accountant),
                )
                eps[sel] = e
        if todo.size and len(cache) + todo.size <= _CACHE_LIMIT:
            cache.update(zip(fixed[todo].tolist(), eps[todo].tolist(), strict=True))
        out[live] = eps[inv.reshape(-1)]
        return out

    def _spent(self, adversary: str, extra: int = 0, accountant: str | None = None) -> np.ndarray:
        acc = self.accountant if accountant is None else as_accountant_name(accountant)
        present = [o for o in observers_of(adversary) if o in self.observers]
        if not present:
            raise ValueError(
                f"adversary: this {self.unit}-level ledger accounts against "
                f"{', '.join(self.observers)}, not {adversary}"
            )
        out: np.ndarray | None = None
        for obs in present:
            e = self._epsilon(obs, self.counts[obs] + extra, acc)
            out = e if out is None else np.maximum(out, e)
        assert out is not None
        return out

    def lifetime_spent(self, adversary: str = "both", extra: int = 0) -> np.ndarray:
        """Lifetime ε of each unit (``both`` = the larger over the observers accounted): every
        earlier run on this data composed with this one charged ``extra`` more rounds (this
        run's own ε when no budget store is attached)."""
        if self.lifetime is None:
            return self._spent(adversary, extra=extra)
        present = [o for o in observers_of(adversary) if o in self.observers]
        if not present:
            return self._spent(adversary, extra=extra)  # raises, naming the observers
        out: np.ndarray | None = None
        for obs in present:
            e = self.lifetime.spent(self, obs, self.counts[obs] + extra)
            out = e if out is None else np.maximum(out, e)
        assert out is not None
        return out

    def planned_epsilon(self, adversary: str = "both") -> np.ndarray:
        """ε of each unit after the mechanism's planned rounds (every observer charged T)."""
        present = [o for o in observers_of(adversary) if o in self.observers]
        t = int(self.mechanism.planned_rounds)
        out = np.zeros(self.n)
        for obs in present:
            out = np.maximum(out, self._epsilon(obs, np.full(self.n, t), self.accountant))
        return out

    def spent_epsilon(self, adversary: str = "both", accountant: str | None = None) -> np.ndarray:
        """ε spent so far by each unit (``both`` = the larger over the observers accounted).

        ``accountant`` overrides the ledger's accountant for this call (e.g. an approximate
        accountant shown beside the rigorous one)."""
        return self._spent(adversary, accountant=accountant)

    def would_exceed(
        self,
        mask: np.ndarray | None = None,
        adversary: str = "both",
        budgets: np.ndarray | None = None,
    ) -> np.ndarray:
        """Pre-check for the next round: True where being charged once more (against every
        requested observer the ledger accounts) would overspend the budget.

        ``mask`` (optional) restricts the check to units that could take part in the next
        round; the server side assumes the unit's silo participates (worst case). ``budgets``
        (optional, (n,)) are the limits enforced instead of the units' own budgets, for a
        baseline that accounts every unit against another ε (IDP-FedAvg's strict/relaxed);
        reports still compare with the units' own budgets.
        """
        present = [o for o in observers_of(adversary) if o in self.observers]
        if not present:
            return np.zeros(self.n, dtype=bool)
        limit = self.budgets
        if budgets is not None:
            limit = np.asarray(budgets, dtype=np.float64)
            if limit.shape != (self.n,) or np.isnan(limit).any():
                raise ValueError(f"budgets: expected ({self.n},) limits (not NaN)")
        view = "both" if len(present) == 2 else present[0]
        exceed = self._spent(view, extra=1) > limit
        if self.lifetime is not None and self.lifetime.enforce:
            exceed |= self.lifetime_spent(view, extra=1) > self.budgets
        if mask is not None:
            exceed &= _mask(mask, self.n, "mask")
        return exceed

    def record_round(self, participated: np.ndarray, active: np.ndarray) -> None:
        """Charge one round: ``active`` = the unit was not stopped; ``participated`` = it was
        active and its silo took part (the server saw its contribution)."""
        act = _mask(active, self.n, "active")
        part = _mask(participated, self.n, "participated")
        if np.any(part & ~act):
            raise ValueError("participated: a unit cannot participate in a round it sat out")
        for obs, rule in self.charge_rule.items():
            attr = _OBSERVER_ATTR[obs]
            setattr(self, attr, getattr(self, attr) + (act if rule == "active" else part))
        self.sat_out_rounds += ~act
        self.rounds_recorded += 1
        if self.lifetime is not None:  # written ahead: the store holds it before any release
            self.lifetime.charge(self)

    # ------------------------------------------------------------------ reports

    def table(self, accountant: str | None = None) -> dict[str, np.ndarray]:
        """One row per unit: ``id``, ``budget``, ``group``, ``rate``, ``noise_multiplier``,
        ``rounds_<observer>`` and ``epsilon_<observer>`` for every observer (NaN where the
        ledger does not account against it), ``stopped``, ``excluded``."""
        idx, labels = budget_groups(self.budgets)
        cols: dict[str, np.ndarray] = {
            "id": self.ids,
            "budget": self.budgets,
            "group": np.asarray(labels)[idx],
            "rate": self.rates,
            "noise_multiplier": self.noise_multipliers,
        }
        for obs in OBSERVERS:
            tag = obs.replace("-", "_")
            if obs in self.observers:
                cols[f"rounds_{tag}"] = self.counts[obs].copy()
                cols[f"epsilon_{tag}"] = self.spent_epsilon(obs, accountant)
            else:
                cols[f"rounds_{tag}"] = np.zeros(self.n, dtype=np.int64)
                cols[f"epsilon_{tag}"] = np.full(self.n, np.nan)
        cols["stopped"] = self.stopped
        cols["excluded"] = self.excluded
        return cols

    def summary(
        self, approximate: str | None = None, capped: np.ndarray | None = None
    ) -> PrivacySummary:
        """The typed per-group, per-observer summary of this ledger's units.

        ``approximate`` names an (approximate) accountant whose largest ε per observer is
        reported beside the rigorous numbers (``approximate["<accountant>_epsilon_max_<obs>"]``);
        ``capped`` marks units whose budget is above what the mechanism can spend (counted per
        group).
        """
        capped_mask = (
            np.zeros(self.n, dtype=bool) if capped is None else _mask(capped, self.n, "capped")
        )
        idx, labels = budget_groups(self.budgets)
        spent = {o: self.spent_epsilon(o) for o in self.observers}
        over = {o: over_budget(spent[o], self.budgets) for o in self.observers}
        stopped, excluded = self.stopped, self.excluded
        floor = (self.rates > 0) & (self.planned_epsilon("both") <= 0)
        life: dict[str, np.ndarray] = {}
        prior = np.zeros(self.n, dtype=bool)
        if self.lifetime is not None:
            life = {o: self.lifetime.spent(self, o, self.counts[o]) for o in self.observers}
            prior = self.lifetime.prior_units
        extra = UnitFacts(floor, prior, life, self.budgets)
        sig = self.noise_multipliers
        per_unit_sigma = bool(sig.size) and bool(sig.min() != sig.max())
        groups = [] if self.n != 1 else [self._one_unit_group(labels[0], spent, over, extra)]
        for g, label in enumerate(labels if self.n != 1 else ()):
            m = idx == g
            if not m.any():
                continue
            b, q = self.budgets[m], self.rates[m]
            info = {"mean_rate": float(q.mean())}
            if q.min() == q.max():  # one sampling rate for the whole group
                info["rate"] = float(q[0])
            # the group's noise multiplier (the largest, if its units differ)
            info["noise_multiplier"] = float(self.noise_multipliers[m].max())
            groups.append(
                GroupSummary(
                    label=label,
                    units=int(m.sum()),
                    budget_min=float(b.min()),
                    budget_max=float(b.max()),
                    excluded=int(excluded[m].sum()),
                    stopped=int(stopped[m].sum()),
                    capped=int(capped_mask[m].sum()),
                    spent_max={o: float(spent[o][m].max()) for o in self.observers},
                    utilization_sum={o: float((spent[o][m] / b).sum()) for o in self.observers},
                    over_budget={o: int(over[o][m].sum()) for o in self.observers},
                    info=info,
                    **extra.group(m),
                )
            )
        approx: dict[str, float] = {}
        if approximate is not None:
            for o in self.observers:
                e = self.spent_epsilon(o, approximate)
                approx[f"{approximate}_epsilon_max_{o.replace('-', '_')}"] = float(e.max())
        info = (
            {}
            if per_unit_sigma
            else {"noise_multiplier": float(self.noise_multipliers[0]) if self.n else 0.0}
        )
        return PrivacySummary(
            unit=self.unit,
            units=self.n,
            observers=tuple(o for o in OBSERVERS if o in self.observers),
            accountant=self.accountant,
            groups=tuple(groups),
            approximate=approx,
            info=info,
            lifetime=""
            if self.lifetime is None
            else "enforced"
            if self.lifetime.enforce
            else "respend",
        )

    def _one_unit_group(
        self,
        label: str,
        spent: dict[str, np.ndarray],
        over: dict[str, np.ndarray],
        extra: UnitFacts,
    ) -> GroupSummary:
        """The one group of a one-unit ledger (e.g. a client's own), in plain floats: the same
        numbers as the general per-group reductions, without their cost."""
        b, q = float(self.budgets[0]), float(self.rates[0])
        obs = self.observers
        return GroupSummary(
            label=label,
            units=1,
            budget_min=b,
            budget_max=b,
            excluded=int(q <= 0),
            stopped=int(self.sat_out_rounds[0] > 0 and q > 0),
            spent_max={o: float(spent[o][0]) for o in obs},
            utilization_sum={o: float(spent[o][0]) / b for o in obs},
            over_budget={o: int(over[o][0]) for o in obs},
            info={"mean_rate": q, "rate": q, "noise_multiplier": float(self.noise_multipliers[0])},
            **extra.group(np.ones(1, dtype=bool)),
        )

    # ------------------------------------------------------------------ resume

    def state_dict(self) -> dict[str, Any]:
        """The integer counters that, with the same units and mechanism, resume exactly."""
        state: dict[str, Any] = {counter_key(o): c.copy() for o, c in self.counts.items()}
        state["sat_out_rounds"] = self.sat_out_rounds.copy()
        state["rounds_recorded"] = int(self.rounds_recorded)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        keys = [counter_key(o) for o in self.observers] + ["sat_out_rounds"]
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
            setattr(self, _OBSERVER_ATTR[obs], loaded[counter_key(obs)].copy())
        self.sat_out_rounds = loaded["sat_out_rounds"].copy()
        self.rounds_recorded = int(rounds)
        if self.lifetime is not None:  # charges beyond the restored counts stay charged
            self.lifetime.rebase(self)

    @property
    def plan(self) -> UnitMechanism:
        """The mechanism description (historical name)."""
        return self.mechanism
