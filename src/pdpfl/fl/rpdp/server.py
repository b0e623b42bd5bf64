"""The DP-FedAvg server of rPDP-FL (Algorithm 3, lines 5-7 and 17) and of every baseline.

Poisson client sampling with rate λ -- one independent coin per client from the server's own
secret randomness; an empty round is allowed and counts (line 7) -- and
x^{t+1} = x^t + η_s · Σ Δx_i / Σ w_i with w_i = 1 (the paper's simple average; line 17) or
w_i = n_i when the silo sizes are declared public (``data.public_silo_sizes``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pdpfl.fl.api import Aggregate, Params, Scalars

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.randomness import Randomness

__all__ = ["FedAvgServer"]


class FedAvgServer:
    """The server of rPDP-FL (Algorithm 3, lines 5-7 and 17) and of every DP-FedAvg baseline.

    Parameters
    ----------
    initial_params
        x⁰, the public initial model.
    client_rate
        λ: each client is selected independently with probability λ every round.
    randomness
        The server's own randomness (client-sampling coins).
    server_lr
        η_s: x^{t+1} = x^t + η_s · Σ Δx_i / Σ w_i.
    central_noise
        The silos' central discrete noise (``privacy.central_noise: discrete``): its grid,
        shown in ``summary.json`` (public, derived from the config and the model).
    """

    public_metrics: ClassVar[frozenset[str]] = frozenset()
    needs_individual_updates: ClassVar[bool] = False

    def __init__(
        self,
        initial_params: Params,
        *,
        client_rate: float,
        randomness: Randomness,
        server_lr: float = 1.0,
        central_noise: dict[str, Any] | None = None,
    ) -> None:
        if not 0 < client_rate <= 1:
            raise ValueError(f"client_rate: must be in (0, 1], got {client_rate}")
        self._initial = [np.asarray(p, dtype=np.float32).copy() for p in initial_params]
        self.client_rate = float(client_rate)
        self.randomness = randomness
        self.server_lr = float(server_lr)
        self.participation: dict[int, int] = {}
        self.rounds_done = 0
        self.empty_rounds = 0
        self.central_noise = central_noise

    def initial_params(self) -> Params:
        return [p.copy() for p in self._initial]

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        """Poisson client sampling: one independent Bernoulli(λ) coin per client (sorted ids)."""
        ids = sorted(int(c) for c in client_ids)
        if self.client_rate >= 1.0:
            return ids
        coins = self.randomness.stream("client-sampling", int(round_index)).uniform(len(ids))
        return [c for c, u in zip(ids, coins, strict=True) if u < self.client_rate]

    def round_config(self, round_index: int) -> Scalars:
        return {"round": int(round_index)}

    def aggregate(self, round_index: int, global_params: Params, aggregate: Aggregate) -> Params:
        """x^{t+1} = x^t + η_s Σ_i Δx_i·w_i / Σ_i w_i (unchanged for an empty round)."""
        if aggregate.empty or aggregate.weight <= 0:
            return [np.asarray(p).copy() for p in global_params]
        scale = self.server_lr / aggregate.weight
        return [
            (np.asarray(base, dtype=np.float64) + scale * np.asarray(t, dtype=np.float64)).astype(
                np.float32
            )
            for base, t in zip(global_params, aggregate.total, strict=True)
        ]

    def record_round(self, round_index: int, selected: list[int]) -> None:
        """Type I view: how many rounds each client took part in (empty rounds count)."""
        for c in selected:
            self.participation[int(c)] = self.participation.get(int(c), 0) + 1
        self.rounds_done += 1
        self.empty_rounds += int(not selected)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "participation": {str(k): v for k, v in self.participation.items()},
            "rounds_done": self.rounds_done,
            "empty_rounds": self.empty_rounds,
        }
        if self.central_noise is not None:  # derived from the config: not loaded back
            state["central_noise"] = dict(self.central_noise)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.participation = {int(k): int(v) for k, v in state["participation"].items()}
        self.rounds_done = int(state["rounds_done"])
        self.empty_rounds = int(state["empty_rounds"])
