"""A PriFedSync client on the silo template: its personalized local model h_j and its ledger.

Round r at client j (Algorithm 1 with Algorithm 2 as local training; §4's instantiation):

1. **Join** (Algorithm 1, "Poisson sample Ω"): the client's own Bernoulli(p) coin from its own
   randomness (:meth:`PriFedSyncSilo.participates`); nobody redraws an empty round. A client
   whose ledger refuses the round (its records would exceed their budget) does not join.
2. **Charge before release** (the template): a joined round is charged to the client's
   record-level :class:`~pdpfl.ledger.PrivacyLedger` -- one row per record id, budget the
   client's target ε, rate γ = B/n, mechanism :class:`~pdpfl.privacy.unit.LocalStepsPlan`,
   charged per participation to every observer -- before :meth:`PriFedSyncSilo.step` runs.
3. **Local training** (Algorithm 2, :meth:`PriFedSyncSilo.step`): K DP-SGD steps from h_j, each
   on a batch of exactly B records drawn uniformly without replacement
   (:func:`pdpfl.dp.steps.wor_sample`; ``sampler: poisson``: one Bernoulli(B/n) coin per record),
   per-sample clipping to C, Gaussian noise σ·C, division by the public B. The optimizer state
   persists at the client (a function of noisy gradients only). The release is the new local
   model w̃_j with weight 1; a client that did not join releases zeros of weight 0.
4. **Elastic sync** (Eq. 2.1): h_j ← (1 − α)·w̃_j + α·w̄ when the client next receives the global
   model w̄ (the evaluation that follows the round, or its next fit).

Audit canaries (:mod:`pdpfl.audit.prifedsync_canaries`; None in every ordinary run): the
silo's :attr:`~PriFedSyncSilo.extra_rows` are canary records. Under ``sampler: wor`` they join
the pool the batches are drawn from (``wor_sample(n + m, B)``; a drawn canary's clipped row is
added to the clipped sum before the noise); under ``sampler: poisson`` each gets its own
Bernoulli(γ) coin per step (:func:`pdpfl.dp.engine.train_steps`'s ``extra``).

Evaluation replies carry only ``loss``, ``accuracy``, ``n``: of the local model h_j
(``evaluate: local``, the paper's metric) or of the global model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.fl.api import Contribution, Params, Scalars
from pdpfl.fl.common import checked_noise
from pdpfl.fl.prifedsync.mechanism import (
    PriFedSyncSetup,
    client_plan,
    clt_mu,
    epsilon,
    planned_epsilon,
    strong_epsilon,
)
from pdpfl.fl.template import RoundPlan, Silo
from pdpfl.ledger import PrivacyLedger, PrivacySummary

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pdpfl.data.federation import ClientData
    from pdpfl.dp.extra_rows import ExtraRows
    from pdpfl.randomness import Randomness

__all__ = ["NO_TARGET", "PriFedSyncClient", "PriFedSyncSilo"]

#: Budget-group label of the records of clients without a target (budget: the planned ε).
NO_TARGET = "no target"


def _as_tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    import torch  # here: parsing a config never imports torch

    return (
        torch.as_tensor(np.asarray(x, dtype=np.float32)),
        torch.as_tensor(np.asarray(y, dtype=np.int64)),
    )


class PriFedSyncSilo(Silo):
    """One PriFedSync client: its data, personalized local model, ledger and randomness.

    ``extra_rows``: audit canary records (module docstring; None in an ordinary run).

    Parameters
    ----------
    client_id
        The client's index.
    model
        A torch model with the public initialisation x⁰ (its weights become h_j).
    data
        The client's :class:`~pdpfl.data.federation.ClientData` (never leaves it); its
        ``record_ids`` key the ledger.
    setup
        The published :class:`~pdpfl.fl.prifedsync.mechanism.PriFedSyncSetup`.
    randomness
        The client's own randomness (join coins, batches, noise).
    batch_size
        B: records per step (WOR) / expected batch size (Poisson), and the public normaliser.
    target_epsilon
        This client's target ε at δ (None: no target; σ and K as configured, and the budget of
        its records is the ε of all ``rounds`` participations, which the run cannot exceed).
    optimizer, lr, momentum, weight_decay, physical_batch_size
        The local optimizer (created once; its state persists across rounds).
    """

    def __init__(
        self,
        client_id: int,
        model: torch.nn.Module,
        data: ClientData,
        setup: PriFedSyncSetup,
        *,
        randomness: Randomness,
        batch_size: float,
        target_epsilon: float | None = None,
        optimizer: str = "sgd",
        lr: float = 0.1,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        physical_batch_size: int = 512,
    ) -> None:
        from pdpfl.dp.engine import make_optimizer
        from pdpfl.dp.steps import check_normalizer
        from pdpfl.models import get_params

        self.setup = setup
        self.model = model
        self.randomness = randomness
        self.sampler = setup.sampler
        self.alpha = float(setup.alpha)
        self.client_rate = float(setup.client_rate)
        self.max_grad_norm = float(setup.max_grad_norm)
        self.evaluate_model = setup.evaluate
        self.num_clients = int(setup.num_clients)
        self.physical_batch_size = int(physical_batch_size)
        self.x_train, self.y_train = _as_tensors(data.x_train, data.y_train)
        self.x_test, self.y_test = _as_tensors(data.x_test, data.y_test)
        n = int(self.y_train.shape[0])
        self.batch_size = check_normalizer(batch_size, "training.batch_size")
        if self.sampler == "wor" and float(self.batch_size) != int(self.batch_size):
            raise ValueError(f"training.batch_size: must be a whole number, got {batch_size}")
        plan, self.rate = client_plan(
            setup, n, self.batch_size, target_epsilon, client_id=client_id
        )
        #: What each local step adds (σ_j after calibration, C): the description the ledger's
        #: mechanism is built from and every step draws from.
        from pdpfl.models import num_parameters

        self.noise = setup.noise(plan, num_parameters(model))
        #: The client's mechanism (σ_j, K_j after calibration) and its ratio γ = B/n.
        self.mechanism = plan.with_noise(self.noise.noise_multiplier)
        #: The client's target ε at δ (None: none; the records' budget is then the planned ε).
        self.target_epsilon = None if target_epsilon is None else float(target_epsilon)
        budget = (
            self.target_epsilon
            if self.target_epsilon is not None
            else planned_epsilon(self.mechanism, self.rate, setup.rounds, setup.rigorous_accountant)
        )
        # orders=None: the accountant's own grid for the event (without-replacement events
        # have their integer grid, Theorem 9); the calibration above used the same
        ledger = PrivacyLedger(
            np.full(n, budget),
            np.full(n, self.rate),
            self.mechanism,
            ids=getattr(data, "record_ids", None),
            orders=None,
            accountant=setup.rigorous_accountant,
        )
        super().__init__(client_id, ledger, adversary="both")
        self.ledger: PrivacyLedger = ledger
        self.optimizer = make_optimizer(
            optimizer, self.model.parameters(), lr=lr, weight_decay=weight_decay, momentum=momentum
        )
        #: h_j: the personalized local model (float32 arrays, trainable parameters only).
        self.local: Params = get_params(self.model)
        #: Round whose global model the client still has to sync with (-1: none).
        self.pending_sync = -1
        #: Batches of the last local training (stays at the silo; for tests).
        self.last_batches: list[np.ndarray] = []
        #: Mean training loss of the last local training (stays at the silo).
        self.last_train_loss: float | None = None
        #: Audit canary records (None in every ordinary run).
        self.extra_rows: ExtraRows | None = None

    # -- the template's duties, PriFedSync's way ---------------------------------------------
    def _precheck(self) -> np.ndarray:
        """Records allowed in the next participation. ``budget_accounting: clt`` enforces the
        target with Theorem 2's ε (as calibrated); the ledger and every report still use the
        rigorous bound, so a CLT-enforced target the bound exceeds is reported over budget."""
        if self.setup.budget_accounting != "clt":
            return super()._precheck()
        count = int(self.ledger.server_rounds.max(initial=0)) + 1
        exceed = epsilon(self.mechanism, self.rate, count, "clt") > self.ledger.budgets
        return ~exceed & (self.ledger.rates > 0)

    def join_coin(self, round_index: int) -> bool:
        """This client's own Bernoulli(p) coin for ``round_index`` (never sent)."""
        if self.client_rate >= 1.0:
            return True
        u = self.randomness.stream("client-join", int(round_index), self.client_id).uniform(1)
        return bool(u[0] < self.client_rate)

    def participates(self, round_index: int, config: Scalars) -> bool:
        """Joins when its own coin comes up and its ledger lets its records take part."""
        return self.join_coin(round_index) and bool(self._precheck().any())

    # -- accounting views (stay at the silo) -------------------------------------------------
    @property
    def participations_charged(self) -> int:
        """Participations charged to the client's records (every record the same)."""
        return int(self.ledger.server_rounds.max(initial=0))

    @property
    def stopped(self) -> bool:
        """True once the ledger made the client sit out a round (its target was reached)."""
        return bool(self.ledger.stopped.any())

    def spent(self, accounting: str = "rigorous", participations: int | None = None) -> float:
        """ε at δ of the client's records (``rigorous``: the headline; ``clt``: Theorem 2)."""
        count = self.participations_charged if participations is None else int(participations)
        return epsilon(self.mechanism, self.rate, count, accounting, self.setup.rigorous_accountant)

    @property
    def gdp_figures(self) -> bool:
        """Whether the CLT GDP figures exist: not for the exact discrete Gaussian
        (``privacy.central_noise: discrete``), which has no proven μ-GDP bound."""
        return self.setup.central_noise != "discrete"

    def clt_mu(self, participations: int | None = None) -> float:
        """Theorem 2's CLT μ_j after the charged participations (an approximation; refused for
        discrete noise, :attr:`gdp_figures`)."""
        if not self.gdp_figures:
            raise ValueError(
                "clt_mu: the steps add the exact discrete Gaussian (privacy.central_noise: "
                "discrete), which has no proven μ-GDP bound; no CLT μ is stated for it"
            )
        count = self.participations_charged if participations is None else int(participations)
        return clt_mu(self.mechanism, self.rate, count)

    def strong_epsilon(self) -> float:
        """Rigorous ε of the paper's strong notion (the (m − 1)-fold composition)."""
        return strong_epsilon(
            self.mechanism,
            self.rate,
            self.participations_charged,
            self.num_clients,
            self.setup.rigorous_accountant,
        )

    def privacy_summary(self) -> PrivacySummary:
        """The ledger's summary (rigorous headline) with the CLT figures labelled approximate:
        the ``gdp-clt`` ε per observer, μ_j (``clt_mu``; merged over clients: the weak μ_max)
        and the paper's strong √(m − 1)·μ_j (``clt_mu_strong``).

        The records of a client without a target form the budget group ``no target`` (their
        budget is the planned ε of their own client, so merged over clients they are one group,
        not one per client)."""
        from dataclasses import replace

        if not self.gdp_figures:  # the exact discrete Gaussian: no GDP figure at all
            summary = self.ledger.summary()
            if self.target_epsilon is None:
                labelled = tuple(replace(g, label=NO_TARGET) for g in summary.groups)
                summary = replace(summary, groups=labelled)
            return summary
        summary = self.ledger.summary(approximate="gdp-clt")
        mu = self.clt_mu()
        approx = {
            **summary.approximate,
            "clt_mu": mu,
            "clt_mu_strong": float(np.sqrt(max(self.num_clients - 1, 0))) * mu,
        }
        groups = summary.groups
        if self.target_epsilon is None:
            groups = tuple(replace(g, label=NO_TARGET) for g in groups)
        return replace(summary, approximate=approx, groups=groups)

    # -- the mechanism -----------------------------------------------------------------------
    def _sync(self, global_params: Params) -> None:
        """Eq. (2.1): h ← (1 − α)·h + α·global, in float64, rounded once to float32."""
        a = self.alpha
        self.local = [
            (
                np.asarray(h, np.float64)
                + a * (np.asarray(g, np.float64) - np.asarray(h, np.float64))
            ).astype(np.float32)
            for h, g in zip(self.local, global_params, strict=True)
        ]
        self.pending_sync = -1

    def step(self, global_params: Params, plan: RoundPlan) -> Contribution:
        """Algorithm 2 from h_j if the client joined (already charged); else zeros, weight 0."""
        if self.pending_sync >= 0:
            self._sync(global_params)
        if not (plan.participates and plan.active.any()):
            return Contribution(
                update=[np.zeros(np.shape(p), dtype=np.float32) for p in self.local], weight=0.0
            )
        self._train(plan.round_index)
        self.pending_sync = plan.round_index
        return Contribution(update=[p.astype(np.float32) for p in self.local], weight=1.0)

    def _train(self, round_index: int) -> None:
        import torch

        from pdpfl.dp.engine import PersonalizedDPSGD, train_steps
        from pdpfl.dp.steps import wor_sample
        from pdpfl.models import get_params, set_params

        set_params(self.model, self.local)
        stream = self.randomness.stream("local-training", int(round_index), self.client_id)
        k = int(self.mechanism.local_steps)
        noise = checked_noise(self.noise, self.ledger, f"client {self.client_id}")
        n = int(self.y_train.shape[0])
        self.last_batches = []
        self.model.train()
        if self.sampler == "poisson":
            res = train_steps(
                self.model,
                self.x_train,
                self.y_train,
                rates=torch.full((n,), self.rate, dtype=torch.float64),
                steps=k,
                noise=noise,
                optimizer=self.optimizer,
                stream=stream,
                normalizer=self.batch_size,
                physical_batch_size=self.physical_batch_size,
                extra=self.extra_rows,
            )
            self.last_train_loss = float(res.mean_loss)
        else:
            engine = PersonalizedDPSGD(
                self.model,
                self.optimizer,
                noise=noise,
                physical_batch_size=self.physical_batch_size,
            )
            b = int(self.batch_size)
            extra = self.extra_rows
            m = 0 if extra is None else extra.num_rows
            loss_total = 0.0
            for _ in range(k):
                drawn = wor_sample(n + m, b, stream)  # canary records join the pool (audit)
                idx = drawn[drawn < n]
                self.last_batches.append(idx.numpy())
                dev = engine.device  # training.device: the sampled batch crosses to it
                grads, loss_sum = engine.privatized_gradient(
                    self.x_train[idx].to(dev),
                    self.y_train[idx].to(dev),
                    self.batch_size,
                    stream,
                    None if extra is None else _drawn_rows(extra, (drawn[drawn >= n] - n).numpy()),
                )
                self.optimizer.zero_grad(set_to_none=True)
                for p, g in zip(engine.params, grads, strict=True):
                    p.grad = g
                self.optimizer.step()
                loss_total += loss_sum
            self.last_train_loss = loss_total / (k * b) if k else float("nan")
        self.local = get_params(self.model)

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, params: Params, round_index: int, config: Scalars) -> Scalars:
        """Catch up, sync a joined round's local model with ``params`` (Eq. 2.1), then test."""
        self.catch_up(int(round_index) + 1)
        if 0 <= self.pending_sync <= int(round_index):
            self._sync(params)
        return self.test(params)

    def _metrics(self, params: Params) -> Scalars:
        from pdpfl.dp.engine import evaluate
        from pdpfl.models import set_params

        set_params(self.model, params)
        res = evaluate(self.model, self.x_test, self.y_test)
        return {"loss": float(res["loss"]), "accuracy": float(res["accuracy"]), "n": int(res["n"])}

    def test(self, params: Params) -> Scalars:
        """The local model's test metrics (``evaluate: local``) or those of ``params``."""
        return self._metrics(self.local if self.evaluate_model == "local" else params)

    def evaluate_pair(self, global_params: Params) -> dict[str, Scalars]:
        """Test metrics of the local model and of ``global_params`` (operator use only)."""
        return {"local": self._metrics(self.local), "global": self._metrics(global_params)}

    # -- resume ------------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        import torch

        opt_state = {
            int(k): {
                name: (v.detach().clone() if torch.is_tensor(v) else v) for name, v in entry.items()
            }
            for k, entry in self.optimizer.state_dict()["state"].items()
        }
        return {
            "pending_sync": self.pending_sync,
            "local": [np.asarray(p, dtype=np.float32).copy() for p in self.local],
            "optimizer": opt_state,
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        import torch

        if not state:
            raise ValueError(f"client {self.client_id}: state holds no local model")
        local = [np.asarray(p, dtype=np.float32).copy() for p in state["local"]]
        if len(local) != len(self.local) or any(
            a.shape != b.shape for a, b in zip(local, self.local, strict=True)
        ):
            raise ValueError(f"client {self.client_id}: state holds a different model")
        self.local = local
        self.pending_sync = int(state["pending_sync"])
        groups = self.optimizer.state_dict()["param_groups"]
        opt_state = {
            int(k): {
                name: (torch.as_tensor(v) if isinstance(v, np.ndarray | torch.Tensor) else v)
                for name, v in entry.items()
            }
            for k, entry in dict(state["optimizer"]).items()
        }
        self.optimizer.load_state_dict({"state": opt_state, "param_groups": groups})


def _drawn_rows(rows: ExtraRows, drawn: np.ndarray) -> ExtraRows:
    """The canary rows a without-replacement batch drew (rate 1: taken as drawn)."""
    from pdpfl.dp.extra_rows import ExtraRows

    np.add.at(rows.counts, drawn, 1)
    return ExtraRows(
        coords=rows.coords[drawn],
        values=rows.values[drawn],
        rates=np.ones(drawn.size, dtype=np.float64),
    )


#: Former name (code written against the first release).
PriFedSyncClient = PriFedSyncSilo
