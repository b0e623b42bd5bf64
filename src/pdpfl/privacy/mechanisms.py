"""Mechanisms described as data (like dp-accounting's ``DpEvent`` algebra), per-record rates.

A training run is a small tree of frozen dataclasses that states every privacy parameter
explicitly (σ, q, τ, λ, T, k); an accountant (:mod:`pdpfl.privacy.registry`) interprets it.

* :class:`GaussianMechanism` — sensitivity-1 Gaussian noise, noise multiplier σ.
* :class:`DistributedDiscreteGaussian` — an integer vector plus the sum of ``shares`` i.i.d.
  discrete Gaussian shares (Kairouz, Liu & Steinke 2021; one share: the discrete Gaussian of
  Canonne, Kamath & Steinke 2020), in integer units (:mod:`pdpfl.privacy.discrete`).
* :class:`PoissonSampled` — each record enters independently with its own probability q
  (a scalar, or one rate per record: rPDP-FL Lemma 4); add/remove neighbours.
* :class:`SampledWithoutReplacement` — a uniformly random batch of exactly B of the n records,
  ratio γ = B/n (a scalar or one ratio per record); replace-one neighbours, so the inner
  Gaussian's σ is relative to the replace-one sensitivity 2C (PriFedSync Algorithm 2).
* :class:`Composed` — ``count`` adaptive repetitions.
* :class:`TwoStageRound` — one rPDP-FL round: the client takes part with probability λ and then
  runs ``local`` (rPDP-FL Lemma 6).
* :class:`Sequence` — adaptive composition of different mechanisms.
* :class:`GroupPrivacy` — the guarantee of ``inner`` for datasets that differ in ``group_size``
  units (ULDP-FL GROUP-k: Lemma 8 / Lemma 9, conversion ``rdp``, ``dp`` or ``best``).

:func:`plan_event` builds the event of a training plan for an adversary (rPDP-FL Theorem 1 and
the Type I server view). This module imports no plan: a plan builds its events from here
(:meth:`pdpfl.privacy.plan.TrainingPlan.round_event`), never the other way round.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Literal, TypeGuard, Union

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.adversary import Adversary, as_adversary
from pdpfl.privacy.rdp import check_noise_multiplier, check_rates

__all__ = [
    "GROUP_CONVERSIONS",
    "Composed",
    "DistributedDiscreteGaussian",
    "GaussianMechanism",
    "GroupConversion",
    "GroupPrivacy",
    "Mechanism",
    "PoissonSampled",
    "SampledWithoutReplacement",
    "Sequence",
    "TwoStageRound",
    "outline",
    "plan_event",
]

#: How a record-level guarantee becomes a group guarantee (:class:`GroupPrivacy`).
GroupConversion = Literal["rdp", "dp", "best"]
GROUP_CONVERSIONS: tuple[str, ...] = ("rdp", "dp", "best")


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


@dataclass(frozen=True)
class DistributedDiscreteGaussian:
    """x + Σ of ``shares`` i.i.d. N_Z(0, σ_s²)^d shares, x an integer vector (integer units).

    Neighbouring inputs differ by an integer vector k with ‖k‖₂² ≤ ``l2_sensitivity_sq`` (N, a
    real number ≥ 0) and, if given, ‖k‖₁ ≤ ``l1_sensitivity``. ``shares`` is the fewest shares
    any released sum holds (the survivor threshold t: a sum of more survivors is
    post-processing of the sum of t). ``share_variance`` is σ_s² (a value below the sampler's
    σ²_used is conservative). With one share this is the discrete Gaussian mechanism. RDP:
    :func:`pdpfl.privacy.discrete.distributed_discrete_gaussian_rdp` (``rdp`` accountant only).
    """

    share_variance: float
    shares: int
    l2_sensitivity_sq: float
    dimension: int
    l1_sensitivity: int | None = None

    def __post_init__(self) -> None:
        for name, allow_zero in (("share_variance", False), ("l2_sensitivity_sq", True)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise ValueError(f"{name}: expected a number, got {v!r}")
            f = float(v)
            if not (math.isfinite(f) and (f > 0 or (allow_zero and f == 0))):
                bound = ">= 0" if allow_zero else "> 0"
                raise ValueError(f"{name}: must be a finite number {bound}, got {v!r}")
            object.__setattr__(self, name, f)
        for name, minimum in (("shares", 1), ("dimension", 1)):
            object.__setattr__(self, name, _integer_field(getattr(self, name), name, minimum))
        if self.l1_sensitivity is not None:
            l1 = _integer_field(self.l1_sensitivity, "l1_sensitivity", 0)
            object.__setattr__(self, "l1_sensitivity", l1)

    @property
    def noise_multiplier(self) -> float:
        """√(t·σ_s²/N): the continuous-Gaussian noise multiplier of the main term."""
        if self.l2_sensitivity_sq == 0:
            return math.inf
        return math.sqrt(self.shares * self.share_variance / self.l2_sensitivity_sq)


def _integer_field(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral | float):
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True, eq=False)
class _Sampled:
    """Shared by the two samplers: a rate (scalar or per record) around an inner mechanism."""

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
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _Sampled)
        return (
            np.ndim(self.rate) == np.ndim(other.rate)
            and np.array_equal(self.rate, other.rate)
            and self.inner == other.inner
        )

    def __hash__(self) -> int:
        key = self.rate if isinstance(self.rate, float) else self.rate.tobytes()
        return hash((type(self), key, self.inner))

    def __repr__(self) -> str:
        r = self.rate if isinstance(self.rate, float) else f"array(n={self.rate.size})"
        return f"{type(self).__name__}(rate={r}, inner={self.inner!r})"


@dataclass(frozen=True, eq=False, repr=False)
class PoissonSampled(_Sampled):
    """Poisson sampling: each record is included independently with probability ``rate``.

    ``rate`` is a float in [0, 1] or a 1-d array of per-record rates (stored read-only); the
    accountant then returns one row per rate. Neighbouring datasets: add/remove one record.
    """


@dataclass(frozen=True, eq=False, repr=False)
class SampledWithoutReplacement(_Sampled):
    """A uniformly random batch of exactly B of the n records, ``rate`` = γ = B/n.

    Neighbouring datasets: replace one record (n is fixed). The inner Gaussian's noise
    multiplier is relative to the replace-one sensitivity 2C: pdpfl's DP-SGD noise σ·C is
    ``GaussianMechanism(σ/2)`` here (the paper's σ_j of PriFedSync Algorithm 2). Accounted by
    Wang, Balle & Kasiviswanathan 2019, Theorem 9 (:mod:`pdpfl.privacy.wor`).
    """


@dataclass(frozen=True)
class Composed:
    """``count`` ≥ 0 adaptive repetitions of ``inner``."""

    inner: Mechanism
    count: int

    def __post_init__(self) -> None:
        _check_inner(self.inner, "inner")
        c: object = self.count
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


@dataclass(frozen=True)
class GroupPrivacy:
    """``inner``'s guarantee for neighbouring datasets that differ in ``group_size`` records.

    ULDP-FL's GROUP-k (Theorem 4 with Proposition 2): a record-level mechanism protects a user
    who has at most k records. ``conversion`` selects the route:

    * ``rdp`` -- Lemma 9 (Mironov 2017, Prop. 2): k rounded up to 2^c, orders α ≥ 2^{c+1}
      become α/2^c with RDP 3^c·ρ(α) (:func:`pdpfl.privacy.group.group_epsilon_from_rdp`);
    * ``dp`` -- Lemma 4 then Lemma 8 ((kε, k·e^{(k−1)ε}·δ')), with the inner δ' optimized over
      the whole range that can matter (:func:`pdpfl.privacy.group.group_epsilon_dp`);
    * ``best`` -- the smaller of the two (both are upper bounds).

    ``Composed(GroupPrivacy(e, k), n)`` is the same mechanism as ``GroupPrivacy(Composed(e, n),
    k)`` (n repetitions of e, seen by groups of k), and accountants treat it so.
    """

    inner: Mechanism
    group_size: int
    conversion: GroupConversion = "best"

    def __post_init__(self) -> None:
        _check_inner(self.inner, "inner")
        k: object = self.group_size
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or int(k) < 1:
            raise ValueError(f"group_size: must be an integer >= 1, got {k!r}")
        if self.conversion not in GROUP_CONVERSIONS:
            raise ValueError(
                f"conversion: expected one of {', '.join(GROUP_CONVERSIONS)}, "
                f"got {self.conversion!r}"
            )
        object.__setattr__(self, "group_size", int(k))


Mechanism = Union[  # noqa: UP007
    GaussianMechanism,
    DistributedDiscreteGaussian,
    PoissonSampled,
    SampledWithoutReplacement,
    Composed,
    TwoStageRound,
    Sequence,
    GroupPrivacy,
]
_MECHANISM_TYPES = (
    GaussianMechanism,
    DistributedDiscreteGaussian,
    PoissonSampled,
    SampledWithoutReplacement,
    Composed,
    TwoStageRound,
    Sequence,
    GroupPrivacy,
)


def is_mechanism(value: object) -> TypeGuard[Mechanism]:
    """True if ``value`` is one of the event types of this module."""
    return isinstance(value, _MECHANISM_TYPES)


def outline(event: Mechanism, depth: int = 2) -> str:
    """Short structural name, e.g. ``PoissonSampled(Composed(...))`` (for error messages)."""
    name = type(event).__name__
    if isinstance(event, GaussianMechanism | DistributedDiscreteGaussian):
        return name
    if depth == 0:
        return f"{name}(...)"
    children: list[Mechanism]
    if isinstance(event, _Sampled | Composed | GroupPrivacy):
        children = [event.inner]
    elif isinstance(event, TwoStageRound):
        children = [event.local]
    else:
        children = list(event.events)
    return f"{name}({', '.join(outline(c, depth - 1) for c in children)})"


def plan_event(
    rates: ArrayLike,
    plan: object,
    adversary: Adversary | str = "third-party",
    participations: int | None = None,
) -> Mechanism:
    """The mechanism of a training plan as seen by ``adversary`` (per-record ``rates``).

    ``plan.total_event(rates, adversary, rounds=k)``, i.e. the plan's round event
    (:meth:`~pdpfl.privacy.plan.TrainingPlan.round_event`) composed over the charged rounds:

    * centralized (``rounds is None``):
      ``Composed(Composed(PoissonSampled(q, Gaussian(σ)), τ), 1)``;
    * third-party (rPDP-FL Theorem 1):
      ``Composed(TwoStageRound(λ, Composed(PoissonSampled(q, Gaussian(σ)), τ)), T)``;
    * server (Type I, no λ amplification):
      ``Composed(Composed(PoissonSampled(q, Gaussian(σ)), τ), k)``, k = ``participations``
      (default T).

    ``plan`` is a :class:`~pdpfl.privacy.plan.TrainingPlan` or any other unit mechanism (an
    object with ``total_event`` and ``planned_rounds``; read structurally, so that this module
    needs no plan). ``adversary="both"`` has no single event (it is the max of two ε):
    ValueError.
    """
    adv = as_adversary(adversary)
    if adv is Adversary.BOTH:
        raise ValueError("adversary: 'both' has no single event; account each adversary")
    total_event = getattr(plan, "total_event", None)
    if not callable(total_event) or not hasattr(plan, "planned_rounds"):
        raise ValueError(
            f"plan: expected a TrainingPlan (a unit mechanism), got {type(plan).__name__}"
        )
    check_rates(rates)
    rounds = getattr(plan, "rounds", None)
    if rounds is None:
        if participations is not None:
            raise ValueError("participations: only meaningful for federated plans (rounds set)")
        event: Mechanism = total_event(rates, adv.value)
        return event
    k = int(rounds)
    if participations is not None:
        p: object = participations
        if isinstance(p, bool) or not isinstance(p, numbers.Integral) or not 0 <= int(p) <= k:
            raise ValueError(f"participations: must be an integer in [0, rounds={rounds}]")
        if adv is not Adversary.THIRD_PARTY:
            k = int(p)
    event = total_event(rates, adv.value, rounds=k)
    return event
