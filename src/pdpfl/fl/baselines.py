"""The rPDP-FL paper's baselines (rPDP-FL §7.2), each registered as its own algorithm.

* **Minimum** (StrongForAll): uniform DP-FedAvg at ε_min for every record.
* **Dropout**: ε_mod; records with ε_ij < ε_mod are dropped (q = 0), the rest get (ε_mod, δ).
* **Uniform DP-FedAvg at ε** (``algorithm.epsilon``): like Dropout at a given ε.
* **PrivacyFree**: FedAvg without clipping or noise (ε = ∞; every record counts as over budget).
* **Centralized rPDP-SGD** on the pooled data (simulation only).

ε_min and ε_mod are *public*: ``algorithm.epsilon`` when set, otherwise the budget scenario's
public minimum / expected value (:func:`pdpfl.budgets.public_statistics`), computed from the
configuration alone -- never from the silos' budgets. With budgets read from files there is no
public value and ``algorithm.epsilon`` is required.

Two calibrations for the uniform baselines:

1. default -- *same σ as rPDP-FL*, every kept record gets q = F(ε) from the same estimator. This
   isolates the effect of personalization: the only difference to rPDP-FL is the rates;
2. ``algorithm.sampling_rate = q`` -- the classic DP-FedAvg tuning: a fixed q and the σ for which
   q spends exactly ε (:func:`pdpfl.calibrate.noise_for_uniform_rate`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from pdpfl.fl.api import FederationInfo
from pdpfl.fl.common import accounting_adversary, public_budget_statistics
from pdpfl.fl.publication import Publication
from pdpfl.fl.registry import (
    AlgorithmSpec,
    MethodSpec,
    register_algorithm,
    register_method,
)
from pdpfl.fl.rpdp import (
    DpFedAvgConfig,
    _common,
    build_dp_client,
    build_fedavg_server,
    fit_published_estimator,
    mechanism_plan,
    noise_multiplier,
)
from pdpfl.fl.rpdp import setup as rpdp_setup

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.config import ExperimentConfig

__all__ = [
    "CentralizedConfig",
    "DropoutConfig",
    "MinimumConfig",
    "PrivacyFreeConfig",
    "UniformConfig",
    "centralized_setup",
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
        if self.epsilon is None:
            minimum, mean = public_budget_statistics(config)
            value = {"minimum": minimum, "mean": mean}.get(self.statistic or "")
            if value is None:
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


class MinimumConfig(_UniformBase):
    """Minimum (StrongForAll): everyone at ε_min (public: the scenario's smallest budget)."""

    name: Literal["minimum"] = "minimum"
    statistic: ClassVar[str | None] = "minimum"


class DropoutConfig(_UniformBase):
    """Dropout: ε_mod (public: the scenario's expected budget); records below it are dropped."""

    name: Literal["dropout"] = "dropout"
    statistic: ClassVar[str | None] = "mean"


class UniformConfig(_UniformBase):
    """Uniform DP-FedAvg at ``epsilon`` (records with smaller budgets are dropped)."""

    name: Literal["uniform"] = "uniform"


class PrivacyFreeConfig(DpFedAvgConfig):
    """FedAvg without clipping or noise: the utility ceiling (no DP at all)."""

    name: Literal["privacy-free"] = "privacy-free"
    private: ClassVar[bool] = False


class CentralizedConfig(DpFedAvgConfig):
    """rPDP-SGD on the pooled data of all silos (simulation only)."""

    name: Literal["centralized"] = "centralized"


def uniform_epsilon(config: ExperimentConfig) -> float:
    """ε of a uniform baseline: ``algorithm.epsilon``, else the scenario's public statistic."""
    algo = config.algorithm
    if algo.epsilon is not None:
        return float(algo.epsilon)
    minimum, mean = public_budget_statistics(config)
    value = {"minimum": minimum, "mean": mean}.get(getattr(algo, "statistic", None) or "")
    if value is None:
        raise ValueError(f"algorithm.epsilon: required for algorithm {algo.name!r}")
    return float(value)


def uniform_setup(config: ExperimentConfig, info: FederationInfo) -> dict[str, Any]:
    """Uniform DP-FedAvg at the public ε (same σ and F as rPDP-FL, or a fixed q)."""
    eps = uniform_epsilon(config)
    algo = config.algorithm
    if algo.sampling_rate is not None:
        from pdpfl.calibrate import noise_for_uniform_rate

        sigma = float(
            noise_for_uniform_rate(
                eps, algo.sampling_rate, mechanism_plan(config, 1.0),
                adversary=accounting_adversary(config),
            )
        )
        pub = Publication(
            mode="uniform",
            noise_multiplier=sigma,
            uniform_epsilon=eps,
            uniform_rate=float(algo.sampling_rate),
            **_common(config),
        )
        return {"publication": pub.to_dict()}
    sigma = noise_multiplier(config)
    est = fit_published_estimator(config, sigma)
    q = float(np.clip(est.rates(np.array([eps]))[0], 0.0, 1.0))
    if q <= 0:
        raise ValueError(
            f"algorithm.epsilon: the uniform ε = {eps:g} is below the smallest ε this mechanism can "
            "give a positive sampling rate; lower σ or choose a larger ε"
        )
    pub = Publication(
        mode="uniform",
        noise_multiplier=sigma,
        uniform_epsilon=eps,
        uniform_rate=q,
        estimator=est.to_dict(),
        **_common(config),
    )
    return {"publication": pub.to_dict()}


def privacy_free_setup(config: ExperimentConfig, info: FederationInfo) -> dict[str, Any]:
    pub = Publication(mode="non-private", noise_multiplier=0.0, **_common(config))
    return {"publication": pub.to_dict()}


def centralized_setup(config: ExperimentConfig, federation: Any) -> tuple[ExperimentConfig, Any]:
    """Centralized rPDP-SGD on the pooled data, as a one-silo federation (``centralized``).

    The pooled training (and test) data of all silos form one silo that is always selected
    (λ = 1) and runs T rounds of τ personalized DP-SGD steps with the same σ, C and published
    estimator F as rPDP-FL -- i.e. T·τ steps of rPDP-SGD (paper §5) with q_ij = F(ε_ij) -- so
    the outputs and the ledger have the same form as a federated run.
    """
    from pdpfl.config import with_updates
    from pdpfl.data.federation import Federation

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


_UNIFORM = dict(
    unit="record", setup=uniform_setup, server=build_fedavg_server, client=build_dp_client
)
register_algorithm(
    AlgorithmSpec(
        name="minimum",
        config=MinimumConfig,
        summary="Minimum: uniform DP-FedAvg at ε_min for everyone",
        **_UNIFORM,
    )
)
register_algorithm(
    AlgorithmSpec(
        name="dropout",
        config=DropoutConfig,
        summary="Dropout: records below ε_mod dropped, the rest at ε_mod",
        **_UNIFORM,
    )
)
register_algorithm(
    AlgorithmSpec(
        name="uniform",
        config=UniformConfig,
        summary="uniform DP-FedAvg at a given ε",
        toy_overrides=("algorithm.epsilon=3.0",),
        **_UNIFORM,
    )
)
register_method(
    MethodSpec(
        "uniform",
        lambda arg: ["algorithm.name=uniform", *([f"algorithm.epsilon={arg}"] if arg else [])],
        "uniform DP-FedAvg at ε = ARG",
        takes_argument=True,
    ),
    replace=True,
)
register_algorithm(
    AlgorithmSpec(
        name="privacy-free",
        config=PrivacyFreeConfig,
        unit="none",
        setup=privacy_free_setup,
        server=build_fedavg_server,
        client=build_dp_client,
        summary="FedAvg without DP (the utility ceiling)",
    )
)
register_algorithm(
    AlgorithmSpec(
        name="centralized",
        config=CentralizedConfig,
        unit="record",
        setup=rpdp_setup,
        server=build_fedavg_server,
        client=build_dp_client,
        summary="rPDP-SGD on the pooled data (simulation only)",
        prepare=centralized_setup,
        simulation_only=True,
    )
)
