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
   q spends exactly ε (:func:`pdpfl.calibration.noise_for_uniform_rate`).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from pdpfl.config import METHODS, ExperimentConfig, MethodSpec, PrivacyUnitName, with_updates
from pdpfl.data.federation import Federation
from pdpfl.fl.algorithm import register_algorithm
from pdpfl.fl.api import FederationInfo
from pdpfl.fl.common import public_budget_statistics
from pdpfl.fl.rpdp.config import DpFedAvgConfig
from pdpfl.fl.rpdp.mechanism import (
    DpFedAvgSetup,
    fit_published_estimator,
    mechanism_plan,
    noise_multiplier,
    personalized_setup,
    setup_fields,
)

__all__ = [
    "CentralizedConfig",
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
        minimum, mean = public_budget_statistics(config)
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
        if self.sampling_rate is not None:
            from pdpfl.calibration import noise_for_uniform_rate

            sigma = float(
                noise_for_uniform_rate(
                    eps, self.sampling_rate, mechanism_plan(config, 1.0),
                    adversary=config.privacy.adversary,
                )
            )
            return DpFedAvgSetup(
                mode="uniform", noise_multiplier=sigma, uniform_epsilon=eps,
                uniform_rate=float(self.sampling_rate), **setup_fields(config),
            )
        sigma = noise_multiplier(config)
        est = fit_published_estimator(config, sigma)
        q = float(np.clip(est.rates(np.array([eps]))[0], 0.0, 1.0))
        if q <= 0:
            raise ValueError(
                f"algorithm.epsilon: the uniform ε = {eps:g} is below the smallest ε this "
                "mechanism can give a positive sampling rate; lower σ or choose a larger ε"
            )
        return DpFedAvgSetup(
            mode="uniform", noise_multiplier=sigma, uniform_epsilon=eps, uniform_rate=q,
            estimator=est.to_dict(), **setup_fields(config),
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
        return DpFedAvgSetup(mode="non-private", noise_multiplier=0.0, **setup_fields(config))


@register_algorithm
class CentralizedConfig(DpFedAvgConfig):
    """rPDP-SGD on the pooled data of all silos (simulation only)."""

    name: Literal["centralized"] = "centralized"
    simulation_only: ClassVar[bool] = True
    summary: ClassVar[str] = "rPDP-SGD on the pooled data (simulation only)"

    def setup(self, config: ExperimentConfig, info: FederationInfo) -> DpFedAvgSetup:
        return personalized_setup(config)

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


def uniform_epsilon(config: ExperimentConfig) -> float:
    """ε of a uniform baseline config (``algorithm.epsilon`` or the public statistic)."""
    algo = config.algorithm
    if not isinstance(algo, _UniformBase):
        raise ValueError(f"algorithm {algo.name!r} is not a uniform DP-FedAvg baseline")
    return algo.uniform_epsilon(config)
