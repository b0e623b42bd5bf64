"""rPDP-FL: record-level personalized DP federated learning (rPDP-FL §6.2, Algorithm 3).

Server, once before round 1 (Algorithm 3, lines 1-4; :func:`setup`): fixes (σ, δ, T, τ, λ, C) --
σ from ``privacy.noise_multiplier`` or as the σ at which q = 1 spends ``privacy.epsilon_max`` --
and fits the rate estimator F (Algorithm 2; ``certified`` by default) for the configured
observer(s). It publishes both (:class:`~pdpfl.fl.publication.Publication`); no data is read.

Silo (:class:`DpFedAvgClient`, one per silo, holds the silo's data, budgets and secret
randomness):

* q_ij = F(ε_ij), applied locally (line 4); budgets never leave the silo. A record whose budget
  is below the smallest achievable ε is an error unless ``privacy.allow_exclusion`` (then it
  gets q = 0 and is counted as excluded);
* each round it is asked: τ DP-SGD steps from the global model (lines 9-15,
  :func:`pdpfl.dp.engine.train_steps`) with Poisson sampling at rates q_ij, clipping at C,
  Gaussian noise σC and division by the public expected batch size ``training.batch_size``; it
  releases only Δx_i = x_i^{t,τ} − x^t (line 16) as a :class:`~pdpfl.fl.api.Contribution`. A silo
  whose records have all sat out still runs its τ noise-only steps: nothing distinguishes it;
* the per-record budget accountant (§6.2; a :class:`pdpfl.ledger.PrivacyLedger` of the silo's
  own records): a *pre-check* before the round (a record that would exceed its budget against
  the configured observer sits out with q = 0) and the charge after it, written before the
  contribution is returned. Third-party (Type II) accounting advances every round whether or not
  the silo was sampled; server (Type I) accounting counts the rounds the silo trained in. A silo
  learns about rounds it was not asked in from ``round_index`` and catches up deterministically.

Server (:class:`FedAvgServer`): Poisson client sampling with rate λ -- one independent coin per
client from the server's own secret randomness; an empty round is allowed and counts (line 7) --
and x^{t+1} = x^t + η_s · Σ Δx_i / Σ w_i with w_i = 1 (the paper's simple average; line 17) or
w_i = n_i when the silo sizes are declared public (``data.public_silo_sizes``).

The same client and server serve every DP-FedAvg baseline of :mod:`pdpfl.fl.baselines`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from pdpfl.fl.aggregation import empty_aggregate  # noqa: F401 (re-export for algorithms)
from pdpfl.fl.api import Aggregate, Contribution, FederationInfo, Params, Scalars
from pdpfl.fl.common import (
    accounting_adversary,
    budget_groups,
    client_budgets,
    initial_params,
    noise_for_max_budget_cached,
    noise_source_problems,
    public_budget_statistics,
    silo_model,
)
from pdpfl.fl.publication import Publication
from pdpfl.fl.registry import AlgorithmConfig, AlgorithmSpec, register_algorithm
from pdpfl.randomness import Randomness

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.config import ExperimentConfig

__all__ = [
    "DpFedAvgClient",
    "DpFedAvgConfig",
    "FedAvgServer",
    "RpdpClient",
    "RpdpConfig",
    "RpdpServer",
    "budget_groups",
    "build_dp_client",
    "build_fedavg_server",
    "mechanism_plan",
]

#: Tolerance when comparing spent ε with a budget (floating-point noise only).
_EPS_TOL = 1e-9


# ------------------------------------------------------------------------------ configuration


class DpFedAvgConfig(AlgorithmConfig):
    """Fields shared by rPDP-FL and the DP-FedAvg baselines."""

    weighting: Literal["uniform", "num_examples"] = Field(
        "uniform",
        description="uniform: the paper's simple average; num_examples: weight by silo size "
        "(needs data.public_silo_sizes: true, since sizes are otherwise private)",
    )
    server_lr: float = Field(1.0, gt=0, description="η_s: x ← x + η_s · mean(Δx)")

    #: Whether the algorithm adds DP noise (False only for the privacy-free baseline).
    private: ClassVar[bool] = True
    #: Silos draw their own λ-coin under ``participation: hidden`` (see fl/aggregation/secure.py).
    supports_hidden_participation: ClassVar[bool] = True

    def check(self, config: ExperimentConfig) -> list[str]:
        problems = []
        if self.weighting == "num_examples" and not config.data.public_silo_sizes:
            problems.append(
                "algorithm.weighting: num_examples weights updates by silo size, which is private; "
                "set data.public_silo_sizes: true to declare the sizes public, or use uniform"
            )
        if self.private:
            if config.training.batch_size is None:
                problems.append(
                    "training.batch_size: required under DP -- the public expected batch size B "
                    "that divides each step's noisy sum (e.g. 32; one value or one per silo)"
                )
            problems += noise_source_problems(config, "σ such that q = 1 spends ε_max")
        return problems


class RpdpConfig(DpFedAvgConfig):
    """rPDP-FL (Algorithm 3): per-record rates q_ij = F(ε_ij)."""

    name: Literal["rpdp"] = "rpdp"


# ------------------------------------------------------------------------------- publication


def mechanism_plan(config: ExperimentConfig, sigma: float):  # -> TrainingPlan
    """The public :class:`~pdpfl.privacy.plan.TrainingPlan` (σ, δ, τ, T, λ) of a config."""
    from pdpfl.privacy.plan import TrainingPlan

    tr = config.training
    return TrainingPlan(
        noise_multiplier=float(sigma),
        delta=config.privacy.delta,
        steps=tr.local_steps,
        rounds=tr.rounds,
        client_rate=tr.client_rate,
    )


def noise_multiplier(config: ExperimentConfig) -> float:
    """σ: ``privacy.noise_multiplier``, or the σ at which q = 1 spends exactly ε_max."""
    pv, tr = config.privacy, config.training
    if pv.noise_multiplier is not None:
        return float(pv.noise_multiplier)
    if pv.epsilon_max is None:
        raise ValueError("privacy: set privacy.noise_multiplier or privacy.epsilon_max")
    return noise_for_max_budget_cached(
        float(pv.epsilon_max), pv.delta, tr.local_steps, tr.rounds, tr.client_rate,
        accounting_adversary(config),
    )


def fit_published_estimator(config: ExperimentConfig, sigma: float) -> Any:
    """F for the config's mechanism and observer (memoized inside the calibrators)."""
    from pdpfl.calibrate import fit_estimator

    return fit_estimator(
        mechanism_plan(config, sigma),
        method=config.privacy.calibration,
        adversary=accounting_adversary(config),
        accountant=config.privacy.accountant,
    )


def _common(config: ExperimentConfig) -> dict[str, Any]:
    tr, pv = config.training, config.privacy
    return dict(
        delta=pv.delta,
        local_steps=tr.local_steps,
        rounds=tr.rounds,
        client_rate=tr.client_rate,
        max_grad_norm=tr.max_grad_norm,
        adversary=pv.adversary,
        calibration=pv.calibration,
        participation=getattr(config, "participation", "visible"),
    )


def check_feasible(config: ExperimentConfig, estimator: Any) -> None:
    """Refuse, before training, a public budget scenario with budgets F cannot honour.

    Uses only the scenario's public minimum (never a silo's budgets); silos check their own
    budgets again when they are built.
    """
    if config.privacy.allow_exclusion:
        return
    minimum, _ = public_budget_statistics(config)
    floor = getattr(estimator, "min_epsilon", None)
    if minimum is not None and floor is not None and minimum < float(floor) * (1 - 1e-12):
        raise ValueError(
            f"budgets: the scenario allows budgets down to ε = {minimum:g}, below the smallest "
            f"ε this mechanism can give a positive sampling rate ({float(floor):.4g}); lower σ "
            "(privacy.noise_multiplier / raise privacy.epsilon_max), or set "
            "privacy.allow_exclusion: true to train without those records (q = 0)"
        )


def setup(config: ExperimentConfig, info: FederationInfo) -> dict[str, Any]:
    """Algorithm 3, lines 1-4: σ and the estimator F, published to every silo (public)."""
    sigma = noise_multiplier(config)
    est = fit_published_estimator(config, sigma)
    check_feasible(config, est)
    pub = Publication(
        mode="personalized", noise_multiplier=sigma, estimator=est.to_dict(), **_common(config)
    )
    return {"publication": pub.to_dict()}


# ------------------------------------------------------------------------------- silo side


def _full_rate_epsilon(publication: Publication, epsilon_max: float | None) -> float | None:
    """ε_max: ``privacy.epsilon_max`` when configured, else what the estimator spends at q = 1
    (None when the estimator does not say, e.g. binary search)."""
    if epsilon_max is not None:
        return float(epsilon_max)
    est = publication.estimator_object()
    for attr in ("max_epsilon", "eps_at_one"):
        value = getattr(est, attr, None)
        if value is not None:
            return float(value)
    return None


def _capped(budgets: np.ndarray, rates: np.ndarray, publication: Publication,
            epsilon_max: float | None) -> np.ndarray:
    """Records sampled at q = 1 whose budget is above ε_max: they spend less than allowed."""
    cap = _full_rate_epsilon(publication, epsilon_max)
    if cap is None:
        return np.zeros(len(budgets), dtype=bool)
    return (rates >= 1.0) & (budgets > cap * (1 + 1e-9))


class DpFedAvgClient:
    """One silo of rPDP-FL (and, with other rates, of every DP-FedAvg baseline).

    Parameters
    ----------
    client_id
        The silo's index in the federation.
    model
        A torch model built with the public initialisation; its weights are overwritten each round.
    data
        The silo's :class:`~pdpfl.data.federation.ClientData` (never leaves it).
    budgets
        ε_ij of the silo's training records (never leaves it).
    publication
        What the server published (σ, δ, τ, T, λ, C, the estimator F or the uniform rate).
    randomness
        The silo's own mechanism randomness (record coins and noise).
    normalizer
        The public expected batch size B dividing each step's noisy sum (required under DP).
    weight
        The public weight of this silo's update (1, or its size when declared public); the
        released update is ``weight · Δx``.
    allow_exclusion
        Allow records whose budget is below the smallest achievable ε (they get q = 0 and are
        counted as excluded); otherwise such records are an error.
    optimizer, lr, momentum, weight_decay, physical_batch_size
        The local optimizer (:func:`pdpfl.dp.engine.make_optimizer`), recreated every round.
    nonprivate_rate
        The privacy-free baseline's sampling rate (B/n; no DP).
    """

    def __init__(
        self,
        client_id: int,
        model: torch.nn.Module,
        data: Any,
        budgets: np.ndarray,
        publication: Publication,
        *,
        randomness: Randomness,
        normalizer: float | None,
        weight: float = 1.0,
        allow_exclusion: bool = False,
        epsilon_cap: float | None = None,
        cap_at_epsilon_max: bool = False,
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
        self.randomness = randomness
        self.optimizer_name, self.lr = optimizer, float(lr)
        self.momentum, self.weight_decay = float(momentum), float(weight_decay)
        self.physical_batch_size = int(physical_batch_size)
        self.weight = float(weight)
        self.x_train, self.y_train = _as_tensors(data.x_train, data.y_train)
        self.x_test, self.y_test = _as_tensors(data.x_test, data.y_test)
        self.budgets = np.asarray(budgets, dtype=float)
        if self.budgets.shape != (len(self.y_train),):
            raise ValueError(
                f"silo {client_id}: {self.budgets.shape[0]} budgets for {len(self.y_train)} records"
            )
        self.private = publication.mode != "non-private"
        self.groups, self.group_labels = budget_groups(self.budgets)
        n = len(self.budgets)
        self.excluded = np.zeros(n, dtype=bool)
        self.capped = np.zeros(n, dtype=bool)
        if self.private:
            from pdpfl.dp.steps import check_normalizer
            from pdpfl.ledger import PrivacyLedger

            self.normalizer = check_normalizer(normalizer, "training.batch_size")
            self.rates = publication.record_rates(self.budgets)
            if publication.mode == "personalized":
                self.excluded = self.rates <= 0
                if self.excluded.any() and not allow_exclusion:
                    low = self.budgets[self.excluded]
                    raise ValueError(
                        f"budgets: silo {client_id} has {int(self.excluded.sum())} record(s) with "
                        f"budgets in [{low.min():g}, {low.max():g}], below the smallest ε this "
                        "mechanism can give a positive rate; set privacy.allow_exclusion: true to "
                        "exclude them, or lower σ"
                    )
                self.capped = _capped(self.budgets, self.rates, publication, epsilon_cap)
                if self.capped.any() and not cap_at_epsilon_max:
                    high = self.budgets[self.capped]
                    raise ValueError(
                        f"budgets: silo {client_id} has {int(self.capped.sum())} record(s) with "
                        f"budgets in [{high.min():g}, {high.max():g}], above ε_max = "
                        f"{_full_rate_epsilon(publication, epsilon_cap):.6g} (what sampling "
                        "at q = 1 spends), so they would silently get less than their budget; "
                        "lower those budgets, raise privacy.epsilon_max, or set "
                        "budgets.cap_at_epsilon_max: true to train them at q = 1"
                    )
            self.ledger = PrivacyLedger(
                self.budgets,
                self.rates,
                publication.plan(),
                groups=self.groups,
                accountant=(publication.estimator or {}).get("accountant", "rdp"),
                server_sees_participation=publication.participation != "hidden",
            )
        else:
            self.normalizer = None
            q = 1.0 if nonprivate_rate is None else float(nonprivate_rate)
            self.rates = np.full(n, min(1.0, q))
            self.ledger = None
        #: Next round whose accounting has not been recorded yet.
        self.next_round = 0
        self.participations = 0
        self.sat_out = np.zeros(n, dtype=bool)
        #: How often each record was drawn into a local batch (stays on the silo; for tests).
        self.selection_counts = np.zeros(n, dtype=np.int64)
        #: Mean training loss of the silo's last round (stays on the silo: not DP-protected).
        self.last_train_loss: float | None = None

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
    def fit(self, global_params: Params, round_index: int, config: Scalars) -> Contribution:
        from pdpfl.dp.engine import make_optimizer, train_steps
        from pdpfl.models import get_params, set_params

        t = int(round_index)
        if t < self.next_round:
            raise ValueError(f"silo {self.client_id}: round {t} was already accounted")
        self._catch_up(t)
        active = self._precheck()
        rates = np.where(active, self.rates, 0.0)
        set_params(self.model, global_params)
        opt = make_optimizer(
            self.optimizer_name,
            self.model.parameters(),
            lr=self.lr,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
        )
        # A silo whose records all sat out still runs τ noise-only steps (same release shape).
        result = train_steps(
            self.model,
            self.x_train,
            self.y_train,
            rates=torch.as_tensor(rates, dtype=torch.float64),
            steps=self.publication.local_steps,
            noise_multiplier=self.publication.noise_multiplier,
            max_grad_norm=self.publication.max_grad_norm,
            optimizer=opt,
            stream=self.randomness.stream("local-training", t, self.client_id),
            normalizer=self.normalizer,
            private=self.private,
            physical_batch_size=self.physical_batch_size,
        )
        # Write-ahead: the round is charged before the update is returned.
        self._record(True, active)
        self.selection_counts += np.asarray(result.selection_counts, dtype=np.int64)
        self.last_train_loss = float(result.mean_loss)
        new = get_params(self.model)
        delta = [
            (np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) * self.weight
            for a, b in zip(new, global_params, strict=True)
        ]
        return Contribution(update=[d.astype(np.float32) for d in delta], weight=self.weight)

    # -- hidden participation (aggregation: secure, participation: hidden) -----------------
    def participation_coin(self, round_index: int) -> bool:
        """This silo's own λ-coin for ``round_index`` (from its own randomness; never sent)."""
        rate = float(self.publication.client_rate)
        if rate >= 1.0:
            return True
        u = self.randomness.stream("hidden-participation", int(round_index), self.client_id)
        return bool(u.uniform(1)[0] < rate)

    def public_weight(self) -> float:
        """The public weight of this silo's update (1, or its size when declared public)."""
        return self.weight

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
        """Aggregates of this silo's records (stays at the silo: never sent to the server)."""
        n = len(self.budgets)
        out: Scalars = {
            "n_records": n,
            "participations": self.participations,
            "stopped": int(self.sat_out.sum()),
            "excluded": int(self.excluded.sum()),
            "capped": int(self.capped.sum()),
            "private": self.private,
        }
        for adv, tag in (("third-party", "third_party"), ("server", "server")):
            eps = self.spent(adv)
            over = eps > self.budgets * (1 + _EPS_TOL) + _EPS_TOL
            out[f"over_budget_{tag}"] = int(over.sum())
            if n and self.private:
                out[f"eps_{tag}_max"] = float(eps.max())
                out[f"eps_{tag}_p50"] = float(np.quantile(eps, 0.5))
                out[f"eps_{tag}_p90"] = float(np.quantile(eps, 0.9))
            else:
                out[f"eps_{tag}_max"] = float("inf") if n else 0.0
            util = eps / self.budgets
            for g, label in enumerate(self.group_labels):
                mask = self.groups == g
                if not mask.any():
                    continue
                key = f"group.{label}"
                out[f"{key}.count"] = int(mask.sum())
                out[f"{key}.budget"] = float(self.budgets[mask].max())
                out[f"{key}.excluded"] = int(self.excluded[mask].sum())
                out[f"{key}.max_spent_{tag}"] = float(eps[mask].max())
                out[f"{key}.sum_utilization_{tag}"] = float(util[mask].sum())
                out[f"{key}.over_budget_{tag}"] = int(over[mask].sum())
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "next_round": self.next_round,
            "participations": self.participations,
            "sat_out": self.sat_out.copy(),
            "selection_counts": self.selection_counts.copy(),
            "ledger": None if self.ledger is None else self.ledger.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_round = int(state["next_round"])
        self.participations = int(state["participations"])
        self.sat_out = np.asarray(state["sat_out"], dtype=bool).copy()
        self.selection_counts = np.asarray(state["selection_counts"], dtype=np.int64).copy()
        if self.ledger is not None:
            self.ledger.load_state_dict(state["ledger"])


#: Former name (kept for user code written against the first release).
RpdpClient = DpFedAvgClient


def _as_tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.as_tensor(np.asarray(x, dtype=np.float32)), torch.as_tensor(
        np.asarray(y, dtype=np.int64)
    )


# ----------------------------------------------------------------------------- server side


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
        return {
            "participation": {str(k): v for k, v in self.participation.items()},
            "rounds_done": self.rounds_done,
            "empty_rounds": self.empty_rounds,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.participation = {int(k): int(v) for k, v in state["participation"].items()}
        self.rounds_done = int(state["rounds_done"])
        self.empty_rounds = int(state["empty_rounds"])


#: Former name (kept for user code written against the first release).
RpdpServer = FedAvgServer


# ------------------------------------------------------------------------------ builders


def build_fedavg_server(
    config: ExperimentConfig, info: FederationInfo, public: dict[str, Any], randomness: Randomness
) -> FedAvgServer:
    """The DP-FedAvg server shared by rPDP-FL and its baselines."""
    return FedAvgServer(
        initial_params(config, info),
        client_rate=config.training.client_rate,
        randomness=randomness,
        server_lr=config.algorithm.server_lr,
    )


def build_dp_client(
    config: ExperimentConfig,
    client_id: int,
    data: Any,
    info: FederationInfo,
    public: dict[str, Any],
    randomness: Randomness,
) -> DpFedAvgClient:
    """One silo of rPDP-FL or a DP-FedAvg baseline, from its own data and the publication."""
    pub = Publication.from_dict(public["publication"])
    n = len(data.y_train)
    batch = config.training.batch_size_for(client_id)
    weight = 1.0
    if config.algorithm.weighting == "num_examples":
        if info.silo_sizes is None:
            raise ValueError("algorithm.weighting: num_examples needs data.public_silo_sizes: true")
        weight = float(info.silo_sizes[client_id])
    tr = config.training
    return DpFedAvgClient(
        client_id,
        silo_model(config, info),
        data,
        client_budgets(config, client_id, data),
        pub,
        randomness=randomness,
        normalizer=batch if pub.mode != "non-private" else None,
        weight=weight,
        allow_exclusion=config.privacy.allow_exclusion,
        epsilon_cap=config.privacy.epsilon_max,
        cap_at_epsilon_max=config.budgets.cap_at_epsilon_max,
        optimizer=tr.optimizer,
        lr=tr.lr,
        momentum=tr.momentum,
        weight_decay=tr.weight_decay,
        physical_batch_size=tr.physical_batch_size,
        nonprivate_rate=(
            min(1.0, batch / max(n, 1)) if (pub.mode == "non-private" and batch) else None
        ),
    )


register_algorithm(
    AlgorithmSpec(
        name="rpdp",
        config=RpdpConfig,
        unit="record",
        setup=setup,
        server=build_fedavg_server,
        client=build_dp_client,
        summary="rPDP-FL: every record its own ε (two-stage sampling, certified ε→q)",
    )
)
