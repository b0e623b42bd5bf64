"""The unit mechanism of distributed discrete Gaussian noise (a :class:`~pdpfl.privacy.unit.
UnitMechanism` a ledger charges).

:class:`SampledDiscreteGaussianPlan` is :class:`~pdpfl.privacy.unit.SampledGaussianPlan`'s
counterpart when every silo adds an exact discrete Gaussian share to an integer vector and the
shares are summed inside secure aggregation (Kairouz, Liu & Steinke, ICML 2021): its round event
is ``PoissonSampled(q, DistributedDiscreteGaussian(σ_s², t, N, d))``
(:mod:`pdpfl.privacy.discrete`, :mod:`pdpfl.privacy.subsampled`). The encoding that produces
what it describes is :mod:`pdpfl.dp.discrete_params` / :mod:`pdpfl.dp.discrete_encoding`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.mechanisms import (
    Composed,
    DistributedDiscreteGaussian,
    Mechanism,
    PoissonSampled,
)
from pdpfl.privacy.rdp import check_rates
from pdpfl.privacy.unit import (
    Charge,
    PrivacyUnit,
    _check_int,
    _check_observers,
    _check_sigma,
    _observer_in,
    as_unit,
)

__all__ = ["SampledDiscreteGaussianPlan"]


def _float_down(value: Fraction) -> float:
    """The largest float ≤ ``value`` (accounting with less noise than added is conservative)."""
    f = float(value)
    if Fraction(f) > value:
        f = math.nextafter(f, 0.0)
    return f


@dataclass(frozen=True)
class SampledDiscreteGaussianPlan:
    """One Poisson-subsampled *distributed discrete* Gaussian per round (integer units).

    The discrete counterpart of :class:`SampledGaussianPlan` for distributed noise under secure
    summation (Kairouz, Liu & Steinke, ICML 2021): unit u is included with probability q_u; its
    contribution, scaled and rounded to an integer vector (conditional randomized rounding),
    has squared L2 norm at most ``l2_sensitivity_sq`` = N; every released sum holds at least
    ``shares`` = t i.i.d. discrete Gaussian shares of variance ``share_variance`` = σ_s² each.
    The round event is ``PoissonSampled(q, DistributedDiscreteGaussian(σ_s², t, N, d))``: only
    the ``rdp`` accountant interprets it (the distributed discrete bound and the general
    sub-sampling bound, :mod:`pdpfl.privacy.subsampled`); ``pld`` and ``gdp-clt`` refuse it.
    Without sub-sampling use q = 1 (the event is then the base mechanism exactly).

    The noise multiplier is σ = √(t·σ_s²/N) (the continuous-Gaussian multiplier of the main
    term). :meth:`with_noise` keeps the shares that are actually added (σ_s²) and rescales the
    sensitivity, N' = t·σ_s²/σ'² (rounded up): a unit whose contribution is bounded by a smaller
    N_u (a ULDP-FL user weight w_u < 1) is charged ``with_noise(√(t·σ_s²/N_u))``, and a
    calibration that asks for a larger σ' is met by adding shares of variance σ'²·N/t ≥ σ_s²,
    whose τ term is smaller than the one accounted -- both conservative.

    Parameters
    ----------
    unit
        ``client`` or ``user``.
    share_variance
        σ_s² of one share (integer units; at most what the sampler adds).
    shares
        t ≥ 1: the fewest shares any released sum holds.
    l2_sensitivity_sq
        N > 0: the accounted squared L2 sensitivity (integer units).
    dimension
        d ≥ 1: coordinates of the integer vector (after any padding for a rotation).
    delta, rounds
        δ in (0, 1), T ≥ 1.
    observers
        ``("third-party", "server")`` by default: with secure summation the server sees only the
        noisy sum.
    l1_sensitivity
        Optional L1 bound of a contribution (integer units).
    """

    unit: PrivacyUnit
    share_variance: float
    shares: int
    l2_sensitivity_sq: float
    dimension: int
    delta: float
    rounds: int
    observers_: tuple[str, ...] = ("third-party", "server")
    l1_sensitivity: int | None = None

    def __post_init__(self) -> None:
        unit = as_unit(self.unit)
        if unit is PrivacyUnit.RECORD:
            raise ValueError("unit: record-level plans are TrainingPlan (rPDP-FL two-stage)")
        delta = float(self.delta)
        if not (0.0 < delta < 1.0):
            raise ValueError(f"delta: must be in (0, 1), got {delta}")
        # the event validates σ_s², t, N, d and Δ₁ (one place)
        event = DistributedDiscreteGaussian(
            self.share_variance,
            self.shares,
            self.l2_sensitivity_sq,
            self.dimension,
            self.l1_sensitivity,
        )
        if event.l2_sensitivity_sq <= 0:
            raise ValueError(f"l2_sensitivity_sq: must be > 0, got {self.l2_sensitivity_sq!r}")
        object.__setattr__(self, "unit", unit)
        object.__setattr__(self, "share_variance", event.share_variance)
        object.__setattr__(self, "shares", event.shares)
        object.__setattr__(self, "l2_sensitivity_sq", event.l2_sensitivity_sq)
        object.__setattr__(self, "dimension", event.dimension)
        object.__setattr__(self, "l1_sensitivity", event.l1_sensitivity)
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "rounds", _check_int(self.rounds, "rounds", 1))
        object.__setattr__(self, "observers_", _check_observers(tuple(self.observers_)))
        _check_sigma(self.noise_multiplier)

    @classmethod
    def for_multiplier(
        cls,
        unit: PrivacyUnit | str,
        noise_multiplier: float,
        shares: int,
        l2_sensitivity_sq: float,
        dimension: int,
        delta: float,
        rounds: int,
        observers: tuple[str, ...] = ("third-party", "server"),
        l1_sensitivity: int | None = None,
    ) -> SampledDiscreteGaussianPlan:
        """The plan whose shares carry σ_s² = σ²·N/t (:meth:`required_share_variance`)."""
        required = cls.required_share_variance(noise_multiplier, shares, l2_sensitivity_sq)
        return cls(
            as_unit(unit),
            _float_down(required),
            shares,
            l2_sensitivity_sq,
            dimension,
            delta,
            rounds,
            observers,
            l1_sensitivity,
        )

    @staticmethod
    def required_share_variance(
        noise_multiplier: float, shares: int, l2_sensitivity_sq: float
    ) -> Fraction:
        """σ²·N/t exactly: the least variance each share must carry for noise multiplier σ
        (the sampler rounds it up, :func:`pdpfl.discrete_noise.discrete_gaussian_spec`)."""
        sigma = Fraction(_check_sigma(noise_multiplier))
        return sigma * sigma * Fraction(float(l2_sensitivity_sq)) / int(shares)

    @property
    def noise_multiplier(self) -> float:
        """σ = √(t·σ_s²/N)."""
        return math.sqrt(self.shares * self.share_variance / self.l2_sensitivity_sq)

    @property
    def planned_rounds(self) -> int:
        return self.rounds

    @property
    def observers(self) -> tuple[str, ...]:
        return self.observers_

    def base_event(self) -> DistributedDiscreteGaussian:
        """The round's mechanism without sub-sampling."""
        return DistributedDiscreteGaussian(
            self.share_variance,
            self.shares,
            self.l2_sensitivity_sq,
            self.dimension,
            self.l1_sensitivity,
        )

    def round_event(self, rates: ArrayLike, observer: str) -> Mechanism:
        _observer_in(observer, self.observers_, self.unit)
        q = check_rates(rates)
        rate = q if np.ndim(rates) else float(q[0])
        return PoissonSampled(rate, self.base_event())

    def charged_on(self, observer: str) -> Charge:
        _observer_in(observer, self.observers_, self.unit)
        return "active"

    def total_event(self, rates: ArrayLike, observer: str, rounds: int | None = None) -> Mechanism:
        k = self.rounds if rounds is None else int(rounds)
        return Composed(self.round_event(rates, observer), k)

    def with_noise(self, noise_multiplier: float) -> SampledDiscreteGaussianPlan:
        """The same shares seen with noise multiplier σ': sensitivity N' = t·σ_s²/σ'² (rounded
        up; see the class docstring)."""
        sigma = _check_sigma(noise_multiplier)
        if sigma == self.noise_multiplier:
            return self
        n_sq = self.shares * self.share_variance / (sigma * sigma)
        n_sq = math.nextafter(math.nextafter(n_sq * (1.0 + 4.0 * 2.0**-52), math.inf), math.inf)
        return SampledDiscreteGaussianPlan(
            self.unit,
            self.share_variance,
            self.shares,
            n_sq,
            self.dimension,
            self.delta,
            self.rounds,
            self.observers_,
            self.l1_sensitivity,
        )
