"""PriFedSync: personalized local models synchronized privately (Zheng, Chen, Long, Su,
*Federated f-Differential Privacy*, AISTATS 2021).

Algorithm 1 (the PriFedSync framework) with Algorithm 2 (NoisySGD) as local training,
instantiated as in the paper's §4: aggregation rate η = 1 and the interpolated helper model of
Eq. (2.1) with α = 0.1.

* :mod:`~pdpfl.fl.prifedsync.mechanism` -- the published setup, each client's record-level
  mechanism (:class:`~pdpfl.privacy.unit.LocalStepsPlan`) and its σ_j / K_j calibration;
* :mod:`~pdpfl.fl.prifedsync.silo` -- a client on the silo template: join coin, ledger,
  Algorithm 2 from its personalized local model, elastic sync (Eq. 2.1);
* :mod:`~pdpfl.fl.prifedsync.server` -- the aggregation (Algorithm 1);
* :mod:`~pdpfl.fl.prifedsync.config` -- the ``prifedsync`` config section, which builds them;
* :mod:`~pdpfl.fl.prifedsync.report` -- operator views over every client (simulation,
  benchmarks): local vs global models, the federated privacy numbers.
"""

from pdpfl.fl.prifedsync.config import PriFedSyncConfig
from pdpfl.fl.prifedsync.mechanism import (
    PriFedSyncSetup,
    client_plan,
    neighbouring,
    target_as_epsilon,
)
from pdpfl.fl.prifedsync.report import evaluate_models, federation_report
from pdpfl.fl.prifedsync.server import PriFedSyncServer
from pdpfl.fl.prifedsync.silo import PriFedSyncClient, PriFedSyncSilo

__all__ = [
    "PriFedSyncClient",
    "PriFedSyncConfig",
    "PriFedSyncServer",
    "PriFedSyncSetup",
    "PriFedSyncSilo",
    "client_plan",
    "evaluate_models",
    "federation_report",
    "neighbouring",
    "target_as_epsilon",
]
