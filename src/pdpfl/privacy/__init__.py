"""Privacy accounting core of pdpfl: pure numpy/scipy, vectorized over per-record rates.

Fast path (functions): :mod:`~pdpfl.privacy.rdp` (Gaussian / Poisson-subsampled Gaussian RDP),
:mod:`~pdpfl.privacy.conversion` (RDP → (ε, δ)), :mod:`~pdpfl.privacy.two_stage` (rPDP-FL Lemma 6,
Theorem 1), :mod:`~pdpfl.privacy.search` (σ for a target ε). Mechanisms as data:
:mod:`~pdpfl.privacy.mechanisms` interpreted by the accountants of
:mod:`~pdpfl.privacy.accountant` (registry: ``rdp``, ``pld`` — :mod:`~pdpfl.privacy.pld`), fed by
one description per algorithm (:mod:`~pdpfl.privacy.unit`). Also f-DP /
Gaussian DP (:mod:`~pdpfl.privacy.gdp`) and group privacy (:mod:`~pdpfl.privacy.group`).
"""

from pdpfl.privacy.accountant import (
    Accountant,
    RdpAccountant,
    accountant_names,
    make_accountant,
    mechanism_epsilon,
    register_accountant,
)
from pdpfl.privacy.adversary import Adversary
from pdpfl.privacy.conversion import rdp_to_delta, rdp_to_epsilon
from pdpfl.privacy.gdp import compose_gdp, gaussian_tradeoff, gdp_delta, gdp_epsilon
from pdpfl.privacy.mechanisms import (
    Composed,
    GaussianMechanism,
    PoissonSampled,
    Sequence,
    TwoStageRound,
    plan_event,
)
from pdpfl.privacy.orders import DEFAULT_ORDERS
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.rdp import gaussian_rdp, poisson_gaussian_rdp, poisson_gaussian_rdp_pairs
from pdpfl.privacy.search import find_noise_multiplier
from pdpfl.privacy.two_stage import plan_epsilon, plan_rdp, round_rdp

__all__ = [
    "DEFAULT_ORDERS",
    "Adversary",
    "TrainingPlan",
    "gaussian_rdp",
    "poisson_gaussian_rdp",
    "rdp_to_epsilon",
    "rdp_to_delta",
    "round_rdp",
    "plan_rdp",
    "plan_epsilon",
    "find_noise_multiplier",
    "GaussianMechanism",
    "PoissonSampled",
    "Composed",
    "TwoStageRound",
    "Sequence",
    "plan_event",
    "RdpAccountant",
    "Accountant",
    "register_accountant",
    "make_accountant",
    "accountant_names",
    "mechanism_epsilon",
    "poisson_gaussian_rdp_pairs",
    "gaussian_tradeoff",
    "gdp_delta",
    "gdp_epsilon",
    "compose_gdp",
]
