"""What a one-run audit can certify at most: ideal canaries through the accounted mechanism.

A one-run audit's ε̂ is limited twice: by how much its canaries' scores reveal, and by how much
any count of correct guesses among m canaries can certify (the statistics' own ceiling). This
module measures the second limit, so that a measured ε̂/ε can be read against what the audit
could have reached at all (issue #39: "explain precisely why").

**Ideal canaries.** Each of m canaries is included with probability ½ and then runs through
the audited group's mechanism -- the event its ledger charges (the f-DP family's member
ν = ``noise_factor``: the rate, the charged rounds and the noise σ·ν) -- as the strongest unit
that mechanism admits: every Gaussian release reveals the canary's whole contribution (a
Gaussian of mean 1/σ in units of its noise, nothing else on its coordinate), every sampling
coin is the canary's own, and every step is seen separately (the accountant's worst case,
stronger than what any observer of pdpfl sees: a silo releases the sum of its round's steps).
The canary's score is the exact log-likelihood ratio of its whole observation (Neyman-Pearson:
no score of these observations ranks canaries better), built over the event's structure:

    Gaussian(σ):          z ~ N(in/σ, 1),            ℓ = z/σ − 1/(2σ²)
    Poisson(q) of inner:  coin c ~ Bernoulli(q),      ℓ = log(1 − q + q·e^{ℓ_inner(in ∧ c)})
    two-stage round (λ):  as Poisson sampling at rate λ (rPDP-FL Lemma 6)
    k compositions:       ℓ = Σ of k independent draws of the inner ℓ

These scores then go through the *same* statistics as a real audit (:func:`pdpfl.audit.evidence
.evidence`: the guess ladder, Steinke et al. and the f-DP test against the group's family, the
same per-test level). The result is one Monte-Carlo draw of the ε̂ a perfect auditor with m
canaries would report; its median over a few seeds is the ceiling quoted in ``docs/audit.md``.

This is a measurement tool, not a test of an implementation: it never sees a run.

**The audit's plan** (:func:`plan_rung`): the same ideal canaries, drawn once from a fixed seed
before the real audit scores anything, choose the number of guesses at which the f-DP test
certifies most; the real audit gives that test half its group's level
(:class:`~pdpfl.audit.evidence.Levels`). The plan is a function of the public configuration
alone (the claimed mechanism, m, δ, the level), never of the canaries' coins or scores, so the
weighted Bonferroni split keeps every test valid.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from pdpfl.audit.bound import guess_counts
from pdpfl.audit.evidence import PLANNED_WEIGHT, Evidence, Levels, evidence, guess_ladder
from pdpfl.audit.fdp import MechanismFamily, audit_family
from pdpfl.ledger import PrivacyLedger
from pdpfl.privacy.mechanisms import (
    Composed,
    GaussianMechanism,
    Mechanism,
    PoissonSampled,
    Sequence,
    TwoStageRound,
)
from pdpfl.seeding import numpy_generator

if TYPE_CHECKING:
    from pdpfl.audit.session import AuditSession

__all__ = [
    "Ceiling",
    "ideal_audit",
    "ideal_scores",
    "plan_rung",
    "seen_noise_factor",
    "session_ceilings",
]

#: Canaries simulated at once (bounds the memory of one draw: chunk × one event's leaves).
_CHUNK = 1 << 14

#: The plan's fixed seed: the plan depends on the configuration alone (module docstring).
PLAN_SEED = 0

#: Draws of ideal canaries the plan takes the median of (:func:`plan_rung`).
PLAN_DRAWS = 3

#: Candidate rungs of the plan: k = m/2, m/4, ... while 2k ≥ 16 (no cap on their number).
_PLAN_RUNGS = 64


def _llr(event: Mechanism, included: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The log-likelihood ratio ("in" against "out") of each canary's observation of ``event``,
    the observation drawn with the canary in where ``included`` (module docstring)."""
    if isinstance(event, GaussianMechanism):
        a = 1.0 / float(event.noise_multiplier)
        z = rng.standard_normal(included.size) + a * included
        return a * z - 0.5 * a * a
    if isinstance(event, PoissonSampled | TwoStageRound):
        if isinstance(event, PoissonSampled):
            rate = np.asarray(event.rate, dtype=np.float64)
            if rate.size != 1:
                raise ValueError("ideal canaries: expected an event with one sampling rate")
            q, inner = float(rate.reshape(-1)[0]), event.inner
        else:
            q, inner = float(event.client_rate), event.local
        if q <= 0.0:  # never sampled: the observation does not depend on the canary
            return np.zeros(included.size)
        coins = rng.random(included.size) < q
        inner_llr = _llr(inner, included & coins, rng)
        # log(1 − q + q·e^ℓ), computed without overflow for large ℓ
        return np.logaddexp(math.log1p(-q) if q < 1.0 else -np.inf, math.log(q) + inner_llr)
    if isinstance(event, Composed):
        total = np.zeros(included.size)
        for _ in range(int(event.count)):
            total += _llr(event.inner, included, rng)
        return total
    if isinstance(event, Sequence):
        total = np.zeros(included.size)
        for part in event.events:
            total += _llr(part, included, rng)
        return total
    raise ValueError(
        f"ideal canaries: cannot simulate {type(event).__name__} (supported: Gaussian, Poisson "
        "sampling, two-stage rounds, compositions and sequences of those)"
    )


def ideal_scores(
    family: MechanismFamily, m: int, rng: np.random.Generator, noise_factor: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, included) of m ideal canaries of ``family``'s member ν = ``noise_factor``: each
    canary's exact log-likelihood ratio (module docstring)."""
    if not (isinstance(m, int | np.integer) and m >= 2):
        raise ValueError(f"m: must be an integer >= 2, got {m!r}")
    if not (math.isfinite(noise_factor) and noise_factor > 0):
        raise ValueError(f"noise_factor: must be a finite number > 0, got {noise_factor!r}")
    mechanism = family.mechanism.with_noise(family.noise * float(noise_factor))
    event = mechanism.round_event(np.array([family.rate]), family.observer)
    included = rng.random(int(m)) < 0.5
    scores = np.empty(int(m))
    for start in range(0, int(m), _CHUNK):
        part = slice(start, min(start + _CHUNK, int(m)))
        llr = np.zeros(part.stop - part.start)
        for _ in range(family.count):  # the charged rounds
            llr += _llr(event, included[part], rng)
        scores[part] = llr
    return scores, included


def plan_rung(
    family: MechanismFamily, m: int, delta: float, share: float, *, noise_factor: float = 1.0
) -> int | None:
    """The planned f-DP test's guesses per side for m canaries of ``family`` (module
    docstring): :data:`PLAN_DRAWS` draws of m ideal canaries at ``noise_factor`` (seed
    :data:`PLAN_SEED`); for every k = m/2, m/4, ... (2k ≥ 16) the median over the draws of the
    correct guesses, tested at the planned level (``share`` ×
    :data:`~pdpfl.audit.evidence.PLANNED_WEIGHT`); the k whose median certifies most (the larger
    k on a tie: one draw's luck at a small k is not a plan). None when the family's event cannot
    be simulated or no k certifies anything."""
    rng = numpy_generator(PLAN_SEED, "audit-plan")
    try:
        draws = [ideal_scores(family, int(m), rng, noise_factor) for _ in range(PLAN_DRAWS)]
    except ValueError:
        return None
    level = float(share) * PLANNED_WEIGHT
    best_k: int | None = None
    best: float | None = None
    for k in guess_ladder(int(m), _PLAN_RUNGS):
        v = int(np.median([guess_counts(scores, inc, k)[1] for scores, inc in draws]))
        found = audit_family(family, int(m), 2 * k, v, level, better_than=best)
        if found is not None and found.parameter is not None:
            best_k, best = k, found.parameter
    return best_k


def seen_noise_factor(session: AuditSession, observer: str, family: MechanismFamily) -> float:
    """ν of the noise the real canaries meet, where the hook states it
    (:meth:`~pdpfl.audit.hooks.CanaryHook.round_signal`: ν = 1/(μ·σ), e.g. IDP-FedAvg's value
    noise σ_v against the charged σ_p under adaptive clipping); 1 where it states nothing."""
    signal = session.hook.round_signal(session.run, observer)
    return 1.0 if signal is None else 1.0 / (signal * family.noise)


@dataclass(frozen=True)
class Ceiling:
    """One draw of an ideal audit: the accountant's ε (ν = 1), the ε̂ ideal canaries of the
    member ν = ``noise_factor`` got, and their :class:`~pdpfl.audit.evidence.Evidence`."""

    claimed: float
    epsilon: float
    noise_factor: float
    evidence: Evidence

    @property
    def ratio(self) -> float:
        return self.epsilon / self.claimed if self.claimed > 0 else 0.0


def ideal_audit(
    family: MechanismFamily,
    m: int,
    delta: float,
    level: float | Levels,
    *,
    seed: int = 0,
    noise_factor: float = 1.0,
) -> Ceiling:
    """Audit m ideal canaries of ``family`` (the member ν = ``noise_factor`` generates them;
    the claim tested is ν = 1, as in a real audit) with the real audit's statistics at the
    per-test ``level`` (or the group's :class:`~pdpfl.audit.evidence.Levels`) and ``delta``:
    one draw of the ceiling (module docstring). ``seed``
    seeds a local generator (a measurement: nothing here is released)."""
    rng = numpy_generator(seed, "audit-ideal-canaries")
    scores, included = ideal_scores(family, m, rng, noise_factor)
    claimed = float(family.epsilon(1.0))
    found = evidence(scores, included, delta, level, claimed=claimed, family=family)
    return Ceiling(claimed, float(found.epsilon), float(noise_factor), found)


def session_ceilings(
    session: AuditSession,
    observer: str,
    *,
    seed: int = 0,
    noise_factor: float | Literal["seen"] = 1.0,
    m: int | None = None,
    labels: Collection[str] | None = None,
) -> dict[str, Ceiling]:
    """One ideal-audit draw per budget group of a planned audit (nothing is trained): each
    group's family as :meth:`AuditSession.execute` builds it, every round charged (every host
    taking part: the most exposed canary, as the family's count), the audit's δ, its levels
    and plan (:func:`plan_rung`, unless the session's settings turn planning off), ``m``
    canaries (default the session's), the groups named in ``labels`` (default all). Groups
    without an f-DP family are left out.

    ``noise_factor="seen"``: the canaries are generated at the noise the real ones meet
    (:func:`seen_noise_factor`), while the claim ν = 1 is tested, as in the real audit."""
    plan, run = session.plan, session.run
    if observer not in session.meta["observers_audited"]:
        raise ValueError(
            f"observer: expected one of {', '.join(session.meta['observers_audited'])}, "
            f"got {observer!r}"
        )
    size = int(session.meta["canaries_per_group"] if m is None else m)
    delta = float(session.meta["audit_delta"])
    rounds = int(session.meta["rounds"])
    trained = np.array([not s.control for s in plan.groups])[plan.group]
    ledgers: dict[int, tuple[np.ndarray, PrivacyLedger]] = {}
    for host in sorted(set(plan.host[trained].tolist())):
        mine = np.flatnonzero((plan.host == host) & trained)
        budgets = np.array([plan.groups[g].budget for g in plan.group[mine]])
        ledger = session.hook.ledger(run, host, budgets, plan.rates[mine], delta)
        for _ in range(rounds):
            ledger.record_round(
                participated=np.ones(mine.size, dtype=bool), active=np.ones(mine.size, dtype=bool)
            )
        ledgers[host] = (mine, ledger)
    out: dict[str, Ceiling] = {}
    for g, spec in enumerate(plan.groups):
        if spec.control or (labels is not None and spec.label not in labels):
            continue
        family = session._family(g, observer, ledgers)  # noqa: SLF001
        if family is not None:
            seen = seen_noise_factor(session, observer, family)
            factor = seen if noise_factor == "seen" else float(noise_factor)
            levels = session.levels(family, observer, size)
            out[spec.label] = ideal_audit(
                family, size, delta, levels, seed=seed, noise_factor=float(factor)
            )
    return out
