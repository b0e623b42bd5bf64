"""Lifetime composition: the ε of a unit that several runs (mechanisms) charged in sequence.

A person's budget is for their data, not for one training run: when runs r = 1..m each charged
unit u ``k_r`` rounds of their own round event E_r (at the unit's rate q_r and noise σ_r), the
unit's lifetime guarantee is that of the adaptive composition E_1^{k_1} ∘ … ∘ E_m^{k_m}. This
module computes it -- never as a sum of rounded per-run ε's where composition is tighter:

* **RDP** (every event with an RDP curve): the curves add order by order (Mironov 2017,
  Prop. 1) on one common grid of orders A -- pdpfl's :data:`~pdpfl.privacy.orders.DEFAULT_ORDERS`
  united with each event family's own grid (without-replacement events: the integer grid of
  Theorem 9, whose fractional orders are bounded by ρ(⌈α⌉)) -- and the sum is converted once
  (Balle et al. 2020, Prop. 12, :func:`~pdpfl.privacy.conversion.rdp_to_epsilon`);
* **group privacy** (ULDP-FL's GROUP-k, ``GroupPrivacy`` events): when every run converts for
  the same group size and route, the *inner* record-level curves add and the group conversion
  (Lemma 9 and/or Lemma 8, :mod:`pdpfl.privacy.group`) is applied once to the sum;
* **PLD** (every run accounted with ``pld`` on events the PLD accountant supports): the runs'
  privacy-loss distributions are built at one discretization interval and composed with
  dp-accounting's FFT composition (pessimistic; the FFT error bound of
  :mod:`pdpfl.privacy.pld` is subtracted from δ); the result is ``min(ε_PLD, ε_RDP)``;
* **anything else** (e.g. a group run composed with a user-level Gaussian run): basic
  composition, each run's own ε at δ/m (m runs), summed -- an upper bound at δ (Dwork & Roth
  2014, Thm. 3.16).

Every value is an upper bound on the unit's ε at ``delta`` against ``observer``. The
composition is independent of the order of the runs (all rules above are symmetric).

:class:`LifetimeComposer` caches the per-(mechanism, σ, q) curves and the per-class results,
so a ledger that asks every round (its own count grows by one) pays one vectorized conversion
per distinct history class of its units.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.accountant import RdpAccountant, mechanism_epsilon
from pdpfl.privacy.conversion import rdp_to_epsilon
from pdpfl.privacy.group import group_epsilon_dp, group_epsilon_from_rdp, group_orders
from pdpfl.privacy.mechanisms import Composed, GroupPrivacy, Mechanism
from pdpfl.privacy.orders import DEFAULT_ORDERS, check_orders
from pdpfl.privacy.unit import UnitMechanism

__all__ = ["LifetimeComposer", "RunCharges", "at_delta", "compose_epsilon"]

#: Classes above this many are composed by RDP only (the PLD composition is per class).
MAX_PLD_CLASSES = 64


@dataclass(frozen=True)
class RunCharges:
    """One run's charges of ``n`` units against one observer.

    Attributes
    ----------
    mechanism
        The run's :class:`~pdpfl.privacy.unit.UnitMechanism` (its σ is replaced per unit).
    rates, noise_multipliers
        (n,) each unit's sampling rate q and noise multiplier σ in that run.
    counts
        (n,) rounds charged to each unit against the observer (0: the run did not touch it).
    accountant
        The run's accountant (``rdp`` or ``pld``): decides whether a PLD composition applies.
    """

    mechanism: UnitMechanism
    rates: np.ndarray
    noise_multipliers: np.ndarray
    counts: np.ndarray
    accountant: str = "rdp"

    def __post_init__(self) -> None:
        q = np.asarray(self.rates, dtype=np.float64).reshape(-1)
        n = q.size
        sig = np.asarray(self.noise_multipliers, dtype=np.float64).reshape(-1)
        k = np.asarray(self.counts).reshape(-1)
        if sig.shape != (n,) or k.shape != (n,):
            raise ValueError("charges: rates, noise_multipliers and counts need one value per unit")
        if np.any((q < 0) | (q > 1)) or np.any(~np.isfinite(sig) | (sig <= 0)):
            raise ValueError("charges: rates must be in [0, 1] and noise multipliers > 0")
        if np.any(k < 0) or np.any(k != np.floor(k)):
            raise ValueError("charges: counts must be non-negative integers")
        object.__setattr__(self, "rates", q)
        object.__setattr__(self, "noise_multipliers", sig)
        object.__setattr__(self, "counts", k.astype(np.int64))

    @property
    def n(self) -> int:
        return int(self.rates.size)


#: A mechanism description (a frozen dataclass of this package).
M = TypeVar("M")


def at_delta(mechanism: M, delta: float) -> M | None:
    """``mechanism`` stated at another δ (None if its description has no ``delta`` field)."""
    if isinstance(mechanism, type) or not dataclasses.is_dataclass(mechanism):
        return None
    if "delta" not in {f.name for f in dataclasses.fields(mechanism)}:
        return None
    described: Any = mechanism  # a dataclass instance (checked above; mypy cannot narrow M)
    shifted: M = dataclasses.replace(described, delta=float(delta))
    return shifted


def _group_of(event: Mechanism) -> tuple[int, str] | None:
    base = event
    while isinstance(base, Composed):
        base = base.inner
    if isinstance(base, GroupPrivacy):
        return base.group_size, base.conversion
    return None


class LifetimeComposer:
    """Lifetime ε of units charged by several runs, against one observer at one δ.

    ``orders`` fixes the RDP grid (default: :data:`DEFAULT_ORDERS` united with every event
    family's own grid). Reuse one composer for one observer and δ: it caches curves and results.
    """

    def __init__(self, observer: str, delta: float, *, orders: ArrayLike | None = None) -> None:
        if not (0.0 < float(delta) < 1.0):
            raise ValueError(f"delta: must be in (0, 1), got {delta!r}")
        self.observer = str(observer)
        self.delta = float(delta)
        self._orders = None if orders is None else check_orders(orders).copy()
        #: (mechanism at σ, q) → curve id; curve id → RDP curve on the grid in use.
        self._curve_ids: dict[tuple[Any, float], int] = {}
        self._events: list[tuple[UnitMechanism, float, str]] = []  # id → (mech at σ, q, acc)
        self._curves: dict[int, np.ndarray] = {}
        self._grid: np.ndarray | None = None
        self._results: dict[bytes, float] = {}

    # ------------------------------------------------------------------ identities
    def _curve_id(self, mechanism: UnitMechanism, sigma: float, q: float, acc: str) -> int:
        mech = mechanism.with_noise(float(sigma))
        key: tuple[Any, float] = (mech, float(q))
        try:
            found = self._curve_ids.get(key)
        except TypeError:  # an unhashable description: never shared
            found = None
            key = (id(mech), float(q))
        if found is None:
            found = len(self._events)
            self._curve_ids[key] = found
            self._events.append((mech, float(q), acc))
        return found

    def _ids(self, part: RunCharges, units: np.ndarray) -> np.ndarray:
        """Curve id of each of ``units`` in ``part`` (−1 where the part did not charge it)."""
        out = np.full(units.size, -1, dtype=np.int64)
        live = part.counts[units] > 0
        if not live.any():
            return out
        pairs = np.stack([part.rates[units][live], part.noise_multipliers[units][live]], axis=1)
        distinct, inverse = np.unique(pairs, axis=0, return_inverse=True)
        ids = np.array(
            [
                self._curve_id(part.mechanism, float(s), float(q), part.accountant)
                for q, s in distinct
            ],
            dtype=np.int64,
        )
        out[live] = ids[inverse.reshape(-1)]
        return out

    # ------------------------------------------------------------------ the grid and curves
    def _event(self, cid: int) -> Mechanism:
        mech, q, _ = self._events[cid]
        return mech.round_event(q, self.observer)  # a scalar rate: one row, PLD-ready

    def _grid_for(self, events: list[Mechanism]) -> np.ndarray:
        if self._orders is not None:
            return self._orders
        acc = RdpAccountant()
        grid = np.asarray(DEFAULT_ORDERS)
        for e in events:
            group = _group_of(e)
            extra = group_orders(group[0]) if group else acc.orders_for(e)
            grid = np.union1d(grid, extra)
        return grid

    def _curve(self, cid: int, grid: np.ndarray) -> np.ndarray:
        if self._grid is None or not np.array_equal(self._grid, grid):
            self._grid, self._curves = grid, {}
        hit = self._curves.get(cid)
        if hit is None:
            event = self._event(cid)
            base = event
            while isinstance(base, Composed):
                base = base.inner
            inner = base.inner if isinstance(base, GroupPrivacy) else event
            hit = RdpAccountant(grid).rdp(inner)[0]
            self._curves[cid] = hit
        return hit

    # ------------------------------------------------------------------ ε
    def epsilon(self, parts: Seq[RunCharges]) -> np.ndarray:
        """(n,) lifetime ε of each unit: the composition of every part's charges (0 for a
        unit no part charged)."""
        parts = list(parts)
        if not parts:
            raise ValueError("parts: expected at least one run's charges")
        n = parts[0].n
        if any(p.n != n for p in parts):
            raise ValueError("parts: every run's charges must cover the same units")
        units = np.arange(n)
        ids = np.stack([self._ids(p, units) for p in parts])  # (P, n)
        counts = np.stack([np.where(i >= 0, p.counts, 0) for p, i in zip(parts, ids, strict=True)])
        out = np.zeros(n)
        live = (counts > 0).any(axis=0)
        if not live.any():
            return out
        classes, inverse = np.unique(
            np.concatenate([ids[:, live], counts[:, live]]).T, axis=0, return_inverse=True
        )
        eps = np.array([self._class_epsilon(row, len(parts)) for row in classes])
        out[live] = eps[inverse.reshape(-1)]
        return out

    def _class_epsilon(self, row: np.ndarray, n_parts: int) -> float:
        key = np.ascontiguousarray(row, dtype=np.int64).tobytes()
        hit = self._results.get(key)
        if hit is None:
            pairs = [
                (int(row[p]), int(row[n_parts + p])) for p in range(n_parts) if row[n_parts + p] > 0
            ]
            hit = self._compose(pairs)
            self._results[key] = hit
        return hit

    def _compose(self, pairs: list[tuple[int, int]]) -> float:
        """ε of the composition of ``count`` rounds of each curve id's event."""
        events = [self._event(cid) for cid, _ in pairs]
        groups = {_group_of(e) for e in events}
        if len(groups) > 1:  # group and non-group runs, or groups of different sizes
            return self._basic(pairs)
        grid = self._grid_for(events)
        total = sum(k * self._curve(cid, grid) for cid, k in pairs)
        group = next(iter(groups))
        if group is None:
            eps = float(rdp_to_epsilon(np.asarray(total)[None, :], grid, self.delta)[0][0])
        else:
            eps = _group_epsilon(np.asarray(total)[None, :], grid, self.delta, *group)
        if all(self._events[cid][2] == "pld" for cid, _ in pairs):
            eps = min(eps, _pld_epsilon(events, [k for _, k in pairs], self.delta))
        return eps

    def _basic(self, pairs: list[tuple[int, int]]) -> float:
        m = len(pairs)
        total = 0.0
        for cid, k in pairs:
            mech, q, acc = self._events[cid]
            shifted = at_delta(mech, self.delta / m)
            if shifted is None:
                return math.inf
            e, _ = mechanism_epsilon(
                shifted, np.array([q]), self.observer, np.array([k]), accountant=acc
            )
            total += float(e[0])
        return total


def _group_epsilon(
    total: np.ndarray, grid: np.ndarray, delta: float, size: int, route: str
) -> float:
    """The group conversion of a summed inner curve (as the RDP accountant's group events)."""
    eps = math.inf
    if route in ("rdp", "best"):
        eps = float(group_epsilon_from_rdp(total, grid, delta, size)[0][0])
    if route in ("dp", "best"):
        eps = min(eps, float(group_epsilon_dp(total, grid, delta, size)[0][0]))
    return eps


def _pld_epsilon(events: list[Mechanism], counts: list[int], delta: float) -> float:
    """PLD composition of ``counts[i]`` rounds of scalar-rate ``events[i]`` (∞ if unsupported).

    One discretization interval for every part (from the central-limit estimate of the
    composition, as :meth:`~pdpfl.privacy.pld.PldAccountant.interval_for`); the FFT error of
    every composition is subtracted from δ (:mod:`pdpfl.privacy.pld`)."""
    from pdpfl.privacy import pld as pldmod

    acc = pldmod.PldAccountant()
    if not all(acc.supports(e) for e in events):
        return math.inf
    compiled = []
    for e in events:
        node, rates = acc._compile(e)  # noqa: SLF001 (the accountant's one traversal)
        compiled.append((node, 1.0 if rates is None else float(np.asarray(rates).reshape(-1)[0])))
    mu = math.sqrt(
        sum(k * pldmod._mu2(node, q) for (node, q), k in zip(compiled, counts, strict=True))
    )
    est = pldmod._gdp_epsilon(mu, delta)
    interval = float(min(max(est / acc.interval_ratio, acc.min_interval), acc.max_interval))
    total, eta = None, 0.0
    for (node, q), k in zip(compiled, counts, strict=True):
        pld, err = pldmod._build(pldmod._flatten(pldmod._Rep(node, k)), q, interval)
        if total is None:
            total, eta = pld, err
            continue
        total = total.compose(pld, tail_mass_truncation=pldmod._TAIL)
        size = max(total._pmf_remove.size, total._pmf_add.size)  # noqa: SLF001
        eta += err + 2.0 * pldmod._FFT_ERROR_CONSTANT * pldmod._U * size * 2.0
    d_eff = delta - eta
    if total is None or d_eff <= 0:
        return math.inf
    return float(total.get_epsilon_for_delta(d_eff))


def compose_epsilon(
    parts: Seq[RunCharges], observer: str, delta: float, *, orders: ArrayLike | None = None
) -> np.ndarray:
    """(n,) lifetime ε of each unit at ``delta`` against ``observer`` (module docstring): the
    composition of every run's charges. ``orders``: an explicit RDP grid (default: the union of
    :data:`DEFAULT_ORDERS` and each event family's grid)."""
    return LifetimeComposer(observer, delta, orders=orders).epsilon(parts)
