"""A parsed ``algorithm:`` section builds its algorithm: setup, server and silos.

Every algorithm is one config class (a pydantic section with ``name: Literal[...]``) that
subclasses :class:`Algorithm` and is registered once with :func:`register_algorithm`. Once the
experiment config is parsed, ``config.algorithm`` *is* the algorithm: the runtimes call its
methods directly and never look a name up again (in the manner of jax_privacy's configs, which
own their DP event and calibration):

1. :meth:`Algorithm.setup` -- at the server, once: what the algorithm publishes before round 1
   (σ, the calibration, ...) as a frozen :class:`PublicSetup`, from the config and the
   federation's public facts only;
2. :meth:`Algorithm.server` -- the server part, with the server's own randomness;
3. :meth:`Algorithm.client` -- at each silo, from that silo's own data, the published setup and
   the silo's own randomness.

The in-process simulator runs all three in one process (:meth:`Algorithm.build`); the Flower
ServerApp runs 1-2 and each ClientApp runs 3 after decoding the setup with
``setup_type.from_dict``.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pdpfl.config import AlgorithmConfig, ExperimentConfig, register_algorithm_config
from pdpfl.fl.aggregation import SumProtocol, check_compatible, protocol_from_config
from pdpfl.fl.api import ClientAlgorithm, FederationInfo, ServerAlgorithm
from pdpfl.fl.checks import check_federation
from pdpfl.fl.environment import Environment, resolve_environment
from pdpfl.fl.lifetime import set_targets

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.data.federation import ClientData, Federation
    from pdpfl.fl.pool import SiloPool
    from pdpfl.randomness import Randomness

__all__ = [
    "Algorithm",
    "Assembly",
    "PublicSetup",
    "as_algorithm",
    "build_federation_algorithms",
    "register_algorithm",
]

S = TypeVar("S", bound="PublicSetup")
A = TypeVar("A", bound="type[Algorithm]")


@dataclasses.dataclass(frozen=True)
class PublicSetup:
    """What the server publishes before round 1: public, data-independent, JSON-able.

    Subclasses are frozen dataclasses of JSON-able fields (numbers, strings, lists, dicts,
    nested :class:`PublicSetup`); :meth:`to_dict`/:meth:`from_dict` carry them to every silo.
    """

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[S], data: dict[str, Any]) -> S:
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
        return cls(**data)


@dataclasses.dataclass
class Assembly:
    """Everything the in-process runtime needs, built once from the parsed config.

    ``config`` is the effective configuration (after :meth:`Algorithm.prepare`), ``warnings``
    the problems :meth:`Algorithm.check_federation` found that do not stop the run.
    """

    config: ExperimentConfig
    federation: Federation
    server: ServerAlgorithm
    clients: dict[int, ClientAlgorithm]
    protocol: SumProtocol
    warnings: list[str]
    #: The torch names of the model's trainable parameters (the released model's keys).
    parameter_names: list[str]
    #: The silos as one :class:`~pdpfl.fl.pool.SiloPool` (``clients`` is then empty): built
    #: when the in-process simulator asked for it and the algorithm offers one.
    pool: SiloPool | None = None


class Algorithm(AlgorithmConfig):
    """An algorithm's config section that knows how to build the algorithm (see module doc)."""

    #: The type :meth:`setup` returns (silos decode the published setup with it).
    setup_type: ClassVar[type[PublicSetup]] = PublicSetup

    @abstractmethod
    def setup(self, config: ExperimentConfig, info: FederationInfo) -> PublicSetup:
        """At the server, once: the published mechanism (never reads silo data)."""

    @abstractmethod
    def server(
        self,
        config: ExperimentConfig,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> ServerAlgorithm:
        """The server part, with the server's own randomness."""

    @abstractmethod
    def client(
        self,
        config: ExperimentConfig,
        client_id: int,
        data: ClientData,
        info: FederationInfo,
        setup: PublicSetup,
        randomness: Randomness,
    ) -> ClientAlgorithm:
        """One silo, built at the silo from its own data only."""

    def prepare(
        self, config: ExperimentConfig, federation: Federation
    ) -> tuple[ExperimentConfig, Federation]:
        """Simulation-only preparation before building (e.g. pooling for ``centralized``)."""
        return config, federation

    def algorithm_checks(self, config: ExperimentConfig, federation: Federation) -> list[str]:
        """The algorithm's own checks of the federation, after the shared ones: errors raise
        (naming the silo and the remedy), warnings are returned. None by default."""
        return []

    def check_federation(self, config: ExperimentConfig, federation: Federation) -> list[str]:
        """Every problem before training: the shared checks (:mod:`pdpfl.fl.checks`) and
        :meth:`algorithm_checks`. Warnings reach the run's headline and ``summary.json``."""
        return [*check_federation(config, federation), *self.algorithm_checks(config, federation)]

    def assemble(
        self, config: ExperimentConfig, federation: Federation, *, pooled: bool = False
    ) -> Assembly:
        """In one call, for the in-process runtime: prepare, the environment (shared checks,
        device, randomness; :func:`resolve_environment`), the algorithm's own checks, the server
        and silos, and the summation protocol, checked against the server.

        ``pooled``: the caller (the in-process simulator) accepts the silos as one
        :class:`~pdpfl.fl.pool.SiloPool` where the algorithm offers one (:meth:`build_pool`)."""
        config, federation = self.prepare(config, federation)
        algorithm = as_algorithm(config.algorithm)
        env = resolve_environment(config, federation)
        warnings = [*env.warnings, *algorithm.algorithm_checks(config, federation)]
        built = algorithm.build_pool(config, federation, env) if pooled else None
        pool: SiloPool | None = None
        clients: dict[int, ClientAlgorithm] = {}
        if built is not None:
            server, pool = built
        else:
            server, clients = algorithm.build_parties(config, federation, env)
        set_targets(config, federation, server, pool if pool is not None else clients)
        protocol = protocol_from_config(config)
        check_compatible(server, protocol)
        return Assembly(
            config,
            federation,
            server,
            clients,
            protocol,
            warnings,
            list(env.parameter_names),
            pool,
        )

    def build(
        self, config: ExperimentConfig, federation: Federation
    ) -> tuple[ServerAlgorithm, dict[int, ClientAlgorithm]]:
        """The server and every silo of an in-process federation (setup computed once; the
        federation is not checked: :meth:`assemble` does that)."""
        return self.build_parties(
            config, federation, resolve_environment(config, federation, check=False)
        )

    def build_pool(
        self, config: ExperimentConfig, federation: Federation, env: Environment
    ) -> tuple[ServerAlgorithm, SiloPool] | None:
        """The server and every silo as one :class:`~pdpfl.fl.pool.SiloPool` (in-process only),
        or None: this algorithm keeps one object per silo (the default)."""
        return None

    def build_parties(
        self, config: ExperimentConfig, federation: Federation, env: Environment
    ) -> tuple[ServerAlgorithm, dict[int, ClientAlgorithm]]:
        """The server and every silo from the resolved environment: :meth:`setup` once, then
        :meth:`server` and :meth:`client` with each party's own randomness."""
        setup = self.setup(config, env.info)
        server = self.server(config, env.info, setup, env.randomness["server"])
        clients = {
            i: self.client(config, i, c, env.info, setup, env.randomness[f"silo-{i}"])
            for i, c in enumerate(federation.clients)
        }
        return server, clients


def as_algorithm(section: AlgorithmConfig) -> Algorithm:
    """``config.algorithm`` as the :class:`Algorithm` it is (TypeError for a config class
    that was registered without subclassing :class:`Algorithm`)."""
    if not isinstance(section, Algorithm):
        raise TypeError(
            f"algorithm {section.name!r}: its config class {type(section).__name__} must "
            "subclass pdpfl.fl.algorithm.Algorithm"
        )
    return section


def register_algorithm(cls: A, *, replace: bool = False) -> A:
    """Register an :class:`Algorithm` subclass (usable as a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(f"register_algorithm: expected an Algorithm subclass, got {cls!r}")
    register_algorithm_config(cls, replace=replace)
    return cls


def build_federation_algorithms(
    config: ExperimentConfig, federation: Federation
) -> tuple[ServerAlgorithm, dict[int, ClientAlgorithm]]:
    """The server and every silo of ``config`` on an in-process federation."""
    return as_algorithm(config.algorithm).build(config, federation)
