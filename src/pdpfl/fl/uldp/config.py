"""ULDP-FL's config sections: one registered :class:`~pdpfl.fl.algorithm.Algorithm` per variant.

``algorithm.name``: ``uldp-naive`` (Algorithm 1, Theorem 3), ``uldp-group`` (Algorithm 2,
Theorem 4), ``uldp-avg`` / ``uldp-sgd`` (Algorithms 3-4, Theorem 5) and ``uldp-default``
(FedAvg without DP). All share one set of fields (so that ``pdpfl compare`` can switch between
them on one config); each variant uses the ones its docstring names and builds its own setup,
server and silos. The ``compare`` methods of the paper's comparison (``uldp-avg-w``,
``uldp-sgd-ws:Q``, ``puldp-avg``, ...) are registered here too. Formula and deviation numbers
refer to ``docs/uldp_spec.md`` (Part A).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar

import numpy as np
from pydantic import Field

from pdpfl.config import ExperimentConfig, PrivacyUnitName
from pdpfl.fl.aggregation.threshold import share_threshold
from pdpfl.fl.algorithm import Algorithm, PublicSetup, register_algorithm
from pdpfl.fl.api import FederationInfo
from pdpfl.fl.common import (
    ModelSource,
    accountant_problems,
    initial_params,
    noise_source_problems,
    silo_model,
)
from pdpfl.fl.uldp import discrete
from pdpfl.fl.uldp.mechanism import (
    GroupSetup,
    UldpSetup,
    UserLevelSetup,
    need_histogram,
    noise_multiplier,
    num_users,
    planned_budgets,
    public_histogram,
    setup_fields,
    user_budgets,
    user_plan,
    user_rates,
)
from pdpfl.fl.uldp.server import (
    AvgServer,
    DefaultServer,
    GroupServer,
    NaiveServer,
    SamplingServer,
    SgdServer,
    UldpServer,
)
from pdpfl.fl.uldp.silo import DefaultSilo, GroupSilo, NaiveSilo, UldpSilo
from pdpfl.fl.uldp.users import AvgSilo, SgdSilo, UserLevelSilo
from pdpfl.fl.uldp.weights import (
    enhanced_weights,
    fair_group_quotas,
    resolve_group_k,
    split_group_quotas,
)
from pdpfl.privacy.mechanisms import Mechanism
from pdpfl.privacy.noise import CentralDiscreteGaussianNoise, GaussianNoise
from pdpfl.privacy.uldp import UserLevelPlan, user_epsilon
from pdpfl.privacy.uldp_central import DiscreteGroupPlan, naive_discrete_plan
from pdpfl.privacy.uldp_discrete import DiscreteUserLevelPlan
from pdpfl.privacy.unit import GroupPlan

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.data.federation import ClientData
    from pdpfl.fl.aggregation.discrete_shares import ShareEncoding
    from pdpfl.randomness import Randomness

__all__ = [
    "UldpAvgConfig",
    "UldpConfig",
    "UldpDefaultConfig",
    "UldpGroupConfig",
    "UldpNaiveConfig",
    "UldpSgdConfig",
    "UserLevelConfig",
]

SiloT = TypeVar("SiloT", bound=UldpSilo)

#: Turn pdpfl.testing.TOY_CONFIG (3 digits silos, 2 rounds) into a user-level toy run.
_TOY = ("data.options.num_users=12",)


class UldpConfig(Algorithm):
    """Fields shared by every ULDP-FL algorithm (each uses the ones its docstring names)."""

    local_epochs: int = Field(
        1,
        ge=1,
        le=100_000,
        description="Q: local epochs per user (AVG) or per silo (NAIVE, "
        "DEFAULT); ULDP-SGD takes one mean gradient per user",
    )
    server_lr: float | None = Field(
        None,
        gt=0,
        description="η_g, the global learning rate; default: the paper's choice, "
        "10 for AVG/SGD (Remark 2: |S|-times larger than FedAvg's) and 1 otherwise",
    )
    weights: Literal["uniform", "enhanced", "private"] = Field(
        "uniform",
        description="AVG/SGD user weights: uniform w = 1/|S|; enhanced w = n_{s,u}/N_u "
        "(Eq. 4; needs data.public_user_histograms: true -- discloses the histograms); or "
        "private: the same n_{s,u}/N_u computed by the private weighting protocol (Protocol 1: "
        "Paillier + masking; no histogram leaves a silo, the server sees only the sum)",
    )
    user_rate: float | None = Field(
        None,
        gt=0,
        le=1,
        description="q: user-level Poisson sub-sampling (Alg. 4, AVG/SGD); "
        "None = every user every round",
    )
    subsampling: Literal["server", "private"] = Field(
        "server",
        description="AVG/SGD with user_rate: who draws the user sample -- the server "
        "(Alg. 4; it learns who was sampled and is accounted without amplification) or private "
        "(Sec. 4.1: 1-out-of-P oblivious transfer of Paillier-encrypted weights; needs weights: "
        "private and user_rate a multiple of 1/ot_items; the server is accounted like a third "
        "party)",
    )
    ot_items: int = Field(
        10,
        ge=2,
        le=1000,
        description="P: items per user of the private sub-sampling's "
        "oblivious transfer (q must be a multiple of 1/P; server cost linear in P·|U|)",
    )
    personal_budgets: bool = Field(
        False,
        description="AVG/SGD: each user's own ε_u (the budgets section, drawn over "
        "users) enforced through per-user sampling rates q_u and the server's user ledger",
    )
    sensitivity: Literal["rigorous", "paper"] = Field(
        "rigorous",
        description="NAIVE: rigorous 2|S|C (default) or the paper's |S|C (the "
        "honest ε is then reported, with a warning)",
    )
    group_k: Annotated[int, Field(ge=1)] | Literal["max", "median"] = Field(
        8,
        description="GROUP: records kept per user across silos (an integer, max or median "
        "of N_u; max/median need data.public_user_histograms)",
    )
    group_flags: Literal["fair", "split"] = Field(
        "split",
        description="GROUP: fair = round-robin over the silos holding the user's "
        "records (needs the histograms); split = data-independent share ⌈k/|S|⌉ per silo",
    )
    group_conversion: Literal["best", "rdp", "dp"] = Field(
        "best", description="GROUP: Lemma 9 (rdp), Lemma 8 (dp) or the smaller (best)"
    )
    record_rate: float | None = Field(
        None,
        gt=0,
        le=1,
        description="GROUP: public per-record Poisson rate of the silos' "
        "DP-SGD (τ = training.local_steps steps per round)",
    )

    unit: ClassVar[PrivacyUnitName] = "user"
    toy_overrides: ClassVar[tuple[str, ...]] = _TOY
    setup_type: ClassVar[type[PublicSetup]] = UldpSetup
    #: η_g when ``server_lr`` is not set (spec A.5.4).
    default_server_lr: ClassVar[float] = 1.0
    #: What the exact central discrete noise is added to (``summary.json``'s central_noise).
    central_noise_site: ClassVar[str] = ""

    # -- checks ----------------------------------------------------------------------------
    def check(self, config: ExperimentConfig) -> list[str]:
        problems: list[str] = []
        tr, data = config.training, config.data
        if tr.client_rate != 1.0:
            problems.append(
                "training.client_rate: ULDP-FL trains every silo every round (the server divides "
                "by |S|); set 1.0"
            )
        if config.aggregation != "plain" and self.weights == "private":
            problems.append(
                "aggregation: algorithm.weights: private runs its own protocol (which includes "
                "secure summation); leave aggregation: plain"
            )
        if self.private and dict(data.options).get("num_users") is None:
            problems.append(
                "data.options.num_users: required by user-level DP (the public number of users "
                "|U|, linked across silos)"
            )
        what = self.histogram_need()
        if what is not None and not data.public_user_histograms:
            problems.append(
                f"{what} need every silo's per-user record counts, which plain aggregation "
                "discloses to the server; set data.public_user_histograms: true to accept that "
                "(or use uniform weights / group_flags: split with an integer group_k)"
            )
        if self.subsampling == "private" and not isinstance(self, UserLevelConfig):
            problems.append(
                f"algorithm.subsampling: private is for uldp-avg / uldp-sgd, not {self.name!r}"
            )
        if not self.private:
            return problems + self.variant_problems(config)
        problems += noise_source_problems(
            config.privacy, "σ such that the planned user-level ε is ε_max"
        )
        what = f"{self.name} (a user)"
        if isinstance(self, UserLevelConfig) and (
            self.discrete_shares(config) or self.weighting_discrete(config)
        ):
            what += " with discrete noise shares (or set privacy.noise_shares: continuous)"
        problems += accountant_problems(config.privacy.accountant, self.round_events(config), what)
        return problems + self.variant_problems(config)

    def round_events(self, config: ExperimentConfig) -> list[Mechanism]:
        """The events the users' ledger charges per round (nominal σ and rate): the
        user-level Poisson-subsampled Gaussian, per observer; and the third party's round as
        the calibrations evaluate it (σ from ε_max, personal rates: the equivalent plan)."""
        plan = UserLevelPlan(1.0, 1.0, config.privacy.delta, config.training.rounds)
        q = np.array([0.5])
        return [plan.round_event(q, obs) for obs in plan.observers] + [
            plan.as_training_plan().round_event(q, "third-party")
        ]

    def histogram_need(self) -> str | None:
        """What of this variant's configuration needs the disclosed histograms (None: nothing)."""
        return None

    def variant_problems(self, config: ExperimentConfig) -> list[str]:
        """This variant's own checks (default: the AVG/SGD-only options are refused)."""
        problems = []
        if self.weights == "private":
            problems.append("algorithm.weights: private applies to uldp-avg and uldp-sgd only")
        if self.personal_budgets:
            problems.append("algorithm.personal_budgets: applies to uldp-avg and uldp-sgd only")
        return problems

    # -- shared builders -------------------------------------------------------------------
    def server_learning_rate(self) -> float:
        """η_g: ``server_lr``, else the paper's per-method value (spec A.5.4)."""
        return float(self.server_lr) if self.server_lr is not None else self.default_server_lr

    # -- the noise, described once (pdpfl.privacy.noise) -----------------------------------
    def noise_for(
        self, sigma: float, max_grad_norm: float, num_silos: int, survivors: int = 0
    ) -> GaussianNoise | None:
        """What the silos add for the configured σ (None: no DP); ``survivors`` is the t each
        silo's share is sized for (0: |S|)."""
        return None

    def noise(self, setup: UldpSetup) -> GaussianNoise | None:
        """The published setup's noise: what every silo draws from
        (:func:`pdpfl.dp.noise.add_noise`) and what the server's user-level plan is built from
        (:meth:`observer_noise`)."""
        return self.noise_for(
            setup.noise_multiplier,
            setup.max_grad_norm,
            setup.num_silos,
            int(getattr(setup, "survivors", 0)),
        )

    def observer_noise(self, noise: GaussianNoise) -> tuple[float, float]:
        """(σ_tp, σ_sv): the noise multipliers a third party and the server see per round under
        plain aggregation (the sum's σ for both unless the variant says otherwise)."""
        return noise.noise_multiplier, noise.noise_multiplier

    # -- exact central discrete noise (privacy.central_noise: discrete) ----------------------
    def central_discrete(self, config: ExperimentConfig) -> bool:
        """The silos add exact central discrete Gaussian noise (``privacy.central_noise:
        discrete``; NAIVE and GROUP, :mod:`pdpfl.privacy.uldp_central`)."""
        return self.private and config.privacy.central_noise == "discrete"

    def discrete_noise(
        self, setup: UldpSetup, dimension: int
    ) -> CentralDiscreteGaussianNoise | None:
        """What each silo adds with ``privacy.central_noise: discrete`` on the grid of the
        ``dimension`` model coordinates (None: the variant adds no central noise)."""
        return None

    def silo_noise(
        self, config: ExperimentConfig, info: FederationInfo, setup: UldpSetup
    ) -> GaussianNoise | CentralDiscreteGaussianNoise | None:
        """The noise every silo draws (and the server's plan is built from): :meth:`noise`, or
        the exact discrete noise of :meth:`discrete_noise` with ``privacy.central_noise:
        discrete``."""
        if self.central_discrete(config):
            noise = self.discrete_noise(setup, discrete.model_size(config, info))
            if noise is not None:
                return noise
        return self.noise(setup)

    def central_noise_summary(
        self, config: ExperimentConfig, info: FederationInfo, setup: UldpSetup
    ) -> dict[str, Any] | None:
        """The ``central_noise`` block of ``summary.json`` (grid, scale; None: continuous)."""
        noise = self.silo_noise(config, info, setup)
        if not isinstance(noise, CentralDiscreteGaussianNoise):
            return None
        return {**noise.summary(), "added_to": self.central_noise_site}

    def warnings(self, config: ExperimentConfig, setup: UldpSetup) -> list[str]:
        """What every run summary of this configuration must say."""
        if config.data.public_user_histograms and self.private:
            return [
                "data.public_user_histograms: every silo's per-user record counts n_(s,u) were "
                "disclosed to the server (and N_u to every silo through the weights/flags); "
                "they are not protected by the reported ε"
            ]
        return []

    def _setup(self, setup: PublicSetup, kind: type[UldpSetup]) -> Any:
        if not isinstance(setup, kind):
            raise TypeError(f"{self.name}: expected a {kind.__name__}, got {type(setup).__name__}")
        return setup

    def _server_kwargs(
        self,
        config: ExperimentConfig,
        info: FederationInfo,
        setup: UldpSetup,
        randomness: Randomness,
    ) -> dict[str, Any]:
        return dict(
            initial_params=initial_params(
                ModelSource.of(config.model, seed=config.seed, device=config.training.device), info
            ),
            setup=setup,
            server_lr=self.server_learning_rate(),
            randomness=randomness,
            warnings=self.warnings(config, setup),
        )

    def _ledger_plan(self, config: ExperimentConfig, setup: UldpSetup) -> UserLevelPlan:
        """The server's :class:`UserLevelPlan`, built from the silos' noise description
        (:meth:`noise`); under secure summation the server sees only the sum, like a third
        party."""
        noise = self.noise(setup)
        if noise is None:
            raise ValueError(f"{self.name}: adds no noise, nothing to account")
        tp, sv = self.observer_noise(noise)
        if config.aggregation == "secure":
            sv = tp
        return user_plan(setup, tp, sv)

    def _silo(
        self,
        cls: type[SiloT],
        config: ExperimentConfig,
        client_id: int,
        data: ClientData,
        info: FederationInfo,
        setup: UldpSetup,
        randomness: Randomness,
    ) -> SiloT:
        tr = config.training
        return cls(
            client_id,
            silo_model(
                ModelSource.of(config.model, seed=config.seed, device=config.training.device), info
            ),
            data,
            setup,
            randomness=randomness,
            noise=self.silo_noise(config, info, setup),
            batch_size=tr.batch_size_for(client_id),
            lr=tr.lr,
            momentum=tr.momentum,
            weight_decay=tr.weight_decay,
            optimizer=tr.optimizer,
            physical_batch_size=tr.physical_batch_size,
        )


def private_subsampling_problems(algo: UldpConfig) -> list[str]:
    """``algorithm.subsampling: private`` (Sec. 4.1): private weights, one uniform q = k/P."""
    if algo.user_rate is None or algo.personal_budgets:
        return [
            "algorithm.subsampling: private needs one user_rate q (personal budgets draw "
            "per-user rates the oblivious transfer cannot carry); set algorithm.user_rate"
        ]
    if algo.weights != "private":
        return [
            "algorithm.subsampling: private hides the sample inside the private weighting "
            f"protocol; set algorithm.weights: private (got {algo.weights!r})"
        ]
    p, q = int(algo.ot_items), float(algo.user_rate)
    k = round(q * p)
    if k < 1 or abs(q * p - k) > 1e-9:
        return [
            f"algorithm.user_rate: with subsampling: private, q must be a multiple of 1/P "
            f"= 1/{p} (algorithm.ot_items) in [1/{p}, 1], got {q!r}; e.g. "
            f"{max(1, min(p, k)) / p:g}"
        ]
    return []


@register_algorithm
class UldpNaiveConfig(UldpConfig):
    """ULDP-NAIVE (Alg. 1): silo-level clipping and noise, σ·κC√|S| per silo (κ = 2: the
    rigorous sensitivity 2|S|C of spec D29; ``sensitivity: paper`` κ = 1)."""

    name: Literal["uldp-naive"] = "uldp-naive"
    summary: ClassVar[str] = (
        "ULDP-NAIVE: silo-level clipping and noise (rigorous 2|S|C sensitivity)"
    )
    #: Each silo's noise can be the exact discrete Gaussian (pdpfl.privacy.uldp_central).
    supports_central_discrete: ClassVar[bool] = True
    central_noise_site: ClassVar[str] = (
        "each silo's clipped update (Alg. 1 line 14; sensitivity 2C per silo, the silos' joint "
        "view accounted)"
    )

    def round_events(self, config: ExperimentConfig) -> list[Mechanism]:
        """With ``privacy.central_noise: discrete``: the joint view of the silos' discrete
        releases, per observer (:func:`~pdpfl.privacy.uldp_central.naive_discrete_plan`)."""
        if not self.central_discrete(config):
            return super().round_events(config)
        noise = CentralDiscreteGaussianNoise(1.0, 2.0, 16)
        plan = naive_discrete_plan(noise, 2, config.privacy.delta, config.training.rounds)
        return [plan.round_event(np.array([1.0]), obs) for obs in plan.observers]

    def discrete_noise(self, setup: UldpSetup, dimension: int) -> CentralDiscreteGaussianNoise:
        """Alg. 1 l. 14 on the grid: each silo's clipped update moves by ≤ 2C when a user is
        removed (spec D29), so its noise is the central discrete Gaussian of sensitivity 2C and
        multiplier (σκ/2)·√|S| -- the joint view of the |S| silos then has the continuous
        plan's σκ/2 (:mod:`pdpfl.privacy.uldp_central`)."""
        s = int(setup.num_silos)
        sigma = setup.noise_multiplier * self.kappa / 2.0 * math.sqrt(s)
        return CentralDiscreteGaussianNoise(sigma, 2.0 * setup.max_grad_norm, int(dimension))

    @property
    def kappa(self) -> float:
        return 2.0 if self.sensitivity == "rigorous" else 1.0

    def noise_for(
        self, sigma: float, max_grad_norm: float, num_silos: int, survivors: int = 0
    ) -> GaussianNoise:
        """Each of the |S| silos adds σκC√|S| (Alg. 1 l. 14): in all, σκ|S|C over the
        rigorous user-level sensitivity 2|S|C of the sum, multiplier σκ/2 (spec D29), in |S|
        shares (any m silos: σκC√(|S|m) over 2mC, never less than σκ/2)."""
        s = int(num_silos)
        return GaussianNoise(sigma * self.kappa / 2.0, 2.0 * s * float(max_grad_norm), s)

    def warnings(self, config: ExperimentConfig, setup: UldpSetup) -> list[str]:
        out = super().warnings(config, setup)
        if self.sensitivity == "paper":
            sigma = setup.noise_multiplier
            claimed = user_epsilon(sigma, setup.delta, setup.rounds)
            out.append(
                "algorithm.sensitivity: paper -- noise scaled for the published sensitivity "
                "|S|·C, but removing a user moves each clipped silo update by up to 2C (spec "
                f"D29); the reported ε is that of noise multiplier σ/2 = {sigma / 2:g}, not the "
                f"paper's claim ε = {claimed:.4g}"
            )
        return out

    def setup(self, config: ExperimentConfig, info: FederationInfo) -> UldpSetup:
        sigma = noise_multiplier(config, discrete=self.central_discrete(config))
        noise = self.noise_for(sigma, config.training.max_grad_norm, info.num_clients)
        setup = UldpSetup(**setup_fields(config, info, num_users(config), sigma, noise.std()))
        drawn = self.silo_noise(config, info, setup)
        if isinstance(drawn, CentralDiscreteGaussianNoise):  # the std each silo really adds
            setup = replace(setup, noise_std=drawn.std())
        return setup

    def server(
        self,
        config: ExperimentConfig,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> NaiveServer:
        s = self._setup(setup, UldpSetup)
        drawn = self.silo_noise(config, info, s)
        plan: UserLevelPlan | DiscreteUserLevelPlan
        if isinstance(drawn, CentralDiscreteGaussianNoise):  # the joint view of the silos
            plan = naive_discrete_plan(drawn, s.num_silos, s.delta, s.rounds)
        else:
            plan = self._ledger_plan(config, s)
        rates = np.ones(s.num_users)
        server = NaiveServer(
            **self._server_kwargs(config, info, s, randomness),
            plan=plan,
            budgets=planned_budgets(plan, rates, config.privacy.accountant),
            rates=rates,
            adversary=config.privacy.adversary,
            accountant=config.privacy.accountant,
        )
        central = self.central_noise_summary(config, info, s)
        if central is not None:  # σ_silo per silo; the joint view's σ_silo/√|S| is charged
            central.update(silos=s.num_silos, accounted_noise_multiplier=plan.noise_multiplier)
        server.central_noise = central
        return server

    def client(
        self,
        config: ExperimentConfig,
        client_id: int,
        data: ClientData,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> NaiveSilo:
        s = self._setup(setup, UldpSetup)
        return self._silo(NaiveSilo, config, client_id, data, info, s, randomness)


@register_algorithm
class UldpGroupConfig(UldpConfig):
    """ULDP-GROUP-k (Alg. 2): ≤ k records per user, silo DP-SGD, group privacy (Theorem 4)."""

    name: Literal["uldp-group"] = "uldp-group"
    summary: ClassVar[str] = "ULDP-GROUP-k: ≤ k records per user, silo DP-SGD, group privacy"
    toy_overrides: ClassVar[tuple[str, ...]] = (
        *_TOY,
        "privacy.epsilon_max=null",
        "privacy.noise_multiplier=2.0",
        "algorithm.record_rate=0.2",
    )
    setup_type: ClassVar[type[PublicSetup]] = GroupSetup
    #: The silos' DP-SGD steps can add the exact discrete Gaussian (pdpfl.privacy.uldp_central).
    supports_central_discrete: ClassVar[bool] = True
    central_noise_site: ClassVar[str] = (
        "the clipped sum of every DP-SGD step of every silo (Alg. 2 line 9; group conversion "
        "of the record-level steps)"
    )

    def round_events(self, config: ExperimentConfig) -> list[Mechanism]:
        """GROUP-k's event: the group conversion of the silos' record-level DP-SGD (its steps
        central discrete Gaussians with ``privacy.central_noise: discrete``)."""
        kind = DiscreteGroupPlan if self.central_discrete(config) else GroupPlan
        plan = kind(
            1.0, config.training.local_steps, config.privacy.delta, config.training.rounds, 2
        )
        return [plan.round_event(np.array([0.5]), obs) for obs in plan.observers]

    def discrete_noise(self, setup: UldpSetup, dimension: int) -> CentralDiscreteGaussianNoise:
        """Each DP-SGD step's central discrete Gaussian (σ, C) on the grid of the ``dimension``
        trainable coordinates, as the rPDP-FL family's step (Alg. 2 l. 9)."""
        return CentralDiscreteGaussianNoise(
            setup.noise_multiplier, setup.max_grad_norm, int(dimension)
        )

    def noise_for(
        self, sigma: float, max_grad_norm: float, num_silos: int, survivors: int = 0
    ) -> GaussianNoise:
        """σC per DP-SGD step on the clipped sum (record level; the group conversion is
        accounting only)."""
        return GaussianNoise(sigma, max_grad_norm)

    def histogram_need(self) -> str | None:
        if self.group_flags == "fair" or self.group_k in ("max", "median"):
            return "algorithm.group_k/group_flags: max/median k and fair flags"
        return None

    def variant_problems(self, config: ExperimentConfig) -> list[str]:
        problems = []
        if config.privacy.noise_multiplier is None:
            problems.append("privacy.noise_multiplier: required by uldp-group")
        if self.record_rate is None:
            problems.append(
                "algorithm.record_rate: required by uldp-group (the public per-record Poisson "
                "rate of the silos' DP-SGD, e.g. 0.1)"
            )
        if config.training.batch_size is None:
            problems.append(
                "training.batch_size: required by uldp-group (the public expected batch size "
                "B dividing each DP-SGD step's noisy sum)"
            )
        return problems + super().variant_problems(config)

    def setup(self, config: ExperimentConfig, info: FederationInfo) -> GroupSetup:
        users = num_users(config)
        hist = public_histogram(config, info, users)
        sigma = noise_multiplier(config)
        k = resolve_group_k(self.group_k, None if hist is None else hist.sum(axis=0))
        if self.group_flags == "fair":
            quota = fair_group_quotas(need_histogram(hist, "algorithm.group_flags: fair flags"), k)
        else:
            quota = split_group_quotas(info.num_clients, users, k)
        std = self.noise_for(sigma, config.training.max_grad_norm, info.num_clients).std()
        setup = GroupSetup(
            **setup_fields(config, info, users, sigma, std),
            group_k=k,
            group_quota=tuple(tuple(int(v) for v in row) for row in quota),
            record_rate=float(self.record_rate or 0.0),
        )
        drawn = self.silo_noise(config, info, setup)
        if isinstance(drawn, CentralDiscreteGaussianNoise):  # the std each step really adds
            setup = replace(setup, noise_std=drawn.std())
        return setup

    def server(
        self,
        config: ExperimentConfig,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> GroupServer:
        s = self._setup(setup, GroupSetup)
        noise = self.silo_noise(config, info, s)
        assert noise is not None
        server = GroupServer(
            **self._server_kwargs(config, info, s, randomness),
            conversion=self.group_conversion,
            noise=noise,
            accountant=config.privacy.accountant,
        )
        server.central_noise = self.central_noise_summary(config, info, s)
        return server

    def client(
        self,
        config: ExperimentConfig,
        client_id: int,
        data: ClientData,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> GroupSilo:
        s = self._setup(setup, GroupSetup)
        return self._silo(GroupSilo, config, client_id, data, info, s, randomness)


class UserLevelConfig(UldpConfig):
    """ULDP-AVG / ULDP-SGD (Alg. 3-4): per-user vectors, clipped to C, weighted, noised per
    silo; uniform, enhanced or private weights; user sub-sampling; personal budgets.

    Each silo adds a *share* N(0, σ²C²/t) of the noise (Alg. 3 line 17 has σ²C²/|S|), with
    t = :func:`~pdpfl.fl.aggregation.share_threshold` ``(config, |S|)`` the fewest silos any
    round's sum is released with (issue #22, item 2): a dropout never leaves less than the
    accounted σ²C² in a released sum. The servers declare ``distributed_noise``, so plain
    summation refuses a round with fewer than t contributions (no aggregate).
    """

    setup_type: ClassVar[type[PublicSetup]] = UserLevelSetup
    default_server_lr: ClassVar[float] = 10.0
    #: Every noise these silos add is already an exact discrete Gaussian share with
    #: ``privacy.noise_shares: discrete``; ``central_noise: discrete`` asks for that.
    supports_central_discrete: ClassVar[bool] = True
    server_class: ClassVar[type[SamplingServer]] = AvgServer
    silo_class: ClassVar[type[UserLevelSilo]] = AvgSilo

    def histogram_need(self) -> str | None:
        return (
            "algorithm.weights: enhanced weights n_{s,u}/N_u"
            if (self.weights == "enhanced")
            else None
        )

    def discrete_shares(self, config: ExperimentConfig) -> bool:
        """The silos add discrete noise shares (``privacy.noise_shares: discrete``, the default;
        personal budgets included: their per-user rates are calibrated against the discrete
        plan). Private weighting keeps its own encoding (:meth:`weighting_discrete`)."""
        return (
            self.private and config.privacy.noise_shares == "discrete" and self.weights != "private"
        )

    def weighting_discrete(self, config: ExperimentConfig) -> bool:
        """Private weights with discrete noise (``privacy.noise_shares: discrete``, the default):
        each silo adds an exact discrete Gaussian on the protocol's grid 2^m·P and the ledger
        charges :func:`~pdpfl.fl.uldp.discrete.private_weighting_plan` (issue #33 item 5)."""
        return (
            self.private and config.privacy.noise_shares == "discrete" and self.weights == "private"
        )

    def variant_problems(self, config: ExperimentConfig) -> list[str]:
        if self.central_discrete(config) and config.privacy.noise_shares != "discrete":
            return [
                f"privacy.central_noise: discrete -- {self.name}'s silos add shares of the noise, "
                "which are exact discrete Gaussians only with privacy.noise_shares: discrete "
                "(got continuous); set noise_shares: discrete or central_noise: continuous"
            ]
        if self.personal_budgets and self.user_rate is not None:
            return [
                "algorithm.user_rate: with personal_budgets each user's rate q_u comes from its "
                "budget; leave user_rate unset"
            ]
        if self.subsampling == "private":
            return private_subsampling_problems(self)
        return []

    def round_events(self, config: ExperimentConfig) -> list[Mechanism]:
        """With discrete noise shares: the distributed discrete Gaussian the users' ledger
        charges (nominal shares), per observer; else the continuous events."""
        if not (self.discrete_shares(config) or self.weighting_discrete(config)):
            return super().round_events(config)
        from pdpfl.privacy.discrete_plan import SampledDiscreteGaussianPlan

        plan = SampledDiscreteGaussianPlan.for_multiplier(
            "user", 1.0, 2, 1e6, 16, config.privacy.delta, config.training.rounds
        )
        view = DiscreteUserLevelPlan(plan, plan)
        q = np.array([0.5])
        return [view.round_event(q, obs) for obs in view.observers]

    def noise_for(
        self, sigma: float, max_grad_norm: float, num_silos: int, survivors: int = 0
    ) -> GaussianNoise:
        """Alg. 3 l. 17 with each silo's share sized for the t survivors, not |S| (issue #22,
        item 2): σC in t shares of σC/√t."""
        return GaussianNoise(sigma, max_grad_norm, survivors or num_silos)

    def observer_noise(self, noise: GaussianNoise) -> tuple[float, float]:
        # Enhanced weights under plain aggregation: the server sees silo s's update, where one
        # user can weigh w_{s,u} = 1 (joint over the silos: ‖w_{·,u}‖₂ ≤ 1) against one share
        # σC/√t. Uniform weights (‖w_{·,u}‖₂ ≤ 1/√|S|: multiplier σ√(|S|/t) ≥ σ), or private
        # weights (the protocol sums the silos' updates before the server sees them), leave it
        # at least the sum's σ.
        sigma = noise.noise_multiplier
        return sigma, noise.share().noise_multiplier if self.weights == "enhanced" else sigma

    @property
    def samples_users(self) -> bool:
        return self.personal_budgets or self.user_rate is not None

    def setup(self, config: ExperimentConfig, info: FederationInfo) -> UserLevelSetup:
        users = num_users(config)
        rate = 1.0 if self.personal_budgets or self.user_rate is None else float(self.user_rate)
        # Alg. 3 l. 17 with the share sized for t survivors, not |S| (issue #22, item 2).
        survivors = share_threshold(config, info.num_clients)
        weighting = self.weighting_discrete(config)
        if (self.discrete_shares(config) or weighting) and config.privacy.noise_multiplier is None:
            # σ planned at ε_max against the plan the ledger charges (the discrete one)
            sigma = discrete.calibrated_sigma(
                config,
                epsilon=float(config.privacy.epsilon_max or 0.0),
                rate=rate,
                silos=info.num_clients,
                survivors=survivors,
                users=users,
                size=discrete.model_size(config, info),
                private_weighting=weighting,
            )
        else:
            sigma = noise_multiplier(config, rate)
        std = self.noise_for(
            sigma, config.training.max_grad_norm, info.num_clients, survivors
        ).std()
        totals = None
        if self.weights == "enhanced":
            hist = need_histogram(
                public_histogram(config, info, users), "algorithm.weights: enhanced weights"
            )
            enhanced_weights(hist)  # validates Σ_s w_(s,u) ≤ 1
            totals = tuple(int(v) for v in hist.sum(axis=0))
        private = self.subsampling == "private"
        setup = UserLevelSetup(
            **setup_fields(config, info, users, sigma, std),
            weights=self.weights,
            user_totals=totals,
            user_sampling=self.samples_users and not private,
            survivors=survivors,
            ot_items=self.ot_items if private else 0,
        )
        if self.discrete_shares(config):  # refused up front when the bit width cannot work
            discrete.encoding(config, setup, discrete.model_size(config, info))
        return setup

    def share_encoding(
        self, config: ExperimentConfig, info: FederationInfo, setup: UserLevelSetup
    ) -> ShareEncoding | None:
        """The silos' discrete share encoding (None: continuous shares)."""
        if not self.discrete_shares(config):
            return None
        return discrete.encoding(config, setup, discrete.model_size(config, info))

    def server(
        self,
        config: ExperimentConfig,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> UldpServer:
        s = self._setup(setup, UserLevelSetup)
        encoding = self.share_encoding(config, info, s)
        plan: Any = self._ledger_plan(config, s)
        if encoding is not None:  # the ledger charges the discrete mechanism that is released
            plan = discrete.discrete_plan(
                encoding.params,
                s.delta,
                s.rounds,
                plain=config.aggregation == "plain",
                uniform=self.weights == "uniform",
            )
        elif self.weighting_discrete(config):  # private weights: discrete noise on 2^m·P
            plan = discrete.private_weighting_plan(
                config,
                sigma=s.noise_multiplier,
                survivors=s.survivors or s.num_silos,
                size=discrete.model_size(config, info),
                hidden_sampling=s.ot_items > 0,
            )
        acc = config.privacy.accountant
        if self.personal_budgets:
            budgets = user_budgets(config)
            rates = user_rates(
                budgets, plan, allow_exclusion=config.privacy.allow_exclusion, accountant=acc
            )
        else:
            rates = np.full(s.num_users, 1.0 if self.user_rate is None else self.user_rate)
            budgets = planned_budgets(plan, rates, acc)
        server = self.server_class(
            **self._server_kwargs(config, info, s, randomness),
            plan=plan,
            budgets=budgets,
            rates=rates,
            adversary=config.privacy.adversary,
            personal=self.personal_budgets,
            accountant=acc,
        )
        server.share_encoding = encoding
        if self.weighting_discrete(config):  # its grid, dither and bits for summary.json
            server.weighting_noise = discrete.private_weighting_summary(
                config,
                sigma=s.noise_multiplier,
                survivors=s.survivors or s.num_silos,
                size=discrete.model_size(config, info),
            )
        return server

    def client(
        self,
        config: ExperimentConfig,
        client_id: int,
        data: ClientData,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> UserLevelSilo:
        s = self._setup(setup, UserLevelSetup)
        silo = self._silo(self.silo_class, config, client_id, data, info, s, randomness)
        silo.share_encoding = self.share_encoding(config, info, s)
        if self.weighting_discrete(config):
            silo.weighting_noise = discrete.private_weighting_noise(
                config,
                sigma=s.noise_multiplier,
                survivors=s.survivors or s.num_silos,
                size=discrete.model_size(config, info),
            )
        return silo


@register_algorithm
class UldpAvgConfig(UserLevelConfig):
    """ULDP-AVG (Alg. 3): per-user local models (Q epochs), clipped, weighted, noised."""

    name: Literal["uldp-avg"] = "uldp-avg"
    summary: ClassVar[str] = "ULDP-AVG: per-user local models, clipped and weighted (user-level DP)"


@register_algorithm
class UldpSgdConfig(UserLevelConfig):
    """ULDP-SGD (Alg. 3): per-user mean gradients, clipped, weighted, noised (x − η_g·…)."""

    name: Literal["uldp-sgd"] = "uldp-sgd"
    summary: ClassVar[str] = (
        "ULDP-SGD: per-user mean gradients, clipped and weighted (user-level DP)"
    )
    server_class: ClassVar[type[SamplingServer]] = SgdServer
    silo_class: ClassVar[type[UserLevelSilo]] = SgdSilo


@register_algorithm
class UldpDefaultConfig(UldpConfig):
    """DEFAULT: FedAvg with two-sided learning rates (Q epochs of SGD(η_l) per silo,
    x ← x + η_g·mean Δ_s), no DP: the utility ceiling (``pdpfl compare`` method ``default``)."""

    name: Literal["uldp-default"] = "uldp-default"
    summary: ClassVar[str] = "DEFAULT (ULDP-FL): FedAvg with two-sided learning rates, no DP"
    private: ClassVar[bool] = False
    unit: ClassVar[PrivacyUnitName] = "none"

    def warnings(self, config: ExperimentConfig, setup: UldpSetup) -> list[str]:
        return ["uldp-default is FedAvg without differential privacy (ε = ∞)"]

    def setup(self, config: ExperimentConfig, info: FederationInfo) -> UldpSetup:
        users = int(dict(config.data.options).get("num_users") or 0)
        return UldpSetup(**setup_fields(config, info, users, 0.0, 0.0))

    def server(
        self,
        config: ExperimentConfig,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> DefaultServer:
        s = self._setup(setup, UldpSetup)
        budgets = user_budgets(config) if s.num_users else np.zeros(0)
        return DefaultServer(**self._server_kwargs(config, info, s, randomness), budgets=budgets)

    def client(
        self,
        config: ExperimentConfig,
        client_id: int,
        data: ClientData,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> DefaultSilo:
        s = self._setup(setup, UldpSetup)
        return self._silo(DefaultSilo, config, client_id, data, info, s, randomness)


# the compare methods of the variants above (registered after them, in the paper's order)
from pdpfl.fl.uldp import methods as _methods  # noqa: E402, F401
