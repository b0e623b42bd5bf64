"""Privacy accounting core of pdpfl: pure numpy/scipy, vectorized over per-record rates.

Fast path (functions): :mod:`~pdpfl.privacy.rdp` (Gaussian / Poisson-subsampled Gaussian RDP),
:mod:`~pdpfl.privacy.conversion` (RDP → (ε, δ)), :mod:`~pdpfl.privacy.two_stage` (rPDP-FL Lemma 6,
Theorem 1), :mod:`~pdpfl.privacy.search` (σ for a target ε). Mechanisms as data:
:mod:`~pdpfl.privacy.mechanisms` interpreted by the accountants registered in
:mod:`~pdpfl.privacy.registry` (``rdp`` — :mod:`~pdpfl.privacy.accountant`; ``pld`` —
:mod:`~pdpfl.privacy.pld`; ``gdp-clt``, an approximation — :mod:`~pdpfl.privacy.gdp_clt`), fed by
one description per algorithm (:mod:`~pdpfl.privacy.unit`), and the noise each mechanism adds,
described once beside its event (:mod:`~pdpfl.privacy.noise`). Also f-DP / Gaussian DP
(:mod:`~pdpfl.privacy.gdp`), sampling without replacement (:mod:`~pdpfl.privacy.wor`) and group
privacy (:mod:`~pdpfl.privacy.group`), the (distributed) discrete Gaussian
(:mod:`~pdpfl.privacy.discrete`) and Poisson sub-sampling of any RDP curve
(:mod:`~pdpfl.privacy.subsampled`).

Importing this package registers every accountant (each module registers itself into the
registry; imports point one way: no module of this package imports the package itself).
"""

from pdpfl.privacy import pld as _pld  # noqa: F401 (registers the "pld" accountant)
from pdpfl.privacy.accountant import RdpAccountant, mechanism_epsilon
from pdpfl.privacy.adversary import Adversary
from pdpfl.privacy.conversion import rdp_to_delta, rdp_to_epsilon
from pdpfl.privacy.discrete import (
    discrete_gaussian_rdp,
    distributed_discrete_gaussian_rdp,
)
from pdpfl.privacy.discrete_plan import SampledDiscreteGaussianPlan
from pdpfl.privacy.gdp import compose_gdp, gaussian_tradeoff, gdp_delta, gdp_epsilon
from pdpfl.privacy.gdp_clt import GdpCltAccountant
from pdpfl.privacy.mechanisms import (
    Composed,
    DistributedDiscreteGaussian,
    GaussianMechanism,
    GroupPrivacy,
    PoissonSampled,
    SampledWithoutReplacement,
    Sequence,
    TwoStageRound,
    plan_event,
)
from pdpfl.privacy.noise import GaussianNoise, JointGaussian, NoiseBindingError
from pdpfl.privacy.orders import DEFAULT_ORDERS
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.rdp import gaussian_rdp, poisson_gaussian_rdp, poisson_gaussian_rdp_pairs
from pdpfl.privacy.registry import (
    Accountant,
    UnsupportedEventError,
    accountant_names,
    make_accountant,
    register_accountant,
    unregister_accountant,
)
from pdpfl.privacy.search import find_noise_multiplier
from pdpfl.privacy.subsampled import poisson_subsampled_rdp
from pdpfl.privacy.two_stage import plan_epsilon, plan_rdp, round_rdp
from pdpfl.privacy.unit import (
    GroupPlan,
    LocalStepsPlan,
    SampledGaussianPlan,
    UnitMechanism,
)

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
    "unregister_accountant",
    "GaussianNoise",
    "JointGaussian",
    "NoiseBindingError",
    "make_accountant",
    "accountant_names",
    "mechanism_epsilon",
    "poisson_gaussian_rdp_pairs",
    "gaussian_tradeoff",
    "gdp_delta",
    "gdp_epsilon",
    "compose_gdp",
    "GdpCltAccountant",
    "GroupPrivacy",
    "SampledWithoutReplacement",
    "UnsupportedEventError",
    "UnitMechanism",
    "SampledGaussianPlan",
    "LocalStepsPlan",
    "GroupPlan",
    "DistributedDiscreteGaussian",
    "SampledDiscreteGaussianPlan",
    "discrete_gaussian_rdp",
    "distributed_discrete_gaussian_rdp",
    "poisson_subsampled_rdp",
]
