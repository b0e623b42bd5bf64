"""Federated algorithms: what a silo computes and what the server aggregates (no I/O).

* :mod:`pdpfl.fl.api` -- the ``ClientAlgorithm`` / ``ServerAlgorithm`` contract.
* :mod:`pdpfl.fl.rpdp` -- rPDP-FL (paper §6.2, Algorithm 3): ``RpdpClient``, ``RpdpServer``.
* :mod:`pdpfl.fl.publication` -- the public mechanism the server publishes before round 1.
* :mod:`pdpfl.fl.baselines` -- Minimum, Dropout, PrivacyFree, Uniform, centralized (§7.2).
* :mod:`pdpfl.fl.factory` -- ``build_server`` / ``build_client`` / ``build_federation_algorithms``.
"""

from pdpfl.fl.api import ClientAlgorithm, ClientUpdate, Params, Scalars, ServerAlgorithm
from pdpfl.fl.publication import Publication
from pdpfl.fl.rpdp import RpdpClient, RpdpServer

__all__ = [
    "ClientAlgorithm",
    "ClientUpdate",
    "Params",
    "Publication",
    "RpdpClient",
    "RpdpServer",
    "Scalars",
    "ServerAlgorithm",
]
