"""PriFedSync's server (Algorithm 1, aggregation with rate η; §4 uses η = 1).

It asks every client each round -- whether a client joins is the client's own coin, and a
round nobody joins is never redrawn -- and sees only the aggregate's sums: Σ w̃_j over the
joined clients and |Ω| = Σ weights (a client that did not join sends zeros of weight 0), so any
summation protocol applies. The global model becomes w̄ ← (1 − η)·w̄ + η·Σ_{j∈Ω} w̃_j / |Ω|;
an empty round leaves it as it is.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pdpfl.fl.api import Aggregate, Params, Scalars

__all__ = ["PriFedSyncServer"]


class PriFedSyncServer:
    """Algorithm 1's server: global ← (1 − η)·global + η·(Σ w̃_j)/|Ω| from the aggregate.

    Parameters
    ----------
    initial
        x⁰, the public initial model.
    server_lr
        η in (0, 1].
    """

    public_metrics: ClassVar[frozenset[str]] = frozenset()
    needs_individual_updates: ClassVar[bool] = False

    def __init__(
        self,
        initial: Params,
        *,
        server_lr: float = 1.0,
        central_noise: dict[str, Any] | None = None,
    ) -> None:
        if not 0 < server_lr <= 1:
            raise ValueError(f"algorithm.server_lr: must be in (0, 1], got {server_lr}")
        self._initial = [np.asarray(p, dtype=np.float32).copy() for p in initial]
        self.server_lr = float(server_lr)
        #: |Ω| of every round so far.
        self.joined: list[int] = []
        self.rounds_done = 0
        self.empty_rounds = 0
        self._last_joined = 0
        #: The clients' central discrete grid (``privacy.central_noise: discrete``) for the run
        #: summary; derived from the config, not loaded back.
        self.central_noise = central_noise

    def initial_params(self) -> Params:
        return [p.copy() for p in self._initial]

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        """Every client: whether it joins is its own coin (Algorithm 1's Ω is never redrawn)."""
        return sorted(int(c) for c in client_ids)

    def round_config(self, round_index: int) -> Scalars:
        return {"round": int(round_index)}

    def aggregate(self, round_index: int, global_params: Params, aggregate: Aggregate) -> Params:
        joined = int(round(aggregate.weight)) if not aggregate.empty else 0
        self._last_joined = joined
        if joined <= 0:
            return [np.asarray(p).copy() for p in global_params]
        eta = self.server_lr
        return [
            (
                (1.0 - eta) * np.asarray(g, np.float64)
                + eta * np.asarray(t, np.float64) / aggregate.weight
            ).astype(np.float32)
            for g, t in zip(global_params, aggregate.total, strict=True)
        ]

    def record_round(self, round_index: int, selected: list[int]) -> None:
        self.joined.append(self._last_joined)
        self.rounds_done += 1
        self.empty_rounds += int(self._last_joined == 0)

    def state_dict(self) -> dict[str, Any]:
        return {
            "joined": list(self.joined),
            "rounds_done": self.rounds_done,
            "empty_rounds": self.empty_rounds,
            "participation": {},
            **({} if self.central_noise is None else {"central_noise": dict(self.central_noise)}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.joined = [int(v) for v in state["joined"]]
        self.rounds_done = int(state["rounds_done"])
        self.empty_rounds = int(state["empty_rounds"])
