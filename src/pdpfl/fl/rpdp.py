"""rPDP-FL: record-level personalized DP federated learning (paper §6.2, Algorithm 3).

Client side (:class:`RpdpClient`, one per silo, holds the silo's data and budgets):

* q_ij = F(ε_ij) with the estimator F *published* by the server (Algorithm 3, lines 2-4);
* each selected round: τ DP-SGD steps from the global model with record-level Poisson sampling
  at rates q_ij, clipping at C and Gaussian noise σC (lines 9-15, :func:`pdpfl.dp.engine.train_steps`);
  returns Δx_i = x_i^{t,τ} - x^t (line 16);
* a per-record budget accountant (§6.2, "The per-record privacy budget accountant", a
  :class:`pdpfl.ledger.PrivacyLedger` of the silo's own records): *pre-check* before the round (a
  record that would exceed its budget under the configured adversary sits out with q = 0) and
  *update* after it. Third-party (Type II) accounting advances every round whether or not the
  silo was sampled (client sampling with rate λ is part of that mechanism); server (Type I)
  accounting counts the rounds in which the silo actually trained. A silo learns about rounds in
  which it was not selected from ``round_index`` on its next ``fit``/``evaluate`` call and catches
  up deterministically.

Server side (:class:`RpdpServer`): Poisson client sampling with rate λ -- an independent coin per
client from ``numpy_generator(seed, "client-sampling", t)``; an empty round is allowed and counts
(line 7) -- and the simple average of the deltas (line 17) times a server learning rate
(default 1). Weighting by the silos' sample counts is available as an option; it uses each silo's
(private) training-set size and is therefore a *different* mechanism from the paper's (the counts
are not protected by the record-level guarantee). The server's Type I view is the per-client
participation count.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pdpfl.fl.api import ClientUpdate, Params, Scalars
from pdpfl.fl.publication import Publication
from pdpfl.seeding import numpy_generator, torch_generator

#: Tolerance when comparing spent ε with a budget (floating-point noise only).
_EPS_TOL = 1e-9


def budget_groups(budgets: np.ndarray, max_levels: int = 8) -> tuple[np.ndarray, list[str]]:
    """Group records by budget for reporting: one group per level, or fixed bins.

    Returns ``(group index per record, group labels)``. Discrete scenarios (at most
    ``max_levels`` distinct budgets) get one group per level; continuous ones the public bins
    (0, 0.2], (0.2, 0.5], (0.5, 1], (1, 2], (2, 5], (5, 10], (10, ∞).
    """
    budgets = np.asarray(budgets, dtype=float)
    levels = np.unique(budgets)
    if len(levels) <= max_levels:
        return np.searchsorted(levels, budgets), [f"{v:g}" for v in levels]
    edges = np.array([0.2, 0.5, 1.0, 2.0, 5.0, 10.0])
    labels_all = ["(0,0.2]", "(0.2,0.5]", "(0.5,1]", "(1,2]", "(2,5]", "(5,10]", "(10,inf)"]
    idx = np.searchsorted(edges, budgets, side="left")
    return idx, labels_all


def _as_tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.as_tensor(np.asarray(x, dtype=np.float32)), torch.as_tensor(
        np.asarray(y, dtype=np.int64)
    )


class RpdpClient:
    """One silo of rPDP-FL (also used, with other rates, by the DP baselines).

    Parameters
    ----------
    client_id
        The silo's index in the federation.
    model
        A torch model (:func:`pdpfl.models.create_model`); its weights are overwritten each round.
    x_train, y_train, x_test, y_test
        The silo's own data (never leaves it).
    budgets
        ε_ij of the silo's training records (never leaves it).
    publication
        What the server published (σ, δ, τ, T, λ, C, the estimator F or the uniform rate).
    seed
        The experiment seed (local training draws from ``torch_generator(seed, "local-training",
        t, client_id)``).
    optimizer, lr, momentum, weight_decay
        The local optimizer (:func:`pdpfl.dp.engine.make_optimizer`), recreated every round.
    private
        False for the privacy-free baseline: no clipping/noise, rate ``nonprivate_rate`` for all.
    """

    def __init__(
        self,
        client_id: int,
        model: torch.nn.Module,
        x_train: np.ndarray,
        y_train: np.ndarray,
        x_test: np.ndarray,
        y_test: np.ndarray,
        budgets: np.ndarray,
        publication: Publication,
        *,
        seed: int,
        optimizer: str = "sgd",
        lr: float = 0.1,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        physical_batch_size: int = 512,
        nonprivate_rate: float | None = None,
    ) -> None:
        self.client_id = int(client_id)
        self.model = model
        self.publication = publication
        self.seed = int(seed)
        self.optimizer_name, self.lr = optimizer, float(lr)
        self.momentum, self.weight_decay = float(momentum), float(weight_decay)
        self.physical_batch_size = int(physical_batch_size)
        self.x_train, self.y_train = _as_tensors(x_train, y_train)
        self.x_test, self.y_test = _as_tensors(x_test, y_test)
        self.budgets = np.asarray(budgets, dtype=float)
        if self.budgets.shape != (len(self.y_train),):
            raise ValueError(
                f"client {client_id}: {self.budgets.shape[0]} budgets for {len(self.y_train)} records"
            )
        self.private = publication.mode != "non-private"
        self.groups, self.group_labels = budget_groups(self.budgets)
        n = len(self.budgets)
        if self.private:
            self.rates = publication.record_rates(self.budgets)
            from pdpfl.ledger import PrivacyLedger

            self.ledger = PrivacyLedger(
                self.budgets, self.rates, publication.plan(), groups=self.groups
            )
        else:
            q = 1.0 if nonprivate_rate is None else float(nonprivate_rate)
            self.rates = np.full(n, min(1.0, q))
            self.ledger = None
        #: Next round whose accounting has not been recorded yet.
        self.next_round = 0
        self.participations = 0
        self.sat_out = np.zeros(n, dtype=bool)
        #: How often each record was drawn into a local batch (stays on the silo; for tests).
        self.selection_counts = np.zeros(n, dtype=np.int64)

    # -- the budget accountant ---------------------------------------------------------------
    def _precheck(self) -> np.ndarray:
        """Records allowed in the next round (pre-check of §6.2): not exceeding their budget."""
        if self.ledger is None:
            return np.ones(len(self.budgets), dtype=bool)
        exceed = np.asarray(
            self.ledger.would_exceed(adversary=self.publication.adversary), dtype=bool
        )
        active = ~exceed & (self.rates > 0)
        self.sat_out |= exceed & (self.rates > 0)
        return active

    def _record(self, participated: bool, active: np.ndarray) -> None:
        if self.ledger is not None:
            self.ledger.record_round(participated=active & participated, active=active)
        self.participations += int(participated)
        self.next_round += 1

    def _catch_up(self, until: int) -> None:
        """Account rounds ``next_round .. until-1`` in which this silo was not selected."""
        while self.next_round < until:
            self._record(False, self._precheck())

    # -- ClientAlgorithm ---------------------------------------------------------------------
    def fit(self, global_params: Params, round_index: int, config: Scalars) -> ClientUpdate:
        from pdpfl.dp.engine import make_optimizer, train_steps
        from pdpfl.models import get_params, set_params

        t = int(round_index)
        if t < self.next_round:
            raise ValueError(f"client {self.client_id}: round {t} was already accounted")
        self._catch_up(t)
        active = self._precheck()
        rates = np.where(active, self.rates, 0.0)
        if self.private and rates.sum() <= 0:
            # Every record has sat out (or has q = 0): nothing is trained, the delta is zero.
            self._record(True, active)
            return ClientUpdate(
                client_id=self.client_id,
                delta=[np.zeros_like(np.asarray(p, dtype=np.float32)) for p in global_params],
                metrics={"active_records": 0, "expected_batch_size": 0.0},
                num_examples=len(self.budgets),
            )
        set_params(self.model, global_params)
        opt = make_optimizer(
            self.optimizer_name,
            self.model.parameters(),
            lr=self.lr,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
        )
        result = train_steps(
            self.model,
            self.x_train,
            self.y_train,
            rates=torch.as_tensor(rates, dtype=torch.float64),
            steps=self.publication.local_steps,
            noise_multiplier=self.publication.noise_multiplier,
            max_grad_norm=self.publication.max_grad_norm,
            optimizer=opt,
            generator=torch_generator(self.seed, "local-training", t, self.client_id),
            private=self.private,
            physical_batch_size=self.physical_batch_size,
        )
        self._record(True, active)
        self.selection_counts += np.asarray(result.selection_counts, dtype=np.int64)
        new = get_params(self.model)
        delta = [np.asarray(a, dtype=np.float32) - np.asarray(b, dtype=np.float32)
                 for a, b in zip(new, global_params, strict=True)]
        return ClientUpdate(
            client_id=self.client_id,
            delta=delta,
            metrics={
                "mean_loss": float(result.mean_loss),
                "active_records": int(active.sum()),
                "expected_batch_size": float(result.expected_batch_size),
            },
            num_examples=len(self.budgets),
        )

    def evaluate(self, params: Params, round_index: int, config: Scalars) -> Scalars:
        from pdpfl.dp.engine import evaluate
        from pdpfl.models import set_params

        self._catch_up(int(round_index) + 1)
        set_params(self.model, params)
        res = evaluate(self.model, self.x_test, self.y_test)
        return {"loss": float(res["loss"]), "accuracy": float(res["accuracy"]), "n": int(res["n"])}

    def spent(self, adversary: str) -> np.ndarray:
        """ε spent so far by each record against ``adversary`` (inf for the non-private mode)."""
        if self.ledger is None:
            return np.full(len(self.budgets), np.inf)
        return np.asarray(self.ledger.spent_epsilon(adversary), dtype=float)

    def privacy_summary(self) -> Scalars:
        """Aggregates only: counts, maxima/quantiles of ε spent, per budget group."""
        n = len(self.budgets)
        out: Scalars = {
            "n_records": n,
            "participations": self.participations,
            "stopped": int(self.sat_out.sum()),
            "private": self.private,
        }
        for adv, tag in (("third-party", "third_party"), ("server", "server")):
            eps = self.spent(adv)
            finite = eps  # inf for the non-private mode (reported as null in JSON)
            over = eps > self.budgets * (1 + _EPS_TOL) + _EPS_TOL
            out[f"over_budget_{tag}"] = int(over.sum())
            if n and self.private:
                out[f"eps_{tag}_max"] = float(eps.max())
                out[f"eps_{tag}_p50"] = float(np.quantile(eps, 0.5))
                out[f"eps_{tag}_p90"] = float(np.quantile(eps, 0.9))
            else:
                out[f"eps_{tag}_max"] = float("inf") if n else 0.0
            util = finite / self.budgets
            for g, label in enumerate(self.group_labels):
                mask = self.groups == g
                if not mask.any():
                    continue
                key = f"group.{label}"
                out[f"{key}.count"] = int(mask.sum())
                out[f"{key}.budget"] = float(self.budgets[mask].max())
                out[f"{key}.max_spent_{tag}"] = float(finite[mask].max())
                out[f"{key}.sum_utilization_{tag}"] = float(util[mask].sum())
                out[f"{key}.over_budget_{tag}"] = int(over[mask].sum())
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "next_round": self.next_round,
            "participations": self.participations,
            "sat_out": self.sat_out.copy(),
            "selection_counts": self.selection_counts.copy(),
            "ledger": None if self.ledger is None else {
                "third_party_rounds": self.ledger.third_party_rounds.copy(),
                "server_rounds": self.ledger.server_rounds.copy(),
                "sat_out_rounds": self.ledger.sat_out_rounds.copy(),
                "rounds_recorded": self.ledger.rounds_recorded,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_round = int(state["next_round"])
        self.participations = int(state["participations"])
        self.sat_out = np.asarray(state["sat_out"], dtype=bool).copy()
        self.selection_counts = np.asarray(state["selection_counts"], dtype=np.int64).copy()
        if self.ledger is not None:
            led = state["ledger"]
            for key in ("third_party_rounds", "server_rounds", "sat_out_rounds"):
                setattr(self.ledger, key, np.asarray(led[key], dtype=np.int64).copy())
            self.ledger.rounds_recorded = int(led["rounds_recorded"])


class RpdpServer:
    """The server of rPDP-FL (Algorithm 3, lines 5-7 and 17) and of every DP-FedAvg baseline.

    Parameters
    ----------
    initial_params
        x^0, the randomly initialised global model (seeded from the experiment seed).
    client_rate
        λ: each client is selected independently with probability λ every round.
    seed
        Experiment seed; round t's coins come from ``numpy_generator(seed, "client-sampling", t)``.
    publication
        The published mechanism (sent along in :meth:`round_config`, scalars only).
    weighting
        ``uniform`` (paper: simple average) or ``num_examples`` (weights n_i / Σn, a different
        mechanism that uses the silos' private training-set sizes).
    server_lr
        Server learning rate η_s: x^{t+1} = x^t + η_s · mean(Δx_i).
    """

    def __init__(
        self,
        initial_params: Params,
        *,
        client_rate: float,
        seed: int,
        publication: Publication | None = None,
        weighting: str = "uniform",
        server_lr: float = 1.0,
    ) -> None:
        if not 0 < client_rate <= 1:
            raise ValueError(f"client_rate must be in (0, 1], got {client_rate}")
        if weighting not in ("uniform", "num_examples"):
            raise ValueError(f"weighting must be 'uniform' or 'num_examples', got {weighting!r}")
        self._initial = [np.asarray(p, dtype=np.float32).copy() for p in initial_params]
        self.client_rate = float(client_rate)
        self.seed = int(seed)
        self.publication = publication
        self.weighting = weighting
        self.server_lr = float(server_lr)
        self.participation: dict[int, int] = {}
        self.rounds_done = 0
        self.empty_rounds = 0

    def initial_params(self) -> Params:
        return [p.copy() for p in self._initial]

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        """Poisson client sampling: one independent Bernoulli(λ) coin per client (sorted ids)."""
        ids = sorted(int(c) for c in client_ids)
        if self.client_rate >= 1.0:
            return ids
        rng = numpy_generator(self.seed, "client-sampling", int(round_index))
        coins = rng.random(len(ids)) < self.client_rate
        return [c for c, keep in zip(ids, coins, strict=True) if keep]

    def round_config(self, round_index: int) -> Scalars:
        cfg: Scalars = {"round": int(round_index)}
        if self.publication is not None:
            cfg["local_steps"] = int(self.publication.local_steps)
        return cfg

    def aggregate(
        self, round_index: int, global_params: Params, updates: list[ClientUpdate]
    ) -> Params:
        """x^{t+1} = x^t + η_s Σ_i w_i Δx_i (w_i = 1/|C^t|, or n_i/Σn with sample weighting)."""
        if not updates:
            return [np.asarray(p).copy() for p in global_params]
        if self.weighting == "num_examples":
            w = np.array([max(u.num_examples, 0) for u in updates], dtype=np.float64)
            w = w / w.sum() if w.sum() > 0 else np.full(len(updates), 1.0 / len(updates))
        else:
            w = np.full(len(updates), 1.0 / len(updates))
        out = []
        for k, base in enumerate(global_params):
            mean = sum(wi * np.asarray(u.delta[k], dtype=np.float64) for wi, u in zip(w, updates, strict=True))
            out.append((np.asarray(base, dtype=np.float64) + self.server_lr * mean).astype(np.float32))
        return out

    def record_round(self, round_index: int, selected: list[int]) -> None:
        """Type I view: how many rounds each client took part in (empty rounds count)."""
        for c in selected:
            self.participation[int(c)] = self.participation.get(int(c), 0) + 1
        self.rounds_done += 1
        self.empty_rounds += int(not selected)

    def state_dict(self) -> dict[str, Any]:
        return {
            "participation": dict(self.participation),
            "rounds_done": self.rounds_done,
            "empty_rounds": self.empty_rounds,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.participation = {int(k): int(v) for k, v in state["participation"].items()}
        self.rounds_done = int(state["rounds_done"])
        self.empty_rounds = int(state["empty_rounds"])
