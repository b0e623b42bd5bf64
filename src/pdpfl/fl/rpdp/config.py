"""rPDP-FL's config section (``algorithm.name: rpdp``) and the DP-FedAvg family it heads.

:class:`DpFedAvgConfig` holds what rPDP-FL and its baselines share (weighting, η_s, the checks)
and builds the shared server and silo; each concrete algorithm only says what it publishes
(:meth:`~pdpfl.fl.algorithm.Algorithm.setup`): rPDP-FL the personalized estimator F
(:func:`~pdpfl.fl.rpdp.mechanism.personalized_setup`), the baselines a uniform rate or no DP.

This is the family's edge: its methods read the experiment config, once each, into plain values
-- :func:`mechanism_spec` (the mechanism's public parameters), :func:`model_source` (x⁰) and
:func:`budget_source` (the silos' budgets) -- and the mechanism, the checks and the shared
helpers (:mod:`pdpfl.fl.common`) take those values, never the config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from pdpfl.config import ExperimentConfig
from pdpfl.fl.algorithm import Algorithm, PublicSetup, register_algorithm
from pdpfl.fl.api import FederationInfo
from pdpfl.fl.common import (
    BudgetSource,
    ModelSource,
    accountant_problems,
    client_budgets,
    initial_params,
    noise_source_problems,
    silo_model,
)
from pdpfl.fl.rpdp.checks import check_budget_mix
from pdpfl.fl.rpdp.mechanism import (
    DpFedAvgSetup,
    MechanismSpec,
    personalized_setup,
    round_events,
)
from pdpfl.fl.rpdp.server import FedAvgServer
from pdpfl.fl.rpdp.silo import DpFedAvgSilo

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.data.federation import ClientData, Federation
    from pdpfl.randomness import Randomness

__all__ = ["DpFedAvgConfig", "RpdpConfig", "budget_source", "mechanism_spec", "model_source"]


def budget_source(config: ExperimentConfig) -> BudgetSource:
    """Where the silos' budgets come from (``budgets:`` and the seed)."""
    return BudgetSource.of(config.budgets, seed=config.seed)


def model_source(config: ExperimentConfig) -> ModelSource:
    """What x⁰ is built from (``model:``, the seed) and where the silos train it."""
    return ModelSource.of(config.model, seed=config.seed, device=config.training.device)


def mechanism_spec(config: ExperimentConfig) -> MechanismSpec:
    """The DP-FedAvg mechanism's public parameters: ``privacy:`` (σ or ε_max, δ, observer,
    calibration, accountant, central noise, exclusion), ``training:`` (τ, T, λ, C), the
    participation and the public budget scenario."""
    pv, tr = config.privacy, config.training
    return MechanismSpec(
        delta=pv.delta,
        local_steps=tr.local_steps,
        rounds=tr.rounds,
        client_rate=tr.client_rate,
        max_grad_norm=tr.max_grad_norm,
        noise_multiplier=pv.noise_multiplier,
        epsilon_max=pv.epsilon_max,
        adversary=pv.adversary,
        calibration=pv.calibration,
        accountant=pv.accountant,
        participation=config.participation,
        central_noise=pv.central_noise,
        allow_exclusion=pv.allow_exclusion,
        budgets=budget_source(config),
    )


class DpFedAvgConfig(Algorithm):
    """Fields and builders shared by rPDP-FL and the DP-FedAvg baselines."""

    weighting: Literal["uniform", "num_examples"] = Field(
        "uniform",
        description="uniform: the paper's simple average; num_examples: weight by silo size "
        "(needs data.public_silo_sizes: true, since sizes are otherwise private)",
    )
    server_lr: float = Field(1.0, gt=0, description="η_s: x ← x + η_s · mean(Δx)")

    setup_type: ClassVar[type[PublicSetup]] = DpFedAvgSetup
    supports_hidden_participation: ClassVar[bool] = True
    supports_central_discrete: ClassVar[bool] = True

    def check(self, config: ExperimentConfig) -> list[str]:
        problems = []
        if self.weighting == "num_examples" and not config.data.public_silo_sizes:
            problems.append(
                "algorithm.weighting: num_examples weights updates by silo size, which is private; "
                "set data.public_silo_sizes: true to declare the sizes public, or use uniform"
            )
        if self.private:
            if config.training.batch_size is None:
                problems.append(
                    "training.batch_size: required under DP -- the public expected batch size B "
                    "that divides each step's noisy sum (e.g. 32; one value or one per silo)"
                )
            problems += noise_source_problems(config.privacy, "σ such that q = 1 spends ε_max")
            problems += self.accountant_problems(config)
        return problems

    def accountant_problems(self, config: ExperimentConfig) -> list[str]:
        """``privacy.accountant`` must interpret the two-stage round every record is charged
        (calibration, σ from ε_max and the silos' ledgers all use it)."""
        return accountant_problems(
            config.privacy.accountant,
            round_events(mechanism_spec(config)),
            f"{self.name} (a record)",
        )

    def algorithm_checks(self, config: ExperimentConfig, federation: Federation) -> list[str]:
        """Each silo can keep the configured budget mix (after the shared checks)."""
        if self.private:
            check_budget_mix(budget_source(config), list(federation.clients))
        return []

    def server(
        self,
        config: ExperimentConfig,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> FedAvgServer:
        model = model_source(config)
        central = None
        if isinstance(setup, DpFedAvgSetup) and setup.private and setup.central_noise == "discrete":
            built = silo_model(model, info)  # what the silos' steps add noise to
            from pdpfl.models import num_parameters

            d = num_parameters(built)
            noise = setup.noise(d)
            central = noise.summary() if hasattr(noise, "summary") else None
        return FedAvgServer(
            initial_params(model, info),
            client_rate=config.training.client_rate,
            randomness=randomness,
            server_lr=self.server_lr,
            central_noise=central,
        )

    def client(
        self,
        config: ExperimentConfig,
        client_id: int,
        data: ClientData,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> DpFedAvgSilo:
        if not isinstance(setup, DpFedAvgSetup):
            raise TypeError(f"{self.name}: expected a DpFedAvgSetup, got {type(setup).__name__}")
        n = len(data.y_train)
        batch = config.training.batch_size_for(client_id)
        weight = 1.0
        if self.weighting == "num_examples":
            if info.silo_sizes is None:
                raise ValueError(
                    "algorithm.weighting: num_examples needs data.public_silo_sizes: true"
                )
            weight = float(info.silo_sizes[client_id])
        tr = config.training
        return DpFedAvgSilo(
            client_id,
            silo_model(model_source(config), info),
            data,
            client_budgets(budget_source(config), client_id, data),
            setup,
            randomness=randomness,
            normalizer=batch if setup.private else None,
            weight=weight,
            allow_exclusion=config.privacy.allow_exclusion,
            epsilon_cap=config.privacy.epsilon_max,
            cap_at_epsilon_max=config.budgets.cap_at_epsilon_max,
            optimizer=tr.optimizer,
            lr=tr.lr,
            momentum=tr.momentum,
            weight_decay=tr.weight_decay,
            physical_batch_size=tr.physical_batch_size,
            nonprivate_rate=(
                min(1.0, batch / max(n, 1)) if (not setup.private and batch) else None
            ),
        )


@register_algorithm
class RpdpConfig(DpFedAvgConfig):
    """rPDP-FL (Algorithm 3): per-record rates q_ij = F(ε_ij)."""

    name: Literal["rpdp"] = "rpdp"

    summary: ClassVar[str] = "rPDP-FL: every record its own ε (two-stage sampling, certified ε→q)"

    def setup(self, config: ExperimentConfig, info: FederationInfo) -> DpFedAvgSetup:
        return personalized_setup(mechanism_spec(config))
