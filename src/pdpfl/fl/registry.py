"""Transitional: the first release's spec-based registration, adapted to :class:`Algorithm`.

Algorithm modules written against the first release registered an ``AlgorithmSpec`` (config
class + ``setup``/``server``/``client`` functions exchanging raw dictionaries).
:func:`register_algorithm` turns such a spec into an :class:`~pdpfl.fl.algorithm.Algorithm`
subclass whose published setup is a :class:`DictSetup`, so both kinds run side by side while the
built-in algorithms move to their own packages. New code subclasses
:class:`~pdpfl.fl.algorithm.Algorithm` directly; this module goes once no algorithm uses it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from pdpfl.config import METHODS, AlgorithmConfig, MethodSpec, PrivacyUnitName
from pdpfl.fl.algorithm import Algorithm, PublicSetup
from pdpfl.fl.algorithm import register_algorithm as _register

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.config import ExperimentConfig
    from pdpfl.data.federation import ClientData, Federation
    from pdpfl.fl.api import ClientAlgorithm, FederationInfo, ServerAlgorithm
    from pdpfl.randomness import Randomness

__all__ = [
    "AlgorithmConfig",
    "AlgorithmSpec",
    "DictSetup",
    "MethodSpec",
    "register_algorithm",
    "register_method",
]


@dataclasses.dataclass(frozen=True)
class DictSetup(PublicSetup):
    """A published setup that is a raw JSON-able dictionary (first-release algorithms)."""

    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DictSetup:  # type: ignore[override]
        return cls(dict(data))


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """A first-release registration (see the module docstring)."""

    name: str
    config: type[AlgorithmConfig]
    unit: PrivacyUnitName
    setup: Callable[..., dict[str, Any]]
    server: Callable[..., Any]
    client: Callable[..., Any]
    summary: str = ""
    prepare: Callable[..., Any] | None = None
    simulation_only: bool = False
    toy_overrides: tuple[str, ...] = ()


def register_algorithm(spec: AlgorithmSpec, *, replace: bool = False) -> type[Algorithm]:
    """Register ``spec`` as an :class:`Algorithm` subclass of its config class."""
    s = spec

    class Adapted(s.config, Algorithm):  # type: ignore[misc,valid-type]
        setup_type: ClassVar[type[PublicSetup]] = DictSetup
        unit: ClassVar[PrivacyUnitName] = s.unit
        summary: ClassVar[str] = s.summary
        simulation_only: ClassVar[bool] = s.simulation_only
        toy_overrides: ClassVar[tuple[str, ...]] = s.toy_overrides

        def setup(self, config: ExperimentConfig, info: FederationInfo) -> PublicSetup:
            return DictSetup(dict(s.setup(config, info)))

        def server(self, config: ExperimentConfig, info: FederationInfo, setup: PublicSetup,
                   randomness: Randomness) -> ServerAlgorithm:
            return s.server(config, info, setup.to_dict(), randomness)  # type: ignore[no-any-return]

        def client(self, config: ExperimentConfig, client_id: int, data: ClientData,
                   info: FederationInfo, setup: PublicSetup,
                   randomness: Randomness) -> ClientAlgorithm:
            return s.client(  # type: ignore[no-any-return]
                config, client_id, data, info, setup.to_dict(), randomness
            )

        def prepare(self, config: ExperimentConfig, federation: Federation
                    ) -> tuple[ExperimentConfig, Federation]:
            if s.prepare is None:
                return config, federation
            return s.prepare(config, federation)  # type: ignore[no-any-return]

    Adapted.__name__ = Adapted.__qualname__ = s.config.__name__
    Adapted.__module__ = s.config.__module__
    return _register(Adapted, replace=replace)


def register_method(spec: MethodSpec, *, replace: bool = False) -> MethodSpec:
    """Register a ``pdpfl compare`` method (e.g. ``strict`` = idp-fedavg at ε_min)."""
    return METHODS.register(spec.name, spec, replace=replace)
