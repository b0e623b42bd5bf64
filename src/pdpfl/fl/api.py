"""The contract between federated algorithms and the runtimes that execute them.

An algorithm is split into what a silo computes (:class:`ClientAlgorithm`, which holds the silo's
private data, budgets, sampling rates and record ledger) and what the server computes
(:class:`ServerAlgorithm`: client sampling, aggregation, the Type I participation view). Neither
side does I/O, threads or sockets; a runtime (the in-process simulator or Flower) only moves
:data:`Params` and small dictionaries of scalars between them, so both runtimes execute exactly the
same code and, with the same seed, produce the same model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

#: Model parameters as float32 arrays in ``state_dict`` order: what crosses the network.
Params = list[np.ndarray]

#: Scalars only (int, float, str, bool): safe to send as a Flower ConfigRecord/MetricRecord.
Scalars = dict[str, Any]


@dataclass
class ClientUpdate:
    """What a selected silo returns after its local training in one round."""

    client_id: int
    delta: Params
    """Local model minus the global model it started from, after τ local steps."""
    metrics: Scalars = field(default_factory=dict)
    """Aggregate, non-sensitive metrics (e.g. mean local loss, number of active records)."""
    num_examples: int = 0
    """The silo's training-set size. Private: only the optional weighted aggregation uses it."""


@runtime_checkable
class ClientAlgorithm(Protocol):
    """The silo side of an algorithm (lives where the data lives)."""

    client_id: int

    def fit(self, global_params: Params, round_index: int, config: Scalars) -> ClientUpdate:
        """Run this round's local training from ``global_params`` and return the update."""
        ...

    def evaluate(self, params: Params, round_index: int, config: Scalars) -> Scalars:
        """Test loss/accuracy of ``params`` on this silo's test split (``loss``, ``accuracy``, ``n``)."""
        ...

    def privacy_summary(self) -> Scalars:
        """Aggregate privacy state of this silo's records (no per-record values)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume this silo exactly (ledger, counters)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class ServerAlgorithm(Protocol):
    """The server side of an algorithm."""

    def initial_params(self) -> Params: ...

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        """Clients taking part in this round (e.g. Poisson sampling with rate λ; may be empty)."""
        ...

    def round_config(self, round_index: int) -> Scalars:
        """Public per-round configuration sent to the selected silos."""
        ...

    def aggregate(
        self, round_index: int, global_params: Params, updates: list[ClientUpdate]
    ) -> Params:
        """The next global model (an empty round returns ``global_params`` unchanged)."""
        ...

    def record_round(self, round_index: int, selected: list[int]) -> None:
        """Update the server's own (Type I) view after a round."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
