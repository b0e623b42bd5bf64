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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pdpfl.fl.api import Contribution, Params, PrivacyBoundaryError, Scalars
from pdpfl.ledger import PrivacyLedger, PrivacySummary

__all__ = ["PooledEvaluation", "SiloPool"]

if TYPE_CHECKING:
    from pdpfl.fl.aggregation.discrete_shares import ShareEncoding


@dataclass(frozen=True)
class PooledEvaluation:
    """Every pooled client's evaluation reply (``loss``, ``accuracy``, ``n``), as arrays in id
    order: the round's metrics line then carries the pooled metrics and the number of clients
    evaluated, not one entry per client (:func:`pdpfl.fl.rounds.metrics_line`)."""

    n: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray

    def check(self, round_index: int) -> None:
        """The gate of :data:`~pdpfl.fl.messages.EVALUATE_REPLY` for every reply at once:
        ``n`` an integer >= 0, ``loss`` >= 0 and ``accuracy`` in [0, 1] (or NaN)."""
        n, loss, acc = (np.asarray(a, dtype=np.float64) for a in (self.n, self.loss, self.accuracy))
        bad = (
            ~np.isfinite(n)
            | (n < 0)
            | (n != np.floor(n))
            | (loss < 0)
            | ((acc < 0) | (acc > 1))
            | np.isinf(acc)
        )
        if n.shape != loss.shape or n.shape != acc.shape:
            raise PrivacyBoundaryError(f"round {round_index}: evaluation replies of unequal length")
        if bad.any():
            silo = int(np.flatnonzero(bad)[0])
            raise PrivacyBoundaryError(
                f"silo {silo}: evaluation reply of round {round_index} out of range (n an integer "
                ">= 0, loss >= 0, accuracy in [0, 1])"
            )

    def diverged(self) -> int | None:
        """The first client whose test loss is not finite although it has test records."""
        bad = ~np.isfinite(np.asarray(self.loss, dtype=np.float64)) & (np.asarray(self.n) > 0)
        return int(np.flatnonzero(bad)[0]) if bad.any() else None

    def pooled(self) -> dict[str, float]:
        """:func:`pdpfl.fl.rounds.pooled_evaluation` of these replies (vectorized)."""
        has = np.asarray(self.n) > 0
        if not has.any():
            nan = float("nan")
            return {"accuracy": nan, "loss": nan, "mean_client_accuracy": nan}
        n = np.asarray(self.n, dtype=np.float64)[has]
        acc = np.asarray(self.accuracy, dtype=np.float64)[has]
        loss = np.asarray(self.loss, dtype=np.float64)[has]
        weights = n / n.sum()
        return {
            "accuracy": float(np.dot(weights, acc)),
            "loss": float(np.dot(weights, loss)),
            "mean_client_accuracy": float(acc.mean()),
        }


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
    share_encoding: ShareEncoding | None = None
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
    def evaluate(self, params: Params, round_index: int, config: Scalars) -> PooledEvaluation:
        """Charge every client through ``round_index``; every client's test metrics."""

    @abstractmethod
    def privacy_summary(self) -> PrivacySummary | None:
        """The privacy of every client (one summary; None when nothing is accounted)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The resumable state of every client (arrays, not one entry per client)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
