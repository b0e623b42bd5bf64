"""Validated experiment configuration (YAML + ``--set key=value`` overrides).

One :class:`ExperimentConfig` describes a whole run: the federation (dataset, partition, data
folder), the model, the algorithm (rPDP-FL or a baseline), the budget scenario, the privacy
mechanism (σ or ε_max, δ, adversary, calibration) and the training schedule (T, τ, λ, C,
optimizer). Unknown keys and bad values are rejected with one message per problem naming the
dotted field, e.g. ``training.rounds: Input should be greater than or equal to 1``.

Overrides use dotted keys (``training.lr=0.05``); a leaf name that is unique over the sections
may be given alone (``rounds=5`` sets ``training.rounds``, T).

The package: :mod:`~pdpfl.config.base` (the error, the section base),
:mod:`~pdpfl.config.sections` (data, model, budgets, privacy, lifetime, training, secure,
Flower, server optimizer), :mod:`~pdpfl.config.experiment` (the experiment, the algorithm
section's base and the registries), :mod:`~pdpfl.config.loading` (YAML, overrides, validation
messages, hash and fingerprint).
"""

from pdpfl.config.base import MAX_BATCH_SIZE, ConfigError
from pdpfl.config.experiment import (
    ALGORITHMS,
    BUILTIN_ALGORITHMS,
    METHODS,
    AlgorithmConfig,
    ExperimentConfig,
    MethodSpec,
    PrivacyUnitName,
    experiment_model,
    get_method,
    method_names,
    register_algorithm_config,
)
from pdpfl.config.loading import (
    apply_overrides,
    config_from_dict,
    config_hash,
    config_to_dict,
    load_config,
    read_config_file,
    run_fingerprint,
    with_updates,
)
from pdpfl.config.sections import (
    BudgetsConfig,
    ClientResourcesConfig,
    DataConfig,
    FlowerConfig,
    FlowerSimulationConfig,
    LifetimeConfig,
    ModelConfig,
    PrivacyConfig,
    SecureConfig,
    ServerOptimizerConfig,
    TrainingConfig,
)

__all__ = [
    "ALGORITHMS",
    "BUILTIN_ALGORITHMS",
    "MAX_BATCH_SIZE",
    "METHODS",
    "AlgorithmConfig",
    "BudgetsConfig",
    "ClientResourcesConfig",
    "ConfigError",
    "DataConfig",
    "ExperimentConfig",
    "FlowerConfig",
    "FlowerSimulationConfig",
    "LifetimeConfig",
    "MethodSpec",
    "ModelConfig",
    "PrivacyConfig",
    "PrivacyUnitName",
    "SecureConfig",
    "ServerOptimizerConfig",
    "TrainingConfig",
    "apply_overrides",
    "config_from_dict",
    "config_hash",
    "config_to_dict",
    "experiment_model",
    "get_method",
    "load_config",
    "method_names",
    "read_config_file",
    "register_algorithm_config",
    "run_fingerprint",
    "with_updates",
]
