"""The rPDP-FL paper's baselines (rPDP-FL §7.2), each registered as its own algorithm.

* **Minimum** (StrongForAll): uniform DP-FedAvg at ε_min for every record.
* **Dropout**: ε_mod; records with ε_ij < ε_mod are dropped (q = 0), the rest get (ε_mod, δ).
* **Uniform DP-FedAvg at ε** (``algorithm.epsilon``): like Dropout at a given ε.
* **PrivacyFree**: FedAvg without clipping or noise (ε = ∞; every record counts as over budget).
* **Centralized rPDP-SGD** on the pooled data (simulation only), and its comparison method
  **Filter** (``centralized-filter``): private full-batch GD with Feldman & Zrnic's individual
  Rényi filter (rPDP-FL §7.1, Table 2; :mod:`pdpfl.dp.filter`) on the same pooled data.

ε_min and ε_mod are *public*: ``algorithm.epsilon`` when set, otherwise the budget scenario's
public minimum / expected value (:func:`pdpfl.budgets.public_statistics`), computed from the
configuration alone -- never from the silos' budgets. With budgets read from files there is no
public value and ``algorithm.epsilon`` is required.

Two calibrations for the uniform baselines:

1. default -- *same σ as rPDP-FL*, every kept record gets q = F(ε) from the same estimator. This
   isolates the effect of personalization: the only difference to rPDP-FL is the rates;
2. ``algorithm.sampling_rate = q`` -- the classic DP-FedAvg tuning: a fixed q and the σ for which
   q spends exactly ε (:func:`pdpfl.calibration.noise_for_uniform_rate`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from pdpfl.config import METHODS, ExperimentConfig, MethodSpec, PrivacyUnitName, with_updates
from pdpfl.data.federation import Federation
from pdpfl.fl.algorithm import PublicSetup, register_algorithm
from pdpfl.fl.api import Contribution, FederationInfo, Params, Scalars
from pdpfl.fl.common import (
    accountant_problems,
    client_budgets,
    public_budget_statistics,
    silo_model,
)
from pdpfl.fl.rpdp.config import DpFedAvgConfig, budget_source, mechanism_spec, model_source
from pdpfl.fl.rpdp.mechanism import (
    DpFedAvgSetup,
    fit_published_estimator,
    mechanism_plan,
    noise_multiplier,
    personalized_setup,
    setup_fields,
)
from pdpfl.fl.rpdp.server import FedAvgServer
from pdpfl.fl.template import RoundPlan, Silo
from pdpfl.ledger import GroupSummary, PrivacySummary
from pdpfl.ledger.groups import budget_groups, over_budget
from pdpfl.ledger.summary import OBSERVERS
from pdpfl.privacy.noise import (
    CentralDiscreteGaussianNoise,
    GaussianNoise,
    central_noise,
    check_charged,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pdpfl.data.federation import ClientData
    from pdpfl.randomness import Randomness

__all__ = [
    "CentralizedConfig",
    "CentralizedFilterConfig",
    "FilterSetup",
    "FilterSilo",
    "DropoutConfig",
    "MinimumConfig",
    "PrivacyFreeConfig",
    "UniformConfig",
    "uniform_epsilon",
]


class _UniformBase(DpFedAvgConfig):
    epsilon: float | None = Field(
        None, gt=0, description="the public uniform ε (overrides the scenario's public value)"
    )
    sampling_rate: float | None = Field(
        None, gt=0, le=1, description="fixed record rate q (σ is then calibrated for ε)"
    )

    #: Which public scenario statistic stands in for ε when ``epsilon`` is not set.
    statistic: ClassVar[str | None] = None

    def check(self, config: ExperimentConfig) -> list[str]:
        problems = super().check(config)
        if self.epsilon is None and self._public_statistic(config) is None:
            problems.append(
                f"algorithm.epsilon: required for {self.name} -- "
                + (
                    "the budget scenario does not determine a public "
                    f"{self.statistic or 'value'} (budgets from files, or data-dependent)"
                    if self.statistic
                    else "the uniform ε of every kept record"
                )
            )
        return problems

    def _public_statistic(self, config: ExperimentConfig) -> float | None:
        minimum, mean = public_budget_statistics(budget_source(config))
        return {"minimum": minimum, "mean": mean}.get(self.statistic or "")

    def uniform_epsilon(self, config: ExperimentConfig) -> float:
        """ε of the baseline: ``algorithm.epsilon``, else the scenario's public statistic."""
        if self.epsilon is not None:
            return float(self.epsilon)
        value = self._public_statistic(config)
        if value is None:
            raise ValueError(f"algorithm.epsilon: required for algorithm {self.name!r}")
        return float(value)

    def setup(self, config: ExperimentConfig, info: FederationInfo) -> DpFedAvgSetup:
        """Uniform DP-FedAvg at the public ε (same σ and F as rPDP-FL, or a fixed q)."""
        eps = self.uniform_epsilon(config)
        spec = mechanism_spec(config)
        if self.sampling_rate is not None:
            from pdpfl.calibration import noise_for_uniform_rate

            sigma = float(
                noise_for_uniform_rate(
                    eps,
                    self.sampling_rate,
                    mechanism_plan(spec, 1.0),
                    adversary=spec.adversary,
                    accountant=spec.accountant,
                )
            )
            return DpFedAvgSetup(
                mode="uniform",
                noise_multiplier=sigma,
                uniform_epsilon=eps,
                uniform_rate=float(self.sampling_rate),
                **setup_fields(spec),
            )
        sigma = noise_multiplier(spec)
        est = fit_published_estimator(spec, sigma)
        q = float(np.clip(est.rates(np.array([eps]))[0], 0.0, 1.0))
        if q <= 0:
            raise ValueError(
                f"algorithm.epsilon: the uniform ε = {eps:g} is below the smallest ε this "
                "mechanism can give a positive sampling rate; lower σ or choose a larger ε"
            )
        return DpFedAvgSetup(
            mode="uniform",
            noise_multiplier=sigma,
            uniform_epsilon=eps,
            uniform_rate=q,
            estimator=est.to_dict(),
            **setup_fields(spec),
        )


@register_algorithm
class MinimumConfig(_UniformBase):
    """Minimum (StrongForAll): everyone at ε_min (public: the scenario's smallest budget)."""

    name: Literal["minimum"] = "minimum"
    statistic: ClassVar[str | None] = "minimum"
    summary: ClassVar[str] = "Minimum: uniform DP-FedAvg at ε_min for everyone"


@register_algorithm
class DropoutConfig(_UniformBase):
    """Dropout: ε_mod (public: the scenario's expected budget); records below it are dropped."""

    name: Literal["dropout"] = "dropout"
    statistic: ClassVar[str | None] = "mean"
    summary: ClassVar[str] = "Dropout: records below ε_mod dropped, the rest at ε_mod"


@register_algorithm
class UniformConfig(_UniformBase):
    """Uniform DP-FedAvg at ``epsilon`` (records with smaller budgets are dropped)."""

    name: Literal["uniform"] = "uniform"
    summary: ClassVar[str] = "uniform DP-FedAvg at a given ε"
    toy_overrides: ClassVar[tuple[str, ...]] = ("algorithm.epsilon=3.0",)


METHODS.register(
    "uniform",
    MethodSpec(
        "uniform",
        lambda arg: ["algorithm.name=uniform", *([f"algorithm.epsilon={arg}"] if arg else [])],
        "uniform DP-FedAvg at ε = ARG",
        takes_argument=True,
    ),
    replace=True,
)


@register_algorithm
class PrivacyFreeConfig(DpFedAvgConfig):
    """FedAvg without clipping or noise: the utility ceiling (no DP at all)."""

    name: Literal["privacy-free"] = "privacy-free"
    private: ClassVar[bool] = False
    unit: ClassVar[PrivacyUnitName] = "none"
    summary: ClassVar[str] = "FedAvg without DP (the utility ceiling)"

    def setup(self, config: ExperimentConfig, info: FederationInfo) -> DpFedAvgSetup:
        fields = setup_fields(mechanism_spec(config))
        return DpFedAvgSetup(mode="non-private", noise_multiplier=0.0, **fields)


@register_algorithm
class CentralizedConfig(DpFedAvgConfig):
    """rPDP-SGD on the pooled data of all silos (simulation only)."""

    name: Literal["centralized"] = "centralized"
    simulation_only: ClassVar[bool] = True
    summary: ClassVar[str] = "rPDP-SGD on the pooled data (simulation only)"

    def setup(self, config: ExperimentConfig, info: FederationInfo) -> DpFedAvgSetup:
        return personalized_setup(mechanism_spec(config))

    def prepare(
        self, config: ExperimentConfig, federation: Federation
    ) -> tuple[ExperimentConfig, Federation]:
        """The pooled training (and test) data of all silos as one always-selected silo
        (λ = 1) running T rounds of τ personalized DP-SGD steps with the same σ, C and F as
        rPDP-FL -- T·τ steps of rPDP-SGD (paper §5) -- so outputs and ledger keep their form."""
        pooled = federation.pooled()
        one = Federation(
            name=f"{federation.name}-pooled",
            clients=[pooled],
            input_shape=federation.input_shape,
            num_classes=federation.num_classes,
            feature_names=federation.feature_names,
            class_names=federation.class_names,
        )
        return with_updates(config, ["training.client_rate=1.0"]), one


@dataclass(frozen=True)
class FilterSetup(PublicSetup):
    """The Filter baseline's public mechanism: σ, δ, C, τ steps per round, T rounds, and the
    Rényi order (None: each record the order that maximises its squared-norm budget)."""

    noise_multiplier: float
    delta: float
    local_steps: int
    rounds: int
    max_grad_norm: float
    adversary: str = "both"
    order: float | None = None
    central_noise: str = "continuous"

    def noise(self, dimension: int | None = None) -> GaussianNoise | CentralDiscreteGaussianNoise:
        """What every filtered GD step adds: N(0, σ²C²) per coordinate, or with
        ``central_noise: discrete`` the exact discrete Gaussian on the grid of the
        ``dimension`` trainable coordinates (:mod:`pdpfl.dp.filter`)."""
        return central_noise(
            self.central_noise, self.noise_multiplier, self.max_grad_norm, dimension
        )


class FilterSilo(Silo):
    """The pooled data's owner running private GD with the individual filter.

    Each record's budget ε_i becomes a squared-norm budget B_i at its order α_i
    (:func:`pdpfl.dp.filter.squared_norm_budgets`); every step clips record i to
    ``min(C, √(B_i − spent_i))`` and drops it once its budget binds, so
    ε_i(spent) = α_i·spent_i/(2σ²C²) + log(1/δ)/(α_i − 1) ≤ ε_i at every point: the privacy
    summary reports that ε per record (for every observer: the silo releases each round's noisy
    update, the models are post-processing). Noisy sums are divided by the public
    ``training.batch_size`` (full-batch GD: the declared public data-set size, the paper's 486
    for pooled Heart).
    """

    def __init__(
        self,
        client_id: int,
        model: torch.nn.Module,
        data: ClientData,
        budgets: np.ndarray,
        setup: FilterSetup,
        *,
        randomness: Randomness,
        normalizer: float,
        allow_exclusion: bool = False,
        optimizer: str = "sgd",
        lr: float = 0.1,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        physical_batch_size: int = 512,
    ) -> None:
        import torch

        from pdpfl.dp.filter import FilterState, accounting_clip, best_filter_orders
        from pdpfl.dp.steps import check_normalizer

        super().__init__(client_id, None, adversary=setup.adversary)
        self.setup, self.model, self.randomness = setup, model, randomness
        self.normalizer = check_normalizer(normalizer, "training.batch_size")
        self.optimizer_name, self.lr = optimizer, float(lr)
        self.momentum, self.weight_decay = float(momentum), float(weight_decay)
        self.physical_batch_size = int(physical_batch_size)
        self.x_train = torch.as_tensor(np.asarray(data.x_train, dtype=np.float32))
        self.y_train = torch.as_tensor(np.asarray(data.y_train, dtype=np.int64))
        self.x_test = torch.as_tensor(np.asarray(data.x_test, dtype=np.float32))
        self.y_test = torch.as_tensor(np.asarray(data.y_test, dtype=np.int64))
        self.budgets = np.asarray(budgets, dtype=np.float64)
        self.alphas = (
            best_filter_orders(self.budgets, delta=setup.delta)
            if setup.order is None
            else np.full(self.budgets.size, float(setup.order))
        )
        rho = self.budgets - math.log(1 / setup.delta) / (self.alphas - 1)
        if np.any(rho <= 0) and not allow_exclusion:
            low = self.budgets[rho <= 0]
            raise ValueError(
                f"budgets: {low.size} record(s) with budgets in [{low.min():g}, {low.max():g}] "
                f"are at or below log(1/δ)/(α−1) at algorithm.filter_order = {setup.order}; leave "
                "filter_order unset (each record its best order), or set "
                "privacy.allow_exclusion: true to train without them"
            )
        #: What every step adds: N(0, σ²C²) per coordinate (or the exact discrete noise on the
        #: grid of the trainable coordinates); the filter's budgets (and every ε reported) are
        #: stated in its σ and C (C' = C + √d/γ for the discrete noise: accounting_clip).
        from pdpfl.models import num_parameters

        self.noise = setup.noise(num_parameters(model))
        self._charged = self.noise.noise_multiplier
        self.accounting_clip = accounting_clip(self.noise)
        scale = 2 * self.noise.noise_multiplier**2 * self.accounting_clip**2
        self.state = FilterState.start(np.maximum(rho, 0.0) * scale / self.alphas)

    def spent_epsilon(self) -> np.ndarray:
        """ε each record has spent so far (0 for a record that never contributed)."""
        from pdpfl.dp.filter import filter_epsilons

        eps = filter_epsilons(
            self.state.spent,
            delta=self.setup.delta,
            noise_multiplier=self._charged,
            max_grad_norm=self.accounting_clip,
            alphas=self.alphas,
        )
        return np.where(self.state.spent > 0, eps, 0.0)

    def step(self, global_params: Params, plan: RoundPlan) -> Contribution:
        """τ filtered full-batch GD steps from the global model; release Δx."""
        from pdpfl.dp.engine import make_optimizer
        from pdpfl.dp.filter import filter_gd_steps
        from pdpfl.models import get_params, set_params

        set_params(self.model, global_params)
        opt = make_optimizer(
            self.optimizer_name,
            self.model.parameters(),
            lr=self.lr,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
        )
        filter_gd_steps(
            self.model,
            self.x_train,
            self.y_train,
            self.state,
            steps=self.setup.local_steps,
            noise=self._noise(),
            optimizer=opt,
            stream=self.randomness.stream("local-training", plan.round_index, self.client_id),
            normalizer=self.normalizer,
            physical_batch_size=self.physical_batch_size,
        )
        new = get_params(self.model)
        return Contribution(
            update=[
                (np.asarray(a, np.float64) - np.asarray(b, np.float64)).astype(np.float32)
                for a, b in zip(new, global_params, strict=True)
            ]
        )

    def _noise(self) -> GaussianNoise | CentralDiscreteGaussianNoise:
        """The noise of this round's steps, checked against the σ the filter accounts."""
        check_charged(self.noise, self._charged, what=f"silo {self.client_id}")
        return self.noise

    def test(self, params: Params) -> Scalars:
        from pdpfl.dp.engine import evaluate
        from pdpfl.models import set_params

        set_params(self.model, params)
        res = evaluate(self.model, self.x_test, self.y_test)
        return {"loss": float(res["loss"]), "accuracy": float(res["accuracy"]), "n": int(res["n"])}

    def privacy_summary(self) -> PrivacySummary:
        spent = self.spent_epsilon()
        over = over_budget(spent, self.budgets)
        idx, labels = budget_groups(self.budgets)
        groups = []
        for g, label in enumerate(labels):
            m = idx == g
            if not m.any():
                continue
            b = self.budgets[m]
            groups.append(
                GroupSummary(
                    label=label,
                    units=int(m.sum()),
                    budget_min=float(b.min()),
                    budget_max=float(b.max()),
                    excluded=int((self.state.budgets[m] <= 0).sum()),
                    stopped=int((self.state.exit_step[m] > 0).sum()),
                    spent_max={o: float(spent[m].max()) for o in OBSERVERS},
                    utilization_sum={o: float((spent[m] / b).sum()) for o in OBSERVERS},
                    over_budget={o: int(over[m].sum()) for o in OBSERVERS},
                    info={
                        "mean_order": float(self.alphas[m].mean()),
                        "active": float(self.state.active[m].sum()),
                    },
                )
            )
        return PrivacySummary(
            unit="record",
            units=int(self.budgets.size),
            observers=OBSERVERS,
            accountant="rdp-filter",
            groups=tuple(groups),
            info={"noise_multiplier": float(self.setup.noise_multiplier)},
        )

    def extra_state(self) -> dict[str, Any]:
        s = self.state
        return {
            "spent": s.spent.copy(),
            "active": s.active.copy(),
            "exit_step": s.exit_step.copy(),
            "steps_done": int(s.steps_done),
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if not state:
            return
        n = self.budgets.size
        spent = np.asarray(state["spent"], dtype=np.float64)
        active = np.asarray(state["active"], dtype=bool)
        exits = np.asarray(state["exit_step"], dtype=np.int64)
        if spent.shape != (n,) or active.shape != (n,) or exits.shape != (n,):
            raise ValueError("silo state: the filter's per-record arrays have the wrong shape")
        self.state.spent, self.state.active, self.state.exit_step = spent, active, exits
        self.state.steps_done = int(state["steps_done"])


@register_algorithm
class CentralizedFilterConfig(CentralizedConfig):
    """Filter (rPDP-FL §7.1, Table 2): private full-batch GD with Feldman & Zrnic's individual
    Rényi filter on the pooled data (simulation only): the comparison method of
    ``centralized`` (rPDP-SGD with SCF / certified rates)."""

    name: Literal["centralized-filter"] = "centralized-filter"  # type: ignore[assignment]
    filter_order: float | None = Field(
        None,
        gt=1,
        description="the Rényi order α of every record's filter (default: each "
        "record the order that maximises its squared-norm budget)",
    )
    summary: ClassVar[str] = "Filter: private GD with an individual Rényi filter (pooled data)"
    #: Its steps can add the exact discrete Gaussian (budgets then in C' = C + √d/γ).
    supports_central_discrete: ClassVar[bool] = True
    setup_type: ClassVar[type[PublicSetup]] = FilterSetup

    def accountant_problems(self, config: ExperimentConfig) -> list[str]:
        """The Rényi filter has no event: only ``rdp`` accounts it."""
        return accountant_problems(config.privacy.accountant, None, self.name)

    def setup(self, config: ExperimentConfig, info: FederationInfo) -> FilterSetup:  # type: ignore[override]
        """σ = ``privacy.noise_multiplier``, or the σ at which a record of budget ε_max
        clipped to C at all T·τ steps spends exactly ε_max
        (:func:`pdpfl.dp.filter.filter_noise_for_max_budget`)."""
        from pdpfl.dp.filter import filter_noise_for_max_budget

        pv, tr = config.privacy, config.training
        if pv.noise_multiplier is not None:
            sigma = float(pv.noise_multiplier)
        elif pv.epsilon_max is not None:
            sigma = filter_noise_for_max_budget(
                float(pv.epsilon_max), steps=tr.rounds * tr.local_steps, delta=pv.delta
            )
        else:
            raise ValueError("privacy: set privacy.noise_multiplier or privacy.epsilon_max")
        return FilterSetup(
            noise_multiplier=sigma,
            delta=pv.delta,
            local_steps=tr.local_steps,
            rounds=tr.rounds,
            max_grad_norm=tr.max_grad_norm,
            adversary=pv.adversary,
            order=self.filter_order,
            central_noise=pv.central_noise,
        )

    def server(
        self,
        config: ExperimentConfig,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> FedAvgServer:
        """The centralized server, showing the steps' discrete grid in ``summary.json``."""
        server = super().server(config, info, setup, randomness)
        if isinstance(setup, FilterSetup) and setup.central_noise == "discrete":
            model = silo_model(model_source(config), info)  # what the steps add noise to
            from pdpfl.models import num_parameters

            noise = setup.noise(num_parameters(model))
            if isinstance(noise, CentralDiscreteGaussianNoise):
                server.central_noise = noise.summary()
        return server

    def client(  # type: ignore[override]
        self,
        config: ExperimentConfig,
        client_id: int,
        data: ClientData,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> FilterSilo:
        if not isinstance(setup, FilterSetup):
            raise TypeError(f"{self.name}: expected a FilterSetup, got {type(setup).__name__}")
        tr = config.training
        batch = tr.batch_size_for(client_id)
        if batch is None:
            raise ValueError(
                "training.batch_size: required for centralized-filter (the public "
                "data-set size that divides each noisy sum)"
            )
        return FilterSilo(
            client_id,
            silo_model(model_source(config), info),
            data,
            client_budgets(budget_source(config), client_id, data),
            setup,
            randomness=randomness,
            normalizer=float(batch),
            allow_exclusion=config.privacy.allow_exclusion,
            optimizer=tr.optimizer,
            lr=tr.lr,
            momentum=tr.momentum,
            weight_decay=tr.weight_decay,
            physical_batch_size=tr.physical_batch_size,
        )


def uniform_epsilon(config: ExperimentConfig) -> float:
    """ε of a uniform baseline config (``algorithm.epsilon`` or the public statistic)."""
    algo = config.algorithm
    if not isinstance(algo, _UniformBase):
        raise ValueError(f"algorithm {algo.name!r} is not a uniform DP-FedAvg baseline")
    return algo.uniform_epsilon(config)
