"""rPDP-FL's published mechanism (Algorithm 3, lines 1-4): σ, the estimator F, and the plan.

The server fixes (σ, δ, T, τ, λ, C) -- σ from ``privacy.noise_multiplier`` or as the σ at which
q = 1 spends ``privacy.epsilon_max`` -- computes the sampling-probability estimator F
(Algorithm 2; ``certified`` by default, ``scf`` or ``binary-search``) for the configured
observer(s), and sends both to every silo, which maps its own records' budgets to q_ij = F(ε_ij)
locally (budgets never leave the silo). The same :class:`DpFedAvgSetup` describes the uniform
baselines (one q for every kept record) and the privacy-free baseline.

Nothing here reads the experiment config: the config section
(:func:`pdpfl.fl.rpdp.config.mechanism_spec`) reads it once into a :class:`MechanismSpec`,
and every function below takes that value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from pdpfl.fl.algorithm import PublicSetup
from pdpfl.fl.common import (
    BudgetSource,
    noise_for_max_budget_cached,
    public_budget_statistics,
)
from pdpfl.privacy.mechanisms import Mechanism
from pdpfl.privacy.noise import central_noise
from pdpfl.privacy.plan import TrainingPlan

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.calibration import RateEstimator
    from pdpfl.dp.noise import CentralNoise

__all__ = [
    "DpFedAvgSetup",
    "MechanismSpec",
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


@dataclass(frozen=True)
class MechanismSpec:
    """What the configuration asks of the DP-FedAvg mechanism, read once from it (public).

    ``noise_multiplier`` / ``epsilon_max`` are the two ways to fix σ (exactly one is set for a
    private run); δ, τ, T, λ, C, the observer(s), the calibration of F, the accountant, the
    participation and the central noise are the fields :class:`DpFedAvgSetup` publishes;
    ``allow_exclusion`` and the public ``budgets`` scenario decide :func:`check_feasible`.
    """

    delta: float
    local_steps: int
    rounds: int
    client_rate: float
    max_grad_norm: float
    noise_multiplier: float | None = None
    epsilon_max: float | None = None
    adversary: str = "both"
    calibration: str = "certified"
    accountant: str = "rdp"
    participation: str = "visible"
    central_noise: str = "continuous"
    allow_exclusion: bool = False
    budgets: BudgetSource = BudgetSource()


def mechanism_plan(spec: MechanismSpec, sigma: float) -> TrainingPlan:
    """The public :class:`~pdpfl.privacy.plan.TrainingPlan` (σ, δ, τ, T, λ) of a mechanism."""
    return TrainingPlan(
        noise_multiplier=float(sigma),
        delta=spec.delta,
        steps=spec.local_steps,
        rounds=spec.rounds,
        client_rate=spec.client_rate,
        noise="discrete" if spec.central_noise == "discrete" else "continuous",
    )


def noise_multiplier(spec: MechanismSpec) -> float:
    """σ: ``privacy.noise_multiplier``, or the σ at which q = 1 spends exactly ε_max (under
    ``privacy.accountant``, the accountant of the estimator and the ledgers)."""
    if spec.noise_multiplier is not None:
        return float(spec.noise_multiplier)
    if spec.epsilon_max is None:
        raise ValueError("privacy: set privacy.noise_multiplier or privacy.epsilon_max")
    return noise_for_max_budget_cached(
        float(spec.epsilon_max),
        spec.delta,
        spec.local_steps,
        spec.rounds,
        spec.client_rate,
        spec.adversary,
        spec.accountant,
        spec.central_noise,
    )


def fit_published_estimator(spec: MechanismSpec, sigma: float) -> RateEstimator:
    """F for the mechanism and observer (memoized inside the calibrators)."""
    from pdpfl.calibration import fit_estimator

    return fit_estimator(
        mechanism_plan(spec, sigma),
        method=spec.calibration,
        adversary=spec.adversary,
        accountant=spec.accountant,
    )


def round_events(spec: MechanismSpec) -> list[Mechanism]:
    """The events a record's ledger charges per round under this mechanism (both observers:
    the ledger accounts both whatever ``privacy.adversary`` enforces), at a nominal σ and rate."""
    plan = mechanism_plan(spec, 1.0)
    return [plan.round_event(np.array([0.5]), obs) for obs in plan.observers]


def setup_fields(spec: MechanismSpec) -> dict[str, Any]:
    """The fields every DP-FedAvg setup shares (δ, τ, T, λ, C, observer, ...)."""
    return dict(
        delta=spec.delta,
        local_steps=spec.local_steps,
        rounds=spec.rounds,
        client_rate=spec.client_rate,
        max_grad_norm=spec.max_grad_norm,
        adversary=spec.adversary,
        calibration=spec.calibration,
        accountant=spec.accountant,
        participation=spec.participation,
        central_noise=spec.central_noise,
    )


def check_feasible(spec: MechanismSpec, estimator: RateEstimator) -> None:
    """Refuse, before training, a public budget scenario with budgets F cannot honour.

    Uses only the scenario's public minimum (never a silo's budgets); silos check their own
    budgets again when they are built.
    """
    if spec.allow_exclusion:
        return
    minimum, _ = public_budget_statistics(spec.budgets)
    floor = getattr(estimator, "min_epsilon", None)
    if minimum is not None and floor is not None and minimum < float(floor) * (1 - 1e-12):
        raise ValueError(
            f"budgets: the scenario allows budgets down to ε = {minimum:g}, below the smallest "
            f"ε this mechanism can give a positive sampling rate ({float(floor):.4g}); lower σ "
            "(privacy.noise_multiplier / raise privacy.epsilon_max), or set "
            "privacy.allow_exclusion: true to train without those records (q = 0)"
        )


def personalized_setup(spec: MechanismSpec) -> DpFedAvgSetup:
    """Algorithm 3, lines 1-4: σ and the estimator F, published to every silo (public)."""
    sigma = noise_multiplier(spec)
    est = fit_published_estimator(spec, sigma)
    check_feasible(spec, est)
    return DpFedAvgSetup(
        mode="personalized",
        noise_multiplier=sigma,
        estimator=est.to_dict(),
        **setup_fields(spec),
    )
