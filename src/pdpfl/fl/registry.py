"""The algorithm registry: one registration per algorithm, used by config, runtimes and CLI.

Each algorithm lives in one module that defines

* its configuration section, a subclass of :class:`AlgorithmConfig` whose ``name`` field is a
  ``Literal`` (the experiment config's ``algorithm`` section is a pydantic discriminated union on
  ``name`` over every registered class);
* what the server computes once before round 1 and publishes (``setup``: public, JSON-able);
* how to build its server part and one silo's part;

and calls :func:`register_algorithm` once at import. Built-in algorithm modules are listed in
:data:`BUILTIN_MODULES` and imported on first use; a user's own algorithm is registered by
importing the module that calls :func:`register_algorithm` before the config is validated.

``pdpfl compare --methods`` names *methods*: an algorithm plus config overrides (e.g.
``uniform:0.5`` → ``algorithm.name=uniform``, ``algorithm.epsilon=0.5``), registered with
:func:`register_method`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.config import ExperimentConfig
    from pdpfl.data.federation import ClientData, Federation
    from pdpfl.fl.api import ClientAlgorithm, FederationInfo, ServerAlgorithm
    from pdpfl.randomness import Randomness

__all__ = [
    "AlgorithmConfig",
    "AlgorithmSpec",
    "BUILTIN_MODULES",
    "MethodSpec",
    "PrivacyUnitName",
    "algorithm_names",
    "algorithm_specs",
    "get_algorithm",
    "get_method",
    "method_names",
    "register_algorithm",
    "register_method",
]

PrivacyUnitName = Literal["record", "client", "user", "none"]

#: Modules that register pdpfl's own algorithms (imported on first registry access).
BUILTIN_MODULES: tuple[str, ...] = (
    "pdpfl.fl.rpdp",
    "pdpfl.fl.baselines",
    "pdpfl.fl.idp_fedavg",
    "pdpfl.fl.prifedsync",
    "pdpfl.fl.uldp",
)


class AlgorithmConfig(BaseModel):
    """Base class of every algorithm's config section (``algorithm:`` in the YAML)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str

    def check(self, config: ExperimentConfig) -> list[str]:
        """Cross-section checks (e.g. a field that needs another section's value).

        Return one ``dotted.field: message`` string per problem; empty when all is well.
        """
        return []


@dataclass(frozen=True)
class AlgorithmSpec:
    """How to build one algorithm.

    Attributes
    ----------
    name
        ``algorithm.name`` in the config.
    config
        Its :class:`AlgorithmConfig` subclass (``name`` must be ``Literal[name]``).
    unit
        Its privacy unit: ``record`` (rPDP-FL, PriFedSync), ``client`` (IDP-FedAvg), ``user``
        (ULDP-FL) or ``none`` (no DP).
    setup
        ``(config, info) -> public``: computed once at the server before round 1 (σ, the
        published calibration, ...). JSON-able; sent to every silo. Never reads silo data.
    server
        ``(config, info, public, randomness) -> ServerAlgorithm``.
    client
        ``(config, client_id, client_data, info, public, randomness) -> ClientAlgorithm``, built
        at the silo from its own data only.
    summary
        One line for ``pdpfl --help`` and the docs.
    prepare
        Optional ``(config, federation) -> (config, federation)`` applied before building, in
        the simulator only (e.g. pooling the silos for a centralized baseline).
    simulation_only
        True if the algorithm cannot run on a Flower deployment (e.g. centralized).
    toy_overrides
        ``--set`` overrides that turn :data:`pdpfl.testing.TOY_CONFIG` (a few digits silos, two
        rounds) into a valid toy run of this algorithm: used by the conformance and Flower tests
        that cover every registered algorithm.
    """

    name: str
    config: type[AlgorithmConfig]
    unit: PrivacyUnitName
    setup: Callable[[ExperimentConfig, FederationInfo], dict[str, Any]]
    server: Callable[[ExperimentConfig, FederationInfo, dict[str, Any], Randomness], ServerAlgorithm]
    client: Callable[
        [ExperimentConfig, int, ClientData, FederationInfo, dict[str, Any], Randomness],
        ClientAlgorithm,
    ]
    summary: str = ""
    prepare: Callable[[ExperimentConfig, Federation], tuple[ExperimentConfig, Federation]] | None = (
        None
    )
    simulation_only: bool = False
    toy_overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class MethodSpec:
    """A ``pdpfl compare`` method: config overrides, optionally parameterised (``name:ARG``)."""

    name: str
    overrides: Callable[[str | None], list[str]]
    help: str = ""
    takes_argument: bool = False


_ALGORITHMS: dict[str, AlgorithmSpec] = {}
_METHODS: dict[str, MethodSpec] = {}
_loaded = False


def _ensure_builtins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN_MODULES:
        importlib.import_module(module)


def register_algorithm(spec: AlgorithmSpec, *, replace: bool = False) -> AlgorithmSpec:
    """Register ``spec`` (and a ``pdpfl compare`` method of the same name)."""
    field = spec.config.model_fields.get("name")
    if field is None or getattr(field.annotation, "__args__", None) != (spec.name,):
        raise ValueError(
            f"algorithm {spec.name!r}: its config class {spec.config.__name__} must declare "
            f"name: Literal[{spec.name!r}]"
        )
    if spec.name in _ALGORITHMS and not replace:
        raise ValueError(f"algorithm {spec.name!r} is already registered")
    _ALGORITHMS[spec.name] = spec
    if spec.name not in _METHODS or replace:
        _METHODS[spec.name] = MethodSpec(
            spec.name, lambda _arg, n=spec.name: [f"algorithm.name={n}"], spec.summary
        )
    _invalidate_config_model()
    return spec


def register_method(spec: MethodSpec, *, replace: bool = False) -> MethodSpec:
    """Register a ``pdpfl compare`` method (e.g. ``strict`` = idp-fedavg at ε_min)."""
    if spec.name in _METHODS and not replace:
        raise ValueError(f"method {spec.name!r} is already registered")
    _METHODS[spec.name] = spec
    return spec


def get_algorithm(name: str) -> AlgorithmSpec:
    _ensure_builtins()
    if name not in _ALGORITHMS:
        raise ValueError(
            f"algorithm.name: unknown algorithm {name!r}; registered: {', '.join(algorithm_names())}"
        )
    return _ALGORITHMS[name]


def algorithm_specs() -> list[AlgorithmSpec]:
    _ensure_builtins()
    return list(_ALGORITHMS.values())


def algorithm_names() -> list[str]:
    _ensure_builtins()
    return list(_ALGORITHMS)


def get_method(text: str) -> tuple[MethodSpec, list[str]]:
    """Resolve ``name`` or ``name:ARG`` to its spec and config overrides (ValueError if unknown)."""
    _ensure_builtins()
    name, sep, arg = text.partition(":")
    spec = _METHODS.get(name)
    if spec is None:
        raise ValueError(f"unknown method {text!r}; choose from {', '.join(method_names())}")
    if sep and not spec.takes_argument:
        raise ValueError(f"method {name!r} takes no argument (got {text!r})")
    if spec.takes_argument and not sep and name not in _ALGORITHMS:
        raise ValueError(f"method {name!r} needs an argument: {name}:VALUE")
    return spec, spec.overrides(arg if sep else None)


def method_names() -> list[str]:
    _ensure_builtins()
    return [f"{m.name}:ARG" if m.takes_argument else m.name for m in _METHODS.values()]


def _invalidate_config_model() -> None:
    """Forget the cached experiment-config model so it is rebuilt with the new algorithm."""
    try:
        from pdpfl import config as config_module
    except ImportError:  # pragma: no cover - during interpreter shutdown
        return
    config_module._MODEL_CACHE.clear()
