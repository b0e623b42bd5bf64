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
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from pdpfl.fl.registry import AlgorithmConfig, algorithm_specs


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
    public_silo_sizes: bool = Field(
        False,
        description="declare the silos' training-set sizes public (needed to weight updates "
        "by silo size under DP); by default sizes never leave a silo",
    )
    public_user_histograms: bool = Field(
        False,
        description="declare every silo's per-user record counts n_{s,u} public (ULDP-FL "
        "enhanced weights and GROUP-k flags under plain aggregation need them): they are then "
        "disclosed to the server and, through the weights, to the silos",
    )


class ModelConfig(_Section):
    """The model: any name registered with :func:`pdpfl.models.register_model`."""

    name: str = "logreg"
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the registered model builder"
    )

    @field_validator("name")
    @classmethod
    def _registered(cls, value: str) -> str:
        from pdpfl.models import MODELS

        if value not in MODELS:
            raise ValueError(f"unknown model {value!r}; registered: {', '.join(sorted(MODELS))}")
        return value


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
    adversary: Literal["third-party", "server", "both"] = Field(
        "both",
        description="observer(s) the budgets are enforced against: the coordinating server "
        "(sees who took part), third parties (see the models), or both (default)",
    )
    calibration: Literal["certified", "scf", "binary-search"] = "certified"
    accountant: Literal["rdp", "pld"] = Field(
        "rdp",
        description="accountant of the calibration and the silo ledgers: rdp (Rényi DP, optimal "
        "order) or pld (privacy-loss distributions: tighter, so larger sampling rates at the "
        "same budgets; σ from epsilon_max is still chosen with rdp)",
    )
    allow_exclusion: bool = Field(
        False,
        description="give q = 0 to records whose budget is below the smallest achievable ε "
        "(counted in the headline) instead of refusing the run",
    )


class TrainingConfig(_Section):
    rounds: int = Field(..., ge=1, le=100_000, description="T, communication rounds")
    local_steps: int = Field(..., ge=1, le=1_000_000, description="τ, local DP-SGD steps")
    client_rate: float = Field(1.0, gt=0, le=1, description="λ, client sampling rate")
    max_grad_norm: float = Field(1.0, gt=0, description="C, per-example clipping bound")
    optimizer: Literal["sgd", "adam", "rmsprop"] = "sgd"
    lr: float = Field(0.1, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: float | list[float] | None = Field(
        None,
        description="the public expected batch size B (one value, or one per silo): under DP "
        "each step's noisy sum is divided by this constant, never by a count computed from "
        "private data; the privacy-free baseline samples at rate B/n",
    )
    physical_batch_size: int = Field(512, ge=1)

    @field_validator("batch_size")
    @classmethod
    def _positive(cls, value: float | list[float] | None) -> float | list[float] | None:
        values = value if isinstance(value, list) else [value] if value is not None else []
        if isinstance(value, list) and not value:
            raise ValueError("expected a number > 0 or a non-empty list (one per silo)")
        for v in values:
            if not (v > 0 and v < float("inf")):
                raise ValueError(f"every batch size must be a finite number > 0, got {v}")
        return value

    def batch_size_for(self, client_id: int) -> float | None:
        """The public expected batch size B of silo ``client_id`` (None if not configured)."""
        b = self.batch_size
        if isinstance(b, list):
            if not 0 <= client_id < len(b):
                raise ValueError(
                    f"training.batch_size: {len(b)} values given but silo {client_id} exists"
                )
            return float(b[client_id])
        return None if b is None else float(b)


class SecureConfig(_Section):
    """Parameters of the cryptographic protocols (``aggregation: secure``, ``weights: private``).

    See docs/secure_aggregation.md. None of these is a secret: keys and masks are drawn from the
    operating system's CSPRNG by the party that owns them and never appear in a config.
    """

    fractional_bits: int = Field(
        32, ge=0, le=52, description="secure summation: fixed-point fractional bits f of the "
        "ring Z_2^64 (resolution 2^-f; each of m silos may send values up to 2^(55-f)/m)"
    )
    paillier_bits: int = Field(
        3072, ge=3072, le=8192, description="private weighting: Paillier modulus size (bits)"
    )
    n_max: int = Field(
        2000, ge=1, le=100_000, description="private weighting: N_max, the largest total "
        "record count of a user (DIV = lcm(1..N_max) must leave room in the Paillier modulus)"
    )
    allowed_totals: list[int] | None = Field(
        None, description="private weighting: the paper's remedy for large N_u -- the only "
        "record totals a user may have (e.g. powers of two); DIV = lcm(allowed_totals)"
    )
    precision: float = Field(
        1e-10, gt=0, lt=1, description="private weighting: fixed-point precision P of Encode"
    )
    workers: int | None = Field(
        None, ge=1, le=64, description="processes for the Paillier arithmetic of each party "
        "(default: min(2, CPUs))"
    )
    threshold: float = Field(
        2.0 / 3.0, description="secure summation and private weighting: a round's sum is "
        "released only if at least t = max(min_survivors, ceil(threshold * n)) of the n silos "
        "asked contributed (dropout tolerance n - t; the server and up to t - 1 silos learn "
        "nothing beyond the sum; a noise share is sized sigma^2 C^2 / t); in (1/2, 1]"
    )
    min_survivors: int = Field(
        2, description="the smallest t of any round (>= 2: a lone upload is never unmasked)"
    )

    @field_validator("threshold")
    @classmethod
    def _threshold(cls, value: float) -> float:
        if not 0.5 < value <= 1.0:
            raise ValueError(
                f"must be in (1/2, 1] (the fraction of a round's silos that must survive; above "
                f"1/2 so that two disjoint survivor sets can never both reach it), got {value}"
            )
        return value

    @field_validator("min_survivors")
    @classmethod
    def _min_survivors(cls, value: int) -> int:
        if value < 2:
            raise ValueError(
                f"must be >= 2 (with one survivor its masked upload would be its update), got "
                f"{value}"
            )
        return value

    @field_validator("allowed_totals")
    @classmethod
    def _totals(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or any(v < 1 for v in value)):
            raise ValueError("expected a non-empty list of positive record counts")
        return value


class ExperimentConfig(_Section):
    """A complete, validated experiment.

    Validate raw dictionaries with :func:`config_from_dict` / :func:`load_config` (or
    ``ExperimentConfig.model_validate``): the ``algorithm`` section is then parsed as the config
    class of the registered algorithm it names.
    """

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> ExperimentConfig:
        if cls is ExperimentConfig:
            return experiment_model().model_validate(obj, *args, **kwargs)
        return super().model_validate(obj, *args, **kwargs)

    name: str = "experiment"
    seed: int = Field(42, ge=0, lt=2**63)
    runtime: Literal["simulation", "flower"] = "simulation"
    randomness: Literal["secure", "reproducible"] = Field(
        "secure",
        description="secure: noise and sampling coins from a CSPRNG with a fresh secret key per "
        "party (default); reproducible: derived from the seed -- no guarantee against anyone "
        "who knows the seed (research and tests only)",
    )
    aggregation: Literal["plain", "secure"] = Field(
        "plain", description="how the silos' contributions are summed: plain (the server sees "
        "each update) or secure (pairwise-masked summation: the server learns only the sum)"
    )
    participation: Literal["visible", "hidden"] = Field(
        "visible", description="visible: the server samples the silos (it sees who took part); "
        "hidden (needs aggregation: secure): every silo sends a masked contribution every "
        "round, drawing its own λ-coin, so the server's view equals a third party's"
    )
    secure: SecureConfig = Field(default_factory=SecureConfig)
    output_dir: str = "runs/experiment"
    threads: int | None = Field(
        None, ge=1, le=256, description="torch intra-op threads while training (1 is fastest "
        "for small models such as logreg); None keeps torch's setting"
    )
    data: DataConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=lambda: _default_algorithm())
    budgets: BudgetsConfig = Field(default_factory=BudgetsConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    training: TrainingConfig

    @model_validator(mode="after")
    def _cross_checks(self) -> ExperimentConfig:
        problems = list(self.algorithm.check(self))
        if self.participation == "hidden":
            if self.aggregation != "secure":
                problems.append(
                    "participation: hidden needs aggregation: secure (with plain summation the "
                    "server sees which silos sent a non-zero update)"
                )
            if not getattr(type(self.algorithm), "supports_hidden_participation", False):
                problems.append(
                    f"participation: hidden is not supported by algorithm {self.algorithm.name!r} "
                    "(its silos do not draw their own participation coin)"
                )
        if problems:
            raise ValueError(_PROBLEM_SEPARATOR.join(problems))
        return self

    @property
    def reproducible(self) -> bool:
        """True in the research mode where noise and coins derive from the seed."""
        return self.randomness == "reproducible"


#: Joins several cross-section problems in one ValueError; split again by :func:`_format_errors`.
_PROBLEM_SEPARATOR = "\n"


def _default_algorithm() -> AlgorithmConfig:
    from pdpfl.fl.registry import get_algorithm

    return get_algorithm("rpdp").config()


#: The experiment-config model built over the registered algorithms (rebuilt on registration).
_MODEL_CACHE: dict[str, type[ExperimentConfig]] = {}


def experiment_model() -> type[ExperimentConfig]:
    """:class:`ExperimentConfig` whose ``algorithm`` is a discriminated union on ``name``."""
    model = _MODEL_CACHE.get("model")
    if model is None:
        classes = tuple(spec.config for spec in algorithm_specs())
        union = classes[0] if len(classes) == 1 else Union[classes]  # noqa: UP007
        model = create_model(
            "ExperimentConfig",
            __base__=ExperimentConfig,
            algorithm=(
                Annotated[union, Field(discriminator="name")],
                Field(default_factory=_default_algorithm),
            ),
        )
        _MODEL_CACHE["model"] = model
    return model


def _format_errors(err: ValidationError) -> list[str]:
    problems = []
    names = {spec.name for spec in algorithm_specs()}
    for e in err.errors():
        parts = [str(p) for p in e["loc"]]
        if len(parts) >= 2 and parts[0] == "algorithm" and parts[1] in names:
            parts = [parts[0], *parts[2:]]  # drop the union tag: algorithm.<name>.x -> algorithm.x
        loc = ".".join(parts)
        msg = e["msg"]
        if e["type"] == "union_tag_invalid":
            msg = (
                f"unknown algorithm {e['input'].get('name')!r}; registered: "
                + ", ".join(sorted(names))
            ) if isinstance(e.get("input"), dict) else msg
            loc = "algorithm.name"
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
            if not loc and ":" in msg:
                problems.extend(m for m in msg.split(_PROBLEM_SEPARATOR) if m)
                continue
        problems.append(f"{loc or 'config'}: {msg}")
    return problems


def _leaf_index() -> dict[str, list[str]]:
    """Leaf field name -> dotted paths (for short override keys such as ``rounds``)."""
    index: dict[str, list[str]] = {}
    for section, field in ExperimentConfig.model_fields.items():
        ann = field.annotation
        if section == "algorithm":
            leaves = dict.fromkeys(f for spec in algorithm_specs() for f in spec.config.model_fields)
            for leaf in leaves:
                index.setdefault(leaf, []).append(f"algorithm.{leaf}")
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
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
        return experiment_model().model_validate(raw)
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
