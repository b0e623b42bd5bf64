"""rPDP-FL: record-level personalized DP federated learning (rPDP-FL §6.2, Algorithm 3).

* :mod:`~pdpfl.fl.rpdp.mechanism` -- what the server publishes (σ, the estimator F; lines 1-4),
  computed from a :class:`~pdpfl.fl.rpdp.mechanism.MechanismSpec` (never the config);
* :mod:`~pdpfl.fl.rpdp.silo` -- personalized DP-SGD at a silo (lines 9-16) on the silo template;
* :mod:`~pdpfl.fl.rpdp.server` -- client sampling and the FedAvg step (lines 5-7, 17);
* :mod:`~pdpfl.fl.rpdp.config` -- the ``rpdp`` config section, which reads the config once into
  plain values and builds all of them;
* :mod:`~pdpfl.fl.rpdp.baselines` -- Minimum, Dropout, Uniform, PrivacyFree, centralized (§7.2).
"""

from pdpfl.fl.rpdp import baselines
from pdpfl.fl.rpdp.config import DpFedAvgConfig, RpdpConfig, mechanism_spec
from pdpfl.fl.rpdp.mechanism import DpFedAvgSetup, MechanismSpec, mechanism_plan, noise_multiplier
from pdpfl.fl.rpdp.server import FedAvgServer
from pdpfl.fl.rpdp.silo import DpFedAvgClient, DpFedAvgSilo

__all__ = [
    "DpFedAvgClient",
    "DpFedAvgConfig",
    "DpFedAvgSetup",
    "DpFedAvgSilo",
    "FedAvgServer",
    "MechanismSpec",
    "RpdpConfig",
    "baselines",
    "mechanism_plan",
    "mechanism_spec",
    "noise_multiplier",
]
