"""What the server publishes before round 1: the mechanism and the calibration (no data).

Algorithm 3 (rPDP-FL paper, §6.2, lines 1-4): the server fixes (σ, δ, T, τ, λ, C), computes the
sampling-probability estimator F (Algorithm 2; ``certified`` by default, ``scf`` or
``binary-search`` selectable) and sends it to every client, which maps its own records' budgets
to q_ij = F(ε_ij) locally -- budgets never leave the silo. The same object also describes the
uniform baselines (one q for every kept record) and the privacy-free baseline.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

Mode = Literal["personalized", "uniform", "non-private"]


@dataclass(frozen=True)
class Publication:
    """Public, data-independent parameters shared by the server with every silo.

    Attributes
    ----------
    mode
        ``personalized`` (rPDP-FL: q_ij = F(ε_ij)), ``uniform`` (DP-FedAvg: every record with
        ε_ij ≥ ``uniform_epsilon`` gets the same q, the others are dropped) or ``non-private``.
    noise_multiplier, delta, local_steps, rounds, client_rate, max_grad_norm
        σ, δ, τ, T, λ and C of the Gaussian mechanism.
    adversary
        Against which adversary the budgets are enforced (``third-party``, ``server``, ``both``).
    estimator
        ``RateEstimator.to_dict()`` of the published estimator F (personalized mode, and uniform
        mode without a fixed rate).
    uniform_epsilon, uniform_rate
        For the uniform mode: the guaranteed ε and the common record rate q.
    participation
        ``visible`` (the server samples the clients) or ``hidden`` (secure summation; each
        client draws its own λ-coin and the server's view equals a third party's).
    """

    mode: Mode
    noise_multiplier: float
    delta: float
    local_steps: int
    rounds: int
    client_rate: float
    max_grad_norm: float
    adversary: str = "third-party"
    calibration: str = "certified"
    estimator: dict[str, Any] | None = None
    uniform_epsilon: float | None = None
    uniform_rate: float | None = None
    participation: str = "visible"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Publication:
        return cls(**data)

    def plan(self):  # -> pdpfl.privacy.plan.TrainingPlan
        """The :class:`~pdpfl.privacy.plan.TrainingPlan` (σ, δ, τ, T, λ) of this mechanism."""
        from pdpfl.privacy.plan import TrainingPlan

        return TrainingPlan(
            noise_multiplier=self.noise_multiplier,
            delta=self.delta,
            steps=self.local_steps,
            rounds=self.rounds,
            client_rate=self.client_rate,
        )

    def record_rates(self, budgets: np.ndarray) -> np.ndarray:
        """q_ij for a silo's own budgets (run on the silo; Algorithm 3 line 4)."""
        budgets = np.asarray(budgets, dtype=float)
        if self.mode == "non-private":
            raise ValueError("the non-private mode has no privacy-driven sampling rates")
        if self.mode == "personalized":
            return np.clip(self.estimator_object().rates(budgets), 0.0, 1.0)
        assert self.uniform_epsilon is not None
        q = self.uniform_rate
        if q is None:
            q = float(np.clip(self.estimator_object().rates(np.array([self.uniform_epsilon]))[0], 0, 1))
        # Records whose budget is below the uniform guarantee are dropped (q = 0).
        keep = budgets >= self.uniform_epsilon * (1 - 1e-12)
        return np.where(keep, q, 0.0)

    def estimator_object(self):  # -> pdpfl.calibrate.RateEstimator
        if self.estimator is None:
            raise ValueError("this publication carries no rate estimator")
        from pdpfl.calibrate import estimator_from_dict

        return estimator_from_dict(self.estimator)
