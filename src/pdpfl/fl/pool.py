"""Silo pools: many simulated silos kept as rows, not objects (the in-process simulator only).

A federation of thousands of clients of which a round samples a few (IDP-FedAvg's central
variant) should cost per round what the sampled clients cost. A :class:`SiloPool` stands in for
the ``{client id: silo}`` dictionary of an in-process run: it keeps every client's privacy
accounting in **one** vectorized ledger (one row per client) and builds a silo object only for a
client that is asked to train this round -- from the data and that ledger's row -- and drops it
after the round. It performs the silo template's round duties (:mod:`pdpfl.fl.template`:
catch-up, pre-check, charge before release, the release gate) for every client at once.

The in-process transport (:class:`pdpfl.runtime.simulation.InProcessTransport`), the budget-store
targets (:mod:`pdpfl.fl.lifetime`) and the run's outputs (one sealed ledger file) recognise a
pool; a Flower deployment never uses one (each SuperNode keeps its own ledger).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar

from pdpfl.fl.api import Contribution, Params, Scalars
from pdpfl.ledger import PrivacyLedger, PrivacySummary

__all__ = ["SiloPool"]


class SiloPool(ABC):
    """Every silo of an in-process federation, as rows (see the module docstring).

    Iterating a pool yields its client ids (as a dictionary of silos would); ``len`` is their
    number. ``ledger`` is the one ledger of every accounted client (None without DP);
    ``lifetime_target`` (set by :func:`pdpfl.fl.lifetime.set_targets`) its budget store.
    """

    #: The :class:`~pdpfl.fl.api.Contribution` metric keys a pooled silo may release.
    public_metrics: ClassVar[frozenset[str]] = frozenset()
    #: The pooled silos' units sit out a round that would exceed their budget (the pre-check).
    enforces_budgets: ClassVar[bool] = True
    #: Pooled silos send float updates (no discrete share encoding).
    share_encoding: Any = None
    #: The observer(s) the pre-check enforces the budgets against.
    adversary: str = "both"
    ledger: PrivacyLedger | None = None

    @property
    @abstractmethod
    def client_ids(self) -> list[int]:
        """Every client's id, ascending."""

    def __iter__(self) -> Iterator[int]:
        return iter(self.client_ids)

    def __len__(self) -> int:
        return len(self.client_ids)

    @abstractmethod
    def silo_names(self) -> list[str]:
        """Every client's name (from the data), in id order."""

    @abstractmethod
    def fit(
        self, selected: list[int], params: Params, round_index: int, config: Scalars
    ) -> list[Contribution]:
        """Round ``round_index``: charge every client (before any release), then the selected
        clients' contributions (in ``selected`` order), each through the silo's release gate."""

    @abstractmethod
    def evaluate(
        self, client_ids: list[int], params: Params, round_index: int, config: Scalars
    ) -> dict[int, Scalars]:
        """Charge every client through ``round_index``; each listed client's test metrics."""

    @abstractmethod
    def privacy_summary(self) -> PrivacySummary | None:
        """The privacy of every client (one summary; None when nothing is accounted)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The resumable state of every client (arrays, not one entry per client)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
