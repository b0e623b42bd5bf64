"""What the Scale server publishes: one noise, one record rate, a clip norm per budget group.

Individualized DP-SGD's *Scale* method (Boenisch, Mühl, Dziedzic, Rinberg & Papernot, "Have it
your way: Individualized Privacy Assignment for DP-SGD", NeurIPS 2023, §4.2 and Algorithm 1
with the individualized clipping of its line 8) personalizes by *sensitivity* instead of by
sampling rate: every record is sampled at the same rate q, every step adds the same Gaussian
noise N(0, σ²C²) to the clipped sum, and the records of privacy group p are clipped to their
own bound C_p ≤ C. A record of group p therefore sees the Gaussian mechanism of multiplier

    σ_p = σ·C / C_p                                     (the paper's σ_p = σ_sample·c / c_p)

subsampled at q: its group's ε_p is met by choosing C_p = σ·C/σ_p with σ_p the multiplier at
which rate q spends ε_p over the whole run (:func:`pdpfl.calibration.noise_for_uniform_rate`,
on the two-stage plan of rPDP-FL: τ local steps per round, client rate λ, T rounds).

Neighbouring relation: add or remove one record (with its budget, i.e. its group membership,
which is part of the record) at one silo, under Poisson sampling of the records at rate q in
every local step and of the silos at rate λ in every round. The record's clipped gradient has
norm at most C_p, the noise std is σC, so one step is the sampled Gaussian of multiplier σ_p;
the ledger charges each record at its own σ_p (``PrivacyLedger(noise_multipliers=...)``).

Two choices differ from the paper, both forced by federated, private data:

* the paper picks σ_sample so that the group-size-weighted mean of the c_p is the original c
  (its Eq. for σ_sample); group sizes are the silos' private data here, so instead the top
  group -- ``privacy.epsilon_max`` -- clips at C = ``training.max_grad_norm`` and σ is its
  multiplier: every C_p ≤ C, and clipping bounds every input at C;
* the groups are public numbers (``algorithm.groups``, or a geometric grid from the budget
  scenario's public minimum to ε_max); a record joins the largest group ε_p ≤ ε_i, so it never
  spends more than its own ε_i (records below the smallest group are excluded: rate 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from pdpfl.fl.algorithm import PublicSetup
from pdpfl.fl.common import BudgetSource, public_budget_statistics
from pdpfl.privacy.mechanisms import Mechanism
from pdpfl.privacy.noise import CentralDiscreteGaussianNoise, central_noise
from pdpfl.privacy.plan import TrainingPlan

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.config import ExperimentConfig
    from pdpfl.dp.noise import CentralNoise

__all__ = ["ScaleSetup", "group_noise", "round_events", "scale_setup", "training_plan"]

#: Budgets within this relative distance of a group's ε belong to it (float parsing slack).
_TOLERANCE = 1e-12


@dataclass(frozen=True)
class ScaleSetup(PublicSetup):
    """Public, data-independent: the shared noise, the record rate and the groups.

    Attributes
    ----------
    noise_multiplier, max_grad_norm
        σ and C: every step adds N(0, σ²C²) per coordinate; the top group clips at C.
    sampling_rate
        q: every record's Poisson rate in every local step.
    delta, local_steps, rounds, client_rate
        δ, τ, T, λ of the two-stage plan every record is charged.
    group_budgets, group_noise
        ε_p ascending and σ_p ≥ σ: group p clips at C_p = σ·C/σ_p (:meth:`clip_norms`).
    adversary, accountant, participation
        The observer(s) enforced, the ledgers' accountant, visible or hidden participation.
    """

    noise_multiplier: float
    max_grad_norm: float
    sampling_rate: float
    delta: float
    local_steps: int
    rounds: int
    client_rate: float
    group_budgets: list[float]
    group_noise: list[float]
    adversary: str = "both"
    accountant: str = "rdp"
    participation: str = "visible"
    central_noise: str = "continuous"

    def noise(self, dimension: int | None = None) -> CentralNoise:
        """What every local step adds: N(0, σ²C²) per coordinate (one draw, every record), or
        with ``central_noise: discrete`` the exact discrete Gaussian on the grid of the
        ``dimension`` trainable coordinates (:class:`CentralDiscreteGaussianNoise`)."""
        return central_noise(
            self.central_noise, self.noise_multiplier, self.max_grad_norm, dimension
        )

    def plan(self) -> TrainingPlan:
        """The two-stage plan (σ of the top group; each record is charged its own σ_p)."""
        return TrainingPlan(
            noise_multiplier=self.noise_multiplier,
            delta=self.delta,
            steps=self.local_steps,
            rounds=self.rounds,
            client_rate=self.client_rate,
            noise="discrete" if self.central_noise == "discrete" else "continuous",
        )

    def groups_of(self, budgets: np.ndarray) -> np.ndarray:
        """Per record, the index of the largest group ε_p ≤ ε_i (-1: below every group)."""
        eps = np.asarray(budgets, dtype=np.float64) * (1 + _TOLERANCE)
        return np.searchsorted(np.asarray(self.group_budgets), eps, side="right") - 1

    def clip_norms(self, budgets: np.ndarray, dimension: int | None = None) -> np.ndarray:
        """C_i = σ·C/σ_p of each record's group (0 for a record below every group); with
        discrete noise C_p = (σΔ'/σ_p − √d)/γ, the largest clip norm whose grid sensitivity
        the one noise charges at least σ_p (:meth:`CentralDiscreteGaussianNoise.clip_for`)."""
        group = self.groups_of(budgets)
        noise = self.noise(dimension)
        if isinstance(noise, CentralDiscreteGaussianNoise):
            clips = [noise.clip_for(s) for s in self.group_noise]
        else:
            clips = [noise.total_std / s for s in self.group_noise]
        per_group = np.array(clips or [0.0], dtype=np.float64)
        return np.where(group >= 0, np.minimum(per_group[group], self.max_grad_norm), 0.0)

    def record_noise(self, budgets: np.ndarray, dimension: int | None = None) -> np.ndarray:
        """σ_i = σ·C/C_i (:meth:`GaussianNoise.for_sensitivity`; with discrete noise
        σ_Z/(γC_i + √d), :meth:`CentralDiscreteGaussianNoise.multiplier_for`): what each record
        is charged (σ for a record below every group, which is never sampled)."""
        noise = self.noise(dimension)
        return np.array(
            [
                record_multiplier(noise, float(c)) if c > 0 else noise.noise_multiplier
                for c in self.clip_norms(budgets, dimension)
            ],
            dtype=np.float64,
        )

    def record_rates(self, budgets: np.ndarray) -> np.ndarray:
        """q for every record in a group, 0 for a record below every group."""
        return np.where(self.groups_of(budgets) >= 0, self.sampling_rate, 0.0)


def record_multiplier(noise: CentralNoise, clip: float) -> float:
    """The multiplier the one noise charges a record clipped at ``clip``."""
    if isinstance(noise, CentralDiscreteGaussianNoise):
        return noise.multiplier_for(clip)
    return noise.for_sensitivity(clip).noise_multiplier


def training_plan(config: ExperimentConfig, sigma: float = 1.0) -> TrainingPlan:
    """The two-stage plan (σ, δ, τ, T, λ) of ``config`` (σ nominal unless given)."""
    tr = config.training
    return TrainingPlan(
        noise_multiplier=float(sigma),
        delta=config.privacy.delta,
        steps=tr.local_steps,
        rounds=tr.rounds,
        client_rate=tr.client_rate,
        noise=config.privacy.central_noise,
    )


def round_events(config: ExperimentConfig, rate: float) -> list[Mechanism]:
    """The events a record's ledger charges per round (both observers), at a nominal σ."""
    plan = training_plan(config)
    return [plan.round_event(np.array([rate]), obs) for obs in plan.observers]


@lru_cache(maxsize=256)
def group_noise(
    epsilon: float,
    rate: float,
    delta: float,
    steps: int,
    rounds: int,
    client_rate: float,
    adversary: str,
    accountant: str,
    central_noise: str = "continuous",
) -> float:
    """σ_p: the smallest multiplier at which rate q spends at most ε over the run (public
    parameters only; memoized, since ``pdpfl compare`` builds the same setup again), against
    the discrete plan with ``central_noise: discrete``."""
    from pdpfl.calibration import noise_for_uniform_rate

    template = TrainingPlan(
        noise_multiplier=1.0,
        delta=delta,
        steps=steps,
        rounds=rounds,
        client_rate=client_rate,
        noise="discrete" if central_noise == "discrete" else "continuous",
    )
    return float(noise_for_uniform_rate(epsilon, rate, template, adversary, accountant=accountant))


def default_groups(config: ExperimentConfig, top: float, points: int) -> list[float]:
    """``points`` budgets, geometric from the scenario's public minimum to ``top``."""
    low, _ = public_budget_statistics(BudgetSource.of(config.budgets, seed=config.seed))
    if low is None:
        raise ValueError(
            "algorithm.groups: required when the budgets come from files (no public minimum)"
        )
    low = min(float(low), top)
    if points == 1 or math.isclose(low, top):
        return [top]
    return [float(v) for v in np.geomspace(low, top, points)]


def scale_setup(
    config: ExperimentConfig, rate: float, groups: list[float] | None, points: int
) -> ScaleSetup:
    """The published mechanism: σ of ε_max at rate q, then σ_p of every group (ascending)."""
    pv, tr = config.privacy, config.training
    if pv.epsilon_max is None:
        raise ValueError("privacy.epsilon_max: required by idp-sgd-scale (the top group's ε)")
    top = float(pv.epsilon_max)
    budgets = sorted({float(g) for g in groups} if groups else default_groups(config, top, points))
    if budgets[-1] > top * (1 + _TOLERANCE):
        raise ValueError(
            f"algorithm.groups: {budgets[-1]:g} is above privacy.epsilon_max = {top:g} "
            "(the top group, which clips at training.max_grad_norm)"
        )
    args = (rate, pv.delta, tr.local_steps, tr.rounds, tr.client_rate, pv.adversary)
    sigma = group_noise(top, *args, pv.accountant, pv.central_noise)
    noise = [max(sigma, group_noise(e, *args, pv.accountant, pv.central_noise)) for e in budgets]
    return ScaleSetup(
        noise_multiplier=sigma,
        max_grad_norm=tr.max_grad_norm,
        sampling_rate=float(rate),
        delta=pv.delta,
        local_steps=tr.local_steps,
        rounds=tr.rounds,
        client_rate=tr.client_rate,
        group_budgets=budgets,
        group_noise=noise,
        adversary=pv.adversary,
        accountant=pv.accountant,
        participation=config.participation,
        central_noise=pv.central_noise,
    )
