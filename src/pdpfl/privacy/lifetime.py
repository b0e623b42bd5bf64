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
  2014, Thm. 3.16);
* **sealed curves** (:class:`CurveCharges`: a private hyper-parameter search stored as one
  entry, each unit's RDP curve of the *whole* search -- Papernot & Steinke 2022, Thm. 2/3 for
  third parties, the random composition of every trial for the server): the curves add to the
  runs' curves order by order on the curves' orders (RDP composition holds at every order), and
  the sum is converted at δ − (1 + e^ε)·p, p the search's probability of stopping at its trial
  cap (the capped search differs from the one the theorem bounds only on that event). A curve
  composed with a group-privacy run falls back to basic composition (each side at δ/2).

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

__all__ = ["CurveCharges", "LifetimeComposer", "RunCharges", "at_delta", "compose_epsilon"]

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

    def take(self, units: np.ndarray) -> RunCharges:
        """The charges of ``units`` only."""
        return RunCharges(
            self.mechanism,
            self.rates[units],
            self.noise_multipliers[units],
            self.counts[units],
            self.accountant,
        )


@dataclass(frozen=True)
class CurveCharges:
    """A sealed entry's charges of ``n`` units against one observer: each unit's RDP curve.

    Attributes
    ----------
    rdp
        (n, len(orders)) the RDP curve each unit was charged (a row of zeros: not charged).
    orders
        The Rényi orders of the curves (all > 1).
    tail
        p: the probability that the entry's mechanism departs from the one its curves bound
        (a search stopped at its trial cap); δ pays (1 + e^ε)·p at conversion.
    counts
        (n,) 1 where the entry charged the unit, else 0 (omitted: the units whose curve is not
        all zeros).
    """

    rdp: np.ndarray
    orders: np.ndarray
    tail: float = 0.0
    counts: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))

    def __post_init__(self) -> None:
        a = check_orders(self.orders)
        r = np.asarray(self.rdp, dtype=np.float64)
        if r.ndim != 2 or r.shape[1] != a.size:
            raise ValueError(f"charges: the curves need shape (units, {a.size}), got {r.shape}")
        if np.unique(a).size != a.size:
            raise ValueError("charges: the curves' orders must be distinct")
        order = np.argsort(a)  # sorted: the common grid is looked up by searchsorted
        a, r = a[order], r[:, order]
        if np.any(np.isnan(r)) or np.any(r < 0):
            raise ValueError("charges: RDP curves must be >= 0 (no NaN)")
        if not (0.0 <= float(self.tail) < 1.0):
            raise ValueError(f"charges: tail must be in [0, 1), got {self.tail!r}")
        given = np.asarray(self.counts).reshape(-1)
        k = (r > 0).any(axis=1) if given.size == 0 and r.shape[0] > 0 else given
        if k.shape != (r.shape[0],):
            raise ValueError("charges: counts need one value per unit")
        object.__setattr__(self, "rdp", r)
        object.__setattr__(self, "orders", a.copy())
        object.__setattr__(self, "tail", float(self.tail))
        object.__setattr__(self, "counts", (np.asarray(k) > 0).astype(np.int64))

    @property
    def n(self) -> int:
        return int(self.rdp.shape[0])

    def take(self, units: np.ndarray) -> CurveCharges:
        """The charges of ``units`` only."""
        return CurveCharges(self.rdp[units], self.orders, self.tail, self.counts[units])


#: A part of a unit's lifetime: a run's mechanism charges or a sealed entry's curves.
Charges = RunCharges | CurveCharges


def convert_with_tail(rdp: np.ndarray, orders: np.ndarray, delta: float, tail: float) -> np.ndarray:
    """(n,) ε of each curve at ``delta`` when the mechanism departs, with probability ``tail``,
    from the one the curves bound: the smallest ε found with ε = conv(δ − (1 + e^ε)·tail)
    checked to hold (∞ where no δ is left). Without a tail, the plain conversion."""
    r = np.atleast_2d(np.asarray(rdp, dtype=np.float64))
    if tail <= 0.0:
        eps, _ = rdp_to_epsilon(r, orders, delta)
        return np.asarray(eps, dtype=np.float64)
    out = np.full(r.shape[0], math.inf)
    guess = np.zeros(r.shape[0])
    for _ in range(100):  # from below: ε grows as the δ left for the curves shrinks
        left = delta - (1.0 + np.exp(np.minimum(guess, 700.0))) * tail
        todo = np.isinf(out) & (left > 0) & np.isfinite(guess)
        if not todo.any():
            break
        step = np.full(r.shape[0], math.inf)
        for d in np.unique(left[todo]):
            sel = todo & (left == d)
            step[sel], _ = rdp_to_epsilon(r[sel], orders, float(d))
        # the uncapped mechanism is (step, δ − (1 + e^guess)·tail)-DP; with step ≤ guess the
        # capped one is (step, δ)-DP
        done = todo & (step <= guess + 1e-12)
        out[done] = step[done]
        guess = np.where(todo & ~done, step + 1e-9, guess)
    return out


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
    def epsilon(self, parts: Seq[Charges]) -> np.ndarray:
        """(n,) lifetime ε of each unit: the composition of every part's charges (0 for a
        unit no part charged)."""
        parts = list(parts)
        if not parts:
            raise ValueError("parts: expected at least one run's charges")
        n = parts[0].n
        if any(p.n != n for p in parts):
            raise ValueError("parts: every run's charges must cover the same units")
        sealed = [p for p in parts if isinstance(p, CurveCharges)]
        if sealed:
            return self._with_curves([p for p in parts if isinstance(p, RunCharges)], sealed, n)
        return self._runs_epsilon([p for p in parts if isinstance(p, RunCharges)], n)

    def _runs_epsilon(self, parts: list[RunCharges], n: int) -> np.ndarray:
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

    def _with_curves(
        self, runs: list[RunCharges], sealed: list[CurveCharges], n: int
    ) -> np.ndarray:
        """Units charged by sealed curves: RDP addition on the curves' common orders."""
        touched = np.zeros(n, dtype=bool)
        for c in sealed:
            touched |= c.counts > 0
        out = self._runs_epsilon(runs, n) if runs else np.zeros(n)
        sel = np.flatnonzero(touched)
        if not sel.size:
            return out
        grid = sealed[0].orders
        for c in sealed[1:]:
            grid = np.intersect1d(grid, c.orders)
        if grid.size == 0:
            raise ValueError("charges: the sealed curves share no Rényi order")
        total = np.zeros((sel.size, grid.size))
        for c in sealed:
            cols = np.searchsorted(c.orders, grid)
            total += c.rdp[sel][:, cols] * (c.counts[sel, None] > 0)
        tail = float(sum(c.tail for c in sealed))
        group = np.zeros(sel.size, dtype=bool)
        if runs:
            ids = np.stack([self._ids(p, sel) for p in runs])  # (P, m)
            counts = np.stack(
                [np.where(i >= 0, p.counts[sel], 0) for p, i in zip(runs, ids, strict=True)]
            )
            live = (counts > 0).any(axis=0)
            if live.any():
                classes, inverse = np.unique(
                    np.concatenate([ids[:, live], counts[:, live]]).T, axis=0, return_inverse=True
                )
                add = np.zeros((classes.shape[0], grid.size))
                is_group = np.zeros(classes.shape[0], dtype=bool)
                p_n = len(runs)
                for j, row in enumerate(classes):
                    pairs = [
                        (int(row[p]), int(row[p_n + p])) for p in range(p_n) if row[p_n + p] > 0
                    ]
                    if any(_group_of(self._event(cid)) is not None for cid, _ in pairs):
                        is_group[j] = True
                        continue
                    acc = RdpAccountant(grid)
                    add[j] = sum(k * acc.rdp(self._event(cid))[0] for cid, k in pairs)
                rows = np.flatnonzero(live)
                total[rows] += add[inverse.reshape(-1)]
                group[rows] = is_group[inverse.reshape(-1)]
        eps = convert_with_tail(total, grid, self.delta, tail)
        if group.any():  # a group run and a sealed curve: basic composition, δ/2 each
            half = LifetimeComposer(self.observer, self.delta / 2)
            g = sel[group]
            own = half._runs_epsilon([p.take(g) for p in runs], g.size)
            curves = np.zeros((g.size, grid.size))
            for c in sealed:
                cols = np.searchsorted(c.orders, grid)
                curves += c.rdp[g][:, cols] * (c.counts[g, None] > 0)
            eps[group] = own + convert_with_tail(curves, grid, self.delta / 2, tail)
        out[sel] = eps
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
    parts: Seq[Charges], observer: str, delta: float, *, orders: ArrayLike | None = None
) -> np.ndarray:
    """(n,) lifetime ε of each unit at ``delta`` against ``observer`` (module docstring): the
    composition of every run's charges. ``orders``: an explicit RDP grid (default: the union of
    :data:`DEFAULT_ORDERS` and each event family's grid)."""
    return LifetimeComposer(observer, delta, orders=orders).epsilon(parts)
