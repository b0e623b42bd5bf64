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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from pdpfl.config_checks import raw_value_problems
from pdpfl.registry import Registry
from pdpfl.safe_yaml import YamlError, load_yaml_file, load_yaml_text

#: Largest public expected batch size B (a larger one divides every noisy sum into nothing:
#: a run that trains nothing and reports success).
MAX_BATCH_SIZE = 1e9
#: Largest hyper-parameter the float32 model can take (a larger one does not convert).
FLOAT32_MAX = 3.4028234663852886e38


class ConfigError(ValueError):
    """Invalid configuration; ``problems`` holds one ``field: message`` string per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


#: What one budget protects: the unit the neighbouring relation adds or removes.
PrivacyUnitName = Literal["record", "client", "user", "none"]

#: Modules that register pdpfl's own algorithms and ``compare`` methods (imported on first use).
BUILTIN_ALGORITHMS: tuple[str, ...] = (
    "pdpfl.fl.rpdp",
    "pdpfl.fl.rpdp.baselines",
    "pdpfl.fl.idp_fedavg",
    "pdpfl.fl.prifedsync",
    "pdpfl.fl.uldp",
)


class AlgorithmConfig(_Section):
    """Base of every algorithm's config section (``algorithm:`` in the YAML).

    A concrete algorithm subclasses :class:`pdpfl.fl.algorithm.Algorithm` (which adds how the
    parsed section builds its server and silos), declares ``name: Literal["..."]`` and is
    registered once (:func:`pdpfl.fl.algorithm.register_algorithm`); the experiment config's
    ``algorithm`` section is then a discriminated union on ``name`` over every registered class.
    """

    # Non-finite numbers are refused before pydantic runs (pdpfl.config_checks), except in a
    # field that declares json_schema_extra={"allow_infinity": True} (e.g. IDP-FedAvg's ∞ budget
    # of non-private clients), so pydantic itself must let ∞ through here.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=True)

    name: str

    #: The privacy unit of the algorithm's guarantee.
    unit: ClassVar[PrivacyUnitName] = "record"
    #: One line for ``pdpfl --help``, the docs and ``pdpfl compare``.
    summary: ClassVar[str] = ""
    #: Whether the algorithm adds DP noise (False for the privacy-free baselines).
    private: ClassVar[bool] = True
    #: Silos draw their own participation coin under ``participation: hidden``.
    supports_hidden_participation: ClassVar[bool] = False
    #: True if the algorithm cannot run on a Flower deployment (e.g. centralized).
    simulation_only: ClassVar[bool] = False
    #: ``--set`` overrides turning :data:`pdpfl.testing.TOY_CONFIG` into a toy run of it.
    toy_overrides: ClassVar[tuple[str, ...]] = ()

    def check(self, config: ExperimentConfig) -> list[str]:
        """Cross-section checks; one ``dotted.field: message`` per problem (empty: all well)."""
        return []


@dataclass(frozen=True)
class MethodSpec:
    """A ``pdpfl compare`` method: config overrides, optionally parameterised (``name:ARG``)."""

    name: str
    overrides: Callable[[str | None], list[str]]
    help: str = ""
    takes_argument: bool = False


#: Every registered algorithm's config class, by ``algorithm.name``.
ALGORITHMS: Registry[type[AlgorithmConfig]] = Registry("algorithm.name", BUILTIN_ALGORITHMS)
#: ``pdpfl compare --methods``: an algorithm plus overrides (``uniform:0.5``, ``strict``, ...).
METHODS: Registry[MethodSpec] = Registry("--methods", BUILTIN_ALGORITHMS)


def _name_override(name: str) -> Callable[[str | None], list[str]]:
    """The ``pdpfl compare`` overrides that select algorithm ``name``."""
    return lambda _arg: [f"algorithm.name={name}"]


def register_algorithm_config(cls: type[AlgorithmConfig], *, replace: bool = False
                              ) -> type[AlgorithmConfig]:
    """Register an algorithm's config class (and a ``compare`` method of the same name)."""
    field = cls.model_fields.get("name")
    name = getattr(field.annotation, "__args__", (None,))[0] if field is not None else None
    if field is None or getattr(field.annotation, "__args__", None) != (name,) or not name:
        raise ValueError(
            f"algorithm: the config class {cls.__name__} must declare name: Literal['<name>']"
        )
    ALGORITHMS.register(str(name), cls, replace=replace)
    if not METHODS.registered(str(name)) or replace:
        METHODS.register(
            str(name),
            MethodSpec(str(name), _name_override(str(name)), cls.summary),
            replace=True,
        )
    return cls


def get_method(text: str) -> tuple[MethodSpec, list[str]]:
    """Resolve ``name`` or ``name:ARG`` to its spec and config overrides (ValueError if unknown)."""
    name, sep, arg = text.partition(":")
    if name not in METHODS:
        raise ValueError(f"unknown method {text!r}; choose from {', '.join(method_names())}")
    spec = METHODS.get(name)
    if sep and not spec.takes_argument:
        raise ValueError(f"method {name!r} takes no argument (got {text!r})")
    if spec.takes_argument and not sep and name not in ALGORITHMS:
        raise ValueError(f"method {name!r} needs an argument: {name}:VALUE")
    return spec, spec.overrides(arg if sep else None)


def method_names() -> list[str]:
    return [f"{m.name}:ARG" if m.takes_argument else m.name for m in METHODS.values()]


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
        default=False,
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

    @model_validator(mode="after")
    def _options_fit_the_builder(self) -> ModelConfig:
        """``options`` must be keyword arguments the registered builder takes."""
        import inspect

        from pdpfl.models import MODELS

        builder = MODELS.get(self.name)
        if builder is None or not self.options:
            return self
        try:
            signature = inspect.signature(builder)
        except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
            return self
        params = list(signature.parameters.values())
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return self
        allowed = [p.name for p in params[2:]
                   if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        unknown = sorted(set(self.options) - set(allowed))
        if unknown:
            raise ValueError(
                f"options: unknown option(s) {unknown} for model {self.name!r}; "
                f"allowed: {allowed}"
            )
        return self


class BudgetsConfig(_Section):
    """Per-record privacy budgets (see :mod:`pdpfl.budgets`, :mod:`pdpfl.data.budget_table`)."""

    scenario: str = "three-levels"
    params: dict[str, Any] = Field(default_factory=dict)
    file: str | None = Field(
        None, min_length=1, description="budgets file: a .csv with the columns record_id and "
        "epsilon (matched by id), or one ε per training record in order (.csv/.npy); "
        "{client_id} and {client} are replaced per silo",
    )
    on_unmatched: Literal["error", "ignore"] = Field(
        "error", description="budgets for record ids that are not in the data: an error "
        "(default), or ignore them -- counted in the run's warnings",
    )
    cap_at_epsilon_max: bool = Field(
        False, description="records whose budget is above the ε that sampling at q = 1 spends "
        "(privacy.epsilon_max) are an error by default; true trains them at q = 1 (they spend "
        "less than their budget), counted in the run's warnings",
    )

    @field_validator("file")
    @classmethod
    def _placeholders(cls, value: str | None) -> str | None:
        if value is not None:
            from pdpfl.data.budget_table import file_placeholders

            file_placeholders(value)
        return value

    @model_validator(mode="after")
    def _scenario_builds(self) -> BudgetsConfig:
        """The scenario and its params are checked here (not when the run assigns budgets),
        so that a bad value is reported as ``budgets: ...`` before anything runs."""
        if self.file is None:
            from pdpfl.budgets import make_scenario

            try:
                make_scenario(self.scenario, **self.params)
            except (ValueError, TypeError) as exc:
                text = str(exc)
                raise ValueError(
                    text if text.startswith("scenario") else f"params: {text}"
                ) from None
        return self


class PrivacyConfig(_Section):
    """The DP mechanism: σ (or ε_max, giving σ at q = 1), δ, adversary, calibration."""

    noise_multiplier: float | None = Field(None, gt=0)
    epsilon_max: float | None = Field(None, gt=0)
    delta: float = Field(1e-5, gt=0, lt=1)
    adversary: Literal["third-party", "server", "both"] = Field(
        "both",
        description="observer(s) the budgets are enforced against: the coordinating server "
        "(sees who took part), third parties (see the models), or both (default)",
    )
    calibration: Literal["certified", "scf", "scf-paper", "binary-search"] = Field(
        "certified", description="ε → q: certified (exact on a grid, default), scf (pdpfl's "
        "curve fit), scf-paper (rPDP-FL's SCF as its reference code ran it), binary-search"
    )
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
    device: str = Field(
        "cpu",
        description="where each silo trains: cpu (default), cuda, cuda:<index>, mps, or auto "
        "(cuda if available, else mps, else cpu); parameters leave the device as CPU arrays "
        "before release and aggregation, and the random numbers are drawn on the CPU",
    )

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        import re

        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
            raise ValueError(
                f"expected one of auto, cpu, cuda, cuda:<index>, mps, got {value!r}"
            )
        return value

    @field_validator("lr", "weight_decay")
    @classmethod
    def _float32(cls, value: float) -> float:
        if value > FLOAT32_MAX:  # (non-finite values are refused by the loader)
            raise ValueError(
                f"must be at most {FLOAT32_MAX:.4g} (the largest float32 the model takes), "
                f"got {value:g}"
            )
        return value

    @field_validator("batch_size")
    @classmethod
    def _positive(cls, value: float | list[float] | None) -> float | list[float] | None:
        values = value if isinstance(value, list) else [value] if value is not None else []
        if isinstance(value, list) and not value:
            raise ValueError("expected a number > 0 or a non-empty list (one per silo)")
        for v in values:
            if not (v > 0 and v <= MAX_BATCH_SIZE):
                raise ValueError(
                    f"every batch size must be a number in (0, {MAX_BATCH_SIZE:.0e}], got {v}"
                )
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


class ClientResourcesConfig(_Section):
    """Ray resources of each ClientApp actor of Flower's Simulation Engine."""

    num_cpus: float = Field(1.0, gt=0, le=1024, description="CPUs per actor (the actor pool "
                            "has about CPUs / num_cpus actors)")
    num_gpus: float = Field(0.0, ge=0, le=64, description="GPUs (or a fraction of one) per "
                            "actor; 0 trains on the CPU")


class FlowerSimulationConfig(_Section):
    """``runtime: flower-simulation``: Flower's Simulation Engine (Ray backend)."""

    client_resources: ClientResourcesConfig = Field(
        default_factory=lambda: ClientResourcesConfig.model_validate({})
    )


class FlowerConfig(_Section):
    """Settings of the Flower runtimes (they never change what is computed)."""

    simulation: FlowerSimulationConfig = Field(
        default_factory=lambda: FlowerSimulationConfig.model_validate({})
    )


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
    runtime: Literal["simulation", "flower", "flower-simulation"] = Field(
        "simulation", description="simulation (in-process), flower (SuperLink + SuperNodes on "
        "loopback) or flower-simulation (Flower's Simulation Engine, Ray: pdpfl[simulation])"
    )
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
    secure: SecureConfig = Field(default_factory=lambda: SecureConfig.model_validate({}))
    flower: FlowerConfig = Field(default_factory=lambda: FlowerConfig.model_validate({}))
    output_dir: str = "runs/experiment"
    save_models: Literal["final", "every-round"] = Field(
        "final", description="final: model.safetensors only; every-round: also the global "
        "model after each round, models/round-NNNN.safetensors"
    )
    threads: int | None = Field(
        None, ge=1, le=256, description="torch intra-op threads while training (1 is fastest "
        "for small models such as logreg); None keeps torch's setting"
    )
    data: DataConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=lambda: _default_algorithm())
    budgets: BudgetsConfig = Field(default_factory=lambda: BudgetsConfig.model_validate({}))
    privacy: PrivacyConfig = Field(default_factory=lambda: PrivacyConfig.model_validate({}))
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
    return ALGORITHMS.get("rpdp").model_validate({})


#: The experiment-config model built over the registered algorithms, per registry version.
_MODEL_CACHE: dict[int, type[ExperimentConfig]] = {}


def experiment_model() -> type[ExperimentConfig]:
    """:class:`ExperimentConfig` whose ``algorithm`` is a discriminated union on ``name``."""
    classes = tuple(ALGORITHMS.values())  # loads the built-in algorithms first
    model = _MODEL_CACHE.get(ALGORITHMS.version)
    if model is None:
        union = classes[0] if len(classes) == 1 else Union[classes]  # noqa: UP007
        tagged: Any = Annotated[union, Field(discriminator="name")]
        model = create_model(
            "ExperimentConfig",
            __base__=ExperimentConfig,
            algorithm=(tagged, Field(default_factory=_default_algorithm)),
        )
        _MODEL_CACHE.clear()
        _MODEL_CACHE[ALGORITHMS.version] = model
    return model


def _format_errors(err: ValidationError) -> list[str]:
    problems: list[str] = []
    names = set(ALGORITHMS.names())
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
        if e["type"] == "finite_number":
            msg = f"must be a finite number, got {e.get('input')!r}"
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
            leaves = dict.fromkeys(f for cls in ALGORITHMS.values() for f in cls.model_fields)
            for leaf in leaves:
                index.setdefault(leaf, []).append(f"algorithm.{leaf}")
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            for leaf in ann.model_fields:
                index.setdefault(leaf, []).append(f"{section}.{leaf}")
        else:
            index.setdefault(section, []).append(section)
    return index


def _parse_value(key: str, text: str) -> Any:
    """The YAML value of ``--set key=text`` (hardened loader: plain data, limits)."""
    return load_yaml_text(text, source=f"--set {key}")


#: Most parts of a dotted ``--set`` key (``data.options.x`` has 3).
_MAX_KEY_PARTS = 8


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` overrides (YAML-parsed values) to a raw config dictionary."""
    try:
        data = json.loads(json.dumps(raw))  # deep copy of plain data
    except (TypeError, ValueError, RecursionError) as err:
        raise ConfigError([f"config: not plain data (mappings, lists, text, numbers): "
                           f"{err}"]) from None
    index = _leaf_index()
    problems = []
    for item in overrides:
        if "=" not in item:
            problems.append(f"--set {item!r}: expected key=value")
            continue
        key, text = item.split("=", 1)
        key = key.strip()
        if key.count(".") >= _MAX_KEY_PARTS or not all(key.split(".")):
            problems.append(f"--set {key[:80]!r}: expected a dotted key such as training.lr "
                            f"(at most {_MAX_KEY_PARTS} parts, none empty)")
            continue
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
            try:
                node[parts[-1]] = _parse_value(key, text)
            except YamlError as err:
                problems.append(str(err))
    if problems:
        raise ConfigError(problems)
    return data


def _section_fields(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each section's pydantic fields ("" = top-level keys; the algorithm named in ``raw``)."""
    fields: dict[str, dict[str, Any]] = {"": dict(ExperimentConfig.model_fields)}
    for section, field in ExperimentConfig.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            fields[section] = dict(ann.model_fields)
    algorithm = raw.get("algorithm")
    fields["algorithm"] = _algorithm_fields(
        algorithm.get("name") if isinstance(algorithm, dict) else None)
    return fields


def _algorithm_fields(name: Any) -> dict[str, Any]:
    """The pydantic fields of the registered algorithm ``name`` (default rpdp; {} if unknown)."""
    key = name if isinstance(name, str) else "rpdp"
    return dict(ALGORITHMS.get(key).model_fields) if key in ALGORITHMS else {}


def config_from_dict(raw: Any, overrides: list[str] | None = None) -> ExperimentConfig:
    """Validate a raw dictionary (after ``overrides``); raises :class:`ConfigError`."""
    if not isinstance(raw, dict):
        raise ConfigError(["config: expected a mapping of sections (data, training, ...)"])
    raw = apply_overrides(raw, list(overrides or []))
    try:
        problems = raw_value_problems(raw, _section_fields(raw))
    except RecursionError:
        problems = ["config: nested too deeply"]
    if problems:
        raise ConfigError(problems)
    try:
        return experiment_model().model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a YAML config file, read with :mod:`pdpfl.safe_yaml`'s limits
    (plain data only, no duplicate keys); an empty file is ``{}``."""
    try:
        raw = load_yaml_file(path)
    except YamlError as err:
        raise ConfigError([f"config: {err}"]) from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError([f"config: {path} holds a {_kind(raw)}; expected a mapping of "
                           "sections (data, training, ...)"])
    return raw


def _kind(value: Any) -> str:
    return {list: "list", str: "text value", int: "number", float: "number",
            bool: "boolean"}.get(type(value), type(value).__name__)


def load_config(
    path: str | Path, overrides: list[str] | None = None, *, data_dir: str | None = None
) -> ExperimentConfig:
    """Read a YAML config file, apply overrides (and ``data_dir``), and validate it."""
    raw = read_config_file(path)
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


def run_fingerprint(config: ExperimentConfig) -> str:
    """What a checkpoint must match to be resumed: :func:`config_hash` of the config with its
    file paths resolved (``--data-dir data`` and ``--data-dir /abs/data`` are the same run),
    the output folder, the number of rounds T (a finished run may be extended) and the
    per-round model option left out."""
    data = config_to_dict(config)
    data.pop("output_dir", None)
    data.pop("save_models", None)
    data["training"].pop("rounds", None)
    data["training"].pop("device", None)  # a run may continue on another device
    data.pop("flower", None)  # nor do the Simulation Engine's resources
    for section, key in (("data", "data_dir"), ("budgets", "file")):
        value = data.get(section, {}).get(key)
        if value:
            data[section][key] = str(Path(value).expanduser().resolve())
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def with_updates(config: ExperimentConfig, overrides: list[str]) -> ExperimentConfig:
    """A validated copy of ``config`` with ``key=value`` overrides applied."""
    return config_from_dict(config_to_dict(config), overrides)
