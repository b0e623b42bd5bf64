"""The central variant's clients as one pool: one ledger row per client, silos only when sampled.

In the central variant (the paper) the trusted aggregator samples each client with its group's
q_{g(i)}; a round is ≈ c clients whatever N. The in-process simulator keeps the N clients as a
:class:`CentralClientPool` (a :class:`~pdpfl.fl.pool.SiloPool`):

* **one vectorized client ledger** -- a :class:`~pdpfl.ledger.PrivacyLedger` with one row per
  accounted client (id = its name, budget = its ε, rate = q_{g(i)}, noise multiplier = σ_{g(i)},
  mechanism :func:`~pdpfl.fl.idp_fedavg.mechanism.client_mechanism` -- the same
  Poisson-subsampled Gaussian (spec B.4) each client's own one-row ledger charged, so every
  client's ε is the one it had with its own ledger);
* the silo template's duties for all clients at once: the **catch-up** of rounds a client was
  not asked in is one vectorized charge; the **pre-check** (would the next round exceed the ε
  the client is accounted against -- its own, or ε_min/ε_max for strict/relaxed -- or its
  lifetime budget) is one vectorized test; the round is **charged for every client before any
  release** (third parties: every active client; the server: the sampled ones);
* a :class:`~pdpfl.fl.idp_fedavg.silo.CentralIdpSilo` is built only for a client the server
  sampled this round, from the data and its ledger row, trained (batched), released through
  its gate, and dropped -- no per-client object is kept for the clients not sampled;
* the test metrics of every client come from one pass over the concatenated test splits;
  summaries, checkpoints (arrays) and the end-of-run ledger file (one sealed file, N rows) come
  from the one ledger.

Clients with ε = ∞ (non-private) and the ``no-dp`` method keep no ledger row (ε = ∞ reported).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.fl.api import Contribution, Params, Scalars
from pdpfl.fl.idp_fedavg.budgets import label_of
from pdpfl.fl.idp_fedavg.mechanism import IdpSetup, client_mechanism
from pdpfl.fl.idp_fedavg.silo import CentralIdpSilo
from pdpfl.fl.idp_fedavg.training import evaluate_arrays
from pdpfl.fl.pool import PooledEvaluation, SiloPool
from pdpfl.fl.template import RoundPlan
from pdpfl.ledger import GroupSummary, PrivacyLedger, PrivacySummary, observers_of

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["CentralClientPool"]

#: Builds client ``i``'s silo (no ledger of its own: the pool accounts) from its data.
SiloFactory = Callable[[int, float], CentralIdpSilo]


class CentralClientPool(SiloPool):
    """The N clients of a central IDP-FedAvg run (see the module docstring).

    Parameters
    ----------
    clients
        Every client's data (:class:`~pdpfl.data.federation.ClientData`), in id order.
    budgets
        (N,) each client's ε (``inf``: non-private).
    setup
        The published :class:`~pdpfl.fl.idp_fedavg.mechanism.IdpSetup` (central variant).
    silo
        ``silo(i, budget)`` builds client i's :class:`CentralIdpSilo` without a ledger of its
        own, with its own randomness.
    model_factory
        Builds the public model (for the test metrics).
    """

    def __init__(
        self,
        clients: Sequence[Any],
        budgets: np.ndarray,
        setup: IdpSetup,
        *,
        silo: SiloFactory,
        model_factory: Callable[[], torch.nn.Module],
    ) -> None:
        if setup.variant != "central":
            raise ValueError("CentralClientPool: only the central variant samples its clients")
        self.clients = clients
        self.setup = setup
        self._silo = silo
        self._model_factory = model_factory
        self._model: torch.nn.Module | None = None
        n = len(clients)
        self.budgets = np.asarray(budgets, dtype=np.float64).reshape(-1)
        if self.budgets.shape != (n,):
            raise ValueError(f"budgets: expected one ε per client ({n}), got {self.budgets.size}")
        self._n = n
        #: Every client's name (from the data), one array (no per-client object).
        self.names = np.array(
            [str(getattr(c, "name", i)) for i, c in enumerate(clients)], dtype=str
        )
        self.groups = np.array([setup.group_of(float(b)) for b in self.budgets], dtype=np.int64)
        rates = np.asarray(setup.rates, dtype=np.float64)
        self.rates = rates[self.groups]
        accounted = np.array(
            [
                setup.private
                and math.isfinite(float(b))
                and setup.assigned[g] is not None
                and setup.accounted(int(g))
                for b, g in zip(self.budgets, self.groups, strict=True)
            ],
            dtype=bool,
        )
        #: Each client's ledger row (-1: it keeps none -- ε = ∞ or no DP).
        self.row = np.full(n, -1, dtype=np.int64)
        self.row[accounted] = np.arange(int(accounted.sum()))
        self._accounted = np.flatnonzero(accounted)
        self.ledger = None
        #: The ε the pre-check enforces per row (its own; ε_min/ε_max for strict/relaxed).
        self.enforced = np.zeros(0)
        if accounted.any():
            g = self.groups[accounted]
            # each group's σ: that of the mechanism its clients' own ledgers were charged under
            per_group = {
                int(k): float(getattr(client_mechanism(setup, int(k)), "noise_multiplier"))  # noqa: B009
                for k in np.unique(g)
            }
            sigmas = np.array([per_group[int(k)] for k in g], dtype=np.float64)
            self.ledger = PrivacyLedger(
                self.budgets[accounted],
                self.rates[accounted],
                client_mechanism(setup, None),
                ids=self.names[accounted],
                noise_multipliers=sigmas,
                accountant=setup.accountant,
            )
            assigned = {int(k): float(setup.assigned[int(k)] or 0.0) for k in np.unique(g)}
            self.enforced = np.array([assigned[int(k)] for k in g], dtype=np.float64)
        #: The next round whose accounting has not been recorded yet (every client).
        self.next_round = 0
        #: Rounds in which each client's data entered a release.
        self.participations = np.zeros(n, dtype=np.int64)
        self._tests: tuple[torch.Tensor, torch.Tensor, np.ndarray] | None = None

    # ------------------------------------------------------------------ description
    @property
    def client_ids(self) -> list[int]:
        return list(range(self._n))

    def silo_names(self) -> list[str]:
        return [str(n) for n in self.names]

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            self._model = self._model_factory()
        return self._model

    # ------------------------------------------------------------------ the template's duties
    def _allowed(self) -> np.ndarray:
        """Rows allowed in the next round (the template's :meth:`~pdpfl.fl.template.Silo.
        _allowed`, for every row at once): not over the enforced ε once charged, rate > 0, and
        not over the lifetime budget (when enforced)."""
        ledger = self.ledger
        assert ledger is not None
        exceed = ledger.would_exceed(adversary=self.adversary, budgets=self.enforced)
        active = ~np.asarray(exceed, dtype=bool) & (ledger.rates > 0)
        if (
            ledger.lifetime is not None
            and ledger.lifetime.enforce
            and any(o in ledger.observers for o in observers_of(self.adversary))
        ):
            over = ledger.lifetime_spent(self.adversary, extra=1) > ledger.budgets
            active &= ~np.asarray(over, dtype=bool)
        return active

    def _account(self, participants: np.ndarray) -> np.ndarray:
        """Charge the next round to every row (``participants``: the rows whose client was
        sampled); returns the rows that were active."""
        if self.ledger is None:
            active = np.zeros(0, dtype=bool)
        else:
            active = self._allowed()
            self.ledger.record_round(participated=active & participants, active=active)
        self.next_round += 1
        return active

    def catch_up(self, until: int) -> None:
        """Charge rounds ``next_round .. until-1`` in which no client was asked (one vectorized
        charge per round: third parties do not see who was sampled)."""
        none = np.zeros(0 if self.ledger is None else self.ledger.n, dtype=bool)
        while self.next_round < until:
            self._account(none)

    def fit(
        self, selected: list[int], params: Params, round_index: int, config: Scalars
    ) -> list[Contribution]:
        t = int(round_index)
        if t < self.next_round:
            raise ValueError(f"clients: round {t} was already accounted")
        chosen = [int(c) for c in selected]
        if len(set(chosen)) != len(chosen) or any(not 0 <= c < self._n for c in chosen):
            raise ValueError(f"round {t}: the selection names unknown or repeated clients")
        self.catch_up(t)
        rows = self.row[np.asarray(chosen, dtype=np.int64)] if chosen else np.zeros(0, np.int64)
        participants = np.zeros(0 if self.ledger is None else self.ledger.n, dtype=bool)
        participants[rows[rows >= 0]] = True
        active = self._account(participants)  # write-ahead: every client charged first
        self.participations[chosen] += 1
        if not chosen:
            return []
        silos, jobs = [], []
        for c, r in zip(chosen, rows, strict=True):
            silo = self._silo(c, float(self.budgets[c]))
            silo.next_round = t + 1
            joins = bool(active[r]) if r >= 0 else True  # a stopped client releases zeros
            plan = RoundPlan(t, np.array([joins]), joins, dict(config))
            silos.append(silo)
            jobs.append(silo.prepare(params, plan))
        results = CentralIdpSilo.train_batch(jobs)
        return [
            s.release(s.finish(job, res), params)
            for s, job, res in zip(silos, jobs, results, strict=True)
        ]

    def evaluate(self, params: Params, round_index: int, config: Scalars) -> PooledEvaluation:
        self.catch_up(int(round_index) + 1)
        x, y, owner = self._test_data()
        n, loss, acc = evaluate_arrays(self.model, params, x, y, owner, self._n)
        return PooledEvaluation(n, loss, acc)

    def _test_data(self) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """Every client's test split, concatenated once (and the owner of each record)."""
        if self._tests is None:
            import torch

            xs = [np.asarray(c.x_test, dtype=np.float32) for c in self.clients]
            ys = [np.asarray(c.y_test, dtype=np.int64) for c in self.clients]
            owner = np.concatenate([np.full(len(y), j, dtype=np.int64) for j, y in enumerate(ys)])
            self._tests = (
                torch.as_tensor(np.concatenate(xs)),
                torch.as_tensor(np.concatenate(ys)),
                owner,
            )
        return self._tests

    # ------------------------------------------------------------------ reports
    def privacy_summary(self) -> PrivacySummary | None:
        """Every client's privacy, unit ``client``: the ledger's summary (with the run's noise
        multiplier, as each client reported it) merged with the ε = ∞ clients'."""
        run = (
            {}
            if self.setup.noise_multiplier is None
            else {"noise_multiplier": float(self.setup.noise_multiplier)}
        )
        parts: list[PrivacySummary] = []
        if self.ledger is not None:
            summary = self.ledger.summary()
            parts.append(summary if dict(summary.info) == run else summary.with_info(**run))
        free = np.flatnonzero(self.row < 0)
        if free.size:
            parts.append(self._unaccounted_summary(free, run))
        return PrivacySummary.merge(parts) if parts else None

    def _unaccounted_summary(self, clients: np.ndarray, run: dict[str, float]) -> PrivacySummary:
        """ε = ∞ for ``clients``: non-private ones (budget ∞, never over it) or ``no-dp``."""
        observers = tuple(self.setup.observers)
        groups = []
        for b in np.unique(self.budgets[clients]):
            members = clients[self.budgets[clients] == b]
            g = int(self.groups[members[0]])
            rate = float(self.setup.rates[g])
            over = len(members) * int(math.isfinite(float(b)))  # ε = ∞ exceeds a finite ε
            info = {"mean_rate": rate, "rate": rate}
            sigma = self.setup.noise_multipliers[g]
            if sigma is not None:
                info["noise_multiplier"] = float(sigma)
            groups.append(
                GroupSummary(
                    label=label_of(float(b)),
                    units=int(len(members)),
                    budget_min=float(b),
                    budget_max=float(b),
                    spent_max={o: math.inf for o in observers},
                    utilization_sum={o: math.inf if over else 0.0 for o in observers},
                    over_budget={o: over for o in observers},
                    info=info,
                )
            )
        return PrivacySummary(
            unit="client",
            units=int(clients.size),
            observers=observers,
            accountant="rdp",
            groups=tuple(groups),
            private=self.setup.private,
            info=run,
        )

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        return {
            "next_round": int(self.next_round),
            "participations": self.participations.copy(),
            "ledger": None if self.ledger is None else self.ledger.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        next_round = int(state["next_round"])
        if next_round < 0:
            raise ValueError("clients state: next_round must be >= 0")
        part = np.asarray(state["participations"], dtype=np.int64).reshape(-1)
        if part.shape != (self._n,) or np.any(part < 0):
            raise ValueError(
                f"clients state: participations must be {self._n} non-negative integers"
            )
        if self.ledger is not None:
            if state.get("ledger") is None:
                raise ValueError("clients state: missing the ledger")
            self.ledger.load_state_dict(state["ledger"])
        self.next_round = next_round
        self.participations = part.copy()
