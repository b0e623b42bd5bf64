"""The paper's baselines (rPDP-FL §7.2) as configurations of the rPDP-FL classes.

* **Minimum** (StrongForAll): uniform DP-FedAvg at ε_min = min_ij ε_ij for every record.
* **Dropout**: ε_mod = mean budget; records with ε_ij < ε_mod are dropped (q = 0), the rest
  get uniform (ε_mod, δ)-DP.
* **PrivacyFree**: FedAvg without clipping or noise (ε = ∞; every record counts as over budget).
* **Uniform DP-FedAvg at ε**: like Dropout at a given ε (``algorithm.epsilon``).
* **Centralized rPDP-SGD** on the pooled data (:mod:`pdpfl.dp.centralized`).

The uniform baselines are :class:`~pdpfl.fl.rpdp.RpdpClient`/:class:`~pdpfl.fl.rpdp.RpdpServer`
with a :class:`~pdpfl.fl.publication.Publication` in ``uniform`` mode. Two calibrations are
available (see :func:`pdpfl.fl.factory.publish`):

1. default -- *same σ as rPDP-FL*, every kept record gets q = F(ε) from the same estimator. This
   isolates the effect of personalization: the only difference to rPDP-FL is the rates;
2. ``algorithm.sampling_rate = q`` -- the classic DP-FedAvg tuning: a fixed q and the σ for which
   q spends exactly ε (``pdpfl.calibrate.noise_for_uniform_rate``).
"""

from __future__ import annotations

from typing import Any

from pdpfl.config import ExperimentConfig, with_updates

#: Method name (as used by ``pdpfl compare --methods``) -> ``algorithm.name``.
METHODS = {
    "rpdp": "rpdp",
    "minimum": "minimum",
    "dropout": "dropout",
    "privacy-free": "privacy-free",
    "uniform": "uniform",
    "centralized": "centralized",
}


def method_config(config: ExperimentConfig, method: str, epsilon: float | None = None) -> ExperimentConfig:
    """``config`` with ``algorithm.name`` set to ``method`` (and ``algorithm.epsilon`` if given)."""
    if method not in METHODS:
        raise ValueError(f"method: unknown {method!r}; choose from {', '.join(METHODS)}")
    overrides = [f"algorithm.name={METHODS[method]}"]
    if epsilon is not None:
        overrides.append(f"algorithm.epsilon={float(epsilon)}")
    return with_updates(config, overrides)


def centralized_setup(config: ExperimentConfig, federation: Any) -> tuple[ExperimentConfig, Any]:
    """Centralized rPDP-SGD on the pooled data, as a one-silo federation (``centralized``).

    The pooled training (and test) data of all silos form one silo that is always selected
    (λ = 1) and runs T rounds of τ personalized DP-SGD steps with the same σ, C and published
    estimator F as rPDP-FL -- i.e. T·τ steps of rPDP-SGD (paper §5) with q_ij = F(ε_ij) -- so
    the outputs and the ledger have the same form as a federated run. Budgets are drawn for the
    pooled records from the same scenario (seeded by the config seed).
    """
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
    return with_updates(config, ["algorithm.name=rpdp", "training.client_rate=1.0"]), one
