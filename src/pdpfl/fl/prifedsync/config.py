"""PriFedSync's config section (``algorithm.name: prifedsync``), which builds the algorithm.

The section holds the paper's knobs (sampler, α of Eq. 2.1, η, per-client targets) and builds
the published :class:`~pdpfl.fl.prifedsync.mechanism.PriFedSyncSetup`, the
:class:`~pdpfl.fl.prifedsync.server.PriFedSyncServer` and each
:class:`~pdpfl.fl.prifedsync.silo.PriFedSyncSilo` from the silo's own data. It also states the
run's neighbouring relation (:attr:`PriFedSyncConfig.neighbouring`): replace one record of one
client with batches drawn without replacement, add/remove one with Poisson batches.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator

from pdpfl.config import ExperimentConfig, PrivacyUnitName
from pdpfl.fl.algorithm import Algorithm, PublicSetup, register_algorithm
from pdpfl.fl.api import FederationInfo
from pdpfl.fl.common import ModelSource, accountant_problems, initial_params, silo_model
from pdpfl.fl.prifedsync.mechanism import (
    Accounting,
    PriFedSyncSetup,
    Sampler,
    client_events,
    client_target,
    neighbouring,
    public_setup,
)
from pdpfl.fl.prifedsync.server import PriFedSyncServer
from pdpfl.fl.prifedsync.silo import PriFedSyncSilo

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.data.federation import ClientData
    from pdpfl.randomness import Randomness

__all__ = ["PriFedSyncConfig"]


@register_algorithm
class PriFedSyncConfig(Algorithm):
    """``algorithm: {name: prifedsync, ...}`` -- see :mod:`pdpfl.fl.prifedsync`."""

    name: Literal["prifedsync"] = "prifedsync"
    sampler: Sampler = Field(
        "wor",
        description="wor: batches of exactly B records drawn uniformly without replacement "
        "(the paper's Algorithm 2); poisson: one Bernoulli(B/n) coin per record",
    )
    alpha: float = Field(
        0.1,
        ge=0,
        le=1,
        description="elastic sync: a joined client moves its local model this "
        "fraction toward the global model (Eq. 2.1)",
    )
    server_lr: float = Field(
        1.0, gt=0, le=1, description="η: global ← (1 − η)·global + η·mean of joined local models"
    )
    target_epsilon: float | list[float | None] | None = Field(
        None,
        description="per-client target ε at privacy.delta (one value, or one per client; "
        "privacy.epsilon_max is the target of every client without one)",
    )
    target_mu: float | list[float | None] | None = Field(
        None, description="per-client target μ-GDP, enforced as its (ε, δ) at privacy.delta"
    )
    calibrate: Literal["noise", "steps"] = Field(
        "noise",
        description="what a client with a target adjusts: its noise σ_j or its local "
        "steps K_j (≤ training.local_steps, at privacy.noise_multiplier)",
    )
    local_epoch: bool = Field(
        False,
        description="K_j = min(training.local_steps, ⌈n_j/B⌉): one local epoch per "
        "round (computed at the silo from its own n_j, as in the paper's §4)",
    )
    planned_rounds: int | None = Field(
        None,
        ge=1,
        description="participations a target is calibrated for (default: all "
        "training.rounds); the ledger stops a client before it would exceed its target",
    )
    budget_accounting: Accounting = Field(
        "rigorous",
        description="rigorous: RDP bound (WOR: Wang et al. 2019 Thm 9); clt: the "
        "paper's Theorem 2 μ (an approximation that can under-report)",
    )
    evaluate: Literal["local", "global"] = Field(
        "local",
        description="what each silo's evaluation reply measures on its test split: its "
        "personalized local model (the paper's metric) or the global model",
    )

    unit: ClassVar[PrivacyUnitName] = "record"
    summary: ClassVar[str] = "PriFedSync: personalized local models, elastic sync, federated f-DP"
    setup_type: ClassVar[type[PublicSetup]] = PriFedSyncSetup
    #: Every local step can add the exact central discrete Gaussian (``privacy.central_noise:
    #: discrete``; LocalStepsPlan(noise="discrete"), rdp only).
    supports_central_discrete: ClassVar[bool] = True

    @property
    def neighbouring(self) -> str:
        """The run's neighbouring relation (read by the run summary)."""
        return neighbouring(self.sampler)

    @field_validator("target_epsilon", "target_mu")
    @classmethod
    def _positive_targets(cls, value: Any) -> Any:
        values = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not value:
            raise ValueError("expected a number > 0 or a non-empty list (one per client)")
        for v in values:
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"every target must be a finite number > 0 (or null), got {v}")
        return value

    def targets_given(self) -> bool:
        return self.target_epsilon is not None or self.target_mu is not None

    def check(self, config: ExperimentConfig) -> list[str]:
        problems = []
        tr, pv = config.training, config.privacy
        if tr.batch_size is None:
            problems.append(
                "training.batch_size: required -- the public batch size B (records per step, "
                "and the constant dividing each noisy sum); one value or one per client"
            )
        elif self.sampler == "wor":
            values = tr.batch_size if isinstance(tr.batch_size, list) else [tr.batch_size]
            if any(float(v) != int(v) for v in values):
                problems.append(
                    "training.batch_size: batches drawn without replacement have a whole number "
                    f"of records; got {tr.batch_size}"
                )
        if self.target_epsilon is not None and self.target_mu is not None:
            problems.append("algorithm: set only one of target_epsilon and target_mu")
        if pv.epsilon_max is not None and pv.noise_multiplier is not None:
            problems.append(
                "privacy: set only one of privacy.noise_multiplier and privacy.epsilon_max (the "
                "target ε of every client without its own algorithm.target_epsilon/target_mu)"
            )
        targets = self.target_epsilon if self.target_epsilon is not None else self.target_mu
        per_client = targets if isinstance(targets, list) else [targets]
        some_without = not self.targets_given() or None in per_client
        needs_sigma = self.calibrate == "steps" or (some_without and pv.epsilon_max is None)
        if needs_sigma and pv.noise_multiplier is None:
            problems.append(
                "privacy.noise_multiplier: required (σ: noise std σ·C per step) unless every "
                "client has a target (algorithm.target_epsilon / target_mu, or privacy."
                "epsilon_max for all) and algorithm.calibrate is noise"
            )
        if self.planned_rounds is not None and self.planned_rounds > tr.rounds:
            problems.append(
                f"algorithm.planned_rounds: at most training.rounds ({tr.rounds}), got "
                f"{self.planned_rounds}"
            )
        n = config.data.num_clients
        for field in ("target_epsilon", "target_mu"):
            value = getattr(self, field)
            if isinstance(value, list) and n is not None and len(value) != n:
                problems.append(
                    f"algorithm.{field}: {len(value)} values for {n} clients (data.num_clients)"
                )
        discrete = pv.central_noise == "discrete"
        if discrete and self.budget_accounting == "clt":
            problems.append(
                "algorithm.budget_accounting: clt is Theorem 2's central-limit μ of the Gaussian "
                "mechanism; with privacy.central_noise: discrete the steps add the exact discrete "
                "Gaussian, which has no proven μ-GDP bound (its trade-off function is not the "
                "Gaussian's G_μ), so no GDP number is stated for it -- use "
                "budget_accounting: rigorous (rdp) or privacy.central_noise: continuous"
            )
        # the rigorous accountant of every client's ledger (and calibration, unless clt)
        what = f"prifedsync with sampler: {self.sampler} (a record)"
        if discrete:
            what += " with central discrete noise (or set privacy.central_noise: continuous)"
        problems += accountant_problems(config.privacy.accountant, client_events(config), what)
        return problems

    # -- building the algorithm --------------------------------------------------------------
    def setup(self, config: ExperimentConfig, info: FederationInfo) -> PriFedSyncSetup:
        """The published setup (configuration only; each client calibrates at its silo)."""
        return public_setup(config, info)

    def server(
        self,
        config: ExperimentConfig,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> PriFedSyncServer:
        model_source = ModelSource.of(config.model, seed=config.seed, device=config.training.device)
        central = None
        if isinstance(setup, PriFedSyncSetup) and setup.central_noise == "discrete":
            from pdpfl.privacy.noise import CentralDiscreteGaussianNoise

            # the grid of the clients' steps (σ_j is each client's own; shown at σ = 1)
            model = silo_model(model_source, info)
            from pdpfl.models import num_parameters

            d = num_parameters(model)
            grid = CentralDiscreteGaussianNoise(1.0, setup.max_grad_norm, d).summary()
            grid.pop("noise_multiplier")
            grid.pop("variance")
            grid["noise_multiplier"] = "each client's own σ_j (its ledger)"
            central = grid
        return PriFedSyncServer(
            initial_params(model_source, info), server_lr=self.server_lr, central_noise=central
        )

    def client(
        self,
        config: ExperimentConfig,
        client_id: int,
        data: ClientData,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> PriFedSyncSilo:
        """One client, from its own data, the published setup and its own randomness."""
        if not isinstance(setup, PriFedSyncSetup):
            raise TypeError(f"prifedsync: expected a PriFedSyncSetup, got {type(setup).__name__}")
        tr = config.training
        batch = tr.batch_size_for(client_id)
        if batch is None:
            raise ValueError("training.batch_size: required (the public batch size B)")
        return PriFedSyncSilo(
            client_id,
            silo_model(
                ModelSource.of(config.model, seed=config.seed, device=config.training.device), info
            ),
            data,
            setup,
            randomness=randomness,
            batch_size=batch,
            target_epsilon=client_target(config, client_id),
            optimizer=tr.optimizer,
            lr=tr.lr,
            momentum=tr.momentum,
            weight_decay=tr.weight_decay,
            physical_batch_size=tr.physical_batch_size,
        )
