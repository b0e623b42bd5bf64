"""Mechanisms described as data (like dp-accounting's ``DpEvent`` algebra), per-record rates.

A training run is a small tree of frozen dataclasses that states every privacy parameter
explicitly (σ, q, τ, λ, T); an accountant (:mod:`pdpfl.privacy.accountant`) interprets it.

* :class:`GaussianMechanism` — sensitivity-1 Gaussian noise, noise multiplier σ.
* :class:`PoissonSampled` — each record enters independently with its own probability q
  (a scalar, or one rate per record: rPDP-FL Lemma 4).
* :class:`Composed` — ``count`` adaptive repetitions.
* :class:`TwoStageRound` — one rPDP-FL round: the client takes part with probability λ and then
  runs ``local`` (rPDP-FL Lemma 6).
* :class:`Sequence` — adaptive composition of different mechanisms.

:func:`plan_event` builds the event of a :class:`~pdpfl.privacy.plan.TrainingPlan` for an
adversary (rPDP-FL Theorem 1 and the Type I server view).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Union

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.adversary import Adversary, as_adversary
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.rdp import check_noise_multiplier, check_rates

__all__ = [
    "Mechanism",
    "GaussianMechanism",
    "PoissonSampled",
    "Composed",
    "TwoStageRound",
    "Sequence",
    "plan_event",
    "outline",
]


def _check_inner(value: object, name: str) -> None:
    if not isinstance(value, _MECHANISM_TYPES):
        raise ValueError(f"{name}: expected a mechanism, got {type(value).__name__}")


@dataclass(frozen=True)
class GaussianMechanism:
    """Gaussian mechanism with sensitivity 1 and noise multiplier σ > 0 (std σ·C)."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        if isinstance(self.noise_multiplier, bool):
            raise ValueError("noise_multiplier: expected a number > 0, got a bool")
        sigma = check_noise_multiplier(self.noise_multiplier, "noise_multiplier")
        object.__setattr__(self, "noise_multiplier", sigma)


@dataclass(frozen=True, eq=False)
class PoissonSampled:
    """Poisson sampling: each record is included independently with probability ``rate``.

    ``rate`` is a float in [0, 1] or a 1-d array of per-record rates (stored read-only); the
    accountant then returns one row per rate.
    """

    rate: float | np.ndarray
    inner: Mechanism

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool):
            raise ValueError("rate: expected a number in [0, 1], got a bool")
        scalar = np.ndim(self.rate) == 0
        try:
            q = check_rates(self.rate, "rate")
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ValueError) and str(exc).startswith("rate:"):
                raise
            raise ValueError(f"rate: expected numbers in [0, 1], got {self.rate!r}") from None
        if not scalar and np.ndim(self.rate) != 1:
            raise ValueError(f"rate: expected a scalar or a 1-d array, got {np.shape(self.rate)}")
        _check_inner(self.inner, "inner")
        if scalar:
            object.__setattr__(self, "rate", float(q[0]))
        else:
            q = q.copy()
            q.setflags(write=False)
            object.__setattr__(self, "rate", q)

    @property
    def rates(self) -> np.ndarray:
        """The rate(s) as a 1-d array."""
        return np.atleast_1d(np.asarray(self.rate, dtype=np.float64))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PoissonSampled):
            return NotImplemented
        return (
            np.ndim(self.rate) == np.ndim(other.rate)
            and np.array_equal(self.rate, other.rate)
            and self.inner == other.inner
        )

    def __hash__(self) -> int:
        key = self.rate if isinstance(self.rate, float) else self.rate.tobytes()
        return hash((PoissonSampled, key, self.inner))

    def __repr__(self) -> str:
        r = self.rate if isinstance(self.rate, float) else f"array(n={self.rate.size})"
        return f"PoissonSampled(rate={r}, inner={self.inner!r})"


@dataclass(frozen=True)
class Composed:
    """``count`` ≥ 0 adaptive repetitions of ``inner``."""

    inner: Mechanism
    count: int

    def __post_init__(self) -> None:
        _check_inner(self.inner, "inner")
        c = self.count
        if isinstance(c, bool) or not isinstance(c, numbers.Integral | float):
            raise ValueError(f"count: expected an integer >= 0, got {c!r}")
        if isinstance(c, float) and not (math.isfinite(c) and c.is_integer()):
            raise ValueError(f"count: expected an integer >= 0, got {c!r}")
        if int(c) < 0:
            raise ValueError(f"count: must be an integer >= 0, got {c!r}")
        object.__setattr__(self, "count", int(c))


@dataclass(frozen=True)
class TwoStageRound:
    """One rPDP-FL round (Lemma 6): the client is sampled with probability λ = ``client_rate``
    and, if sampled, runs ``local`` (typically τ Poisson-sampled Gaussian steps); otherwise the
    round reveals nothing about its records (to a third-party adversary)."""

    client_rate: float
    local: Mechanism

    def __post_init__(self) -> None:
        lam = self.client_rate
        if isinstance(lam, bool) or not isinstance(lam, numbers.Real):
            raise ValueError(f"client_rate: expected a number in (0, 1], got {lam!r}")
        if not (0.0 < float(lam) <= 1.0):
            raise ValueError(f"client_rate: must be in (0, 1], got {lam!r}")
        _check_inner(self.local, "local")
        object.__setattr__(self, "client_rate", float(lam))


@dataclass(frozen=True)
class Sequence:
    """Adaptive composition of different mechanisms, in order."""

    events: tuple[Mechanism, ...]

    def __post_init__(self) -> None:
        if isinstance(self.events, str | bytes) or not hasattr(self.events, "__iter__"):
            raise ValueError(f"events: expected a sequence of mechanisms, got {self.events!r}")
        events = tuple(self.events)
        if not events:
            raise ValueError("events: expected at least one mechanism")
        for i, e in enumerate(events):
            _check_inner(e, f"events[{i}]")
        object.__setattr__(self, "events", events)


Mechanism = Union[GaussianMechanism, PoissonSampled, Composed, TwoStageRound, Sequence]  # noqa: UP007
_MECHANISM_TYPES = (GaussianMechanism, PoissonSampled, Composed, TwoStageRound, Sequence)


def outline(event: Mechanism, depth: int = 2) -> str:
    """Short structural name, e.g. ``PoissonSampled(Composed(...))`` (for error messages)."""
    name = type(event).__name__
    if isinstance(event, GaussianMechanism):
        return name
    if depth == 0:
        return f"{name}(...)"
    if isinstance(event, PoissonSampled | Composed):
        children = [event.inner]
    elif isinstance(event, TwoStageRound):
        children = [event.local]
    else:
        children = list(event.events)
    return f"{name}({', '.join(outline(c, depth - 1) for c in children)})"


def plan_event(
    rates: ArrayLike,
    plan: TrainingPlan,
    adversary: Adversary | str = "third-party",
    participations: int | None = None,
) -> Mechanism:
    """The mechanism of a training plan as seen by ``adversary`` (per-record ``rates``).

    ``plan.total_event(rates, adversary, rounds=k)``, i.e. the plan's round event
    (:meth:`~pdpfl.privacy.plan.TrainingPlan.round_event`) composed over the charged rounds:

    * centralized (``rounds is None``): ``Composed(Composed(PoissonSampled(q, Gaussian(σ)), τ), 1)``;
    * third-party (rPDP-FL Theorem 1):
      ``Composed(TwoStageRound(λ, Composed(PoissonSampled(q, Gaussian(σ)), τ)), T)``;
    * server (Type I, no λ amplification):
      ``Composed(Composed(PoissonSampled(q, Gaussian(σ)), τ), k)``, k = ``participations``
      (default T).

    ``adversary="both"`` has no single event (it is the max of two ε): ValueError.
    """
    adv = as_adversary(adversary)
    if adv is Adversary.BOTH:
        raise ValueError("adversary: 'both' has no single event; account each adversary")
    if not isinstance(plan, TrainingPlan):
        raise ValueError(f"plan: expected a TrainingPlan, got {type(plan).__name__}")
    check_rates(rates)
    if plan.rounds is None:
        if participations is not None:
            raise ValueError("participations: only meaningful for federated plans (rounds set)")
        return plan.total_event(rates, adv.value)
    k = plan.rounds
    if participations is not None:
        k = participations
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= k <= plan.rounds:
            raise ValueError(f"participations: must be an integer in [0, rounds={plan.rounds}]")
    if adv is Adversary.THIRD_PARTY:
        k = plan.rounds
    return plan.total_event(rates, adv.value, rounds=int(k))
