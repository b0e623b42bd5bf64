"""The IDP-FedAvg server (Algorithm 2): sampling, aggregation and adaptive clipping.

Every round (spec B.3, made exact):

1. sampling -- central: one independent Bernoulli(q_{g(i)}) per client from the server's own
   randomness, no redraw of an empty round; distributed: every client is asked and flips its
   own coin;
2. the clipped updates are summed, N(0, σ_v²C_t²) is added (central: by the server, from the
   setup's noise description :meth:`~pdpfl.fl.idp_fedavg.mechanism.IdpSetup.aggregation_noise`
   through :func:`pdpfl.dp.noise.add_noise`; distributed: the clients' shares) and the sum is
   divided by the public denominator (the expected number of sampled clients, never the
   realized count, spec I6); θ ← θ + η_s·mean;
3. adaptive clipping (Andrew et al. 2021, geometric): the noisy fraction of unclipped updates
   b̃_t (count noise σ_b) moves C_{t+1} = C_t·exp(−η_C(b̃_t − γ)) (:func:`clip_update`). C_t is
   public: it is sent with every round's configuration (``clip_norm``).

Audit canaries (:mod:`pdpfl.audit.client_canaries`; nothing here in an ordinary run): the
central server's :attr:`~IdpFedAvgServer.extra_rows` are canary *clients* at the trusted
aggregator -- each sampled with its own Bernoulli(q) from the server's stream, its update clipped
to C_t, counted in the unclipped fraction and added to the clipped sum before the noise.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pdpfl.fl.api import Aggregate, Params, Scalars
from pdpfl.fl.idp_fedavg.mechanism import IdpSetup, clip_update
from pdpfl.randomness import Randomness

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.dp.extra_rows import ExtraRows
    from pdpfl.fl.aggregation.discrete_shares import ShareEncoding

__all__ = ["CentralIdpServer", "DistributedIdpServer", "IdpFedAvgServer"]


class IdpFedAvgServer(ABC):
    """The IDP-FedAvg server (Algorithm 2). Subclasses fix the trust model.

    Parameters
    ----------
    initial_params
        θ⁰ (public).
    setup
        The published :class:`~pdpfl.fl.idp_fedavg.mechanism.IdpSetup`.
    client_groups
        Central variant: each client's privacy-group index (the server samples client i with
        q_{g(i)}, so it knows the groups, as in the paper). ``None`` in the distributed variant.
    randomness
        The server's own randomness (client coins, noise, count noise).
    """

    public_metrics: ClassVar[frozenset[str]] = frozenset()
    #: The clients' discrete share encoding (distributed variant; None: float updates).
    share_encoding: ShareEncoding | None = None
    needs_individual_updates: ClassVar[bool] = False

    def __init__(
        self,
        initial_params: Params,
        setup: IdpSetup,
        *,
        client_groups: np.ndarray | None,
        randomness: Randomness,
    ) -> None:
        self._initial = [np.asarray(p, dtype=np.float32).copy() for p in initial_params]
        self.setup = setup
        self.randomness = randomness
        self.groups = None if client_groups is None else np.asarray(client_groups, dtype=np.int64)
        self.clip_norm = float(setup.initial_clip)
        self.clip_history: list[float] = []
        self.unclipped_history: list[float] = []
        self.participation: dict[int, int] = {}
        self.rounds_done = 0
        self.empty_rounds = 0
        self._selected: dict[int, list[int]] = {}
        #: Audit canary clients (central variant; None in every ordinary run).
        self.extra_rows: ExtraRows | None = None

    def initial_params(self) -> Params:
        return [p.copy() for p in self._initial]

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        """Every client is asked (override: the central server samples)."""
        return sorted(int(c) for c in client_ids)

    def round_config(self, round_index: int) -> Scalars:
        """Public per-round values: the round and the current clip norm C_t."""
        return {"round": int(round_index), "clip_norm": float(self.clip_norm)}

    @abstractmethod
    def aggregate(self, round_index: int, global_params: Params, aggregate: Aggregate) -> Params:
        """The next global model from this round's aggregate (the variant's trust model)."""

    def _step(self, global_params: Params, mean: list[np.ndarray]) -> Params:
        eta = self.setup.server_lr
        return [
            (np.asarray(base, dtype=np.float64) + eta * np.asarray(m, dtype=np.float64)).astype(
                np.float32
            )
            for base, m in zip(global_params, mean, strict=True)
        ]

    def _adapt(self, unclipped: float) -> None:
        """C_{t+1} from the noisy unclipped fraction (adaptive clipping only)."""
        self.clip_history.append(self.clip_norm)
        if not self.setup.adaptive:
            return
        b = min(1.0, max(0.0, unclipped))
        self.unclipped_history.append(b)
        self.clip_norm = clip_update(
            self.clip_norm, b, self.setup.target_quantile, self.setup.clip_lr
        )

    def record_round(self, round_index: int, selected: list[int]) -> None:
        for c in selected:
            self.participation[int(c)] = self.participation.get(int(c), 0) + 1
        self.rounds_done += 1
        self.empty_rounds += int(not selected)
        self._selected.pop(int(round_index), None)

    def state_dict(self) -> dict[str, Any]:
        return {
            "clip_norm": self.clip_norm,
            "clip_history": list(self.clip_history),
            "unclipped_history": list(self.unclipped_history),
            "participation": {str(k): v for k, v in self.participation.items()},
            "rounds_done": self.rounds_done,
            "empty_rounds": self.empty_rounds,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clip_norm = float(state["clip_norm"])
        self.clip_history = [float(v) for v in state["clip_history"]]
        self.unclipped_history = [float(v) for v in state["unclipped_history"]]
        self.participation = {int(k): int(v) for k, v in state["participation"].items()}
        self.rounds_done = int(state["rounds_done"])
        self.empty_rounds = int(state["empty_rounds"])


class CentralIdpServer(IdpFedAvgServer):
    """Central DP (the paper): the trusted aggregator samples, clips, sums and adds noise."""

    needs_individual_updates: ClassVar[bool] = True

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        """One independent Bernoulli(q_{g(i)}) per client from the server's randomness."""
        ids = sorted(int(c) for c in client_ids)
        if self.groups is None:
            raise ValueError("the central IDP-FedAvg server needs every client's group")
        rates = np.asarray(self.setup.rates)[self.groups[ids]]
        coins = self.randomness.stream("client-sampling", int(round_index)).uniform(len(ids))
        chosen = [c for c, u, q in zip(ids, coins, rates, strict=True) if u < q]
        self._selected[int(round_index)] = chosen
        return chosen

    def aggregate(self, round_index: int, global_params: Params, aggregate: Aggregate) -> Params:
        """Clip each Δ_i to C_t (SCALE: C_{g(i)}), sum, add N(0, σ_v²C_t²), divide by the
        public denominator; update C_t with the noisy unclipped fraction."""
        import torch

        from pdpfl.dp.noise import add_noise
        from pdpfl.dp.steps import noisy_normalised_sum

        t = int(round_index)
        setup = self.setup
        contributions = list(aggregate.contributions or [])
        shapes = [np.shape(p) for p in global_params]
        if contributions:
            stacked = [
                torch.as_tensor(
                    np.stack([np.asarray(c.update[i], dtype=np.float64) for c in contributions])
                )
                for i in range(len(shapes))
            ]
        else:
            stacked = [torch.zeros((0, *s), dtype=torch.float64) for s in shapes]
        if not setup.private:
            sums = [s.sum(0) for s in stacked]
            mean = noisy_normalised_sum(sums, None, setup.denominator, None)
            self._adapt(0.0)
            return self._step(global_params, [m.numpy() for m in mean])
        sums, below = self._clipped_sum(stacked, shapes, self._clip_factors(t, len(contributions)))
        if self.extra_rows is not None:  # audit canary clients: sampled, clipped, counted
            before = int(self.extra_rows.counts.sum())
            self.extra_rows.add_sampled(
                sums, self.randomness.stream("audit-canary-clients", t), self.clip_norm
            )
            below -= 0.5 * (int(self.extra_rows.counts.sum()) - before)  # all above C_t
        # (no accounted client at all -- every group ε = ∞ -- needs no noise)
        accounted = any(setup.accounted(g) for g in range(len(setup.budgets)))
        if setup.central_noise == "discrete":
            return self._aggregate_discrete(t, global_params, sums, below, accounted)
        mean = noisy_normalised_sum(
            sums,
            setup.aggregation_noise(self.clip_norm) if accounted else None,
            setup.denominator,
            self.randomness.stream("aggregation-noise", t),
        )
        unclipped = 0.0
        count = setup.count_noise()
        if count is not None:
            value = torch.tensor([below], dtype=torch.float64)
            add_noise(value, count, self.randomness.stream("count-noise", t))
            unclipped = float(value[0]) / setup.denominator + 0.5
        new = self._step(global_params, [m.numpy() for m in mean])
        self._adapt(unclipped)
        return new

    def _aggregate_discrete(
        self, t: int, global_params: Params, sums: list[Any], below: float, accounted: bool
    ) -> Params:
        """``privacy.central_noise: discrete`` (:mod:`pdpfl.fl.idp_fedavg.central_discrete`): the
        clipped sum in units of C_t on the grid γ = 2^k + an exact N_Z(0, σ_Z²)^d, the count
        2·Σ(1[‖Δ‖ ≤ C_t] − ½) ∈ Z + an exact N_Z(0, (2σ_b)²), each through the one noise adder;
        then ×C_t/denominator and b̃_t = count/(2·denominator) + ½ (post-processing)."""
        import torch

        from pdpfl.dp.noise import add_noise
        from pdpfl.dp.steps import noisy_normalised_sum
        from pdpfl.fl.idp_fedavg import central_discrete

        setup, clip = self.setup, float(self.clip_norm)
        value = central_discrete.value_noise(setup) if accounted else None
        count = central_discrete.count_noise(setup)
        if accounted:  # the noises drawn are at least what every ledger charges
            central_discrete.check_drawn(setup)
        units = [s.to(torch.float64) / clip for s in sums]  # C_t = 1: a fixed grid
        mean = noisy_normalised_sum(
            units, value, setup.denominator, self.randomness.stream("aggregation-noise", t)
        )
        unclipped = 0.0
        if count is not None:
            doubled = torch.tensor([round(2.0 * below)], dtype=torch.int64)  # an integer already
            add_noise(doubled, count, self.randomness.stream("count-noise", t))
            unclipped = float(doubled[0]) / (2.0 * setup.denominator) + 0.5
        new = self._step(global_params, [m.numpy() * clip for m in mean])
        self._adapt(unclipped)
        return new

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.setup.central_noise == "discrete" and any(
            self.setup.accounted(g) for g in range(len(self.setup.budgets))
        ):  # for the run summary (derived from the setup: ignored when loading)
            from pdpfl.fl.idp_fedavg.central_discrete import summary

            state["central_noise"] = summary(self.setup)
        return state

    def _clipped_sum(
        self, stacked: list[Any], shapes: list[tuple[int, ...]], factors: np.ndarray
    ) -> tuple[list[Any], float]:
        """Σ_i clip(Δ_i, C_t·f_i) and Σ_i (1[‖Δ_i‖ ≤ C_t·f_i] − ½)."""
        import torch

        from pdpfl.dp.steps import clip_vectors, vector_norms

        k = len(factors)
        if not k:
            return [torch.zeros(s, dtype=torch.float64) for s in shapes], 0.0
        bound = torch.as_tensor(self.clip_norm * factors, dtype=torch.float64)
        # A non-finite update (crafted or broken) would turn the noisy sum into NaN: it is
        # replaced by zeros, which the clipping bound trivially holds for.
        bad = ~torch.stack([torch.isfinite(s.reshape(k, -1)).all(1) for s in stacked]).all(0)
        if bool(bad.any()):
            keep = (~bad).to(torch.float64)
            stacked = [
                torch.nan_to_num(s, nan=0.0, posinf=0.0, neginf=0.0)
                * keep.reshape(-1, *([1] * (s.dim() - 1)))
                for s in stacked
            ]
        norms = vector_norms(stacked)
        norms = torch.where(bad, torch.full_like(norms, math.inf), norms)
        clipped, _ = clip_vectors(stacked, bound)
        below = float((norms <= bound).to(torch.float64).sum()) - 0.5 * k
        return [c.sum(0) for c in clipped], below

    def _clip_factors(self, t: int, k: int) -> np.ndarray:
        """C_{g(i)}/C_t per contribution (SCALE); contributions arrive in selected order."""
        factors = np.asarray(self.setup.clip_factors, dtype=np.float64)
        if np.all(factors == 1.0):
            return np.ones(k)
        chosen = self._selected.get(t, [])
        if len(chosen) == k and self.groups is not None:
            return np.asarray(factors[self.groups[np.asarray(chosen, dtype=np.int64)]])
        # A lost client broke the alignment: the smallest clip bounds everyone (more private).
        return np.full(k, float(factors.min()))


class DistributedIdpServer(IdpFedAvgServer):
    """Distributed noise: clients self-sample, clip and noise; the server sees only sums.

    Every released sum holds at least t = ``setup.survivors`` noise shares (σ_v²C_t²/t each):
    ``distributed_noise`` makes plain summation refuse a round with fewer contributions, and a
    round without aggregate keeps the model and C_t (nothing was released).
    """

    public_metrics: ClassVar[frozenset[str]] = frozenset({"clip_count"})
    #: Each client adds a share σ_v²C_t²/t of the noise (pdpfl.fl.aggregation.share_threshold).
    distributed_noise: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from pdpfl.fl.idp_fedavg.discrete import encoding

        super().__init__(*args, **kwargs)
        #: The clients' discrete share encoding (None: continuous shares).
        self.share_encoding = encoding(self.setup)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.share_encoding is not None:  # for the run summary (ignored when loading)
            state["noise_shares"] = self.share_encoding.summary()
        return state

    def aggregate(self, round_index: int, global_params: Params, aggregate: Aggregate) -> Params:
        setup = self.setup
        if aggregate.empty:  # no aggregate (fewer than t shares): nothing to learn from
            self.clip_history.append(self.clip_norm)
            return [np.asarray(p).copy() for p in global_params]
        # discrete shares are decoded in units of C_t (pdpfl.fl.idp_fedavg.discrete)
        unit = self.clip_norm if self.share_encoding is not None else 1.0
        mean = [np.asarray(t, dtype=np.float64) * unit / setup.denominator for t in aggregate.total]
        unclipped = 0.0
        if setup.adaptive:
            unclipped = float(aggregate.metrics.get("clip_count", 0.0)) / setup.denominator + 0.5
        new = self._step(global_params, mean)
        self._adapt(unclipped)
        return new
