"""The rPDP-FL silo (Algorithm 3, lines 9-16): personalized DP-SGD from the global model.

Built at the silo from its own data, its records' budgets and the published setup:

* q_ij = F(ε_ij), applied locally (line 4); budgets never leave the silo. A record whose budget
  is below the smallest achievable ε is an error unless ``privacy.allow_exclusion`` (then it
  gets q = 0 and is counted as excluded);
* each round it is asked, :meth:`DpFedAvgSilo.step` runs τ DP-SGD steps from the global model
  (lines 9-15, :func:`pdpfl.dp.engine.train_steps`): Poisson sampling at rates q_ij, clipping at
  C, Gaussian noise σC and division by the public expected batch size B; it releases only
  Δx_i = x_i^{t,τ} − x^t (line 16). A silo whose records all sat out still runs its τ
  noise-only steps: nothing distinguishes it;
* the round duties (pre-check, catch-up, charge before release, resume) are the template's
  (:class:`pdpfl.fl.template.Silo`) over a record-level ledger keyed by the records' ids.

The same silo serves every DP-FedAvg baseline (other rates) and the privacy-free baseline
(no ledger, no noise, rate B/n).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.fl.api import Contribution, Params, Scalars
from pdpfl.fl.common import checked_noise
from pdpfl.fl.rpdp.mechanism import DpFedAvgSetup
from pdpfl.fl.template import RoundPlan, Silo
from pdpfl.ledger import PrivacyLedger, PrivacySummary, nonprivate_summary

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pdpfl.data.federation import ClientData
    from pdpfl.dp.extra_rows import ExtraRows
    from pdpfl.dp.noise import CentralNoise
    from pdpfl.randomness import Randomness

__all__ = ["DpFedAvgClient", "DpFedAvgSilo"]


def _as_tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    import torch  # here: parsing a config never imports torch

    return (
        torch.as_tensor(np.asarray(x, dtype=np.float32)),
        torch.as_tensor(np.asarray(y, dtype=np.int64)),
    )


class DpFedAvgSilo(Silo):
    """One silo of rPDP-FL (and, with other rates, of every DP-FedAvg baseline).

    Parameters
    ----------
    client_id
        The silo's index in the federation.
    model
        A torch model built with the public initialisation; its weights are overwritten each round.
    data
        The silo's :class:`~pdpfl.data.federation.ClientData` (never leaves it); its
        ``record_ids`` key the ledger.
    budgets
        ε_ij of the silo's training records (never leaves it).
    setup
        What the server published (σ, δ, τ, T, λ, C, the estimator F or the uniform rate).
    randomness
        The silo's own mechanism randomness (record coins and noise).
    normalizer
        The public expected batch size B dividing each step's noisy sum (required under DP).
    weight
        The public weight of this silo's update (1, or its size when declared public); the
        released update is ``weight · Δx``.
    allow_exclusion
        Allow records whose budget is below the smallest achievable ε (q = 0, excluded).
    epsilon_cap, cap_at_epsilon_max
        ε_max (``privacy.epsilon_max``; None: what F spends at q = 1) and whether records with
        budgets above it may train at q = 1 (counted as capped); otherwise they are an error.
    optimizer, lr, momentum, weight_decay, physical_batch_size
        The local optimizer (:func:`pdpfl.dp.engine.make_optimizer`), recreated every round.
    nonprivate_rate
        The privacy-free baseline's sampling rate (B/n; no DP).
    """

    def __init__(
        self,
        client_id: int,
        model: torch.nn.Module,
        data: ClientData,
        budgets: np.ndarray,
        setup: DpFedAvgSetup,
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
        self.setup = setup
        self.model = model
        self.randomness = randomness
        self.optimizer_name, self.lr = optimizer, float(lr)
        self.momentum, self.weight_decay = float(momentum), float(weight_decay)
        self.physical_batch_size = int(physical_batch_size)
        self.weight = float(weight)
        self.x_train, self.y_train = _as_tensors(data.x_train, data.y_train)
        self.x_test, self.y_test = _as_tensors(data.x_test, data.y_test)
        self.budgets = np.asarray(budgets, dtype=float)
        n = len(self.y_train)
        if self.budgets.shape != (n,):
            raise ValueError(f"silo {client_id}: {self.budgets.shape[0]} budgets for {n} records")
        ids = getattr(data, "record_ids", None)
        ledger = None
        #: What every local step adds (None without DP); the ledger's plan is built from it.
        self.noise: CentralNoise | None = None
        #: Records trained at q = 1 with a budget above ε_max (they spend less than allowed).
        self.capped = np.zeros(n, dtype=bool)
        if setup.private:
            from pdpfl.dp.steps import check_normalizer

            self.normalizer: float | None = check_normalizer(normalizer, "training.batch_size")
            self.rates = setup.record_rates(self.budgets)
            if setup.mode == "personalized":
                self._refuse_unreachable(client_id, allow_exclusion)
                self.capped = self._capped(client_id, epsilon_cap, cap_at_epsilon_max)
            # the trainable coordinates (the grid of privacy.central_noise: discrete)
            from pdpfl.models import num_parameters

            dimension = num_parameters(model)
            self.noise = setup.noise(dimension)
            ledger = PrivacyLedger(
                self.budgets,
                self.rates,
                setup.plan(self.noise),
                ids=ids,
                accountant=setup.accountant,
            )
        else:
            self.normalizer = None
            q = 1.0 if nonprivate_rate is None else float(nonprivate_rate)
            self.rates = np.full(n, min(1.0, q))
        super().__init__(client_id, ledger, adversary=setup.adversary)
        #: How often each record was drawn into a local batch (stays on the silo; for tests).
        self.selection_counts = np.zeros(n, dtype=np.int64)
        #: Mean training loss of the silo's last round (stays on the silo: not DP-protected).
        self.last_train_loss: float | None = None
        #: Audit canaries (:mod:`pdpfl.audit`): extra rows sampled, clipped and noised with the
        #: records in every step (:mod:`pdpfl.dp.extra_rows`). None in every ordinary run.
        self.extra_rows: ExtraRows | None = None

    def _refuse_unreachable(self, client_id: int, allow_exclusion: bool) -> None:
        low_mask = self.rates <= 0
        if low_mask.any() and not allow_exclusion:
            low = self.budgets[low_mask]
            raise ValueError(
                f"budgets: silo {client_id} has {int(low_mask.sum())} record(s) with budgets in "
                f"[{low.min():g}, {low.max():g}], below the smallest ε this mechanism can give a "
                "positive rate; set privacy.allow_exclusion: true to exclude them, or lower σ"
            )

    def _capped(self, client_id: int, epsilon_cap: float | None, allowed: bool) -> np.ndarray:
        """Records sampled at q = 1 whose budget is above ε_max: an error unless allowed."""
        cap = epsilon_cap
        if cap is None:  # σ given: what the estimator spends at q = 1
            est = self.setup.estimator_object()
            cap = next(
                (
                    float(v)
                    for v in (getattr(est, "max_epsilon", None), getattr(est, "eps_at_one", None))
                    if v is not None
                ),
                None,
            )
        if cap is None:
            return np.zeros(len(self.budgets), dtype=bool)
        capped = (self.rates >= 1.0) & (self.budgets > cap * (1 + 1e-9))
        if capped.any() and not allowed:
            high = self.budgets[capped]
            raise ValueError(
                f"budgets: silo {client_id} has {int(capped.sum())} record(s) with budgets in "
                f"[{high.min():g}, {high.max():g}], above ε_max = {cap:.6g} (what sampling at "
                "q = 1 spends), so they would silently get less than their budget; lower those "
                "budgets, raise privacy.epsilon_max, or set budgets.cap_at_epsilon_max: true to "
                "train them at q = 1"
            )
        return capped

    # -- reporting -------------------------------------------------------------------------
    @property
    def sat_out(self) -> np.ndarray:
        """Records the pre-check made sit out at least once (stays on the silo)."""
        if self.ledger is None:
            return np.zeros(len(self.budgets), dtype=bool)
        return self.ledger.stopped

    @property
    def excluded(self) -> np.ndarray:
        if self.ledger is None:
            return np.zeros(len(self.budgets), dtype=bool)
        return self.ledger.excluded

    def spent(self, adversary: str) -> np.ndarray:
        """ε spent so far by each record against ``adversary`` (∞ without DP)."""
        if self.ledger is None:
            return np.full(len(self.budgets), np.inf)
        return np.asarray(self.ledger.spent_epsilon(adversary), dtype=float)

    def privacy_summary(self) -> PrivacySummary:
        if self.ledger is None:
            return nonprivate_summary("record", self.budgets)
        return self.ledger.summary(capped=self.capped)

    # -- the mechanism ---------------------------------------------------------------------
    def step(self, global_params: Params, plan: RoundPlan) -> Contribution:
        """τ DP-SGD steps at the active records' rates; release weight · Δx (line 16)."""
        import torch

        from pdpfl.dp.engine import make_optimizer, train_steps
        from pdpfl.models import get_params, set_params

        rates = self.rates if self.ledger is None else np.where(plan.active, self.rates, 0.0)
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
            steps=self.setup.local_steps,
            noise=self._noise(),
            optimizer=opt,
            stream=self.randomness.stream("local-training", plan.round_index, self.client_id),
            normalizer=self.normalizer,
            private=self.setup.private,
            physical_batch_size=self.physical_batch_size,
            extra=self.extra_rows,
        )
        self.selection_counts += np.asarray(result.selection_counts, dtype=np.int64)
        self.last_train_loss = float(result.mean_loss)
        new = get_params(self.model)
        delta = [
            (
                (np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) * self.weight
            ).astype(np.float32)
            for a, b in zip(new, global_params, strict=True)
        ]
        return Contribution(update=delta, weight=self.weight)

    def _noise(self) -> CentralNoise | None:
        """The noise of this round's steps, checked against what the ledger charges."""
        if self.noise is None:
            return None
        return checked_noise(self.noise, self.ledger, f"silo {self.client_id}")

    def test(self, params: Params) -> Scalars:
        from pdpfl.dp.engine import evaluate
        from pdpfl.models import set_params

        set_params(self.model, params)
        res = evaluate(self.model, self.x_test, self.y_test)
        return {"loss": float(res["loss"]), "accuracy": float(res["accuracy"]), "n": int(res["n"])}

    # -- hidden participation (aggregation: secure, participation: hidden) -----------------
    def participation_coin(self, round_index: int) -> bool:
        """This silo's own λ-coin for ``round_index`` (from its own randomness; never sent)."""
        rate = float(self.setup.client_rate)
        if rate >= 1.0:
            return True
        u = self.randomness.stream("hidden-participation", int(round_index), self.client_id)
        return bool(u.uniform(1)[0] < rate)

    def public_weight(self) -> float:
        """The public weight of this silo's update (1, or its size when declared public)."""
        return self.weight

    # -- resume ----------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        return {"selection_counts": self.selection_counts.copy()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if "selection_counts" in state:
            counts = np.asarray(state["selection_counts"], dtype=np.int64)
            if counts.shape != self.selection_counts.shape:
                raise ValueError("silo state: selection_counts has the wrong shape")
            self.selection_counts = counts.copy()


#: Former name (user code written against the first release).
DpFedAvgClient = DpFedAvgSilo
