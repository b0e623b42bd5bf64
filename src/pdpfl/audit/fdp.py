"""The f-DP one-run audit: Mahloujifar, Melis & Chaudhuri (ICML 2025, "Auditing f-Differential
Privacy in One Run", arXiv 2410.22235), the guessing game with abstentions.

m canaries are each included with probability ½; the auditor makes r guesses (abstaining on the
other m − r) and v of them are right. If every canary's inclusion is f-DP -- no test between
"in" and "out" has a true-positive rate above f̄(α) = 1 − f(α) at false-positive rate α -- the
paper bounds the probability of v or more correct guesses through a recursion on the inverse
blow-up function f̄⁻¹ (the smallest FPR that reaches a given TPR; their Algorithm 3 for an
alphabet of k = 2 values, "in" and "out"). With τ the level:

    r_v = τ·v/m,      h_v = τ·(r − v)/m,
    for i = v − 1, …, 0:
        h_i = max(h_{i+1}, f̄⁻¹(r_{i+1})),
        r_i = r_{i+1} + i/(r − i) · (h_i − h_{i+1}),
    the hypothesis "f-DP" is rejected at level τ when r_0 + h_0 > r/m       (:func:`rejects`)

(once h stops growing it never grows again: the loop ends there). A smaller f̄⁻¹ (a less private
hypothesis) makes rejection harder, so an f̄⁻¹ that is a *lower* bound on the hypothesis' own
(:meth:`pdpfl.privacy.risk.PrivacyCurve.fpr`, tabulated by :class:`FprTable`, which rounds
down) keeps the test valid.

Two families of hypotheses, each ordered from the least to the most private member:

* :func:`gaussian_family` -- μ-GDP, f̄⁻¹(y) = Φ(Φ⁻¹(y) − μ) (the paper's choice);
* :class:`MechanismFamily` -- **the accountant's own mechanism** for the audited group (its
  sampling rate, rounds and accountant), with the noise multiplier σ·ν for a factor ν > 0;
  ν = 1 is what the run claims. Its curve is the PLD's (pessimistic: an upper bound on every
  attack), so a correct implementation is rejected at ν = 1 with probability at most τ.

:func:`audit_family` finds the least private member that the observed count rejects on the
grid ν = 2^(j/:data:`GRID`) (rejection is monotone along a family: it gallops from the claim
ν = 1, then bisects) and reports ε̂ = that member's ε: for the mechanism family, the ε the run's
accountant gives the noise σ·ν̂ at the audit's δ (:func:`ledger_epsilon`). Whatever the true
mechanism, a correct implementation has its own member ν = 1 rejected -- ε̂ at least the
accountant's ε -- with probability at most τ; when the implementation behaves like the
accounted mechanism at *some* noise level, ε̂ is a lower bound on its ε. The recursion is
checked against an independent 30-digit re-implementation and its coverage by simulation
(``tests/test_audit_fdp.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special

from pdpfl.ledger import PrivacyLedger
from pdpfl.privacy.risk import PrivacyCurve

__all__ = [
    "FprTable",
    "MechanismFamily",
    "audit_family",
    "gaussian_family",
    "ledger_epsilon",
    "rejects",
]

#: Inverse blow-up function: the smallest FPR at which a test reaches TPR y (a lower bound).
Inverse = Callable[[float], float]


def _check(m: int, r: int, v: int, level: float) -> None:
    if not (0 <= v <= r <= m):
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if not 0 < level < 1:
        raise ValueError(f"level: must be in (0, 1), got {level}")


def rejects(inverse: Inverse, m: int, r: int, v: int, level: float) -> bool:
    """True when v correct of r guesses among m canaries reject "every canary is f-DP" at
    ``level`` (the recursion of the module docstring; ``inverse`` is f̄⁻¹)."""
    _check(m, r, v, level)
    if v == 0:
        return False
    rr = level * v / m
    h = level * (r - v) / m
    for i in range(v - 1, -1, -1):
        h_new = max(h, float(inverse(rr)))
        if h_new == h:  # a fixed point: nothing changes any more
            break
        rr = min(rr + (i / (r - i)) * (h_new - h), 1.0)
        h = h_new
    return rr + h > r / m


def gaussian_family(mu: float) -> Inverse:
    """f̄⁻¹ of μ-GDP: Φ(Φ⁻¹(y) − μ) (Dong, Roth & Su 2022, Def. 2.6)."""
    m = float(mu)

    def inverse(y: float) -> float:
        if y <= 0.0:
            return 0.0
        if y >= 1.0:
            return 1.0
        return float(special.ndtr(special.ndtri(y) - m))

    return inverse


class FprTable:
    """f̄⁻¹ of a :class:`~pdpfl.privacy.risk.PrivacyCurve` on a fine grid of TPRs, evaluated by
    rounding the query *down* to the grid (f̄⁻¹ is non-decreasing, so the result is a lower
    bound: the test stays valid)."""

    def __init__(self, curve: PrivacyCurve, points: int = 4000) -> None:
        tails = np.geomspace(1e-14, 0.5, points)
        grid = np.unique(np.concatenate([[0.0], tails, 1.0 - tails, [1.0]]))
        self.grid = grid
        self.values = np.maximum.accumulate(curve.pruned().fpr(grid))

    def __call__(self, y: float) -> float:
        i = int(np.searchsorted(self.grid, y, side="right")) - 1
        return float(self.values[max(i, 0)])


#: Members of a mechanism family sit on the grid ν = 2^(j / GRID) (about 2 % apart in σ).
GRID = 32


@dataclass
class MechanismFamily:
    """The audited group's own mechanism at noise σ·ν (module docstring).

    ``mechanism``: the :class:`~pdpfl.privacy.unit.UnitMechanism` the canaries' ledger charges;
    ``rate``, ``count``: the largest rate and number of charged rounds among the group's
    canaries (a member at these is less private than every canary's own, so it is the
    hypothesis for all of them); ``noise``: the group's σ (the smallest among its canaries);
    ``epsilon``: ν ↦ the accountant's ε of the member at the audit's δ. Members are built once
    per grid point ν = 2^(j/:data:`GRID`) and kept.
    """

    mechanism: Any
    observer: str
    rate: float
    count: int
    noise: float
    epsilon: Callable[[float], float]
    _tables: dict[int, FprTable] = field(default_factory=dict, repr=False)
    _eps: dict[int, float] = field(default_factory=dict, repr=False)

    def describe(self) -> str:
        return (
            f"{type(self.mechanism).__name__} at q = {self.rate:.4g}, {self.count} charged "
            f"round(s), noise σ·ν (σ = {self.noise:.4g}; ν = 1 is the run's claim)"
        )

    def member(self, j: int) -> FprTable:
        """f̄⁻¹ of the member ν = 2^(j/GRID) (cached)."""
        table = self._tables.get(j)
        if table is None:
            table = self._build(2.0 ** (j / GRID))
            self._tables[j] = table
        return table

    def epsilon_at(self, j: int) -> float:
        value = self._eps.get(j)
        if value is None:
            value = float(self.epsilon(2.0 ** (j / GRID)))
            self._eps[j] = value
        return value

    def inverse(self, factor: float) -> Inverse:
        """f̄⁻¹ of the member ν = ``factor`` (a grid point is cached)."""
        j = math.log2(float(factor)) * GRID
        if abs(j - round(j)) < 1e-9:
            return self.member(int(round(j)))
        return self._build(float(factor))

    def _build(self, factor: float) -> FprTable:
        from pdpfl.privacy.pld import PldAccountant
        from pdpfl.privacy.risk import privacy_curve

        sigma = self.noise * float(factor)
        event = self.mechanism.with_noise(sigma).round_event(np.array([self.rate]), self.observer)
        curve = privacy_curve(
            self.mechanism,
            self.rate,
            self.observer,
            self.count,
            noise_multiplier=sigma,
            interval=None,
            rdp=not PldAccountant().supports(event),
            max_pairs=2000,
        )
        return FprTable(curve)


@dataclass(frozen=True)
class FamilyBound:
    """The f-DP audit of one group and one guess count: ε̂ and the member ν̂ that gave it
    (None: no member rejected, ε̂ = 0)."""

    epsilon: float
    parameter: float | None


def audit_family(
    family: MechanismFamily,
    m: int,
    r: int,
    v: int,
    level: float,
    *,
    low: float = 1.0 / 8.0,
    high: float = 32.0,
    better_than: float | None = None,
) -> FamilyBound | None:
    """ε̂ of the mechanism family: the ε of the least private grid member ν̂ that (m, r, v)
    rejects (module docstring).

    Rejection is monotone in ν (more noise: more private: easier to reject), so a search over
    the grid between ``low`` and ``high`` -- galloping from the claim ν = 1, then bisecting --
    finds the rejected member next to the last one that is not rejected; ε̂ is its ε, never
    above the exact crossing's. If ``high`` is not rejected, ε̂ = 0; if ``low`` is, ε̂ = ε(low)
    (a lower bound). ``better_than``: a member ν already found by another test; None is
    returned at once (one evaluation) when this count cannot reject the next less private
    member, i.e. cannot give a larger ε̂.
    """
    _check(m, r, v, level)
    bottom, top = round(math.log2(low) * GRID), round(math.log2(high) * GRID)

    def rejected(j: int) -> bool:
        return rejects(family.member(j), m, r, v, level)

    if v == 0 or 2 * v <= r:
        return None if better_than is not None else FamilyBound(0.0, None)
    if better_than is not None or rejected(0):
        # gallop down from a rejected member: the claim ν = 1 (j = 0; its table also serves the
        # power check), or the next member below another test's result
        if better_than is None:
            hi, step = 0, GRID
        else:
            hi, step = round(math.log2(better_than) * GRID) - 1, 1
            if not rejected(hi):
                return None
        lo = max(bottom, hi - step)
        while lo > bottom and rejected(lo):
            hi, step = lo, 2 * step
            lo = max(bottom, hi - step)
        if lo >= hi or rejected(lo):  # down to the low end: ε(low), a lower bound
            return FamilyBound(family.epsilon_at(lo), 2.0 ** (lo / GRID))
    else:  # gallop up from the claim, which is not rejected
        lo, hi, step = 0, min(top, GRID), 2 * GRID
        while hi < top and not rejected(hi):
            lo, hi = hi, min(top, hi + step)
            step *= 2
        if not rejected(hi):
            return FamilyBound(0.0, None)
    while hi - lo > 1:  # invariant: lo not rejected, hi rejected
        mid = (lo + hi) // 2
        if rejected(mid):
            hi = mid
        else:
            lo = mid
    return FamilyBound(family.epsilon_at(hi), 2.0 ** (hi / GRID))


def ledger_epsilon(
    ledger: PrivacyLedger, obs: str, rate: float, count: int, sigma: float
) -> Callable[[float], float]:
    """ν ↦ the ε ``ledger``'s accountant gives one unit at ``rate`` charged ``count`` rounds
    against ``obs`` under noise σ·ν (the same conversion as the canaries' own ε, so ν = 1 gives
    the accountant's ε of the group): :attr:`MechanismFamily.epsilon`."""

    def epsilon(factor: float) -> float:
        one = PrivacyLedger(
            np.ones(1),
            np.array([rate]),
            ledger.mechanism,
            noise_multipliers=np.array([sigma * float(factor)]),
            orders=ledger.orders,
            accountant=ledger.accountant,
        )
        for _ in range(count):
            one.record_round(participated=np.ones(1, bool), active=np.ones(1, bool))
        return float(one.spent_epsilon(obs)[0])

    return epsilon
