"""The noise a mechanism adds, described once, beside the event it is accounted as.

jax_privacy's ``DPExecutionPlan`` keeps the noise transform and its ``dp_event`` in one object,
so the σ that is added and the σ that is accounted are one field. pdpfl does the same with a
*noise description*, pure data (no torch):

* :class:`GaussianNoise` -- N(0, (σ·C)²/t) per coordinate: noise multiplier σ, the L2
  sensitivity C of the clipped query it protects (the clipping bound), and the number of
  shares t it is split into (distributed noise: each of t parties adds one share, so any t
  survivors together carry the whole σ²C²; t = 1 for central noise). :meth:`GaussianNoise.std`
  is what one party adds, :meth:`GaussianNoise.event` the
  :class:`~pdpfl.privacy.mechanisms.GaussianMechanism` a ledger charges for one release;
* :class:`JointGaussian` -- several Gaussian queries about the same unit released together
  (IDP-FedAvg's clipped update and its adaptive-clipping count, Andrew et al. 2021): one
  Gaussian of multiplier (Σ_k σ_k⁻²)^{-1/2}. Gaussian mechanisms compose exactly into this one
  (RDP α/(2σ_k²) add, Mironov 2017 Prop. 1; μ_k = 1/σ_k compose to √Σμ_k², Dong, Roth & Su 2022
  Cor. 3.3; their privacy-loss distributions are Gaussians whose means and variances add), so
  every accountant charges it exactly.

:func:`pdpfl.dp.noise.add_noise` is the one function that draws DP noise, and it takes one of
these descriptions; each algorithm builds its ledger's
:class:`~pdpfl.privacy.unit.UnitMechanism` from the same object (``noise.noise_multiplier``),
and a party checks, before it draws, that the description it holds is still what its ledger
charges (:func:`check_charged`). The descriptions are frozen: a changed σ is a new object.

Kinds. Every description class names its ``kind`` (``"gaussian"``); the drawing function looks
the sampler up by kind (:func:`pdpfl.dp.noise.register_sampler`). Another kind of noise (e.g. an
exact discrete Gaussian) is one more description class here -- its parameters, ``std``-like
share rule and event -- and one sampler there; nothing else changes.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import ClassVar

from pdpfl.privacy.mechanisms import DistributedDiscreteGaussian, GaussianMechanism

__all__ = [
    "CentralDiscreteGaussianNoise",
    "DiscreteGaussianNoise",
    "GaussianNoise",
    "JointGaussian",
    "NoiseBindingError",
    "NoiseSpec",
    "central_event_variance",
    "central_noise",
    "central_scale_log2",
    "check_charged",
]


class NoiseBindingError(ValueError):
    """The noise a party is about to add is not the noise its ledger charges."""


def _number(value: object, name: str, rule: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: must be {rule}, got {value!r}")
    return float(value)


def _sensitivity(value: object) -> float:
    c = _number(value, "sensitivity", "a finite number > 0")
    if not (math.isfinite(c) and c > 0.0):
        raise ValueError(
            f"sensitivity: the clipping bound C (max_grad_norm) must be a finite number > 0, "
            f"got {c!r}"
        )
    return c


def _shares(value: object, name: str = "shares") -> int:
    rule = f"{name}: a noise share needs t >= 1 (an integer), got {value!r}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(rule)
    t = float(value)
    if not (math.isfinite(t) and t.is_integer() and t >= 1):
        raise ValueError(rule)
    return int(t)


@dataclass(frozen=True)
class GaussianNoise:
    """Gaussian noise N(0, (σ·C)²/t) per coordinate (see the module docstring).

    This is the one place a noise multiplier is validated before noise is drawn.

    Parameters
    ----------
    noise_multiplier
        σ ≥ 0: the std of the whole release over the sensitivity (0 adds no noise and accounts
        nothing: :meth:`event` refuses it).
    sensitivity
        C > 0: the L2 sensitivity of the query (the clipping bound of what is summed).
    shares
        t ≥ 1: the noise is split into t independent shares of variance σ²C²/t, one per party;
        every release that is accounted holds at least t of them (1: central noise).
    """

    noise_multiplier: float
    sensitivity: float = 1.0
    shares: int = 1

    #: The sampler that draws this noise (:func:`pdpfl.dp.noise.register_sampler`).
    kind: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        sigma = _number(self.noise_multiplier, "noise_multiplier", "a finite number >= 0")
        if not (math.isfinite(sigma) and sigma >= 0.0):
            raise ValueError(f"noise_multiplier: must be a finite number >= 0, got {sigma!r}")
        object.__setattr__(self, "noise_multiplier", sigma)
        object.__setattr__(self, "sensitivity", _sensitivity(self.sensitivity))
        object.__setattr__(self, "shares", _shares(self.shares))

    # -------------------------------------------------------------------- what is added
    @property
    def private(self) -> bool:
        """True if this noise adds anything (σ > 0)."""
        return self.noise_multiplier > 0.0

    @property
    def total_std(self) -> float:
        """σ·C: the std of the whole release (all t shares together)."""
        return self.noise_multiplier * self.sensitivity

    def shares_for(self, announced_survivors: int | None = None) -> int:
        """The t a share is sized for: the description's, or the smaller t a summation protocol
        announced for the round (never less noise than either needs)."""
        t = self.shares
        if announced_survivors is not None:
            t = min(t, _shares(announced_survivors, "announced_survivors"))
        return t

    def std(self, announced_survivors: int | None = None) -> float:
        """The std one party adds per coordinate: σ·C/√t (σ·C for central noise)."""
        t = self.shares_for(announced_survivors)
        return self.total_std if t == 1 else self.total_std / math.sqrt(t)

    # -------------------------------------------------------------------- what is charged
    def event(self) -> GaussianMechanism:
        """The event one release is charged as: ``GaussianMechanism(σ)``."""
        if not self.private:
            raise ValueError("noise_multiplier: 0 adds no noise, so there is nothing to account")
        return GaussianMechanism(self.noise_multiplier)

    # -------------------------------------------------------------------- derived descriptions
    def with_sensitivity(self, sensitivity: float) -> GaussianNoise:
        """The same σ for another clipping bound (std σ·C' -- e.g. the round's adaptive C_t)."""
        return replace(self, sensitivity=sensitivity)

    def for_sensitivity(self, sensitivity: float) -> GaussianNoise:
        """The *same noise* (same std) stated for a query of sensitivity C': multiplier σ·C/C'
        (IDP-FedAvg's SCALE: one noise, per-group clipping bounds)."""
        c = _sensitivity(sensitivity)
        return replace(
            self, noise_multiplier=self.noise_multiplier * self.sensitivity / c, sensitivity=c
        )

    def with_shares(self, shares: int) -> GaussianNoise:
        """The same total noise split into ``shares`` parts."""
        return replace(self, shares=shares)

    def share(self) -> GaussianNoise:
        """One share seen on its own (e.g. by a server that sees every silo's update): σ/√t."""
        return GaussianNoise(self.noise_multiplier / math.sqrt(self.shares), self.sensitivity)


@dataclass(frozen=True)
class JointGaussian:
    """Gaussian queries released together about the same unit: one Gaussian event.

    ``parts[k]`` is the noise of query k relative to the unit's sensitivity in that query; the
    release is charged as ``GaussianMechanism((Σ_k σ_k⁻²)^{-1/2})`` (exact composition of
    Gaussian mechanisms, module docstring). Each part is drawn on its own with
    :func:`pdpfl.dp.noise.add_noise`.
    """

    parts: tuple[GaussianNoise, ...]

    def __post_init__(self) -> None:
        parts = tuple(self.parts)
        if not parts or not all(isinstance(p, GaussianNoise) for p in parts):
            raise ValueError("parts: expected at least one GaussianNoise")
        if not all(p.private for p in parts):
            raise ValueError("parts: every part of a joint release must add noise (σ > 0)")
        object.__setattr__(self, "parts", parts)

    @property
    def noise_multiplier(self) -> float:
        """(Σ_k σ_k⁻²)^{-1/2}: the multiplier of the one Gaussian the parts compose to."""
        if len(self.parts) == 1:
            return self.parts[0].noise_multiplier
        return float(sum(p.noise_multiplier**-2 for p in self.parts) ** -0.5)

    @property
    def private(self) -> bool:
        return True

    def event(self) -> GaussianMechanism:
        """The event one joint release is charged as."""
        return GaussianMechanism(self.noise_multiplier)


@dataclass(frozen=True)
class DiscreteGaussianNoise:
    """One exact discrete Gaussian share N_Z(0, σ_s²) per coordinate of an integer vector
    (Canonne, Kamath & Steinke 2020; distributed: Kairouz, Liu & Steinke 2021).

    The description of :meth:`pdpfl.dp.discrete_params.DiscreteShareParams.noise`: ``variance``
    is σ_s² = σ²·N/t exactly (the sampler rounds it *up* to σ²_used and draws with integer
    arithmetic only), ``noise_multiplier`` the σ of the released sum of ``shares`` = t shares
    over the accounted integer sensitivity √N -- what the ledger's
    :class:`~pdpfl.privacy.discrete_plan.SampledDiscreteGaussianPlan` charges (checked by
    :func:`check_charged`). The shares are sized once, for t: a protocol that announces fewer
    survivors is refused (:meth:`shares_for`), never met with smaller shares.
    """

    variance: Fraction
    noise_multiplier: float
    shares: int = 1

    kind: ClassVar[str] = "discrete-gaussian"

    def __post_init__(self) -> None:
        v = Fraction(self.variance)
        if v <= 0:
            raise ValueError(f"variance: must be > 0, got {self.variance!r}")
        sigma = _number(self.noise_multiplier, "noise_multiplier", "a finite number > 0")
        if not (math.isfinite(sigma) and sigma > 0.0):
            raise ValueError(f"noise_multiplier: must be a finite number > 0, got {sigma!r}")
        object.__setattr__(self, "variance", v)
        object.__setattr__(self, "noise_multiplier", sigma)
        object.__setattr__(self, "shares", _shares(self.shares))

    @property
    def private(self) -> bool:
        return True

    def shares_for(self, announced_survivors: int | None = None) -> int:
        """t: a protocol may announce at least the t the shares were sized for, never fewer
        (the integer encoding's N and σ_s² are fixed at setup)."""
        if announced_survivors is not None:
            t = _shares(announced_survivors, "announced_survivors")
            if t < self.shares:
                raise NoiseBindingError(
                    f"announced_survivors: the discrete shares are sized for t = {self.shares} "
                    f"survivors; a protocol announced {t}, which they would leave short; nothing "
                    "is released"
                )
        return self.shares

    def std(self, announced_survivors: int | None = None) -> float:
        """√σ_s²: the std of one share in integer units (before the sampler rounds it up)."""
        self.shares_for(announced_survivors)
        return math.sqrt(float(self.variance))


#: The inflation target of the central discrete grid: γ = 2^k is the smallest power of two with
#: √d ≤ 2^-10·γC, so the rounding inflates the sensitivity by at most 2^-10 (≈ 0.1 %).
CENTRAL_INFLATION_LOG2 = 10


def central_scale_log2(sensitivity: float, dimension: int) -> int:
    """k of the central discrete grid γ = 2^k (:class:`CentralDiscreteGaussianNoise`): the
    smallest k with √d ≤ 2^-10·2^k·C, i.e. a sensitivity inflation (γC + √d)/(γC) − 1 ≤ 2^-10."""
    c = _sensitivity(sensitivity)
    d = _shares(dimension, "dimension")
    # smallest k with 2^k ≥ 2^10·√d/C, checked exactly on squares: 2^(2k)·C² ≥ 2^20·d
    k = math.floor(math.log2(math.sqrt(d) / c)) + CENTRAL_INFLATION_LOG2 - 2
    while (
        Fraction(2) ** (2 * k) * Fraction(c) ** 2 < Fraction(2) ** (2 * CENTRAL_INFLATION_LOG2) * d
    ):
        k += 1
    return k


def _up(x: float) -> float:
    return math.nextafter(x, math.inf)


@dataclass(frozen=True)
class CentralDiscreteGaussianNoise:
    """Exact *central* discrete Gaussian noise on a grid (issue #33 item 4;
    ``privacy.central_noise: discrete``).

    The mechanism: scale the clipped sum S ∈ R^d by γ = 2^k, round **deterministically** to the
    nearest integer vector, add Z ~ N_Z(0, σ_Z²)^d drawn exactly from the party's stream
    (:func:`pdpfl.discrete_noise.sample_discrete_gaussian`: integer arithmetic only), and divide
    by γ (post-processing). The released integer vector is round(γS) + Z.

    *Sensitivity on the grid.* For neighbours S − S' = g with ‖g‖₂ ≤ C (one record, user or
    client added or removed), round(γS) − round(γS') = γg + (e' − e) with rounding errors e,
    e' ∈ [−½, ½]^d, so ‖round(γS) − round(γS')‖₂ ≤ γC + √d =: Δ'. Both neighbours are rounded,
    hence √d and not √d/2 (the bound of rounding *one* contribution on its own). Deterministic
    rounding needs no randomness and no redraws, and its worst case is the accounted case;
    conditional randomized rounding (Kairouz, Liu & Steinke 2021) rounds each contribution
    separately, which the DP-SGD step cannot do without materializing every per-record
    gradient. With γ chosen so that √d ≤ 2^-10·γC (:func:`central_scale_log2`), the inflation
    Δ'/(γC) − 1 is at most 2^-10. A coordinate-wise clamp of γS to ±2^52 (so the rounding is exact
    in float64 and fits int64) is 1-Lipschitz per coordinate: the bound still holds.

    *Noise and accounting.* σ_Z² = σ²·Δ'² exactly (a :class:`~fractions.Fraction`; the sampler
    rounds it up). The release is the discrete Gaussian mechanism of sensitivity Δ'
    (Canonne, Kamath & Steinke, NeurIPS 2020, Prop. 5 / Thm. 4): D_α ≤ α‖k‖²/(2σ_Z²) ≤ α/(2σ²)
    for every α > 1, with equality at integer orders -- the continuous Gaussian's curve at noise
    multiplier σ. Its ledger event is ``DistributedDiscreteGaussian(σ², 1, 1, 1)``
    (:meth:`event`): one share, sensitivity measured in units of Δ' (for t = 1 the curve depends
    on σ_Z²/Δ'² only, so the event needs neither γ nor d), whose Poisson sub-sampling the ``rdp``
    accountant bounds with the general sub-sampling bound (:mod:`pdpfl.privacy.subsampled`;
    equal to the sub-sampled Gaussian's at integer orders). ``pld`` and ``gdp-clt`` refuse it.

    Parameters
    ----------
    noise_multiplier
        σ > 0, relative to the grid sensitivity Δ'.
    sensitivity
        C > 0, the clipping bound of one contribution (value units).
    dimension
        d ≥ 1: the coordinates the noise is added to (all of them, in one draw).
    scale_log2
        k (γ = 2^k); default :func:`central_scale_log2`.
    """

    noise_multiplier: float
    sensitivity: float
    dimension: int
    scale_log2: int | None = None

    kind: ClassVar[str] = "central-discrete-gaussian"
    #: Central noise: one party adds all of it.
    shares: ClassVar[int] = 1

    def __post_init__(self) -> None:
        sigma = _number(self.noise_multiplier, "noise_multiplier", "a finite number > 0")
        if not (math.isfinite(sigma) and sigma > 0.0):
            raise ValueError(f"noise_multiplier: must be a finite number > 0, got {sigma!r}")
        object.__setattr__(self, "noise_multiplier", sigma)
        object.__setattr__(self, "sensitivity", _sensitivity(self.sensitivity))
        object.__setattr__(self, "dimension", _shares(self.dimension, "dimension"))
        k = self.scale_log2
        if k is None:
            k = central_scale_log2(self.sensitivity, self.dimension)
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not -60 <= int(k) <= 60:
            raise ValueError(f"scale_log2: must be an integer in [-60, 60], got {k!r}")
        object.__setattr__(self, "scale_log2", int(k))

    @property
    def private(self) -> bool:
        return True

    @property
    def scale(self) -> float:
        """γ = 2^k (exact in float64)."""
        return math.ldexp(1.0, int(self.scale_log2 or 0))

    @property
    def grid_sensitivity(self) -> float:
        """Δ' ≥ γC + √d, rounded up (integer units)."""
        return _up(self.scale * self.sensitivity + _up(math.sqrt(self.dimension)))

    @property
    def inflation(self) -> float:
        """Δ'/(γC) − 1: how much the rounding inflates the sensitivity."""
        return self.grid_sensitivity / (self.scale * self.sensitivity) - 1.0

    @property
    def variance(self) -> Fraction:
        """σ_Z² = σ²·Δ'² exactly (integer units; the sampler rounds it up)."""
        return Fraction(self.noise_multiplier) ** 2 * Fraction(self.grid_sensitivity) ** 2

    def std(self, announced_survivors: int | None = None) -> float:
        """σ·Δ'/γ: the std added per coordinate in value units (central: no shares)."""
        return self.noise_multiplier * self.grid_sensitivity / self.scale

    def multiplier_for(self, sensitivity: float) -> float:
        """The multiplier of this noise for a contribution clipped at C' ≤ C: σ_Z/(γC' + √d)
        (its grid sensitivity; rounded down: charging less noise than added is conservative).
        IDP-SGD's per-record clip norms; ``multiplier_for(C)`` is σ up to rounding."""
        c = _sensitivity(sensitivity)
        grid = _up(self.scale * c + _up(math.sqrt(self.dimension)))
        m = self.noise_multiplier * self.grid_sensitivity / grid
        return math.nextafter(math.nextafter(m, 0.0), 0.0)

    def clip_for(self, noise_multiplier: float) -> float:
        """The largest clip norm C' (rounded down) whose grid sensitivity γC' + √d is charged
        at least ``noise_multiplier`` by this noise (0 if none is): IDP-SGD's group clip norms,
        C_p = (σΔ'/σ_p − √d)/γ, shrunk by 10^-12 so that :meth:`multiplier_for` ≥ σ_p."""
        target = _number(noise_multiplier, "noise_multiplier", "a finite number > 0")
        room = self.noise_multiplier * self.grid_sensitivity / target
        c = (room - _up(math.sqrt(self.dimension))) / self.scale * (1.0 - 1e-12)
        if not c > 0.0:
            return 0.0
        c = min(c, self.sensitivity)
        while self.multiplier_for(c) < target:  # float rounding: shrink until charged enough
            c *= 1.0 - 1e-12
        return c

    def event(self) -> DistributedDiscreteGaussian:
        """``DistributedDiscreteGaussian(σ², 1, 1, 1)``: one release in units of Δ' (σ² rounded
        down: accounting less noise than added is conservative)."""
        return DistributedDiscreteGaussian(central_event_variance(self.noise_multiplier), 1, 1.0, 1)

    def summary(self) -> dict[str, object]:
        """The ``summary.json`` entry (``privacy.central_noise``)."""
        return {
            "kind": "discrete",
            "rounding": "deterministic (nearest integer of the scaled clipped sum)",
            "scale_log2": self.scale_log2,
            "dimension": self.dimension,
            "clip": self.sensitivity,
            "grid_sensitivity": self.grid_sensitivity,
            "sensitivity_inflation": self.inflation,
            "noise_multiplier": self.noise_multiplier,
            "variance": float(self.variance),
        }


def central_noise(
    kind: str, noise_multiplier: float, clip: float, dimension: int | None
) -> GaussianNoise | CentralDiscreteGaussianNoise:
    """The central DP-SGD noise of ``privacy.central_noise`` (``kind``): N(0, σ²C²) per
    coordinate, or the exact discrete Gaussian on the grid of the ``dimension`` trainable
    coordinates (its grid sensitivity γC + √d depends on it)."""
    if kind == "discrete":
        if dimension is None:
            raise ValueError(
                "dimension: the central discrete noise needs the number of trainable "
                "coordinates (its grid sensitivity γC + √d depends on it)"
            )
        return CentralDiscreteGaussianNoise(noise_multiplier, clip, dimension)
    return GaussianNoise(noise_multiplier, clip)


def central_event_variance(noise_multiplier: float) -> float:
    """σ² rounded down to a float: the share variance of the central discrete event in units of
    the grid sensitivity (:meth:`CentralDiscreteGaussianNoise.event`)."""
    exact = Fraction(float(noise_multiplier)) ** 2
    f = float(exact)
    if Fraction(f) > exact:
        f = math.nextafter(f, 0.0)
    return f


#: A noise description of any kind (see the module docstring).
NoiseSpec = GaussianNoise | DiscreteGaussianNoise | CentralDiscreteGaussianNoise


def check_charged(
    noise: GaussianNoise | JointGaussian | DiscreteGaussianNoise | CentralDiscreteGaussianNoise,
    charged: float,
    *,
    what: str,
) -> None:
    """Refuse to draw unless ``noise`` is exactly the noise multiplier ``charged`` by the
    party's ledger (both come from one description; a difference means one was changed).

    ``what`` names the party in the error (e.g. ``"silo 3"``).
    """
    sigma = noise.noise_multiplier
    if not sigma == float(charged):
        raise NoiseBindingError(
            f"noise: {what} would add noise of multiplier σ = {sigma!r} but its ledger charges "
            f"σ = {float(charged)!r}; the noise added and the event charged must come from one "
            "description (pdpfl.privacy.noise), nothing is released"
        )
