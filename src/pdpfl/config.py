"""Validated experiment configuration (YAML + ``--set key=value`` overrides).

One :class:`ExperimentConfig` describes a whole run: the federation (dataset, partition, data
folder), the model, the algorithm (rPDP-FL or a baseline), the budget scenario, the privacy
mechanism (σ or ε_max, δ, adversary, calibration) and the training schedule (T, τ, λ, C,
optimizer). Unknown keys and bad values are rejected with one message per problem naming the
dotted field, e.g. ``training.rounds: Input should be greater than or equal to 1``.

Overrides use dotted keys (``training.lr=0.05``); a leaf name that is unique over the sections
may be given alone (``rounds=5`` sets ``training.rounds``, T).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

ALGORITHMS = ("rpdp", "minimum", "dropout", "privacy-free", "uniform", "centralized")
AlgorithmName = Literal["rpdp", "minimum", "dropout", "privacy-free", "uniform", "centralized"]


class ConfigError(ValueError):
    """Invalid configuration; ``problems`` holds one ``field: message`` string per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(_Section):
    """The federation: see :func:`pdpfl.data.load_federation`."""

    dataset: str = Field(..., min_length=1, description="heart-disease, mnist-10k, digits, ...")
    num_clients: int | None = Field(None, ge=1, le=10_000)
    partition: str = "iid"
    partition_params: dict[str, Any] = Field(default_factory=dict)
    data_dir: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)


class ModelConfig(_Section):
    name: Literal["logreg", "mlp", "mnist-cnn", "resnet18-gn"] = "logreg"


class AlgorithmConfig(_Section):
    """Which algorithm runs, and the knobs that only baselines use.

    ``minimum``/``dropout``/``uniform`` are uniform DP-FedAvg: by default they use the same σ
    as rPDP-FL and give every (kept) record the rate q = F(ε) of the published estimator; with
    ``sampling_rate`` set they instead use that fixed q and calibrate σ for ε.
    """

    name: AlgorithmName = "rpdp"
    epsilon: float | None = Field(
        None, gt=0, description="uniform ε (uniform); overrides ε_min/ε_mod for minimum/dropout"
    )
    sampling_rate: float | None = Field(
        None, gt=0, le=1, description="fixed record rate q for the uniform baselines"
    )
    weighting: Literal["uniform", "num_examples"] = "uniform"
    server_lr: float = Field(1.0, gt=0)


class BudgetsConfig(_Section):
    """Per-record privacy budgets (see :mod:`pdpfl.budgets`)."""

    scenario: str = "three-levels"
    params: dict[str, Any] = Field(default_factory=dict)
    file: str | None = None


class PrivacyConfig(_Section):
    """The DP mechanism: σ (or ε_max from which σ is derived at q = 1), δ, adversary, calibration."""

    noise_multiplier: float | None = Field(None, gt=0)
    epsilon_max: float | None = Field(None, gt=0)
    delta: float = Field(1e-5, gt=0, lt=1)
    adversary: Literal["third-party", "server", "both"] = "third-party"
    calibration: Literal["certified", "scf", "binary-search"] = "certified"
    allow_exclusion: bool = True


class TrainingConfig(_Section):
    rounds: int = Field(..., ge=1, le=100_000, description="T, communication rounds")
    local_steps: int = Field(..., ge=1, le=1_000_000, description="τ, local DP-SGD steps")
    client_rate: float = Field(1.0, gt=0, le=1, description="λ, client sampling rate")
    max_grad_norm: float = Field(1.0, gt=0, description="C, per-example clipping bound")
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(0.1, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: int | None = Field(
        None, ge=1, description="expected batch size of the privacy-free baseline (q = B/n)"
    )
    physical_batch_size: int = Field(512, ge=1)


class ExperimentConfig(_Section):
    """A complete, validated experiment."""

    name: str = "experiment"
    seed: int = Field(42, ge=0, lt=2**63)
    runtime: Literal["simulation", "flower"] = "simulation"
    output_dir: str = "runs/experiment"
    threads: int | None = Field(
        None, ge=1, le=256, description="torch intra-op threads while training (1 is fastest "
        "for small models such as logreg); None keeps torch's setting"
    )
    data: DataConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    budgets: BudgetsConfig = Field(default_factory=BudgetsConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    training: TrainingConfig

    @model_validator(mode="after")
    def _privacy_source(self) -> ExperimentConfig:
        private = self.algorithm.name != "privacy-free"
        if private and self.privacy.noise_multiplier is None and self.privacy.epsilon_max is None:
            raise ValueError(
                "privacy: set privacy.noise_multiplier (σ) or privacy.epsilon_max "
                "(σ such that q = 1 spends ε_max)"
            )
        if self.privacy.noise_multiplier is not None and self.privacy.epsilon_max is not None:
            raise ValueError(
                "privacy: set only one of privacy.noise_multiplier and privacy.epsilon_max"
            )
        if self.algorithm.name == "uniform" and self.algorithm.epsilon is None:
            raise ValueError("algorithm.epsilon: required when algorithm.name is 'uniform'")
        return self


def _format_errors(err: ValidationError) -> list[str]:
    problems = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
            if not loc and ":" in msg:
                problems.append(msg)
                continue
        problems.append(f"{loc or 'config'}: {msg}")
    return problems


def _leaf_index() -> dict[str, list[str]]:
    """Leaf field name -> dotted paths (for short override keys such as ``rounds``)."""
    index: dict[str, list[str]] = {}
    for section, field in ExperimentConfig.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            for leaf in ann.model_fields:
                index.setdefault(leaf, []).append(f"{section}.{leaf}")
        else:
            index.setdefault(section, []).append(section)
    return index


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` overrides (YAML-parsed values) to a raw config dictionary."""
    data = json.loads(json.dumps(raw))  # deep copy of plain data
    index = _leaf_index()
    problems = []
    for item in overrides:
        if "=" not in item:
            problems.append(f"--set {item!r}: expected key=value")
            continue
        key, text = item.split("=", 1)
        key = key.strip()
        if "." not in key:
            paths = index.get(key, [])
            if len(paths) != 1:
                hint = f" (one of {', '.join(paths)})" if paths else ""
                problems.append(f"--set {key}: unknown or ambiguous key{hint}")
                continue
            key = paths[0]
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"--set {key}: {part} is not a section")
                break
            node = child
        else:
            node[parts[-1]] = _parse_value(text)
    if problems:
        raise ConfigError(problems)
    return data


def config_from_dict(raw: Any, overrides: list[str] | None = None) -> ExperimentConfig:
    """Validate a raw dictionary (after ``overrides``); raises :class:`ConfigError`."""
    if not isinstance(raw, dict):
        raise ConfigError(["config: expected a mapping of sections (data, training, ...)"])
    raw = apply_overrides(raw, list(overrides or []))
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None


def load_config(
    path: str | Path, overrides: list[str] | None = None, *, data_dir: str | None = None
) -> ExperimentConfig:
    """Read a YAML config file, apply overrides (and ``data_dir``), and validate it."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError([f"config: file not found: {p}"])
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError([f"config: not valid YAML ({err})"]) from None
    extra = list(overrides or [])
    if data_dir is not None:
        extra.append(f"data.data_dir={data_dir}")
    return config_from_dict(raw, extra)


def config_to_dict(config: ExperimentConfig) -> dict[str, Any]:
    return config.model_dump(mode="json")


def config_hash(config: ExperimentConfig) -> str:
    """SHA-256 (first 16 hex digits) of the canonical JSON of the config, output folder excluded."""
    data = config_to_dict(config)
    data.pop("output_dir", None)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def with_updates(config: ExperimentConfig, overrides: list[str]) -> ExperimentConfig:
    """A validated copy of ``config`` with ``key=value`` overrides applied."""
    return config_from_dict(config_to_dict(config), overrides)
