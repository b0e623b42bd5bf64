"""IDP-FedAvg ``variant: central`` with exact discrete noise (``privacy.central_noise: discrete``).

The trusted aggregator releases two noisy queries per round (Algorithm 2; adaptive clipping,
Andrew et al. 2021): the clipped-update sum and the count of unclipped updates. With discrete
noise both are released on integer grids, each with an exact discrete Gaussian drawn with
integer arithmetic from the server's stream (Canonne, Kamath & Steinke, NeurIPS 2020) through
the one noise adder (:func:`pdpfl.dp.noise.add_noise`):

* **value** (:func:`value_noise`) -- in units where C_t = 1 (so the grid and the noise do not
  change with the adaptive C_t): S = Σ_i Clip(Δ_i, C_t·f_g)/C_t, a client of group g moving it
  by at most f_g (f_g = C_g/C, SCALE's clip factor; 1 otherwise). S is scaled by γ = 2^k,
  rounded deterministically and Z_v ~ N_Z(0, σ_Z²)^d is added
  (:class:`~pdpfl.privacy.noise.CentralDiscreteGaussianNoise`): the grid sensitivity of group
  g is Δ'_g = γ·f_g + √d (both neighbours rounded), and the one noise is sized for the
  accounted group with the smallest factor f_min: σ_Z = σ_v/f_min·(1 + 2^-40)·Δ'_min. Its
  multiplier for group g is σ_Z/Δ'_g ≥ σ_v/f_g -- the continuous one -- because
  f_g·(γf_min + √d) ≥ f_min·(γf_g + √d) ⟺ f_g ≥ f_min (the 2^-40 covers the float rounding
  of the clipped norms and of the multipliers). The server multiplies the released vector by
  C_t/denominator (post-processing);
* **count** (:func:`count_noise`) -- B = 2·Σ_i (1[‖Δ_i‖ ≤ C_t·f_g] − ½) is an integer already
  (no rounding), a client moves it by 1, and Z_c ~ N_Z(0, (2σ_b)²) is added: multiplier 2σ_b,
  exactly the continuous count's. b̃_t = (B + Z_c)/(2·denominator) + ½.

*The joint event.* For integer shifts k the discrete Gaussian's Rényi divergence is
α·k²/(2σ²) at every integer order and at most that at the others (CKS 2020 Prop. 5, see
:mod:`pdpfl.privacy.discrete`); the value and count noises are independent, so a neighbour
shifts the pair by (k_v, k_c) with ‖k_v‖ ≤ Δ'_g, |k_c| ≤ 1 and

    D_α ≤ α/2·(‖k_v‖²/σ_Z² + k_c²/(2σ_b)²) ≤ α/(2σ_g²),   σ_g = (m_{v,g}⁻² + (2σ_b)⁻²)^{-1/2},

one discrete Gaussian event of multiplier σ_g (:func:`group_multiplier`), with equality at
integer orders (the same curve as the continuous joint Gaussian of :class:`~pdpfl.privacy.noise.
JointGaussian`). Each client of group g is charged ``PoissonSampled(q_g,
DistributedDiscreteGaussian(σ², 1, 1, 1))`` per round (:func:`group_plan`, sensitivity in
units of the grid) at σ = the continuous joint multiplier of its group
(:meth:`~pdpfl.fl.idp_fedavg.mechanism.IdpSetup.release_noise`), a lower bound on σ_g (charging
less noise than added is conservative), and SAMPLE (or getNoise for strict/relaxed/SCALE)
calibrates σ and the rates against that same event
(:func:`~pdpfl.fl.idp_fedavg.sample.sample_group_rates` with ``noise="discrete"``). Before any
draw the server checks that σ_g is at least what every accounted group is charged
(:func:`check_drawn`; otherwise :class:`~pdpfl.privacy.noise.NoiseBindingError`, nothing is
released).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Protocol

from pdpfl.privacy.discrete_plan import SampledDiscreteGaussianPlan
from pdpfl.privacy.noise import (
    CentralDiscreteGaussianNoise,
    DiscreteGaussianNoise,
    GaussianNoise,
    JointGaussian,
    NoiseBindingError,
    central_event_variance,
)
from pdpfl.privacy.unit import PrivacyUnit


class IdpSetup(Protocol):
    """What is read of :class:`~pdpfl.fl.idp_fedavg.mechanism.IdpSetup` (not imported: the
    mechanism module builds its ledgers' plans from this one)."""

    @property
    def method(self) -> str: ...
    @property
    def delta(self) -> float: ...
    @property
    def rounds(self) -> int: ...
    @property
    def budgets(self) -> tuple[float, ...]: ...
    @property
    def assigned(self) -> tuple[float | None, ...]: ...
    @property
    def clip_factors(self) -> tuple[float, ...]: ...
    @property
    def noise_multiplier(self) -> float | None: ...
    @property
    def value_noise_multiplier(self) -> float | None: ...
    @property
    def count_noise_std(self) -> float | None: ...
    @property
    def observers(self) -> tuple[str, ...]: ...
    @property
    def model_size(self) -> int: ...
    @property
    def adaptive(self) -> bool: ...
    def accounted(self, group: int) -> bool: ...
    def release_noise(self, group: int) -> GaussianNoise | JointGaussian: ...


__all__ = [
    "MARGIN",
    "check_drawn",
    "count_noise",
    "group_multiplier",
    "group_plan",
    "summary",
    "value_noise",
]

#: Relative extra noise of the value query (covers float rounding of norms and multipliers).
MARGIN = 2.0**-40


def _accounted(setup: IdpSetup) -> list[int]:
    groups = [g for g in range(len(setup.budgets)) if setup.accounted(g)]
    if not groups:
        raise ValueError("no accounted group: nothing to add noise for")
    return groups


def _down(x: float, ulps: int = 2) -> float:
    for _ in range(ulps):
        x = math.nextafter(x, 0.0)
    return x


def value_noise(setup: IdpSetup) -> CentralDiscreteGaussianNoise:
    """The value query's exact discrete noise in units of C_t (module docstring): sensitivity
    f_min (the smallest clip factor of an accounted group), multiplier σ_v/f_min·(1 + 2^-40),
    on the model's d coordinates."""
    sigma = setup.value_noise_multiplier
    if sigma is None:
        raise ValueError(f"method {setup.method!r} adds no noise")
    if int(setup.model_size) < 1:
        raise ValueError("setup: model_size (the model's coordinates) is needed for the grid")
    f_min = min(float(setup.clip_factors[g]) for g in _accounted(setup))
    return CentralDiscreteGaussianNoise(
        float(sigma) / f_min * (1.0 + MARGIN), f_min, int(setup.model_size)
    )


def count_noise(setup: IdpSetup) -> DiscreteGaussianNoise | None:
    """The count query's exact noise N_Z(0, (2σ_b)²) on B = 2·Σ(1[‖Δ‖ ≤ C_t·f_g] − ½) ∈ Z
    (sensitivity 1, multiplier 2σ_b); None with fixed clipping."""
    if not setup.adaptive or setup.count_noise_std is None:
        return None
    m = 2.0 * float(setup.count_noise_std)
    return DiscreteGaussianNoise(Fraction(m) ** 2, m, 1)


def group_multiplier(setup: IdpSetup, group: int) -> float:
    """σ_g: the joint multiplier the drawn noises give a client of ``group`` (value over its
    grid sensitivity γf_g + √d, and the count), rounded down."""
    m_v = value_noise(setup).multiplier_for(float(setup.clip_factors[group]))
    count = count_noise(setup)
    if count is None:
        return m_v
    m_c = count.noise_multiplier
    return _down(float((m_v**-2 + m_c**-2) ** -0.5))


def _charged(setup: IdpSetup, group: int | None) -> float:
    if group is not None:
        return float(setup.release_noise(group).noise_multiplier)
    if setup.noise_multiplier is None:
        raise ValueError(f"method {setup.method!r} adds no noise: nothing to account")
    return float(setup.noise_multiplier)


def group_plan(setup: IdpSetup, group: int | None = None) -> SampledDiscreteGaussianPlan:
    """What a client of ``group`` is charged per round: ``PoissonSampled(q_g,
    DistributedDiscreteGaussian(σ², 1, 1, 1))`` at σ = its group's continuous joint multiplier
    (≤ :func:`group_multiplier`; σ² rounded down); ``None``: the run's σ (a ledger whose units
    give their own σ)."""
    variance = central_event_variance(_charged(setup, group))
    return SampledDiscreteGaussianPlan(
        PrivacyUnit.CLIENT,
        variance,
        1,
        1.0,
        1,
        setup.delta,
        setup.rounds,
        tuple(setup.observers),
    )


def check_drawn(setup: IdpSetup) -> None:
    """Refuse to draw unless every accounted group gets at least the multiplier its clients'
    ledgers charge (:func:`group_plan`)."""
    for g in _accounted(setup):
        drawn = group_multiplier(setup, g)
        charged = group_plan(setup, g).noise_multiplier
        if not drawn >= charged:
            raise NoiseBindingError(
                f"noise: the server would add discrete noise of multiplier σ = {drawn!r} for "
                f"privacy group {g} but its clients' ledgers charge σ = {charged!r}; nothing is "
                "released"
            )


def summary(setup: IdpSetup) -> dict[str, object]:
    """The ``summary.json`` ``central_noise`` block: the value grid (in units of C_t), the count
    grid, and each accounted group's drawn and charged multipliers."""
    value = value_noise(setup)
    out: dict[str, object] = dict(value.summary())
    out["units"] = "the clip norm C_t (the update sum is divided by C_t before the grid)"
    count = count_noise(setup)
    if count is not None:
        out["count"] = {
            "grid": "2·Σ(1[‖Δ‖ ≤ C_t·f_g] − ½): integers, no rounding, sensitivity 1",
            "noise_multiplier": count.noise_multiplier,
            "variance": float(count.variance),
        }
    out["groups"] = [
        {
            "assigned_epsilon": float(setup.assigned[g] or 0.0),
            "grid_sensitivity": value.scale * float(setup.clip_factors[g])
            + math.sqrt(value.dimension),
            "drawn_multiplier": group_multiplier(setup, g),
            "charged_multiplier": group_plan(setup, g).noise_multiplier,
        }
        for g in _accounted(setup)
    ]
    return out
