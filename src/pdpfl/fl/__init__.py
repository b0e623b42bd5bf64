"""Federated algorithms: what a silo computes and releases, what the server does (no I/O).

* :mod:`pdpfl.fl.api` -- the ``ClientAlgorithm`` / ``ServerAlgorithm`` contract, the
  ``Contribution`` a silo releases and the ``Aggregate`` the server receives.
* :mod:`pdpfl.fl.aggregation` -- summation protocols (plain; secure summation plugs in here).
* :mod:`pdpfl.fl.registry` -- one registration per algorithm (config section + builders).
* :mod:`pdpfl.fl.rpdp` -- rPDP-FL (paper §6.2, Algorithm 3): ``DpFedAvgClient``, ``FedAvgServer``.
* :mod:`pdpfl.fl.baselines` -- Minimum, Dropout, Uniform, PrivacyFree, centralized (§7.2).
* :mod:`pdpfl.fl.factory` -- build the server and silos of a config through the registry.
"""

from pdpfl.fl.api import (
    Aggregate,
    ClientAlgorithm,
    Contribution,
    FederationInfo,
    Params,
    PrivacyBoundaryError,
    Scalars,
    ServerAlgorithm,
)
from pdpfl.fl.publication import Publication
from pdpfl.fl.registry import (
    AlgorithmConfig,
    AlgorithmSpec,
    MethodSpec,
    get_algorithm,
    register_algorithm,
    register_method,
)

__all__ = [
    "Aggregate",
    "AlgorithmConfig",
    "AlgorithmSpec",
    "ClientAlgorithm",
    "Contribution",
    "FederationInfo",
    "MethodSpec",
    "Params",
    "PrivacyBoundaryError",
    "Publication",
    "Scalars",
    "ServerAlgorithm",
    "get_algorithm",
    "register_algorithm",
    "register_method",
]
