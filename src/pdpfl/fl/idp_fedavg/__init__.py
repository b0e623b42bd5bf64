"""IDP-FedAvg: every client its own ε through individualized client sampling.

Lange, Borchardt & Rahm, "Federated Learning With Individualized Privacy Through Client
Sampling" (arXiv 2501.17634; reference code luckyos-code/flidp). The privacy unit is a whole
client; equations and algorithm numbers are the paper's, restated with the reconstruction notes
(spec B.1-B.7) in docs/idp_fedavg.md.

* :mod:`~pdpfl.fl.idp_fedavg.budgets` -- each client's ε (privacy groups or a file);
* :mod:`~pdpfl.fl.idp_fedavg.sample` -- SAMPLE (Algorithm 1) with verification;
* :mod:`~pdpfl.fl.idp_fedavg.mechanism` -- the published :class:`IdpSetup`, SCALE, the noise
  split of adaptive clipping, each client's accounting event;
* :mod:`~pdpfl.fl.idp_fedavg.training` -- local training and evaluation, alone or batched;
* :mod:`~pdpfl.fl.idp_fedavg.silo` -- the client on the silo template (central / distributed);
* :mod:`~pdpfl.fl.idp_fedavg.server` -- sampling, aggregation, adaptive clipping (Algorithm 2);
* :mod:`~pdpfl.fl.idp_fedavg.central_discrete` -- the central server's exact discrete value and
  count noise (``privacy.central_noise: discrete``) and the event each client is charged;
* :mod:`~pdpfl.fl.idp_fedavg.config` -- the ``idp-fedavg`` section, which builds all of them.
"""

from pdpfl.fl.idp_fedavg.budgets import (
    assign_client_budgets,
    client_budget,
    label_of,
    read_budget_file,
)
from pdpfl.fl.idp_fedavg.config import COMPARE_METHODS, IdpFedAvgConfig
from pdpfl.fl.idp_fedavg.mechanism import (
    IdpSetup,
    client_mechanism,
    clip_update,
    publish,
    scale_noise,
    split_noise,
)
from pdpfl.fl.idp_fedavg.sample import GroupRates, noise_for_rate, sample_group_rates
from pdpfl.fl.idp_fedavg.server import CentralIdpServer, DistributedIdpServer, IdpFedAvgServer
from pdpfl.fl.idp_fedavg.silo import CentralIdpSilo, DistributedIdpSilo, IdpJob, IdpSilo
from pdpfl.fl.idp_fedavg.training import (
    LocalTraining,
    choose_strategy,
    evaluate_clients,
    has_conv,
    repeated_epochs,
    train_clients,
)

__all__ = [
    "COMPARE_METHODS",
    "CentralIdpServer",
    "CentralIdpSilo",
    "DistributedIdpServer",
    "DistributedIdpSilo",
    "GroupRates",
    "IdpFedAvgConfig",
    "IdpFedAvgServer",
    "IdpJob",
    "IdpSetup",
    "IdpSilo",
    "LocalTraining",
    "assign_client_budgets",
    "choose_strategy",
    "client_budget",
    "client_mechanism",
    "clip_update",
    "evaluate_clients",
    "has_conv",
    "label_of",
    "noise_for_rate",
    "publish",
    "read_budget_file",
    "repeated_epochs",
    "sample_group_rates",
    "scale_noise",
    "split_noise",
    "train_clients",
]
