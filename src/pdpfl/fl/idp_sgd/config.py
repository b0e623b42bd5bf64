"""The ``idp-sgd-scale`` config section (IDP-SGD Scale): it builds the setup, server, silos.

Built through the public extension points only: :func:`~pdpfl.fl.algorithm.register_algorithm`
on an :class:`~pdpfl.fl.algorithm.Algorithm`, a :class:`~pdpfl.fl.template.Silo` and a
:class:`~pdpfl.fl.api.ServerAlgorithm` (no other algorithm package is imported).
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
    silo_model,
)
from pdpfl.fl.idp_sgd.mechanism import ScaleSetup, round_events, scale_setup
from pdpfl.fl.idp_sgd.server import ScaleServer
from pdpfl.fl.idp_sgd.silo import ScaleSilo
from pdpfl.privacy.noise import CentralDiscreteGaussianNoise

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.data.federation import ClientData
    from pdpfl.randomness import Randomness

__all__ = ["ScaleConfig"]


@register_algorithm
class ScaleConfig(Algorithm):
    """Individualized DP-SGD's Scale: one rate q, one noise σC, a clip norm C_p per group."""

    name: Literal["idp-sgd-scale"] = "idp-sgd-scale"
    sampling_rate: float = Field(
        ..., gt=0, le=1, description="q: every record's Poisson rate in every local step"
    )
    groups: list[float] | None = Field(
        None,
        min_length=1,
        description="the public budget groups ε_p (each ≤ privacy.epsilon_max); default: "
        "grid_points budgets, geometric from the scenario's public minimum to ε_max",
    )
    grid_points: int = Field(6, ge=1, le=64, description="groups of the default grid")
    server_lr: float = Field(1.0, gt=0, description="η_s: x ← x + η_s · mean(Δx)")

    summary: ClassVar[str] = "Scale (IDP-SGD): every budget group its own clip norm, one noise"
    setup_type: ClassVar[type[PublicSetup]] = ScaleSetup
    supports_central_discrete: ClassVar[bool] = True
    toy_overrides: ClassVar[tuple[str, ...]] = ("algorithm.sampling_rate=0.2",)

    def check(self, config: ExperimentConfig) -> list[str]:
        problems = []
        if config.privacy.epsilon_max is None or config.privacy.noise_multiplier is not None:
            problems.append(
                "privacy.epsilon_max: idp-sgd-scale needs ε_max (the top group, clipped at "
                "training.max_grad_norm; σ is its noise) and no privacy.noise_multiplier"
            )
        if config.training.batch_size is None:
            problems.append(
                "training.batch_size: required by idp-sgd-scale -- the public expected batch "
                "size B that divides each step's noisy sum"
            )
        if any(g <= 0 for g in self.groups or ()):
            problems.append("algorithm.groups: every group's ε must be > 0")
        return problems + accountant_problems(
            config.privacy.accountant,
            round_events(config, self.sampling_rate),
            "idp-sgd-scale (a record)",
        )

    def setup(self, config: ExperimentConfig, info: FederationInfo) -> ScaleSetup:
        return scale_setup(config, self.sampling_rate, self.groups, self.grid_points)

    def server(
        self,
        config: ExperimentConfig,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> ScaleServer:
        central = None
        if isinstance(setup, ScaleSetup) and setup.central_noise == "discrete":
            model = silo_model(
                ModelSource.of(config.model, seed=config.seed, device=config.training.device), info
            )  # what the silos' steps add noise to
            from pdpfl.models import num_parameters

            noise = setup.noise(num_parameters(model))
            central = noise.summary() if isinstance(noise, CentralDiscreteGaussianNoise) else None
        return ScaleServer(
            initial_params(
                ModelSource.of(config.model, seed=config.seed, device=config.training.device), info
            ),
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
    ) -> ScaleSilo:
        if not isinstance(setup, ScaleSetup):
            raise TypeError(f"idp-sgd-scale: expected a ScaleSetup, got {type(setup).__name__}")
        tr = config.training
        return ScaleSilo(
            client_id,
            silo_model(
                ModelSource.of(config.model, seed=config.seed, device=config.training.device), info
            ),
            data,
            client_budgets(BudgetSource.of(config.budgets, seed=config.seed), client_id, data),
            setup,
            randomness=randomness,
            normalizer=tr.batch_size_for(client_id),
            allow_exclusion=config.privacy.allow_exclusion,
            optimizer=tr.optimizer,
            lr=tr.lr,
            momentum=tr.momentum,
            weight_decay=tr.weight_decay,
            physical_batch_size=tr.physical_batch_size,
        )
