"""Per-unit privacy budget accountant (rPDP-FL §6.2, "budget accountant").

A *unit* is whatever a budget protects: a record (rPDP-FL), later a client or a user. Before a
round, :meth:`PrivacyLedger.would_exceed` pre-checks which units would go over budget if they
took part (those sit the round out); after it, :meth:`PrivacyLedger.record_round` adds the
round's cost. Accounting per round (RDP composes additively, Mironov 2017 Prop. 1):

* third-party adversary (Type II, rPDP-FL Theorem 1 / Lemma 6): every *active* unit adds
  ρ^{τ,λ}(α, q) -- whether or not its client was sampled, since this adversary does not see
  the client sampling;
* server adversary (Type I): a unit adds τ·ρ_SGM(α, q) only in rounds where its client
  participated (and the unit was active);
* an inactive (sat-out) unit adds nothing: its rate is 0 that round;
* with hidden participation (``server_sees_participation=False``: secure summation where every
  silo sends a masked contribution every round and draws its own λ-coin) the server's view
  equals a third party's, so the server observer is charged exactly like the third-party one.

For a centralized plan (``rounds=None``) one recorded round is the plan's ``steps`` SGM steps
for both adversaries.

Scale: the state is three integer counters per unit plus one RDP row per *distinct* rate
(units with equal q share it), never a units × orders matrix. ε is computed as
``rdp_to_epsilon(count · row)`` for each distinct (rate, count) pair, so 10⁶ records with a few
thousand distinct rates cost a few thousand conversions. Counters are integers, so a saved and
reloaded ledger resumes exactly (no double or under counting).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl.budgets import validate_budgets
from pdpfl.io import save_npz
from pdpfl.privacy.adversary import Adversary, as_adversary
from pdpfl.privacy.conversion import rdp_to_epsilon
from pdpfl.privacy.orders import DEFAULT_ORDERS
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.rdp import poisson_gaussian_rdp
from pdpfl.privacy.two_stage import round_rdp
from pdpfl.privacy.unit import SampledGaussianPlan

__all__ = ["PrivacyLedger"]

_FORMAT = "pdpfl-ledger-v1"
_CHUNK = 65_536
#: Summaries group by budget value when there are at most this many distinct budgets.
_MAX_BUDGET_GROUPS = 32



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
    plan : the mechanism (σ, δ, τ, T, λ).
    orders : RDP orders α used for accounting and conversion.
    groups : optional (n,) group label per unit for :meth:`summary` (e.g. budget level,
        client id). Default: the budget value when there are few distinct budgets.
    server_sees_participation : False under hidden participation: the server observer is then
        accounted like the third party (λ-amplified), see the module docstring.
    """

    def __init__(
        self,
        budgets: np.ndarray,
        rates: np.ndarray,
        plan: TrainingPlan | SampledGaussianPlan,
        orders: np.ndarray = DEFAULT_ORDERS,
        groups: np.ndarray | None = None,
        server_sees_participation: bool = True,
    ) -> None:
        self.mechanism = plan
        self.server_sees_participation = bool(server_sees_participation)
        if isinstance(plan, SampledGaussianPlan):
            plan = plan.as_training_plan()
        self.budgets = validate_budgets(budgets)
        n = self.budgets.size
        q = np.asarray(rates, dtype=np.float64)
        if q.shape != (n,):
            raise ValueError(f"rates: expected shape ({n},) like budgets, got {q.shape}")
        if not np.all((q >= 0) & (q <= 1)):
            raise ValueError("rates: every sampling rate must be in [0, 1]")
        self.rates = q
        self.plan = plan
        self.orders = np.asarray(orders, dtype=np.float64)
        if groups is not None:
            groups = np.asarray(groups)
            if groups.shape != (n,):
                raise ValueError(f"groups: expected shape ({n},), got {groups.shape}")
        self.groups = groups
        self.distinct_rates, inverse = np.unique(q, return_inverse=True)
        self.rate_index = inverse.reshape(-1).astype(np.int64)
        self.third_party_rounds = np.zeros(n, dtype=np.int64)
        self.server_rounds = np.zeros(n, dtype=np.int64)
        self.sat_out_rounds = np.zeros(n, dtype=np.int64)
        self.rounds_recorded = 0
        self._tp_row, self._server_row = self._rows()

    # ------------------------------------------------------------------ accounting rows

    def _rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-round RDP rows (n_distinct_rates, n_orders) for each adversary."""
        step = np.asarray(
            poisson_gaussian_rdp(self.distinct_rates, self.plan.noise_multiplier, self.orders),
            dtype=np.float64,
        )
        server = self.plan.steps * step
        if self.plan.rounds is None:
            third_party = server
        else:
            third_party = np.asarray(
                round_rdp(step, self.plan.steps, self.plan.client_rate, self.orders),
                dtype=np.float64,
            )
        return third_party, server

    def _epsilon(self, rate_index: np.ndarray, counts: np.ndarray, row: np.ndarray) -> np.ndarray:
        """ε for units with RDP ``counts · row[rate_index]``, one conversion per distinct pair."""
        counts = np.asarray(counts, dtype=np.int64)
        out = np.zeros(counts.size, dtype=np.float64)
        live = (counts > 0) & (self.distinct_rates[rate_index] > 0)
        if not live.any():
            return out
        width = int(counts.max()) + 1
        keys = rate_index[live] * width + counts[live]
        uniq, inv = np.unique(keys, return_inverse=True)
        ri, cnt = np.divmod(uniq, width)
        eps = np.empty(uniq.size, dtype=np.float64)
        for s in range(0, uniq.size, _CHUNK):
            e = slice(s, s + _CHUNK)
            rdp = cnt[e, None].astype(np.float64) * row[ri[e]]
            eps[e] = np.asarray(rdp_to_epsilon(rdp, self.orders, self.plan.delta)[0]).reshape(-1)
        out[live] = eps[inv.reshape(-1)]
        return out

    @property
    def unit(self) -> str:
        return str(getattr(self.mechanism.unit, "value", self.mechanism.unit))

    @property
    def observers(self) -> tuple[str, ...]:
        """Observers this ledger accounts against (from the mechanism description)."""
        return tuple(self.mechanism.observers)

    def _spent(self, adversary: Adversary, extra: int = 0) -> np.ndarray:
        tp = srv = None
        wanted = ("third-party", "server") if adversary.value == "both" else (adversary.value,)
        if not set(wanted) & set(self.observers):
            raise ValueError(
                f"adversary: this {self.unit}-level ledger accounts against "
                f"{', '.join(self.observers)}, not {adversary.value}"
            )
        if "third-party" in wanted and "third-party" in self.observers:
            tp = self._epsilon(self.rate_index, self.third_party_rounds + extra, self._tp_row)
        if "server" in wanted and "server" in self.observers:
            if self.server_sees_participation:
                srv = self._epsilon(self.rate_index, self.server_rounds + extra, self._server_row)
            else:  # hidden participation: the server sees what a third party sees
                srv = self._epsilon(self.rate_index, self.third_party_rounds + extra, self._tp_row)
        if tp is None:
            return srv
        if srv is None:
            return tp
        return np.maximum(tp, srv)

    # ------------------------------------------------------------------ public API

    @property
    def n(self) -> int:
        return int(self.budgets.size)

    def spent_epsilon(self, adversary: str = "third-party") -> np.ndarray:
        """ε spent so far by each unit (``both`` = the larger of the two adversaries)."""
        return self._spent(as_adversary(adversary))

    def would_exceed(self, mask: np.ndarray | None = None, adversary: str = "both") -> np.ndarray:
        """Pre-check for the next round: True where taking part would overspend the budget.

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
        and its client was sampled (so the server saw its contribution)."""
        act = _mask(active, self.n, "active")
        part = _mask(participated, self.n, "participated")
        if np.any(part & ~act):
            raise ValueError("participated: a unit cannot participate in a round it sat out")
        self.third_party_rounds += act
        self.server_rounds += part
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
            "units": self.n,
            "rounds_recorded": self.rounds_recorded,
            "over_budget": int(np.count_nonzero(worst > self.budgets)),
            "stopped": int(stopped.sum()),
            "utilization_quantiles": {
                str(q): float(v) for q, v in zip(qs, np.quantile(util, qs), strict=True)
            },
            "groups": groups,
        }

    # ------------------------------------------------------------------ persistence

    def state_dict(self) -> dict[str, Any]:
        """The counters (integers) that, with the same budgets, rates and plan, resume exactly."""
        return {
            "third_party_rounds": self.third_party_rounds.copy(),
            "server_rounds": self.server_rounds.copy(),
            "sat_out_rounds": self.sat_out_rounds.copy(),
            "rounds_recorded": int(self.rounds_recorded),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("third_party_rounds", "server_rounds", "sat_out_rounds"):
            arr = np.asarray(state[key], dtype=np.int64)
            if arr.shape != (self.n,) or np.any(arr < 0):
                raise ValueError(f"ledger state: {key} must be {self.n} non-negative integers")
            setattr(self, key, arr.copy())
        self.rounds_recorded = int(state["rounds_recorded"])

    def save(self, path: str | Path) -> None:
        """Write the full state atomically (``.npz``); :meth:`load` resumes exactly."""
        meta = {
            "format": _FORMAT,
            "plan": {k: v for k, v in dataclasses.asdict(self.plan).items()},
            "mechanism": (
                {
                    "kind": "sampled-gaussian",
                    "unit": self.unit,
                    "noise_multiplier": self.mechanism.noise_multiplier,
                    "delta": self.mechanism.delta,
                    "rounds": self.mechanism.rounds,
                    "observers": list(self.mechanism.observers),
                }
                if isinstance(self.mechanism, SampledGaussianPlan)
                else {"kind": "training-plan"}
            ),
            "rounds_recorded": self.rounds_recorded,
            "server_sees_participation": self.server_sees_participation,
        }
        arrays: dict[str, np.ndarray] = {
            "meta": np.array(json.dumps(meta)),
            "budgets": self.budgets,
            "rates": self.rates,
            "orders": self.orders,
            "third_party_rounds": self.third_party_rounds,
            "server_rounds": self.server_rounds,
            "sat_out_rounds": self.sat_out_rounds,
        }
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
                server_sees_participation=bool(meta.get("server_sees_participation", True)),
            )
            ledger.third_party_rounds = z["third_party_rounds"].astype(np.int64)
            ledger.server_rounds = z["server_rounds"].astype(np.int64)
            ledger.sat_out_rounds = z["sat_out_rounds"].astype(np.int64)
        ledger.rounds_recorded = int(meta["rounds_recorded"])
        return ledger


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
