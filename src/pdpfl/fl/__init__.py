"""Federated algorithms: what a silo computes and releases, what the server does (no I/O).

* :mod:`pdpfl.fl.api` -- the ``ClientAlgorithm`` / ``ServerAlgorithm`` contract, the
  ``Contribution`` a silo releases and the ``Aggregate`` the server receives.
* :mod:`pdpfl.fl.algorithm` -- an algorithm is its parsed config section: ``setup``,
  ``server``, ``client``; :func:`~pdpfl.fl.algorithm.register_algorithm` registers one.
* :mod:`pdpfl.fl.template` -- the silo template that owns the round duties (catch-up, pre-check,
  charge before release, resume); algorithms override one step.
* :mod:`pdpfl.fl.aggregation` -- summation protocols: plain, secure, private weighting.
* One package (or module) per algorithm: :mod:`pdpfl.fl.rpdp` (rPDP-FL and the baselines of its
  paper), :mod:`pdpfl.fl.idp_fedavg`, :mod:`pdpfl.fl.uldp`, :mod:`pdpfl.fl.prifedsync`.
"""

from pdpfl.config import AlgorithmConfig, MethodSpec
from pdpfl.fl.algorithm import Algorithm, PublicSetup, as_algorithm, register_algorithm
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
from pdpfl.fl.template import BatchedSilo, RoundPlan, Silo

__all__ = [
    "Aggregate",
    "Algorithm",
    "AlgorithmConfig",
    "BatchedSilo",
    "ClientAlgorithm",
    "Contribution",
    "FederationInfo",
    "MethodSpec",
    "Params",
    "PrivacyBoundaryError",
    "PublicSetup",
    "RoundPlan",
    "Scalars",
    "ServerAlgorithm",
    "Silo",
    "as_algorithm",
    "register_algorithm",
]
