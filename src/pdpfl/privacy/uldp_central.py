"""ULDP-FL's user-level events when every silo adds *exact central* discrete Gaussian noise.

``privacy.central_noise: discrete`` (issue #33 item 4) for the ULDP-FL variants whose silos each
add a whole Gaussian of their own (not a share of one): ULDP-NAIVE (Kato et al., PVLDB 2024,
Algorithm 1 line 14) and ULDP-GROUP-k (Algorithm 2 line 9, the silos' DP-SGD). Each silo scales
its clipped vector by γ = 2^k, rounds it deterministically, adds Z ~ N_Z(0, σ_Z²)^d drawn with
integer arithmetic from its own stream and divides by γ
(:class:`~pdpfl.privacy.noise.CentralDiscreteGaussianNoise`, drawn by the one noise adder
:func:`pdpfl.dp.noise.add_noise`). The discrete Gaussian's Rényi divergence for an integer
shift k is at most α‖k‖²/(2σ_Z²) at every α > 1, with equality at integer orders (Canonne,
Kamath & Steinke, NeurIPS 2020, Prop. 5 / Thm. 4; :func:`pdpfl.privacy.discrete.
discrete_gaussian_rdp`).

ULDP-NAIVE (:func:`naive_discrete_plan`)
    Silo s releases round(γ·Clip(Δ_s, C)) + Z_s. Removing a user moves Clip(Δ_s, C) by at most
    2C in every silo (the rigorous sensitivity, spec D29), so each silo's integer vector moves
    by at most Δ' = γ·2C + √d (both neighbours rounded; the grid of
    ``CentralDiscreteGaussianNoise(σ_silo, 2C, d)``). The silos' noises are independent, so
    the Rényi divergence of the joint view of all |S| releases is the sum of the silos':
    |S|·α/(2σ_silo²) = α/(2σ_eff²) with σ_eff² = σ_silo²/|S| -- one discrete Gaussian release
    of multiplier σ_eff in units of Δ', the event ``DistributedDiscreteGaussian(σ_eff², 1, 1,
    1)``. A server under plain summation sees that joint view; the released sum (secure
    summation, any set of survivors) is a function of it, so both observers are charged that
    one event every round (the server knows that every user takes part). With σ_silo =
    (σκ/2)·√|S| this is the continuous plan's multiplier σκ/2, up to the grid's inflation
    ≤ 2^-10 of the sensitivity.

ULDP-GROUP-k (:class:`DiscreteGroupPlan`)
    The silos' record-level DP-SGD steps are the central discrete step of the rPDP-FL family
    (:class:`~pdpfl.privacy.plan.TrainingPlan` with ``noise="discrete"``): each step's event is
    ``PoissonSampled(q, DistributedDiscreteGaussian(σ², 1, 1, 1))``. Group privacy holds for
    any mechanism's RDP curve (Mironov 2017 Prop. 2, ULDP-FL Lemma 9) and any (ε, δ) guarantee
    (Lemma 8), so the user-level event is ``GroupPrivacy`` of the τ discrete steps, converted
    as the continuous plan's (:class:`~pdpfl.privacy.unit.GroupPlan`).

Only the ``rdp`` accountant interprets these events (``pld`` and ``gdp-clt`` refuse them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.discrete_plan import SampledDiscreteGaussianPlan
from pdpfl.privacy.mechanisms import (
    Composed,
    DistributedDiscreteGaussian,
    GroupPrivacy,
    Mechanism,
    PoissonSampled,
)
from pdpfl.privacy.noise import CentralDiscreteGaussianNoise, central_event_variance
from pdpfl.privacy.rdp import check_rates
from pdpfl.privacy.uldp_discrete import DiscreteUserLevelPlan
from pdpfl.privacy.unit import GroupPlan, PrivacyUnit, _observer_in

__all__ = [
    "DiscreteGroupPlan",
    "discrete_record_rdp",
    "discrete_step_event",
    "joint_event_variance",
    "naive_discrete_plan",
]


def joint_event_variance(noise_multiplier: float, silos: int) -> float:
    """σ_eff² = σ_silo²/|S| rounded down to a float: the multiplier² of the joint view of |S|
    independent central discrete releases of multiplier σ_silo each (module docstring)."""
    s = int(silos)
    if s < 1 or s != silos:
        raise ValueError(f"silos: must be an integer >= 1, got {silos!r}")
    exact = Fraction(float(noise_multiplier)) ** 2 / s
    f = float(exact)
    if Fraction(f) > exact:
        f = math.nextafter(f, 0.0)
    return f


def naive_discrete_plan(
    noise: CentralDiscreteGaussianNoise, silos: int, delta: float, rounds: int
) -> DiscreteUserLevelPlan:
    """ULDP-NAIVE's user-level plan when each of the |S| silos adds ``noise`` (multiplier
    σ_silo over its grid sensitivity γ·2C + √d): ``DistributedDiscreteGaussian(σ_silo²/|S|, 1,
    1, 1)`` per round for both observers (module docstring)."""
    if not isinstance(noise, CentralDiscreteGaussianNoise):
        raise ValueError(f"noise: expected a CentralDiscreteGaussianNoise, got {noise!r}")
    plan = SampledDiscreteGaussianPlan(
        PrivacyUnit.USER,
        joint_event_variance(noise.noise_multiplier, silos),
        1,
        1.0,
        1,
        delta,
        rounds,
    )
    return DiscreteUserLevelPlan(plan, plan)


def discrete_step_event(noise_multiplier: float) -> DistributedDiscreteGaussian:
    """One central discrete DP-SGD step of multiplier σ (units of the grid sensitivity):
    ``DistributedDiscreteGaussian(σ², 1, 1, 1)`` (σ² rounded down)."""
    return DistributedDiscreteGaussian(central_event_variance(noise_multiplier), 1, 1.0, 1)


@dataclass(frozen=True)
class DiscreteGroupPlan(GroupPlan):
    """:class:`~pdpfl.privacy.unit.GroupPlan` whose silos' DP-SGD steps add exact central
    discrete noise: ``GroupPrivacy(Composed(PoissonSampled(q, DDG(σ², 1, 1, 1)), τ), k,
    conversion)`` per round (module docstring)."""

    def round_event(self, rates: ArrayLike, observer: str) -> Mechanism:
        _observer_in(observer, self.observers_, self.unit)
        q = check_rates(rates)
        rate = q if np.ndim(rates) else float(q[0])
        step = PoissonSampled(rate, discrete_step_event(self.noise_multiplier))
        return GroupPrivacy(Composed(step, self.local_steps), self.group_size, self.conversion)


def discrete_record_rdp(
    noise_multiplier: float, rate: float, steps: int
) -> Callable[[np.ndarray], np.ndarray]:
    """ρ(α) of ``steps`` Poisson-sampled central discrete steps at one record rate (GROUP's
    silos with discrete noise; the counterpart of :func:`pdpfl.privacy.uldp.record_rdp`)."""
    from pdpfl.privacy.accountant import RdpAccountant

    event = PoissonSampled(float(rate), discrete_step_event(noise_multiplier))

    def rdp(orders: np.ndarray) -> np.ndarray:
        a = np.asarray(orders, dtype=np.float64)
        return int(steps) * np.asarray(RdpAccountant(orders=a).rdp(event)[0])

    return rdp
