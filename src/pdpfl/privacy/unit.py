"""Privacy units and the one mechanism description each algorithm gives the accountant.

A *unit* is what one budget protects and what the neighbouring relation adds or removes:

* ``record`` -- one training record (rPDP-FL, PriFedSync);
* ``client`` -- a whole client/silo with all its data (IDP-FedAvg);
* ``user`` -- one person with all their records in every silo (ULDP-FL).

Every algorithm describes its mechanism once, as a :class:`UnitMechanism`: what *one round*
costs a unit with sampling rate q, for each observer it is accounted against, and when that
cost is charged (every round the unit is active, or only in rounds its silo took part in). The
same description feeds

* the accountant and ``pdpfl account`` (:meth:`UnitMechanism.total_event`: T rounds),
* the calibration ε → q (the total event on a grid of rates),
* the per-unit ledger (:class:`pdpfl.ledger.PrivacyLedger`: the round event times each unit's
  own counters).

:class:`~pdpfl.privacy.plan.TrainingPlan` is the record-level rPDP-FL description;
:class:`SampledGaussianPlan` describes one Poisson-subsampled Gaussian per round (client-level
IDP-FedAvg, user-level ULDP-FL with sub-sampling; q = 1 without sub-sampling);
:class:`~pdpfl.privacy.discrete_plan.SampledDiscreteGaussianPlan` is the same round with
distributed *discrete* Gaussian noise shares summed in integers (Kairouz, Liu & Steinke 2021;
what silos release under secure summation with exact discrete noise); :class:`LocalStepsPlan`
is PriFedSync's record-level mechanism (K noisy local steps on batches drawn without
replacement, or Poisson, per participation); :class:`GroupPlan` is ULDP-FL's
GROUP-k (record-level DP-SGD seen by users with at most k records).

Every description has ``with_noise(σ)``: the ledger calls it once per distinct σ when units are
charged under different noise multipliers.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import ClassVar, Literal, Protocol, Self, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.adversary import as_adversary
from pdpfl.privacy.mechanisms import (
    GROUP_CONVERSIONS,
    Composed,
    DistributedDiscreteGaussian,
    GaussianMechanism,
    GroupConversion,
    GroupPrivacy,
    Mechanism,
    PoissonSampled,
    SampledWithoutReplacement,
)
from pdpfl.privacy.plan import MIN_NOISE_MULTIPLIER, TrainingPlan
from pdpfl.privacy.rdp import check_rates

__all__ = [
    "Charge",
    "GroupPlan",
    "LocalStepsPlan",
    "PrivacyUnit",
    "SampledGaussianPlan",
    "UnitMechanism",
    "as_unit",
]

#: When a round's cost is charged to a unit: every round it is active, or only in rounds in which
#: its silo actually took part (the server sees participation; third parties do not).
Charge = Literal["active", "participated"]


class PrivacyUnit(str, enum.Enum):  # noqa: UP042 (str mixin: compares equal to its value)
    """What one budget protects (the neighbouring relation adds or removes one unit)."""

    RECORD = "record"
    CLIENT = "client"
    USER = "user"


def as_unit(value: PrivacyUnit | str) -> PrivacyUnit:
    """Parse a :class:`PrivacyUnit`; ValueError names ``unit`` and the allowed values."""
    if isinstance(value, PrivacyUnit):
        return value
    try:
        return PrivacyUnit(str(value).strip().lower())
    except ValueError:
        allowed = ", ".join(u.value for u in PrivacyUnit)
        raise ValueError(f"unit: expected one of {allowed}, got {value!r}") from None


@runtime_checkable
class UnitMechanism(Protocol):
    """One algorithm's mechanism as seen by its privacy unit, round by round."""

    @property
    def unit(self) -> str:
        """The :class:`PrivacyUnit` (a ``str``: ``record``, ``client``, ``user``)."""
        ...

    @property
    def delta(self) -> float:
        """δ of every ε this mechanism is accounted at."""
        ...

    @property
    def noise_multiplier(self) -> float:
        """σ (what :meth:`with_noise` replaces)."""
        ...

    @property
    def planned_rounds(self) -> int:
        """T: the number of rounds the run is planned for (calibration and ``account``)."""
        ...

    @property
    def observers(self) -> tuple[str, ...]:
        """Observers this mechanism is accounted against (``third-party``, ``server``)."""
        ...

    def round_event(self, rates: ArrayLike, observer: str) -> Mechanism:
        """The cost of one charged round to units with sampling rates ``rates``."""
        ...

    def charged_on(self, observer: str) -> Charge:
        """``active``: every round the unit is active; ``participated``: only rounds its silo
        took part in."""
        ...

    def total_event(self, rates: ArrayLike, observer: str, rounds: int | None = None) -> Mechanism:
        """``rounds`` (default T) charged rounds composed."""
        ...

    def with_noise(self, noise_multiplier: float) -> UnitMechanism:
        """The same description with another noise multiplier σ (calibration; the ledger calls
        it once per distinct σ of its units)."""
        ...


@dataclass(frozen=True)
class SampledGaussianPlan:
    """One Poisson-subsampled Gaussian per round: unit u is included with probability q_u.

    Client-level IDP-FedAvg (Alg. 2: Poisson client sampling with per-group rates q_p, noise
    σ·C on the clipped sum) and user-level ULDP-FL (Theorem 5; with user sub-sampling Alg. 4)
    are both this mechanism over ``rounds`` rounds. Without sub-sampling use q = 1 (the plain
    Gaussian mechanism per round).

    Parameters
    ----------
    unit
        ``client`` or ``user`` (``record`` units use :class:`~pdpfl.privacy.plan.TrainingPlan`).
    noise_multiplier
        σ: noise std over the unit's sensitivity.
    delta
        δ in (0, 1).
    rounds
        T ≥ 1 rounds.
    observers
        Who the guarantee is stated against. ``("third-party",)`` by default: the released
        models. A central-DP aggregator that sees clipped updates is *trusted* and not an observer;
        add ``"server"`` only when the server sees just the noisy output (e.g. distributed
        noise with secure summation), in which case it is charged the same event.
    """

    unit: PrivacyUnit
    noise_multiplier: float
    delta: float
    rounds: int
    observers_: tuple[str, ...] = ("third-party",)

    def __post_init__(self) -> None:
        unit = as_unit(self.unit)
        if unit is PrivacyUnit.RECORD:
            raise ValueError("unit: record-level plans are TrainingPlan (rPDP-FL two-stage)")
        sigma = float(self.noise_multiplier)
        if not (math.isfinite(sigma) and sigma >= MIN_NOISE_MULTIPLIER):
            raise ValueError(
                f"noise_multiplier: must be a finite number >= {MIN_NOISE_MULTIPLIER:g} (smaller "
                f"noise overflows the accountant and protects nothing), got {sigma}"
            )
        delta = float(self.delta)
        if not (0.0 < delta < 1.0):
            raise ValueError(f"delta: must be in (0, 1), got {delta}")
        if isinstance(self.rounds, bool) or int(self.rounds) != self.rounds or self.rounds < 1:
            raise ValueError(f"rounds: must be an integer >= 1, got {self.rounds!r}")
        obs = tuple(as_adversary(o).value for o in self.observers_)
        if not obs or "both" in obs:
            raise ValueError("observers: expected a non-empty subset of third-party, server")
        object.__setattr__(self, "unit", unit)
        object.__setattr__(self, "noise_multiplier", sigma)
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "rounds", int(self.rounds))
        object.__setattr__(self, "observers_", obs)

    @property
    def planned_rounds(self) -> int:
        return self.rounds

    @property
    def observers(self) -> tuple[str, ...]:
        return self.observers_

    def _check_observer(self, observer: str) -> str:
        obs = as_adversary(observer).value
        if obs not in self.observers_:
            raise ValueError(
                f"adversary: this {self.unit.value}-level mechanism is accounted against "
                f"{', '.join(self.observers_)}, not {obs}"
            )
        return obs

    def round_event(self, rates: ArrayLike, observer: str) -> Mechanism:
        self._check_observer(observer)
        q = check_rates(rates)
        rate = q if np.ndim(rates) else float(q[0])
        return PoissonSampled(rate, GaussianMechanism(self.noise_multiplier))

    def charged_on(self, observer: str) -> Charge:
        self._check_observer(observer)
        return "active"

    def total_event(self, rates: ArrayLike, observer: str, rounds: int | None = None) -> Mechanism:
        k = self.rounds if rounds is None else int(rounds)
        return Composed(self.round_event(rates, observer), k)

    def as_training_plan(self) -> TrainingPlan:
        """The equivalent :class:`TrainingPlan` (T rounds of one step, λ = 1) for the fast
        accountant paths (``plan_epsilon``, certified calibration)."""
        return TrainingPlan(
            noise_multiplier=self.noise_multiplier,
            delta=self.delta,
            steps=1,
            rounds=self.rounds,
            client_rate=1.0,
        )

    def with_noise(self, noise_multiplier: float) -> SampledGaussianPlan:
        return SampledGaussianPlan(
            self.unit, float(noise_multiplier), self.delta, self.rounds, self.observers_
        )


def _check_sigma(value: float) -> float:
    sigma = float(value)
    if not (math.isfinite(sigma) and sigma >= MIN_NOISE_MULTIPLIER):
        raise ValueError(
            f"noise_multiplier: must be a finite number >= {MIN_NOISE_MULTIPLIER:g} (smaller "
            f"noise overflows the accountant and protects nothing), got {sigma}"
        )
    return sigma


def _check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer):
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    if int(value) != value or int(value) < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_observers(observers: tuple[str, ...]) -> tuple[str, ...]:
    obs = tuple(as_adversary(o).value for o in observers)
    if not obs or "both" in obs:
        raise ValueError("observers: expected a non-empty subset of third-party, server")
    return obs


def _observer_in(observer: str, observers: tuple[str, ...], unit: PrivacyUnit) -> str:
    obs = as_adversary(observer).value
    if obs not in observers:
        raise ValueError(
            f"adversary: this {unit.value}-level mechanism is accounted against "
            f"{', '.join(observers)}, not {obs}"
        )
    return obs


Sampler = Literal["wor", "poisson"]


@dataclass(frozen=True)
class LocalStepsPlan:
    """PriFedSync's record-level mechanism: K noisy local steps per participation.

    Federated f-DP (Zheng, Chen, Long & Su, AISTATS 2021), Algorithm 2 (NoisySGD local
    training): a client that joins a round runs K DP-SGD steps on its n records, each on a batch
    of exactly B records drawn uniformly **without replacement** (``sampler="wor"``: replace-one
    neighbours, sensitivity 2C, so the event's noise multiplier is σ/2 -- the paper's σ_j -- at
    ratio γ = B/n) or by **Poisson** sampling at rate q = B/n (``sampler="poisson"``:
    add/remove neighbours, multiplier σ). σ is pdpfl's noise multiplier (noise std σ·C).

    Every observer's view (each release, the global models, other clients, the server) is
    post-processing of the client's noisy steps (Lemma 3.7), so the same composition is charged
    to every observer, once per participation (``charged_on`` is ``participated``). The rate a
    unit is accounted at is its client's B/n (``round_event(rates, …)``).

    Events: ``Composed(SampledWithoutReplacement(γ, Gaussian(σ/2)), K)`` -- the ``rdp``
    accountant bounds it rigorously (Wang et al. 2019, Theorem 9); the ``gdp-clt`` accountant
    gives Theorem 2's CLT μ (an approximation). Poisson: ``Composed(PoissonSampled(q,
    Gaussian(σ)), K)`` (``rdp``, ``pld``; ``gdp-clt`` gives Bu et al.'s μ).

    Parameters
    ----------
    sampler
        ``wor`` (the paper's) or ``poisson``.
    noise_multiplier
        σ: noise std σ·C per step.
    local_steps
        K ≥ 0 steps per participation.
    delta
        δ in (0, 1).
    rounds
        Planned participations R ≥ 1 (calibration and ``account``).
    noise
        ``continuous`` (default) or ``discrete``: every step adds the exact central discrete
        Gaussian on a grid (``privacy.central_noise: discrete``,
        :class:`~pdpfl.privacy.noise.CentralDiscreteGaussianNoise`, multiplier σ over the grid
        sensitivity γC + √d). The step's inner event is then ``DistributedDiscreteGaussian(σ_e²,
        1, 1, 1)`` at the same σ_e: for Poisson batches σ_e = σ; for WOR batches (replace-one:
        the rounded sums differ by at most 2γC + √d) the multiplier is σ(γC + √d)/(2γC + √d)
        ≥ σ/2, so σ_e = σ/2 bounds it. Only ``rdp`` interprets it (Poisson: the general
        sub-sampling bound; WOR: Theorem 9 of Wang et al. 2019, a bound for any base mechanism
        from its RDP at integer orders, which for the discrete Gaussian are the Gaussian's).
    """

    sampler: Sampler
    noise_multiplier: float
    local_steps: int
    delta: float
    rounds: int
    observers_: tuple[str, ...] = ("third-party", "server")
    noise: Literal["continuous", "discrete"] = "continuous"

    unit: ClassVar[PrivacyUnit] = PrivacyUnit.RECORD

    def __post_init__(self) -> None:
        if self.noise not in ("continuous", "discrete"):
            raise ValueError(
                f"noise: must be 'continuous' or 'discrete' (privacy.central_noise), got "
                f"{self.noise!r}"
            )
        if self.sampler not in ("wor", "poisson"):
            raise ValueError(f"sampler: expected 'wor' or 'poisson', got {self.sampler!r}")
        delta = float(self.delta)
        if not (0.0 < delta < 1.0):
            raise ValueError(f"delta: must be in (0, 1), got {delta}")
        object.__setattr__(self, "noise_multiplier", _check_sigma(self.noise_multiplier))
        object.__setattr__(self, "local_steps", _check_int(self.local_steps, "local_steps", 0))
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "rounds", _check_int(self.rounds, "rounds", 1))
        object.__setattr__(self, "observers_", _check_observers(self.observers_))

    @property
    def planned_rounds(self) -> int:
        return self.rounds

    @property
    def observers(self) -> tuple[str, ...]:
        return self.observers_

    @property
    def event_noise_multiplier(self) -> float:
        """Noise std over the neighbouring relation's sensitivity: σ/2 (WOR) or σ (Poisson)."""
        return self.noise_multiplier / 2.0 if self.sampler == "wor" else self.noise_multiplier

    @property
    def neighbouring(self) -> str:
        return (
            "replace one record of one client (batches without replacement)"
            if self.sampler == "wor"
            else "add/remove one record of one client (Poisson batches)"
        )

    def round_event(self, rates: ArrayLike, observer: str) -> Mechanism:
        """One participation: K steps at the unit's ratio B/n (module docstring)."""
        _observer_in(observer, self.observers_, self.unit)
        q = check_rates(rates)
        rate = q if np.ndim(rates) else float(q[0])
        inner: Mechanism = GaussianMechanism(self.event_noise_multiplier)
        if self.noise == "discrete":
            from pdpfl.privacy.noise import central_event_variance

            inner = DistributedDiscreteGaussian(
                central_event_variance(self.event_noise_multiplier), 1, 1.0, 1
            )
        step: Mechanism = (
            SampledWithoutReplacement(rate, inner)
            if self.sampler == "wor"
            else PoissonSampled(rate, inner)
        )
        return Composed(step, self.local_steps)

    def charged_on(self, observer: str) -> Charge:
        _observer_in(observer, self.observers_, self.unit)
        return "participated"

    def total_event(self, rates: ArrayLike, observer: str, rounds: int | None = None) -> Mechanism:
        k = self.rounds if rounds is None else int(rounds)
        return Composed(self.round_event(rates, observer), k)

    def with_noise(self, noise_multiplier: float) -> LocalStepsPlan:
        return LocalStepsPlan(
            self.sampler,
            float(noise_multiplier),
            self.local_steps,
            self.delta,
            self.rounds,
            self.observers_,
            self.noise,
        )

    def with_steps(self, local_steps: int) -> LocalStepsPlan:
        """The same plan with K = ``local_steps`` (calibration of the local steps)."""
        return LocalStepsPlan(
            self.sampler,
            self.noise_multiplier,
            int(local_steps),
            self.delta,
            self.rounds,
            self.observers_,
            self.noise,
        )


@dataclass(frozen=True)
class GroupPlan:
    """ULDP-FL GROUP-k: record-level DP-SGD seen by users with at most k records.

    Every silo runs τ Poisson-sampled DP-SGD steps per round at record rate q (σ per step) on
    records filtered so that each user has at most k of them across silos (ULDP-FL Theorem 4;
    silos are disjoint: parallel composition). The user-level guarantee is the group conversion
    of the record-level one (Proposition 2), event
    ``GroupPrivacy(Composed(PoissonSampled(q, Gaussian(σ)), τ), k, conversion)`` per round;
    T rounds are ``GroupPrivacy`` of the T·τ steps (accountant ``rdp``). Both observers see the
    same releases; every round is charged (``active``). The rate is the record rate q.
    """

    noise_multiplier: float
    local_steps: int
    delta: float
    rounds: int
    group_size: int
    conversion: GroupConversion = "best"
    observers_: tuple[str, ...] = ("third-party", "server")

    unit: ClassVar[PrivacyUnit] = PrivacyUnit.USER

    def __post_init__(self) -> None:
        delta = float(self.delta)
        if not (0.0 < delta < 1.0):
            raise ValueError(f"delta: must be in (0, 1), got {delta}")
        if self.conversion not in GROUP_CONVERSIONS:
            raise ValueError(
                f"group_conversion: expected one of {', '.join(GROUP_CONVERSIONS)}, "
                f"got {self.conversion!r}"
            )
        object.__setattr__(self, "noise_multiplier", _check_sigma(self.noise_multiplier))
        object.__setattr__(self, "local_steps", _check_int(self.local_steps, "local_steps", 1))
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "rounds", _check_int(self.rounds, "rounds", 1))
        object.__setattr__(self, "group_size", _check_int(self.group_size, "group_k", 1))
        object.__setattr__(self, "observers_", _check_observers(self.observers_))

    @property
    def planned_rounds(self) -> int:
        return self.rounds

    @property
    def observers(self) -> tuple[str, ...]:
        return self.observers_

    def round_event(self, rates: ArrayLike, observer: str) -> Mechanism:
        _observer_in(observer, self.observers_, self.unit)
        q = check_rates(rates)
        rate = q if np.ndim(rates) else float(q[0])
        step = PoissonSampled(rate, GaussianMechanism(self.noise_multiplier))
        return GroupPrivacy(Composed(step, self.local_steps), self.group_size, self.conversion)

    def charged_on(self, observer: str) -> Charge:
        _observer_in(observer, self.observers_, self.unit)
        return "active"

    def total_event(self, rates: ArrayLike, observer: str, rounds: int | None = None) -> Mechanism:
        k = self.rounds if rounds is None else int(rounds)
        return Composed(self.round_event(rates, observer), k)

    def with_noise(self, noise_multiplier: float) -> Self:
        """The same plan at another σ (a subclass keeps its own events)."""
        return replace(self, noise_multiplier=float(noise_multiplier))
