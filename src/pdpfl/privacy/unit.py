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
IDP-FedAvg, user-level ULDP-FL with sub-sampling; q = 1 without sub-sampling).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.adversary import Adversary, as_adversary
from pdpfl.privacy.mechanisms import Composed, GaussianMechanism, Mechanism, PoissonSampled
from pdpfl.privacy.plan import MIN_NOISE_MULTIPLIER, TrainingPlan
from pdpfl.privacy.rdp import check_rates

__all__ = [
    "Charge",
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

    unit: PrivacyUnit
    delta: float

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

    def total_event(
        self, rates: ArrayLike, observer: str, rounds: int | None = None
    ) -> Mechanism:
        """``rounds`` (default T) charged rounds composed."""
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


def _adversary_value(observer: str | Adversary) -> str:
    return as_adversary(observer).value
