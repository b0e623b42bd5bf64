"""Ideal canaries of an accounted mechanism, and the audit's plan drawn from them.

**Ideal canaries** (:func:`ideal_scores`; :mod:`pdpfl.audit.ceiling` explains them): each of m
canaries is included with probability ½ and runs through the event a group's ledger charges as
the strongest unit it admits, every step seen separately, scored by the exact log-likelihood
ratio of its whole observation.

**The audit's plan** (:func:`plan_rung`; issue #39 item 2): ideal canaries of the claim, drawn
from a fixed seed before the real audit scores anything, choose the number of guesses at which
the f-DP test certifies most; the real audit gives that test half its group's level
(:class:`~pdpfl.audit.evidence.Levels`). The plan is a function of the public configuration
alone (the claimed mechanism, m, δ, the level), never of the canaries' coins or scores, so the
weighted Bonferroni split keeps every test valid.
"""

from __future__ import annotations

import math

import numpy as np

from pdpfl.audit.bound import guess_counts
from pdpfl.audit.evidence import PLANNED_WEIGHT, guess_ladder
from pdpfl.audit.fdp import GRID, MechanismFamily, audit_family
from pdpfl.privacy.mechanisms import (
    Composed,
    GaussianMechanism,
    Mechanism,
    PoissonSampled,
    Sequence,
    TwoStageRound,
)
from pdpfl.seeding import numpy_generator

__all__ = ["PLAN_DRAWS", "PLAN_SEED", "ideal_scores", "plan_rung"]

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
    # smallest k first (its search is the cheapest: the recursion runs over the v right
    # guesses); a larger k then costs one evaluation unless it certifies at least as much
    for k in reversed(guess_ladder(int(m), _PLAN_RUNGS)):
        v = int(np.median([guess_counts(scores, inc, k)[1] for scores, inc in draws]))
        # "at least as much": ask for the member one grid step more private than the best
        tie = None if best is None else best * 2.0 ** (1.0 / GRID)
        found = audit_family(family, int(m), 2 * k, v, level, better_than=tie)
        if found is not None and found.parameter is not None:
            best_k, best = k, found.parameter
    return best_k
