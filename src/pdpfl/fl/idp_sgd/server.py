"""The IDP-SGD Scale server: Poisson client sampling at λ and the FedAvg step (DP-FedAvg).

Each round every silo is selected by its own Bernoulli(λ) coin from the server's secret
randomness (an empty round counts), and x^{t+1} = x^t + η_s · Σ Δx_i / Σ w_i with w_i = 1. The
server never sees a record, a budget or a clip norm: only the sum of the noisy updates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pdpfl.fl.api import Aggregate, Params, Scalars

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.randomness import Randomness

__all__ = ["ScaleServer"]


class ScaleServer:
    """A :class:`~pdpfl.fl.api.ServerAlgorithm`: λ-sampling of silos and the FedAvg step."""

    public_metrics: ClassVar[frozenset[str]] = frozenset()
    needs_individual_updates: ClassVar[bool] = False

    def __init__(
        self,
        initial: Params,
        *,
        client_rate: float,
        randomness: Randomness,
        server_lr: float,
        central_noise: dict[str, Any] | None = None,
    ) -> None:
        self._initial = [np.asarray(p, dtype=np.float32).copy() for p in initial]
        self.client_rate, self.server_lr = float(client_rate), float(server_lr)
        self.randomness = randomness
        self.rounds_done = 0
        #: The silos' central discrete noise grid (summary.json; derived, not loaded back).
        self.central_noise = central_noise

    def initial_params(self) -> Params:
        return [p.copy() for p in self._initial]

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        """One independent Bernoulli(λ) coin per silo (sorted ids)."""
        ids = sorted(int(c) for c in client_ids)
        if self.client_rate >= 1.0:
            return ids
        coins = self.randomness.stream("client-sampling", int(round_index)).uniform(len(ids))
        return [c for c, u in zip(ids, coins, strict=True) if u < self.client_rate]

    def round_config(self, round_index: int) -> Scalars:
        return {"round": int(round_index)}

    def aggregate(self, round_index: int, global_params: Params, aggregate: Aggregate) -> Params:
        """x + η_s · ΣΔx / Σw (the model unchanged after an empty round)."""
        if aggregate.empty or aggregate.weight <= 0:
            return [np.asarray(p).copy() for p in global_params]
        scale = self.server_lr / aggregate.weight
        return [
            (np.asarray(x, np.float64) + scale * np.asarray(t, np.float64)).astype(np.float32)
            for x, t in zip(global_params, aggregate.total, strict=True)
        ]

    def record_round(self, round_index: int, selected: list[int]) -> None:
        self.rounds_done += 1

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rounds_done": self.rounds_done}
        if self.central_noise is not None:
            state["central_noise"] = dict(self.central_noise)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds_done = int(state["rounds_done"])
