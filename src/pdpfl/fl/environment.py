"""What a run's configuration decides before any algorithm is built, resolved once.

:func:`resolve_environment` reads the parsed configuration and the federation one time and
returns a frozen :class:`Environment`: the federation's public facts, the shared checks'
warnings, the training device, every party's own mechanism randomness and the model's
parameter names. The algorithm is then built from these values
(:meth:`pdpfl.fl.algorithm.Algorithm.assemble`), so nothing below re-derives them from the
config (the device used to be resolved three times, the initial model built twice).

The steps run in the order of the layers they reach, highest first: the shared checks
(:mod:`pdpfl.fl.checks`, which read the public batch sizes), the device (:mod:`pdpfl.dp.device`),
the budget table (:mod:`pdpfl.data.budget_table`), the randomness (:mod:`pdpfl.randomness`),
the public initial model (:mod:`pdpfl.models`). Each failure is a ``ValueError`` naming the
config field, raised before any mechanism is calibrated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdpfl.fl.api import FederationInfo
from pdpfl.fl.checks import check_silos
from pdpfl.fl.common import federation_info

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pdpfl.config import ExperimentConfig
    from pdpfl.data.federation import Federation
    from pdpfl.randomness import Randomness

__all__ = ["Environment", "parties", "resolve_environment"]


def parties(num_silos: int) -> list[str]:
    """The parties that own mechanism randomness: ``"server"``, ``"silo-0"``, ``"silo-1"``..."""
    return ["server", *(f"silo-{i}" for i in range(num_silos))]


@dataclass(frozen=True)
class Environment:
    """The values a run's config decides for every algorithm (see the module doc)."""

    #: The federation's public facts (shapes, ids, names; sizes only where declared public).
    info: FederationInfo
    #: Problems of the federation that do not stop the run (they reach the summary).
    warnings: tuple[str, ...]
    #: Where the silos train (``training.device``; checked here, on this machine).
    device: torch.device
    #: Each party's own randomness (secure: a fresh key per party; never shared).
    randomness: dict[str, Randomness]
    #: The torch names of the model's trainable parameters (the released model's keys).
    parameter_names: tuple[str, ...]


def resolve_environment(
    config: ExperimentConfig, federation: Federation, *, check: bool = True
) -> Environment:
    """Resolve :class:`Environment` for ``config`` on ``federation`` (``check=False`` skips the
    shared checks of the federation, e.g. for a federation that a test built by hand)."""
    from pdpfl.data.budget_table import check_budget_file
    from pdpfl.dp.device import training_device_for
    from pdpfl.models import initial_model, trainable_parameters
    from pdpfl.randomness import make_randomness

    owners = parties(len(federation.clients))
    info = federation_info(federation, config)
    warnings = check_silos(config, federation) if check else []
    device = training_device_for(config.training.device)  # fails before any work
    if check:
        warnings += check_budget_file(config, federation)
    # every party's own randomness (the server's and each silo's, never shared)
    rngs = {party: make_randomness(config.randomness, config.seed) for party in owners}
    x0 = initial_model(
        config.model.name,
        info.input_shape,
        info.num_classes,
        dict(config.model.options),
        seed=config.seed,
    )
    names = tuple(name for name, _ in trainable_parameters(x0))
    return Environment(info, tuple(warnings), device, rngs, names)
