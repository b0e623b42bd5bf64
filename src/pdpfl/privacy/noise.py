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

from pdpfl.privacy.mechanisms import GaussianMechanism

__all__ = [
    "DiscreteGaussianNoise",
    "GaussianNoise",
    "JointGaussian",
    "NoiseBindingError",
    "NoiseSpec",
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


#: A noise description of any kind (see the module docstring).
NoiseSpec = GaussianNoise | DiscreteGaussianNoise


def check_charged(
    noise: GaussianNoise | JointGaussian | DiscreteGaussianNoise, charged: float, *, what: str
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
