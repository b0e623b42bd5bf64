"""The public privacy parameters of a training run (rPDP-FL Algorithm 3 inputs)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

__all__ = ["TrainingPlan"]


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
    """

    noise_multiplier: float
    delta: float
    steps: int
    rounds: int | None = None
    client_rate: float = 1.0

    def __post_init__(self) -> None:
        sigma = _real(self.noise_multiplier, "noise_multiplier")
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"noise_multiplier: must be a finite number > 0, got {sigma}")
        delta = _real(self.delta, "delta")
        if not (0.0 < delta < 1.0):
            raise ValueError(f"delta: must be in (0, 1), got {delta}")
        steps = _int(self.steps, "steps")
        if steps < 1:
            raise ValueError(f"steps: must be an integer >= 1, got {steps}")
        rounds = None if self.rounds is None else _int(self.rounds, "rounds")
        if rounds is not None and rounds < 1:
            raise ValueError(f"rounds: must be an integer >= 1 (none: centralized DP-SGD), got {rounds}")
        lam = _real(self.client_rate, "client_rate")
        if not (0.0 < lam <= 1.0):
            raise ValueError(f"client_rate: must be in (0, 1], got {lam}")
        object.__setattr__(self, "noise_multiplier", sigma)
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "rounds", rounds)
        object.__setattr__(self, "client_rate", lam)

    @property
    def centralized(self) -> bool:
        """True when there are no federated rounds (plain DP-SGD with ``steps`` steps)."""
        return self.rounds is None

    def with_noise(self, noise_multiplier: float) -> TrainingPlan:
        """The same plan with another noise multiplier σ (e.g. one found by a σ search)."""
        return replace(self, noise_multiplier=float(noise_multiplier))


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
        return int(value)
    raise ValueError(f"{name}: expected an integer, got {value!r}")
