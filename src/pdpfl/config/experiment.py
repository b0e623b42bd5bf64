"""The experiment configuration (:class:`ExperimentConfig`), the base of every algorithm's
section (:class:`AlgorithmConfig`) and the registries of algorithm sections and ``--methods``
names (:mod:`pdpfl.config`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    ConfigDict,
    Field,
    create_model,
    field_validator,
    model_validator,
)

from pdpfl.config.base import _PROBLEM_SEPARATOR, _Section
from pdpfl.config.sections import (
    BudgetsConfig,
    DataConfig,
    FlowerConfig,
    LifetimeConfig,
    ModelConfig,
    PrivacyConfig,
    SecureConfig,
    ServerOptimizerConfig,
    TrainingConfig,
)
from pdpfl.registry import Registry

#: What one budget protects: the unit the neighbouring relation adds or removes.
PrivacyUnitName = Literal["record", "client", "user", "none"]

#: The built-in algorithms: name → the module that registers it. Parsing a config imports only
#: the chosen algorithm's module (``Registry.get``); ``tests/test_config_imports.py`` checks the
#: table against what each module registers, and that parsing imports neither torch nor flwr.
BUILTIN_ALGORITHMS: dict[str, str] = {
    "rpdp": "pdpfl.fl.rpdp",
    **dict.fromkeys(
        ("minimum", "dropout", "uniform", "privacy-free", "centralized", "centralized-filter"),
        "pdpfl.fl.rpdp.baselines",
    ),
    "idp-fedavg": "pdpfl.fl.idp_fedavg",
    "prifedsync": "pdpfl.fl.prifedsync",
    **dict.fromkeys(
        ("uldp-naive", "uldp-group", "uldp-avg", "uldp-sgd", "uldp-default"), "pdpfl.fl.uldp"
    ),
    "idp-sgd-scale": "pdpfl.fl.idp_sgd",
}


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
    #: Its central DP steps can add exact discrete noise (``privacy.central_noise: discrete``).
    supports_central_discrete: ClassVar[bool] = False
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
METHODS: Registry[MethodSpec] = Registry(
    "--methods", tuple(dict.fromkeys(BUILTIN_ALGORITHMS.values()))
)


def _name_override(name: str) -> Callable[[str | None], list[str]]:
    """The ``pdpfl compare`` overrides that select algorithm ``name``."""
    return lambda _arg: [f"algorithm.name={name}"]


def register_algorithm_config(
    cls: type[AlgorithmConfig], *, replace: bool = False
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


class ExperimentConfig(_Section):
    """A complete, validated experiment.

    Validate raw dictionaries with :func:`config_from_dict` / :func:`load_config` (or
    ``ExperimentConfig.model_validate``): the ``algorithm`` section is then parsed as the config
    class of the registered algorithm it names.
    """

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> ExperimentConfig:
        if cls is ExperimentConfig:
            return experiment_model(obj).model_validate(obj, *args, **kwargs)
        return super().model_validate(obj, *args, **kwargs)

    name: str = "experiment"
    seed: int = Field(42, ge=0, lt=2**63)
    runtime: Literal["simulation", "flower", "flower-simulation"] = Field(
        "simulation",
        description="simulation (in-process), flower (SuperLink + SuperNodes on "
        "loopback) or flower-simulation (Flower's Simulation Engine, Ray: pdpfl[simulation])",
    )
    randomness: Literal["secure", "reproducible"] = Field(
        "secure",
        description="secure: noise and sampling coins from a CSPRNG with a fresh secret key per "
        "party (default); reproducible: derived from the seed -- no guarantee against anyone "
        "who knows the seed (research and tests only)",
    )
    aggregation: Literal["plain", "secure"] = Field(
        "plain",
        description="how the silos' contributions are summed: plain (the server sees "
        "each update) or secure (pairwise-masked summation: the server learns only the sum)",
    )
    participation: Literal["visible", "hidden"] = Field(
        "visible",
        description="visible: the server samples the silos (it sees who took part); "
        "hidden (needs aggregation: secure): every silo sends a masked contribution every "
        "round, drawing its own λ-coin, so the server's view equals a third party's",
    )
    secure: SecureConfig = Field(default_factory=lambda: SecureConfig.model_validate({}))
    flower: FlowerConfig = Field(default_factory=lambda: FlowerConfig.model_validate({}))
    output_dir: str = "runs/experiment"
    save_models: Literal["final", "every-round"] = Field(
        "final",
        description="final: model.safetensors only; every-round: also the global "
        "model after each round, models/round-NNNN.safetensors",
    )
    threads: int | None = Field(
        None,
        ge=1,
        le=256,
        description="torch intra-op threads while training (1 is fastest "
        "for small models such as logreg); None keeps torch's setting",
    )
    data: DataConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=lambda: _default_algorithm())
    budgets: BudgetsConfig = Field(default_factory=lambda: BudgetsConfig.model_validate({}))
    privacy: PrivacyConfig = Field(default_factory=lambda: PrivacyConfig.model_validate({}))
    lifetime: LifetimeConfig = Field(default_factory=lambda: LifetimeConfig.model_validate({}))
    training: TrainingConfig
    server_optimizer: ServerOptimizerConfig = Field(
        default_factory=lambda: ServerOptimizerConfig.model_validate({}),
        description="post-processing of each round's released aggregate (FedAvgM, FedAdam, "
        "FedYogi; Reddi et al. 2021); none by default",
    )

    @field_validator("name")
    @classmethod
    def _printable_name(cls, value: str) -> str:
        """A run's name reaches terminals, logs and plot titles: no control characters (an
        escape sequence could rewrite the terminal; a newline would forge log lines)."""
        import unicodedata

        for i, ch in enumerate(value):
            if (
                unicodedata.category(ch) in ("Cc", "Zl", "Zp")
                or "\u202a" <= ch <= "\u202e"
                or ("\u2066" <= ch <= "\u2069")
            ):
                raise ValueError(
                    f"contains the control character U+{ord(ch):04X} at position {i}; a run "
                    "name is shown on terminals, in logs and in plots: use printable characters"
                )
        if not value.strip():
            raise ValueError("must not be empty or blank")
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> ExperimentConfig:
        problems = list(self.algorithm.check(self))
        algorithm_type = type(self.algorithm)
        if (
            self.privacy.central_noise == "discrete"
            and algorithm_type.private
            and not algorithm_type.supports_central_discrete
        ):
            supported = sorted(
                name
                for name in ALGORITHMS.names()
                if getattr(ALGORITHMS.get(name), "supports_central_discrete", False)
                and getattr(ALGORITHMS.get(name), "private", True)
            )
            problems.append(
                f"privacy.central_noise: discrete is not supported by algorithm "
                f"{self.algorithm.name!r} (allowed: continuous; discrete central noise is "
                f"built for {', '.join(supported)})"
            )
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


def _default_algorithm() -> AlgorithmConfig:
    return ALGORITHMS.get("rpdp").model_validate({})


#: The experiment-config model built over the registered algorithms, per registry version.
_MODEL_CACHE: dict[int, type[ExperimentConfig]] = {}


def _algorithm_name(raw: object) -> str:
    """The algorithm a raw config names (``rpdp`` by default)."""
    section = raw.get("algorithm") if isinstance(raw, dict) else None
    name = section.get("name") if isinstance(section, dict) else None
    return name if isinstance(name, str) else "rpdp"


def experiment_model(raw: object = None) -> type[ExperimentConfig]:
    """:class:`ExperimentConfig` whose ``algorithm`` is a discriminated union on ``name``.

    ``raw``: the dictionary about to be validated; only the algorithm it names (and the default,
    rpdp) is loaded (:data:`BUILTIN_ALGORITHMS`), every built-in algorithm without it.
    """
    if raw is None:
        ALGORITHMS.names()  # loads every built-in algorithm
    else:
        ALGORITHMS.load("rpdp")
        ALGORITHMS.load(_algorithm_name(raw))  # an unknown name loads all, for the message
    classes = tuple(ALGORITHMS.loaded())
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
