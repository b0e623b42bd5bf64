"""Build an experiment's server and silos through the algorithm registry.

The same three steps run in every runtime:

1. :func:`public_setup` -- at the server, once: the algorithm's published mechanism (σ, the
   calibration, ...), from the config and the federation's public facts only;
2. :func:`build_server` -- the server part, with the server's own randomness;
3. :func:`build_client` -- at each silo, from that silo's own data, the public setup and the
   silo's own randomness.

The in-process simulator runs all three in one process (:func:`build_federation_algorithms`);
the Flower ServerApp runs 1-2 and each ClientApp runs 3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pdpfl.fl.api import ClientAlgorithm, FederationInfo, ServerAlgorithm
from pdpfl.fl.common import federation_info, party_randomness
from pdpfl.fl.registry import get_algorithm

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.config import ExperimentConfig

__all__ = [
    "build_client",
    "build_federation_algorithms",
    "build_server",
    "federation_info",
    "prepare",
    "public_setup",
]


def prepare(config: ExperimentConfig, federation: Any) -> tuple[ExperimentConfig, Any]:
    """Apply the algorithm's simulation-time preparation (e.g. pooling for ``centralized``)."""
    spec = get_algorithm(config.algorithm.name)
    if spec.prepare is None:
        return config, federation
    return spec.prepare(config, federation)


def public_setup(config: ExperimentConfig, info: FederationInfo) -> dict[str, Any]:
    """What the server publishes before round 1 (JSON-able; never reads silo data)."""
    return dict(get_algorithm(config.algorithm.name).setup(config, info))


def build_server(
    config: ExperimentConfig, info: FederationInfo, public: dict[str, Any]
) -> ServerAlgorithm:
    """The server part of ``config.algorithm``, with the server's own randomness."""
    spec = get_algorithm(config.algorithm.name)
    return spec.server(config, info, public, party_randomness(config, "server"))


def build_client(
    config: ExperimentConfig,
    client_id: int,
    client_data: Any,
    info: FederationInfo,
    public: dict[str, Any],
) -> ClientAlgorithm:
    """One silo, from its own data only, with its own randomness."""
    spec = get_algorithm(config.algorithm.name)
    return spec.client(
        config, int(client_id), client_data, info, public,
        party_randomness(config, f"silo-{int(client_id)}"),
    )


def build_federation_algorithms(
    config: ExperimentConfig, federation: Any
) -> tuple[ServerAlgorithm, dict[int, ClientAlgorithm]]:
    """The server and every silo of an in-process federation (setup computed once)."""
    info = federation_info(federation, config)
    public = public_setup(config, info)
    server = build_server(config, info, public)
    clients = {
        i: build_client(config, i, c, info, public) for i, c in enumerate(federation.clients)
    }
    return server, clients
