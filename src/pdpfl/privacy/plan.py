"""The public privacy parameters of a training run (rPDP-FL Algorithm 3 inputs).

A :class:`TrainingPlan` builds its events from :mod:`pdpfl.privacy.mechanisms` (one direction:
the event algebra knows no plan).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.adversary import Adversary, as_adversary
from pdpfl.privacy.mechanisms import (
    Composed,
    DistributedDiscreteGaussian,
    GaussianMechanism,
    Mechanism,
    PoissonSampled,
    TwoStageRound,
)
from pdpfl.privacy.rdp import check_rates

__all__ = ["TrainingPlan"]


#: Smallest noise multiplier a plan accepts: below it 1/σ² overflows float arithmetic (ε is
#: astronomically large long before, e.g. 5.5e199 at σ = 1e-100).
MIN_NOISE_MULTIPLIER = 1e-100


@dataclass(frozen=True)
class TrainingPlan:
    """The public privacy parameters of a run (rPDP-FL Alg. 3 inputs).

    Parameters
    ----------
    noise_multiplier
        σ > 0: Gaussian noise std divided by the clipping norm.
    delta
        δ in (0, 1).
    steps
        τ ≥ 1: local DP-SGD steps per round (or the total number of steps if ``rounds`` is None).
    rounds
        T ≥ 1 federated rounds; None means centralized DP-SGD (``steps`` compositions).
    client_rate
        λ in (0, 1]: probability that a client takes part in a round.
    noise
        ``continuous`` (the Gaussian mechanism, default) or ``discrete``: every step adds exact
        central discrete Gaussian noise on a grid (``privacy.central_noise: discrete``,
        :class:`~pdpfl.privacy.noise.CentralDiscreteGaussianNoise`); the step's event is then
        ``DistributedDiscreteGaussian(σ², 1, 1, 1)`` (σ relative to the grid sensitivity),
        which only the ``rdp`` accountant interprets.
    discrete_step
        With ``noise = "discrete"``: an explicit step mechanism instead of the central one --
        e.g. the released sum of t discrete Gaussian shares of ULDP-FL's users
        (:meth:`pdpfl.privacy.uldp_discrete.DiscreteUserLevelPlan.as_training_plan`), whose σ
        must be ``noise_multiplier`` = √(t·σ_s²/N).
    """

    noise_multiplier: float
    delta: float
    steps: int
    rounds: int | None = None
    client_rate: float = 1.0
    noise: Literal["continuous", "discrete"] = "continuous"
    discrete_step: DistributedDiscreteGaussian | None = None

    #: The privacy unit of this description (a :class:`pdpfl.privacy.unit.UnitMechanism`).
    unit: ClassVar[str] = "record"

    def __post_init__(self) -> None:
        sigma = _real(self.noise_multiplier, "noise_multiplier")
        if not (math.isfinite(sigma) and sigma >= MIN_NOISE_MULTIPLIER):
            raise ValueError(
                f"noise_multiplier: must be a finite number >= {MIN_NOISE_MULTIPLIER:g} (smaller "
                f"noise overflows the accountant and protects nothing), got {sigma}"
            )
        delta = _real(self.delta, "delta")
        if not (0.0 < delta < 1.0):
            raise ValueError(f"delta: must be in (0, 1), got {delta}")
        steps = _int(self.steps, "steps")
        if steps < 1:
            raise ValueError(f"steps: must be an integer >= 1, got {steps}")
        rounds = None if self.rounds is None else _int(self.rounds, "rounds")
        if rounds is not None and rounds < 1:
            raise ValueError(
                f"rounds: must be an integer >= 1 (none: centralized DP-SGD), got {rounds}"
            )
        lam = _real(self.client_rate, "client_rate")
        if not (0.0 < lam <= 1.0):
            raise ValueError(f"client_rate: must be in (0, 1], got {lam}")
        object.__setattr__(self, "noise_multiplier", sigma)
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "rounds", rounds)
        object.__setattr__(self, "client_rate", lam)
        if self.noise not in ("continuous", "discrete"):
            raise ValueError(
                f"noise: must be 'continuous' or 'discrete' (privacy.central_noise), got "
                f"{self.noise!r}"
            )
        step = self.discrete_step
        if isinstance(step, dict):  # from plan_to_dict
            step = DistributedDiscreteGaussian(**step)
            object.__setattr__(self, "discrete_step", step)
        if step is not None:
            if self.noise != "discrete" or not isinstance(step, DistributedDiscreteGaussian):
                raise ValueError(
                    "discrete_step: a DistributedDiscreteGaussian, with noise = 'discrete'"
                )
            if not math.isclose(step.noise_multiplier, sigma, rel_tol=1e-12):
                raise ValueError(
                    f"noise_multiplier: {sigma!r} is not the discrete step's "
                    f"√(t·σ_s²/N) = {step.noise_multiplier!r}"
                )

    @property
    def centralized(self) -> bool:
        """True when there are no federated rounds (plain DP-SGD with ``steps`` steps)."""
        return self.rounds is None

    def with_noise(self, noise_multiplier: float) -> TrainingPlan:
        """The same plan with another noise multiplier σ (e.g. one found by a σ search); an
        explicit discrete step keeps its shares and rescales its sensitivity, N' = t·σ_s²/σ'²
        (rounded up: as :meth:`~pdpfl.privacy.discrete_plan.SampledDiscreteGaussianPlan.
        with_noise`)."""
        sigma = float(noise_multiplier)
        step = self.discrete_step
        if step is None or sigma == self.noise_multiplier:
            return replace(self, noise_multiplier=sigma)
        n_sq = step.shares * step.share_variance / (sigma * sigma)
        n_sq = math.nextafter(math.nextafter(n_sq * (1.0 + 4.0 * 2.0**-52), math.inf), math.inf)
        new = replace(step, l2_sensitivity_sq=n_sq)
        return replace(self, noise_multiplier=new.noise_multiplier, discrete_step=new)

    # -- the UnitMechanism description (pdpfl.privacy.unit) -----------------------------------
    @property
    def planned_rounds(self) -> int:
        """T (1 for a centralized plan, whose one "round" is all ``steps`` steps)."""
        return 1 if self.rounds is None else int(self.rounds)

    @property
    def observers(self) -> tuple[str, ...]:
        return ("third-party", "server")

    def round_event(self, rates: ArrayLike, observer: str) -> Mechanism:
        """One charged round (rPDP-FL Theorem 1 per round).

        third-party: ``TwoStageRound(λ, Composed(PoissonSampled(q, Gaussian(σ)), τ))`` (Lemma 6);
        server: ``Composed(PoissonSampled(q, Gaussian(σ)), τ)`` (no λ amplification). A
        centralized plan's round is ``Composed(PoissonSampled(q, Gaussian(σ)), steps)`` for both.
        """
        adv = as_adversary(observer)
        if adv is Adversary.BOTH:
            raise ValueError("adversary: 'both' has no single event; account each observer")
        q = check_rates(rates)
        step = PoissonSampled(q if np.ndim(rates) else float(q[0]), self.step_event())
        local = Composed(step, self.steps)
        if self.rounds is None or adv is Adversary.SERVER:
            return local
        return TwoStageRound(self.client_rate, local)

    def step_event(self) -> GaussianMechanism | DistributedDiscreteGaussian:
        """One step's base mechanism (before sampling): ``GaussianMechanism(σ)``, or with
        ``noise = "discrete"`` the central discrete Gaussian in units of its grid sensitivity
        (:meth:`pdpfl.privacy.noise.CentralDiscreteGaussianNoise.event`)."""
        if self.discrete_step is not None:
            return self.discrete_step
        if self.noise == "discrete":
            from pdpfl.privacy.noise import central_event_variance

            return DistributedDiscreteGaussian(
                central_event_variance(self.noise_multiplier), 1, 1.0, 1
            )
        return GaussianMechanism(self.noise_multiplier)

    def charged_on(self, observer: str) -> Literal["active", "participated"]:
        """Third parties are charged every active round; the server only rounds the silo trained."""
        adv = as_adversary(observer)
        if adv is Adversary.BOTH:
            raise ValueError("adversary: 'both' has no single charge rule")
        return "participated" if adv is Adversary.SERVER else "active"

    def total_event(self, rates: ArrayLike, observer: str, rounds: int | None = None) -> Mechanism:
        """``rounds`` (default T) charged rounds composed (rPDP-FL Theorem 1 / Type I view)."""
        k = self.planned_rounds if rounds is None else int(rounds)
        return Composed(self.round_event(rates, observer), k)


def _real(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: expected a real number, got {value!r}")
    out = float(value)
    if math.isnan(out):
        raise ValueError(f"{name}: must not be NaN")
    return out


def _int(value: object, name: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and float(value).is_integer():
        return int(float(value))
    raise ValueError(f"{name}: expected an integer, got {value!r}")
