"""Everything one group's canary scores say, for one observer: two statistics, a verdict, the
measured attack rates.

**The guesses** (fixed before the scores are seen: no split, nothing tuned on the data that is
then reported): the auditor guesses the k highest scores "in" and the k lowest "out" for every k
of a ladder fixed by m alone (:func:`guess_ladder`: k = m/2, m/4, … while 2k ≥ 16, at most
:data:`RUNGS` rungs -- a one-run audit of a strong mechanism is most powerful at small k, a
weak one at large k).

**Two statistics per rung**, each a valid test (the f-DP search skips a rung that cannot beat
the group's best so far -- one evaluation -- and reports it as not searched):

* Steinke, Nasr & Jagielski (NeurIPS 2023): ε̂ such that no (ε, δ)-DP mechanism with ε < ε̂
  gives this many correct guesses (:func:`pdpfl.audit.bound.epsilon_lower_bound`), whatever
  the mechanism;
* Mahloujifar, Melis & Chaudhuri (ICML 2025, f-DP in one run): ε̂ = the accountant's ε of the
  least noise the observations rule out in the group's own mechanism family
  (:func:`pdpfl.audit.fdp.audit_family`).

Every (statistic, rung) is tested at its own level (:class:`Levels`: the caller gives each
group a share of the audit's 1 − confidence, and the share is split among the group's tests --
weighted Bonferroni), and the group's **ε̂ is the largest of them** -- the headline, with the
statistic and rung that gave it. With probability at least the audit's confidence every
reported ε̂ is simultaneously valid. **The planned test** (issue #39 item 2: guesses chosen to
maximise power at the stated level): before any score is seen, ideal canaries of the group's
claimed mechanism (:func:`pdpfl.audit.ideal.plan_rung`) say at which number of guesses the
f-DP test certifies most; that one test gets half the group's share, the other tests split the
rest. The split depends on the public configuration alone, so every test keeps its level; a
plan that misjudges the real canaries costs the other tests half their level, not validity.

**Verdict** (:attr:`Evidence.status`): ``violation`` when ε̂ exceeds the accountant's ε (or
the f-DP test rejects the group's own claimed curve, ν = 1: ε̂ is then at least that ε);
``inconclusive (saturated)`` when a rung got every guess right while *no* test of the ladder
could have certified the accountant's ε even with every guess right (the audit had no power to
fail there: its tests hit their ceilings; :attr:`Evidence.canaries_for_power` says how many
canaries would give it power); else ``consistent``.

**The one-shot estimate** (Andrew et al., ICLR 2024, "One-shot empirical privacy estimation
for federated learning"; :func:`one_shot_estimate`): the included canaries' scores and the
excluded ones' are each summarised by a Gaussian, μ̂ = (mean_in − mean_out)/sd_out, and ε̂ is
that of μ̂-GDP at δ -- what the attack would imply if the mechanism were Gaussian. An *estimate*
(no confidence, no worst case), reported beside the bounds, never as one; it is the paper's
statistic for client-level canaries (the canary clients' Dirac updates are its random
directions, exactly orthogonal).

**Measured attack rates** (:func:`measured_tpr`): the TPR the canaries' scores reach at each
false-positive rate of the risk card (the best threshold on the excluded canaries' scores):
what this attack did, beside what the accountant says any attack can do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdpfl.audit.bound import (
    epsilon_lower_bound,
    guess_counts,
    p_value,
    perfect_guessing_epsilon,
)
from pdpfl.audit.fdp import Inverse, MechanismFamily, audit_family, rejects
from pdpfl.privacy.risk import FPRS

__all__ = [
    "CONSISTENT",
    "INCONCLUSIVE",
    "RUNGS",
    "VIOLATION",
    "Evidence",
    "Levels",
    "Rung",
    "canaries_for_power",
    "evidence",
    "guess_ladder",
    "measured_tpr",
    "one_shot_estimate",
]

#: Per-group statuses (and the audit's overall verdict, the worst of them).
CONSISTENT = "consistent"
VIOLATION = "violation"
INCONCLUSIVE = "inconclusive (saturated)"

#: At most this many guess counts per group (the ladder k = m/2, m/4, ...).
RUNGS = 8

#: The smallest number of guesses on the ladder (fewer can certify nothing at useful levels).
MIN_GUESSES = 16

#: The largest canary count :func:`canaries_for_power` considers.
MAX_CANARIES = 1 << 22

#: Relative slack when comparing ε̂ with the accountant's ε (floating-point noise only).
TOLERANCE = 1e-9


#: The planned f-DP test's part of its group's share of the error (:class:`Levels`).
PLANNED_WEIGHT = 0.5

#: The statistics tested at every rung (their order: :class:`Levels`, ``audit.json``).
STATISTICS = ("steinke", "f-dp")


def guess_ladder(m: int, rungs: int = RUNGS) -> list[int]:
    """Guesses per side: k = m/2, m/4, ... while 2k ≥ :data:`MIN_GUESSES` (at least k = m/2
    when m ≥ 2), at most ``rungs`` of them."""
    ks: list[int] = []
    k = int(m) // 2
    while k >= 1 and len(ks) < rungs and (2 * k >= MIN_GUESSES or not ks):
        if k not in ks:
            ks.append(k)
        k //= 2
    return ks


@dataclass(frozen=True)
class Levels:
    """One group's share of the audit's error split among its tests (weighted Bonferroni: the
    levels add up to ``share``). ``ks``: the rungs; ``planned``: the k of the planned f-DP test
    (module docstring), one of ``ks``, or None. Without a plan every (statistic, rung) gets
    share/(2·rungs); with one, the planned test gets ``weight``·share and each of the other
    2·rungs − 1 tests an equal part of the rest."""

    share: float
    ks: tuple[int, ...]
    planned: int | None = None
    weight: float = PLANNED_WEIGHT

    def __post_init__(self) -> None:
        if not (0.0 < self.share and math.isfinite(self.share)):
            raise ValueError(f"share: must be a finite level > 0, got {self.share!r}")
        if self.planned is not None and self.planned not in self.ks:
            raise ValueError(f"planned: must be one of the rungs {list(self.ks)}")
        if not 0.0 < self.weight < 1.0:
            raise ValueError(f"weight: must be in (0, 1), got {self.weight!r}")

    @classmethod
    def split(cls, share: float, m: int, planned: int | None = None) -> Levels:
        """The ladder of m canaries (:func:`guess_ladder`), with the planned rung added when it
        is not on it."""
        ks = guess_ladder(m)
        if planned is not None and planned not in ks:
            ks = sorted({*ks, int(planned)}, reverse=True)
        return cls(float(share), tuple(ks), planned)

    @property
    def tests(self) -> int:
        return len(STATISTICS) * len(self.ks)

    @property
    def other(self) -> float:
        """The level of every test but the planned one."""
        if self.planned is None:
            return self.share / max(1, self.tests)
        return self.share * (1.0 - self.weight) / (self.tests - 1)

    def level(self, statistic: str, k: int) -> float:
        if statistic not in STATISTICS:
            raise ValueError(f"statistic: expected one of {', '.join(STATISTICS)}")
        if self.planned is not None and statistic == "f-dp" and k == self.planned:
            return self.share * self.weight
        return self.other

    def to_dict(self) -> dict[str, Any]:
        return {
            "share": self.share,
            "planned_k": self.planned,
            "planned_level": None if self.planned is None else self.level("f-dp", self.planned),
            "level_other": self.other,
        }


@dataclass(frozen=True)
class Rung:
    """One guess count of the ladder: r = 2k guesses, v right, and each statistic's ε̂."""

    k: int
    r: int
    v: int
    steinke: float
    fdp: float | None
    fdp_noise_factor: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "guesses": self.r,
            "correct": self.v,
            "epsilon_lower_steinke": self.steinke,
            "epsilon_lower_fdp": self.fdp,
            "fdp_noise_factor": self.fdp_noise_factor,
        }


@dataclass(frozen=True)
class Evidence:
    """One group's audit for one observer (module docstring)."""

    m: int
    included: int
    level: float
    rungs: tuple[Rung, ...]
    claimed: float | None
    statistic: str
    best: int
    power: bool
    canaries_for_power: int | None
    tpr: dict[float, float | None] = field(default_factory=dict)
    fdp_family: str | None = None
    one_shot: tuple[float, float] | None = None
    planned: int | None = None
    planned_level: float | None = None

    @property
    def epsilon(self) -> float:
        """The headline ε̂: the largest of every statistic at every rung."""
        r = self.rungs[self.best] if self.rungs else None
        if r is None:
            return 0.0
        return float(r.fdp if self.statistic == "f-dp" and r.fdp is not None else r.steinke)

    @property
    def epsilon_steinke(self) -> float:
        return max((r.steinke for r in self.rungs), default=0.0)

    @property
    def epsilon_fdp(self) -> float | None:
        values = [r.fdp for r in self.rungs if r.fdp is not None]
        return max(values) if values else None

    @property
    def rejects_claim(self) -> bool:
        """The f-DP test rejected the group's own claimed curve (member ν ≤ 1 of its family):
        ε̂ is then at least the accountant's ε, the crossing lying between grid points."""
        if not self.claimed or self.fdp_family is None:
            return False
        return any(
            r.fdp_noise_factor is not None and r.fdp_noise_factor <= 1.0 + 1e-12 for r in self.rungs
        )

    @property
    def violated(self) -> bool:
        if self.claimed is None:
            return False
        return self.epsilon > self.claimed * (1 + TOLERANCE) + TOLERANCE or self.rejects_claim

    @property
    def saturated(self) -> bool:
        """A rung got every guess right, and no test could have failed (module docstring)."""
        return not self.power and _perfect(self.rungs)

    @property
    def status(self) -> str:
        if self.violated:
            return VIOLATION
        if self.saturated:
            return INCONCLUSIVE
        return CONSISTENT

    def to_dict(self) -> dict[str, Any]:
        win = self.rungs[self.best] if self.rungs else None
        return {
            "epsilon_lower": self.epsilon,
            "statistic": self.statistic,
            "epsilon_lower_steinke": self.epsilon_steinke,
            "epsilon_lower_fdp": self.epsilon_fdp,
            "fdp_family": self.fdp_family,
            "m": self.m,
            "included": self.included,
            "k": win.k if win else 0,
            "guesses": win.r if win else 0,
            "correct": win.v if win else 0,
            "accuracy": (win.v / win.r) if win and win.r else None,
            "level": self.level,
            "planned_k": self.planned,
            "planned_level": self.planned_level,
            "candidate_ks": [r.k for r in self.rungs],
            "rungs": [r.to_dict() for r in self.rungs],
            "power": self.power,
            "saturated": self.saturated,
            "canaries_for_power": self.canaries_for_power,
            "measured_tpr": {f"{a:g}": t for a, t in self.tpr.items()},
            "one_shot_mu": None if self.one_shot is None else self.one_shot[0],
            "one_shot_epsilon": None if self.one_shot is None else self.one_shot[1],
            "status": self.status,
            "rejects_claim": self.rejects_claim,
            "violated": self.violated,
        }


def one_shot_estimate(
    scores: np.ndarray, included: np.ndarray, delta: float
) -> tuple[float, float] | None:
    """Andrew et al.'s (2024) one-shot estimate: (μ̂, ε of μ̂-GDP at δ) from Gaussian fits of
    the included and excluded canaries' scores (module docstring); None with fewer than two
    of either, or no spread."""
    from pdpfl.privacy.gdp import gdp_epsilon

    s = np.asarray(scores, dtype=np.float64)
    inc = np.asarray(included, dtype=bool)
    ins, outs = s[inc], s[~inc]
    if ins.size < 2 or outs.size < 2:
        return None
    spread = float(np.std(outs, ddof=1))
    if not (spread > 0 and math.isfinite(spread)):
        return None
    mu = max(0.0, float(np.mean(ins) - np.mean(outs)) / spread)
    return mu, float(gdp_epsilon(mu, delta))


#: A measured rate needs at least this many false positives allowed at its FPR (fewer: the
#: threshold is one or two scores and the estimate mostly noise; reported as None).
MIN_FALSE_POSITIVES = 5


def _perfect(rungs: tuple[Rung, ...] | list[Rung]) -> bool:
    """Some rung of at least :data:`MIN_GUESSES` guesses got every one right (with no signal
    that happens with probability 2^-16 or less per rung)."""
    return any(r.v == r.r and r.r >= MIN_GUESSES for r in rungs)


def measured_tpr(
    scores: np.ndarray, included: np.ndarray, fprs: tuple[float, ...] = FPRS
) -> dict[float, float | None]:
    """The TPR of "score above t" where t lets ⌊α·n_out⌋ excluded canaries through, for each
    FPR α: a point estimate of this attack's rate, not a bound (None when fewer than
    :data:`MIN_FALSE_POSITIVES` false positives are allowed)."""
    s = np.asarray(scores, dtype=np.float64)
    inc = np.asarray(included, dtype=bool)
    outs = np.sort(s[~inc])[::-1]
    ins = s[inc]
    out: dict[float, float | None] = {}
    for a in fprs:
        allowed = int(math.floor(a * outs.size + 1e-9))
        if allowed < MIN_FALSE_POSITIVES or ins.size == 0:
            out[float(a)] = None
            continue
        # the threshold: strictly above the (allowed + 1)-th highest excluded score
        t = outs[allowed] if allowed < outs.size else -np.inf
        out[float(a)] = float(np.mean(ins > t))
    return out


def _certifies(m: int, r: int, delta: float, level: float, claimed: float) -> bool:
    """Would r correct guesses out of r (among m canaries) certify ε̂ > ``claimed`` with
    Steinke et al.'s bound? (Its p-value at the claimed ε is below the level: one evaluation.)"""
    if perfect_guessing_epsilon(r, level) <= claimed:  # δ > 0 only raises the p-value
        return False
    return p_value(m, r, r, claimed * (1 + TOLERANCE) + TOLERANCE, delta) < level


def _power(
    m: int, ks: list[int], delta: float, levels: Levels, claimed: float, claim: Inverse | None
) -> bool:
    """Could any rung certify ε̂ > ``claimed`` with every guess right?"""
    for k in ks:
        r = 2 * k
        if _certifies(m, r, delta, levels.level("steinke", k), claimed):
            return True
        if claim is not None and rejects(claim, m, r, r, levels.level("f-dp", k)):
            return True
    return False


def canaries_for_power(
    claimed: float,
    delta: float,
    level_for: Callable[[int], float],
    claim: Inverse | None = None,
    start: int = 2,
) -> int | None:
    """The smallest m (a power of two times ``start``, up to :data:`MAX_CANARIES`) at which a
    perfect result of the ladder's widest rung (every canary guessed, every guess right) would
    certify more than ``claimed`` -- with Steinke et al.'s bound at δ, or by rejecting the
    claimed curve (``claim``) in the f-DP test. ``level_for(m)`` is the per-test level at m
    (with a planned test: the other tests' level, the smaller -- the count is then an upper
    bound);
    None when no such m exists up to :data:`MAX_CANARIES` (e.g. δ too large: 2mδ caps it)."""
    m = max(2, int(start))
    p = 1.0 / (1.0 + math.exp(-claimed))
    while m <= MAX_CANARIES:
        level = level_for(m)
        # the δ-term alone, 2mδ·P[B < m]/m = 2δ(1 − p^m), grows with m: past the level it
        # forbids every larger m too
        if 2.0 * delta * -math.expm1(m * math.log(p)) >= level:
            return None
        if _certifies(m, m, delta, level, claimed):
            return m
        if claim is not None and m <= (1 << 17) and rejects(claim, m, m, m, level):
            return m
        m *= 2
    return None


def evidence(
    scores: np.ndarray,
    included: np.ndarray,
    delta: float,
    level: float | Levels,
    *,
    claimed: float | None,
    family: MechanismFamily | None = None,
    order: np.ndarray | None = None,
    ks: list[int] | None = None,
    level_for: Callable[[int], float] | None = None,
) -> Evidence:
    """Audit one group's scores (module docstring). ``claimed``: the accountant's ε at δ (None:
    nothing claimed, e.g. an observer the algorithm makes no statement against; 0 for the
    control group); ``family``: the f-DP hypothesis family (None: Steinke et al. only);
    ``level``: every test's level, or the group's :class:`Levels` (which then fix the rungs;
    ``ks`` must be None); ``level_for(m)``: the per-test level an audit with m canaries per
    group would use (for :attr:`Evidence.canaries_for_power`)."""
    inc = np.asarray(included, dtype=bool)
    m = int(inc.size)
    if isinstance(level, Levels):
        if ks is not None:
            raise ValueError("ks: the rungs come from the Levels")
        levels = level
        ks = list(levels.ks)
    else:
        ks = guess_ladder(m) if ks is None else [int(k) for k in ks]
        levels = Levels(float(level) * len(STATISTICS) * len(ks), tuple(ks))
    counts = [guess_counts(scores, inc, k, order) for k in ks]
    steinke = [
        epsilon_lower_bound(m, r, v, delta, levels.level("steinke", k))
        for k, (r, v) in zip(ks, counts, strict=True)
    ]
    fdp: list[float | None] = [None] * len(ks)
    factor: list[float | None] = [None] * len(ks)
    if family is not None:
        # the rung Steinke et al. rank first is searched fully; the others only when they can
        # beat it (one evaluation each: :func:`audit_family`'s ``better_than``)
        best: float | None = None
        for i in sorted(range(len(ks)), key=lambda i: -steinke[i]):
            found = audit_family(
                family, m, *counts[i], levels.level("f-dp", ks[i]), better_than=best
            )
            if found is None:
                continue
            fdp[i], factor[i] = found.epsilon, found.parameter
            if found.parameter is not None:
                best = found.parameter
    rungs = [
        Rung(k, r, v, steinke[i], fdp[i], factor[i])
        for i, (k, (r, v)) in enumerate(zip(ks, counts, strict=True))
    ]
    best, statistic, top = 0, "steinke", -1.0
    for i, rung in enumerate(rungs):
        for name, value in (("steinke", rung.steinke), ("f-dp", rung.fdp)):
            if value is not None and value > top:
                best, statistic, top = i, name, float(value)
    claim = family.inverse(1.0) if family is not None and claimed else None
    power = claimed is not None and _power(m, ks, delta, levels, claimed, claim)
    needed: int | None = None
    if claimed and not power and _perfect(rungs) and level_for is not None:
        needed = canaries_for_power(claimed, delta, level_for, claim, start=2 * m)
    return Evidence(
        m=m,
        included=int(inc.sum()),
        level=levels.other,
        rungs=tuple(rungs),
        claimed=claimed,
        statistic=statistic,
        best=best,
        power=bool(power),
        canaries_for_power=needed,
        tpr=measured_tpr(scores, inc),
        fdp_family=None if family is None else family.describe(),
        one_shot=one_shot_estimate(scores, inc, delta),
        planned=levels.planned,
        planned_level=None if levels.planned is None else levels.level("f-dp", levels.planned),
    )
