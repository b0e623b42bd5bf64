"""rPDP-FL's config section (``algorithm.name: rpdp``) and the DP-FedAvg family it heads.

:class:`DpFedAvgConfig` holds what rPDP-FL and its baselines share (weighting, η_s, the checks)
and builds the shared server and silo; each concrete algorithm only says what it publishes
(:meth:`~pdpfl.fl.algorithm.Algorithm.setup`): rPDP-FL the personalized estimator F
(:func:`~pdpfl.fl.rpdp.mechanism.personalized_setup`), the baselines a uniform rate or no DP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from pdpfl.config import ExperimentConfig
from pdpfl.fl.algorithm import Algorithm, PublicSetup, register_algorithm
from pdpfl.fl.api import FederationInfo
from pdpfl.fl.common import (
    accountant_problems,
    client_budgets,
    initial_params,
    noise_source_problems,
    silo_model,
)
from pdpfl.fl.rpdp.checks import check_budget_mix
from pdpfl.fl.rpdp.mechanism import DpFedAvgSetup, personalized_setup, round_events
from pdpfl.fl.rpdp.server import FedAvgServer
from pdpfl.fl.rpdp.silo import DpFedAvgSilo

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.data.federation import ClientData, Federation
    from pdpfl.randomness import Randomness

__all__ = ["DpFedAvgConfig", "RpdpConfig"]


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
            problems += noise_source_problems(config, "σ such that q = 1 spends ε_max")
            problems += self.accountant_problems(config)
        return problems

    def accountant_problems(self, config: ExperimentConfig) -> list[str]:
        """``privacy.accountant`` must interpret the two-stage round every record is charged
        (calibration, σ from ε_max and the silos' ledgers all use it)."""
        return accountant_problems(config, round_events(config), f"{self.name} (a record)")

    def algorithm_checks(self, config: ExperimentConfig, federation: Federation) -> list[str]:
        """Each silo can keep the configured budget mix (after the shared checks)."""
        if self.private:
            check_budget_mix(config, list(federation.clients))
        return []

    def server(
        self,
        config: ExperimentConfig,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> FedAvgServer:
        central = None
        if isinstance(setup, DpFedAvgSetup) and setup.private and setup.central_noise == "discrete":
            model = silo_model(config, info)  # what the silos' steps add noise to
            d = sum(p.numel() for p in model.parameters() if p.requires_grad)
            noise = setup.noise(d)
            central = noise.summary() if hasattr(noise, "summary") else None
        return FedAvgServer(
            initial_params(config, info),
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
            silo_model(config, info),
            data,
            client_budgets(config, client_id, data),
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
        return personalized_setup(config)
