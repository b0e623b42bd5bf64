"""IDP-FedAvg's config section (``algorithm.name: idp-fedavg``) and its comparison methods.

The section builds the algorithm (:class:`pdpfl.fl.algorithm.Algorithm`): :meth:`setup`
publishes σ, the group rates and the clipping parameters
(:func:`~pdpfl.fl.idp_fedavg.mechanism.publish`), :meth:`server` the central or distributed
server, :meth:`client` the matching silo with the client's own ε. ``pdpfl compare`` methods:
``idp-fedavg`` (SAMPLE), ``strict`` / ``relaxed`` (everyone at ε_min / ε_max), ``scale``
(SCALE) and ``no-dp``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np
from pydantic import Field

from pdpfl.config import METHODS, ExperimentConfig, MethodSpec, PrivacyUnitName
from pdpfl.fl.algorithm import Algorithm, PublicSetup, register_algorithm
from pdpfl.fl.api import FederationInfo
from pdpfl.fl.common import (
    ModelSource,
    accountant_problems,
    initial_params,
    silo_model,
    training_device,
)
from pdpfl.fl.idp_fedavg.budgets import assign_client_budgets, client_budget
from pdpfl.fl.idp_fedavg.mechanism import IdpSetup, client_events, publish
from pdpfl.fl.idp_fedavg.server import CentralIdpServer, DistributedIdpServer, IdpFedAvgServer
from pdpfl.fl.idp_fedavg.silo import CentralIdpSilo, DistributedIdpSilo, IdpSilo

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.data.federation import ClientData, Federation
    from pdpfl.fl.environment import Environment
    from pdpfl.fl.pool import SiloPool
    from pdpfl.randomness import Randomness

__all__ = ["COMPARE_METHODS", "IdpFedAvgConfig"]

#: ``pdpfl compare --methods`` names → ``algorithm.method`` (and their help).
COMPARE_METHODS: dict[str, tuple[str, str]] = {
    "idp-fedavg": ("individual", "IDP-FedAvg: individual client sampling rates (SAMPLE)"),
    "strict": ("strict", "IDP-FedAvg baseline: every client at ε_min (uniform rate c/N)"),
    "relaxed": ("relaxed", "IDP-FedAvg baseline: every client at ε_max (uniform rate c/N)"),
    "scale": ("scale", "IDP-FedAvg baseline SCALE: per-group clip C·σ̄/σ_p, one noise σ̄·C"),
    "no-dp": ("no-dp", "IDP-FedAvg baseline: same sampling, no clipping, no noise"),
}


@register_algorithm
class IdpFedAvgConfig(Algorithm):
    """IDP-FedAvg (Algorithms 1 and 2) and its comparison methods (``method``).

    Uses ``training.rounds`` (I), ``training.optimizer/lr/momentum/weight_decay`` (the local
    optimizer; the paper: Adam, 5e-4) and ``privacy.delta``. ``training.local_steps``,
    ``training.client_rate``, ``training.batch_size``, ``privacy.noise_multiplier``/
    ``epsilon_max`` and the ``budgets`` section are record-level settings it does not use.
    """

    name: Literal["idp-fedavg"] = "idp-fedavg"
    method: Literal["individual", "strict", "relaxed", "scale", "no-dp"] = Field(
        "individual",
        description="individual: IDP-FedAvg (SAMPLE); strict/relaxed: everyone at ε_min/ε_max; "
        "scale: per-group clipping (SCALE); no-dp: no clipping, no noise",
    )
    variant: Literal["central", "distributed"] = Field(
        "central",
        description="central: trusted aggregator clips and noises (the paper); distributed: "
        "clients self-sample, clip and add noise shares (for secure summation)",
    )
    clients_per_round: float = Field(30.0, gt=0, description="c: expected sampled clients")
    group_budgets: list[float] = Field(
        default_factory=lambda: [1.0, 2.0, 3.0],
        description="ε of each privacy group (.inf for non-private clients)",
        json_schema_extra={"allow_infinity": True},
    )
    group_ratios: list[float] = Field(
        default_factory=lambda: [0.54, 0.37, 0.09], description="fraction of clients per group"
    )
    budget_file: str | None = Field(
        None, description="one ε per client (.csv/.txt one per line, .json list or .npy; inf ok)"
    )
    assignment: Literal["iid", "exact"] = Field(
        "iid",
        description="iid: each client draws its group with the ratios (flidp); exact: the "
        "counts are the ratios × N (largest remainder), shuffled",
    )
    rate_fractions: Literal["realized", "nominal"] = Field(
        "realized", description="group fractions entering SAMPLE: realized counts or the ratios"
    )
    nonprivate_rate: float = Field(1.0, gt=0, le=1, description="q of ε = ∞ clients")
    sample_tolerance: float = Field(
        1e-3, gt=0, lt=0.5, description="relative tolerance of SAMPLE's mean rate vs c/N"
    )
    local_epochs: int = Field(15, ge=1, le=10_000, description="E local epochs")
    local_batch_size: int = Field(128, ge=1, description="local minibatch size")
    local_training: Literal["auto", "batched", "loop"] = Field(
        "auto",
        description="batched: the sampled clients of a process as one vmap computation; loop: "
        "one client at a time; auto: loop for conv nets on CPU (faster there), else batched",
    )
    clipping: Literal["adaptive", "fixed"] = "adaptive"
    initial_clip: float = Field(0.1, gt=0, description="C_0 (fixed clipping: C)")
    target_quantile: float = Field(0.5, gt=0, lt=1, description="γ")
    clip_lr: float = Field(0.2, gt=0, description="η_C of the geometric update")
    count_noise_ratio: float = Field(0.05, gt=0, description="σ_b = ratio × c")
    server_lr: float = Field(1.0, gt=0, description="η_s")
    tolerated_dropouts: int | None = Field(
        None,
        description="removed: the distributed variant sizes every noise share for the "
        "t = max(secure.min_survivors, ceil(secure.threshold * N)) clients any released sum "
        "holds (N - t dropouts tolerated); set secure.threshold instead",
    )

    unit: ClassVar[PrivacyUnitName] = "client"
    summary: ClassVar[str] = (
        "IDP-FedAvg: every client its own ε (individual client sampling rates, SAMPLE)"
    )
    setup_type: ClassVar[type[PublicSetup]] = IdpSetup
    #: The central variant's server adds exact discrete noise under ``privacy.central_noise:
    #: discrete`` (:mod:`pdpfl.fl.idp_fedavg.central_discrete`).
    supports_central_discrete: ClassVar[bool] = True
    #: ``--set`` overrides turning pdpfl's toy config (3 digits silos, 2 rounds) into a toy run.
    toy_overrides: ClassVar[tuple[str, ...]] = (
        "algorithm.clients_per_round=2",
        "algorithm.group_budgets=[2.0,8.0]",
        "algorithm.group_ratios=[0.5,0.5]",
        "algorithm.assignment=exact",
        "algorithm.local_epochs=1",
        "algorithm.local_batch_size=8",
        "algorithm.count_noise_ratio=1.0",
    )

    def check(self, config: ExperimentConfig) -> list[str]:
        problems: list[str] = []
        if len(self.group_budgets) != len(self.group_ratios):
            problems.append(
                "algorithm.group_ratios: one ratio per entry of algorithm.group_budgets "
                f"({len(self.group_ratios)} vs {len(self.group_budgets)})"
            )
        if any(not (b > 0) for b in self.group_budgets):
            problems.append("algorithm.group_budgets: every ε must be > 0 (.inf = non-private)")
        if len(set(self.group_budgets)) != len(self.group_budgets):
            problems.append("algorithm.group_budgets: budgets must be distinct")
        if any(not (r >= 0 and math.isfinite(r)) for r in self.group_ratios) or not math.isclose(
            sum(self.group_ratios), 1.0, abs_tol=1e-6
        ):
            problems.append("algorithm.group_ratios: must be finite, >= 0 and sum to 1")
        if self.tolerated_dropouts is not None:
            problems.append(
                "algorithm.tolerated_dropouts: removed -- the distributed variant now sizes each "
                "noise share sigma_v^2 C^2 / t for t = max(secure.min_survivors, "
                "ceil(secure.threshold * N)) of the N clients (N - t dropouts tolerated, rounds "
                "with fewer than t contributions are not aggregated); set secure.threshold in "
                "(1/2, 1] instead (e.g. 0.9 tolerates 10 % dropouts) and delete this field"
            )
        if self.variant == "central" and config.aggregation != "plain":
            problems.append(
                "algorithm.variant: central IDP-FedAvg clips each client's update at the "
                f"aggregator, which the {config.aggregation!r} protocol hides; use variant: "
                "distributed (clients clip and add noise shares) or aggregation: plain"
            )
        if self.variant == "central" and config.privacy.adversary == "server":
            problems.append(
                "privacy.adversary: the central variant trusts the aggregator (it sees clipped "
                "updates); its guarantee is against third parties -- use third-party/both, or "
                "variant: distributed with secure aggregation"
            )
        n = config.data.num_clients
        if n is not None and self.clients_per_round > n:
            problems.append(
                f"algorithm.clients_per_round: c = {self.clients_per_round:g} exceeds the "
                f"{n} clients (data.num_clients)"
            )
        finite = [b for b in self.group_budgets if math.isfinite(b)]
        if (
            self.method in ("strict", "relaxed", "scale")
            and not finite
            and self.budget_file is None
        ):
            problems.append(f"algorithm.method: {self.method} needs at least one finite budget")
        central_discrete = config.privacy.central_noise == "discrete"
        if central_discrete and self.variant == "distributed":
            problems.append(
                "privacy.central_noise: discrete is the central variant's server noise; the "
                "distributed variant's clients add noise shares (privacy.noise_shares: discrete "
                "makes them exact discrete Gaussians) -- set privacy.central_noise: continuous "
                "or algorithm.variant: central"
            )
        if self.method != "no-dp":  # SAMPLE's calibration and every client ledger use it
            events = client_events(config, self.variant)
            what = "IDP-FedAvg (a client)"
            if central_discrete and self.variant == "central":
                from pdpfl.fl.idp_fedavg.sample import client_plan

                central = client_plan(1.0, config.privacy.delta, config.training.rounds, "discrete")
                events = [*events, central.round_event(np.array([0.5]), "third-party")]
                what += " with central discrete noise (or set privacy.central_noise: continuous)"
            if self.variant == "distributed" and config.privacy.noise_shares == "discrete":
                from pdpfl.privacy.discrete_plan import SampledDiscreteGaussianPlan

                plan = SampledDiscreteGaussianPlan.for_multiplier(
                    "client", 1.0, 2, 1e6, 16, config.privacy.delta, config.training.rounds
                )
                events = [*events, plan.round_event(np.array([0.5]), "third-party")]
                what += " with discrete noise shares (or set privacy.noise_shares: continuous)"
            problems += accountant_problems(config.privacy.accountant, events, what)
        return problems

    # -- building the algorithm ---------------------------------------------------------------
    def setup(self, config: ExperimentConfig, info: FederationInfo) -> IdpSetup:
        """Algorithm 2, lines 1-3 (public; the configuration and the number of clients only).
        Discrete shares that cannot work (bit width, wrap, inflation) are refused here, and
        SAMPLE's rates are re-fitted to the discrete plan (:func:`~pdpfl.fl.idp_fedavg.
        discrete.refit_rates`)."""
        from pdpfl.fl.idp_fedavg.discrete import refit_rates

        # discrete shares: refused here when they cannot work; rates fitted to their plan
        setup: IdpSetup = refit_rates(publish(self, config, info))
        return setup

    def server(
        self,
        config: ExperimentConfig,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> IdpFedAvgServer:
        pub = _as_setup(setup)
        if pub.variant == "central":
            budgets = assign_client_budgets(self, config.seed, info.num_clients)
            groups = np.array([pub.group_of(float(b)) for b in budgets], dtype=np.int64)
            return CentralIdpServer(
                initial_params(
                    ModelSource.of(config.model, seed=config.seed, device=config.training.device),
                    info,
                ),
                pub,
                client_groups=groups,
                randomness=randomness,
            )
        return DistributedIdpServer(
            initial_params(
                ModelSource.of(config.model, seed=config.seed, device=config.training.device), info
            ),
            pub,
            client_groups=None,
            randomness=randomness,
        )

    def build_pool(
        self, config: ExperimentConfig, federation: Federation, env: Environment
    ) -> tuple[IdpFedAvgServer, SiloPool] | None:
        """The central variant in the in-process simulator: the server and the N clients as one
        :class:`~pdpfl.fl.idp_fedavg.pool.CentralClientPool` (one ledger row per client, a silo
        built only when sampled). The distributed variant asks every client every round (each
        flips its own coin): it keeps one silo per client (None here)."""
        from pdpfl.fl.idp_fedavg.pool import CentralClientPool
        from pdpfl.randomness import make_randomness

        setup = self.setup(config, env.info)
        pub = _as_setup(setup)
        if pub.variant != "central":
            return None
        server = self.server(config, env.info, setup, env.randomness["server"])
        training_device(config.training.device)  # the model is built lazily: check the device now
        budgets = assign_client_budgets(self, config.seed, env.info.num_clients)
        factory = partial(
            silo_model,
            ModelSource.of(config.model, seed=config.seed, device=config.training.device),
            env.info,
        )
        key = _model_key(config, env.info)
        clients = list(federation.clients)

        def silo(client_id: int, budget: float) -> CentralIdpSilo:
            # the client's own randomness (secure: a fresh key; reproducible: from the seed,
            # the same streams as a silo built once for the whole run)
            return CentralIdpSilo(
                client_id,
                clients[client_id],
                budget,
                pub,
                randomness=make_randomness(config.randomness, config.seed),
                model_factory=factory,
                model_key=key,
                own_ledger=False,
            )

        pool = CentralClientPool(clients, budgets, pub, silo=silo, model_factory=factory)
        return server, pool

    def client(
        self,
        config: ExperimentConfig,
        client_id: int,
        data: ClientData,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> IdpSilo:
        pub = _as_setup(setup)
        training_device(config.training.device)  # the model is built lazily: check the device now
        silo = CentralIdpSilo if pub.variant == "central" else DistributedIdpSilo
        return silo(
            client_id,
            data,
            client_budget(self, config.seed, info.num_clients, client_id),  # at the client
            pub,
            randomness=randomness,
            model_factory=partial(
                silo_model,
                ModelSource.of(config.model, seed=config.seed, device=config.training.device),
                info,
            ),
            model_key=_model_key(config, info),
        )


def _model_key(config: ExperimentConfig, info: FederationInfo) -> str:
    """Equal for clients whose models share one architecture (they may train in one batch)."""
    return json.dumps(
        [config.model.name, dict(config.model.options), list(info.input_shape), info.num_classes],
        sort_keys=True,
        default=str,
    )


def _as_setup(setup: PublicSetup) -> IdpSetup:
    if not isinstance(setup, IdpSetup):
        raise TypeError(f"idp-fedavg: expected an IdpSetup, got {type(setup).__name__}")
    return setup


def _method_overrides(method: str) -> Callable[[str | None], list[str]]:
    def overrides(_arg: str | None) -> list[str]:
        return ["algorithm.name=idp-fedavg", f"algorithm.method={method}"]

    return overrides


for _name, (_method, _help) in COMPARE_METHODS.items():
    METHODS.register(_name, MethodSpec(_name, _method_overrides(_method), _help), replace=True)
