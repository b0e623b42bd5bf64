"""rPDP-FL's published mechanism (Algorithm 3, lines 1-4): σ, the estimator F, and the plan.

The server fixes (σ, δ, T, τ, λ, C) -- σ from ``privacy.noise_multiplier`` or as the σ at which
q = 1 spends ``privacy.epsilon_max`` -- computes the sampling-probability estimator F
(Algorithm 2; ``certified`` by default, ``scf`` or ``binary-search``) for the configured
observer(s), and sends both to every silo, which maps its own records' budgets to q_ij = F(ε_ij)
locally (budgets never leave the silo). The same :class:`DpFedAvgSetup` describes the uniform
baselines (one q for every kept record) and the privacy-free baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from pdpfl.fl.algorithm import PublicSetup
from pdpfl.fl.common import (
    noise_for_max_budget_cached,
    public_budget_statistics,
)
from pdpfl.privacy.mechanisms import Mechanism
from pdpfl.privacy.noise import central_noise
from pdpfl.privacy.plan import TrainingPlan

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.calibration import RateEstimator
    from pdpfl.config import ExperimentConfig
    from pdpfl.dp.noise import CentralNoise

__all__ = [
    "DpFedAvgSetup",
    "Mode",
    "check_feasible",
    "fit_published_estimator",
    "mechanism_plan",
    "noise_multiplier",
    "personalized_setup",
    "round_events",
    "setup_fields",
]

Mode = Literal["personalized", "uniform", "non-private"]


@dataclass(frozen=True)
class DpFedAvgSetup(PublicSetup):
    """Public, data-independent parameters shared by the server with every silo.

    Attributes
    ----------
    mode
        ``personalized`` (rPDP-FL: q_ij = F(ε_ij)), ``uniform`` (DP-FedAvg: every record with
        ε_ij ≥ ``uniform_epsilon`` gets the same q, the others are dropped) or ``non-private``.
    noise_multiplier, delta, local_steps, rounds, client_rate, max_grad_norm
        σ, δ, τ, T, λ and C of the Gaussian mechanism.
    adversary
        The observer(s) the budgets are enforced against (``third-party``, ``server``, ``both``).
    calibration, accountant
        How F was fitted and which accountant the silos' ledgers use.
    estimator
        ``RateEstimator.to_dict()`` of F (personalized mode; uniform mode without a fixed rate).
    uniform_epsilon, uniform_rate
        Uniform mode: the guaranteed ε and the common record rate q.
    participation
        ``visible`` (the server samples the silos) or ``hidden`` (each silo draws its own λ-coin
        under secure summation). Either way the server is accounted with participation
        revealed (on a real network reply timing tells it who took part).
    central_noise
        ``continuous`` (the secure float Gaussian) or ``discrete`` (exact discrete Gaussian on
        a grid of the clipped sum, :class:`~pdpfl.privacy.noise.CentralDiscreteGaussianNoise`;
        the plan's steps are then the central discrete Gaussian).
    """

    mode: Mode
    noise_multiplier: float
    delta: float
    local_steps: int
    rounds: int
    client_rate: float
    max_grad_norm: float
    adversary: str = "both"
    calibration: str = "certified"
    accountant: str = "rdp"
    estimator: dict[str, Any] | None = None
    uniform_epsilon: float | None = None
    uniform_rate: float | None = None
    participation: str = "visible"
    central_noise: str = "continuous"

    @property
    def private(self) -> bool:
        return self.mode != "non-private"

    def noise(self, dimension: int | None = None) -> CentralNoise:
        """What every local DP-SGD step adds (the description the silo draws from and its
        ledger's plan is built from): N(0, σ²C²) per coordinate, or with ``central_noise:
        discrete`` the exact discrete Gaussian on the grid of the ``dimension`` trainable
        coordinates."""
        if not self.private:
            raise ValueError("the non-private mode adds no noise")
        return central_noise(
            self.central_noise, self.noise_multiplier, self.max_grad_norm, dimension
        )

    def plan(self, noise: CentralNoise | None = None) -> TrainingPlan:
        """The :class:`~pdpfl.privacy.plan.TrainingPlan` (σ, δ, τ, T, λ, noise kind) of this
        mechanism, σ from ``noise`` (default: the setup's σ)."""
        sigma = self.noise_multiplier if noise is None else noise.noise_multiplier
        return TrainingPlan(
            noise_multiplier=sigma,
            delta=self.delta,
            steps=self.local_steps,
            rounds=self.rounds,
            client_rate=self.client_rate,
            noise="discrete" if self.central_noise == "discrete" else "continuous",
        )

    def estimator_object(self) -> RateEstimator:
        if self.estimator is None:
            raise ValueError("this setup carries no rate estimator")
        from pdpfl.calibration import estimator_from_dict

        return estimator_from_dict(self.estimator)

    def record_rates(self, budgets: np.ndarray) -> np.ndarray:
        """q_ij for a silo's own budgets (run on the silo; Algorithm 3 line 4)."""
        budgets = np.asarray(budgets, dtype=float)
        if self.mode == "non-private":
            raise ValueError("the non-private mode has no privacy-driven sampling rates")
        if self.mode == "personalized":
            rates: np.ndarray = np.clip(self.estimator_object().rates(budgets), 0.0, 1.0)
            return rates
        if self.uniform_epsilon is None:
            raise ValueError("uniform mode: uniform_epsilon is missing from the setup")
        q = self.uniform_rate
        if q is None:
            rate = self.estimator_object().rates(np.array([self.uniform_epsilon]))[0]
            q = float(np.clip(rate, 0.0, 1.0))
        # Records whose budget is below the uniform guarantee are dropped (q = 0).
        keep = budgets >= self.uniform_epsilon * (1 - 1e-12)
        return np.where(keep, q, 0.0)


def mechanism_plan(config: ExperimentConfig, sigma: float) -> TrainingPlan:
    """The public :class:`~pdpfl.privacy.plan.TrainingPlan` (σ, δ, τ, T, λ) of a config."""
    tr = config.training
    return TrainingPlan(
        noise_multiplier=float(sigma),
        delta=config.privacy.delta,
        steps=tr.local_steps,
        rounds=tr.rounds,
        client_rate=tr.client_rate,
        noise=config.privacy.central_noise,
    )


def noise_multiplier(config: ExperimentConfig) -> float:
    """σ: ``privacy.noise_multiplier``, or the σ at which q = 1 spends exactly ε_max (under
    ``privacy.accountant``, the accountant of the estimator and the ledgers)."""
    pv, tr = config.privacy, config.training
    if pv.noise_multiplier is not None:
        return float(pv.noise_multiplier)
    if pv.epsilon_max is None:
        raise ValueError("privacy: set privacy.noise_multiplier or privacy.epsilon_max")
    return noise_for_max_budget_cached(
        float(pv.epsilon_max),
        pv.delta,
        tr.local_steps,
        tr.rounds,
        tr.client_rate,
        config.privacy.adversary,
        config.privacy.accountant,
        config.privacy.central_noise,
    )


def fit_published_estimator(config: ExperimentConfig, sigma: float) -> RateEstimator:
    """F for the config's mechanism and observer (memoized inside the calibrators)."""
    from pdpfl.calibration import fit_estimator

    return fit_estimator(
        mechanism_plan(config, sigma),
        method=config.privacy.calibration,
        adversary=config.privacy.adversary,
        accountant=config.privacy.accountant,
    )


def round_events(config: ExperimentConfig) -> list[Mechanism]:
    """The events a record's ledger charges per round under this config (both observers: the
    ledger accounts both whatever ``privacy.adversary`` enforces), at a nominal σ and rate."""
    plan = mechanism_plan(config, 1.0)
    return [plan.round_event(np.array([0.5]), obs) for obs in plan.observers]


def setup_fields(config: ExperimentConfig) -> dict[str, Any]:
    """The fields every DP-FedAvg setup shares (δ, τ, T, λ, C, observer, ...)."""
    tr, pv = config.training, config.privacy
    return dict(
        delta=pv.delta,
        local_steps=tr.local_steps,
        rounds=tr.rounds,
        client_rate=tr.client_rate,
        max_grad_norm=tr.max_grad_norm,
        adversary=pv.adversary,
        calibration=pv.calibration,
        accountant=pv.accountant,
        participation=config.participation,
        central_noise=pv.central_noise,
    )


def check_feasible(config: ExperimentConfig, estimator: RateEstimator) -> None:
    """Refuse, before training, a public budget scenario with budgets F cannot honour.

    Uses only the scenario's public minimum (never a silo's budgets); silos check their own
    budgets again when they are built.
    """
    if config.privacy.allow_exclusion:
        return
    minimum, _ = public_budget_statistics(config)
    floor = getattr(estimator, "min_epsilon", None)
    if minimum is not None and floor is not None and minimum < float(floor) * (1 - 1e-12):
        raise ValueError(
            f"budgets: the scenario allows budgets down to ε = {minimum:g}, below the smallest "
            f"ε this mechanism can give a positive sampling rate ({float(floor):.4g}); lower σ "
            "(privacy.noise_multiplier / raise privacy.epsilon_max), or set "
            "privacy.allow_exclusion: true to train without those records (q = 0)"
        )


def personalized_setup(config: ExperimentConfig) -> DpFedAvgSetup:
    """Algorithm 3, lines 1-4: σ and the estimator F, published to every silo (public)."""
    sigma = noise_multiplier(config)
    est = fit_published_estimator(config, sigma)
    check_feasible(config, est)
    return DpFedAvgSetup(
        mode="personalized",
        noise_multiplier=sigma,
        estimator=est.to_dict(),
        **setup_fields(config),
    )
