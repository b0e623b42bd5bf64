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

The same ideal canaries plan the real audit's f-DP test (:func:`pdpfl.audit.ideal.plan_rung`);
the ceiling uses the session's levels and plan, as the real audit does.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from pdpfl.audit.evidence import Evidence, Levels, evidence
from pdpfl.audit.fdp import MechanismFamily
from pdpfl.audit.ideal import ideal_scores, plan_rung
from pdpfl.ledger import PrivacyLedger
from pdpfl.seeding import numpy_generator

if TYPE_CHECKING:
    from pdpfl.audit.session import AuditSession

__all__ = [
    "Ceiling",
    "ideal_audit",
    "ideal_scores",
    "plan_rung",
    "session_ceilings",
]


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
    (:meth:`AuditSession.seen_noise_factor`), while the claim ν = 1 is tested, as in the real
    audit."""
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
            seen = session.seen_noise_factor(observer, family)
            factor = seen if noise_factor == "seen" else float(noise_factor)
            levels = session.levels(family, observer, size)
            out[spec.label] = ideal_audit(
                family, size, delta, levels, seed=seed, noise_factor=float(factor)
            )
    return out
