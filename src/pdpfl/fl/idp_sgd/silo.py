"""The Scale silo: DP-SGD with one clip norm per budget group (Boenisch et al. 2023, Alg. 1).

Built at the silo from its own data, its records' budgets and the published
:class:`~pdpfl.fl.idp_sgd.mechanism.ScaleSetup`: each record joins its group locally (budgets
never leave the silo) and gets C_i = σ·C/σ_p. Each round it is asked, :meth:`ScaleSilo.step`
runs τ steps from the global model: Poisson sampling at rate q (line 5 of the paper's
Algorithm 1), per-record clipping to C_i (line 8, individualized), the one noise N(0, σ²C²)
(line 10), division by the public expected batch size B; it releases Δx = x^{t,τ} − x^t. The
round duties (pre-check, catch-up, charge before release, resume) are the template's, over a
record-level ledger that charges record i the sampled Gaussian of multiplier σ·C/C_i.

Built from the public pieces of :mod:`pdpfl.dp` only: the engine's sampling, noise and update
(:class:`~pdpfl.dp.PersonalizedDPSGD`) around :func:`~pdpfl.dp.clipped_grad_sum`, which takes
per-record bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.fl.api import Contribution, Params, Scalars
from pdpfl.fl.idp_sgd.mechanism import ScaleSetup, record_multiplier
from pdpfl.fl.template import RoundPlan, Silo
from pdpfl.ledger import PrivacyLedger, PrivacySummary
from pdpfl.privacy.noise import GaussianNoise, check_charged

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pdpfl.data.federation import ClientData
    from pdpfl.dp.extra_rows import ExtraRows
    from pdpfl.dp.noise import CentralNoise
    from pdpfl.randomness import Randomness

__all__ = ["ScaleSilo"]


class ScaleSilo(Silo):
    """One silo of Scale (module docstring).

    Parameters
    ----------
    client_id, model, data, budgets, setup, randomness
        The silo's index, its model (public x⁰), its data and its records' ε (never leave
        it), what the server published, the silo's own mechanism randomness.
    normalizer
        The public expected batch size B dividing each step's noisy sum.
    allow_exclusion
        Allow records whose budget is below the smallest group (rate 0, excluded).
    optimizer, lr, momentum, weight_decay, physical_batch_size
        The local optimizer (:func:`pdpfl.dp.make_optimizer`), recreated every round.
    """

    def __init__(
        self,
        client_id: int,
        model: torch.nn.Module,
        data: ClientData,
        budgets: np.ndarray,
        setup: ScaleSetup,
        *,
        randomness: Randomness,
        normalizer: float | None,
        allow_exclusion: bool = False,
        optimizer: str = "sgd",
        lr: float = 0.1,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        physical_batch_size: int = 512,
    ) -> None:
        import torch  # here: parsing a config never imports torch

        from pdpfl.dp.steps import check_normalizer

        self.setup, self.model, self.randomness = setup, model, randomness
        self.optimizer_name, self.lr = optimizer, float(lr)
        self.momentum, self.weight_decay = float(momentum), float(weight_decay)
        self.physical_batch_size = int(physical_batch_size)
        self.normalizer = check_normalizer(normalizer, "training.batch_size")
        self.x_train = torch.as_tensor(np.asarray(data.x_train, dtype=np.float32))
        self.y_train = torch.as_tensor(np.asarray(data.y_train, dtype=np.int64))
        self.x_test = torch.as_tensor(np.asarray(data.x_test, dtype=np.float32))
        self.y_test = torch.as_tensor(np.asarray(data.y_test, dtype=np.int64))
        self.budgets = np.asarray(budgets, dtype=np.float64)
        if self.budgets.shape != (len(self.y_train),):
            raise ValueError(f"silo {client_id}: {self.budgets.size} budgets for its records")
        self.rates = setup.record_rates(self.budgets)
        below = self.rates <= 0
        if below.any() and not allow_exclusion:
            raise ValueError(
                f"budgets: silo {client_id} has {int(below.sum())} record(s) with budgets below "
                f"the smallest group ε = {setup.group_budgets[0]:g}; add a lower group to "
                "algorithm.groups, or set privacy.allow_exclusion: true to exclude them"
            )
        # the trainable coordinates (the grid of privacy.central_noise: discrete)
        from pdpfl.models import num_parameters

        dimension = num_parameters(model)
        #: C_i: each record's own clipping bound (stays on the silo).
        self.clips = setup.clip_norms(self.budgets, dimension)
        #: The one noise every step adds; record i is charged it at sensitivity C_i.
        self.noise: CentralNoise = setup.noise(dimension)
        ledger = PrivacyLedger(
            self.budgets,
            self.rates,
            setup.plan(),
            ids=data.record_ids,
            noise_multipliers=setup.record_noise(self.budgets, dimension),
            accountant=setup.accountant,
        )
        super().__init__(client_id, ledger, adversary=setup.adversary)
        #: Records above the top group: they spend at most ε_max, less than their budget.
        self.capped = self.budgets > setup.group_budgets[-1] * (1 + 1e-9)
        #: Audit canaries (:mod:`pdpfl.audit`), already scaled to their clip norms; else None.
        self.extra_rows: ExtraRows | None = None
        self.last_train_loss: float | None = None

    def privacy_summary(self) -> PrivacySummary:
        assert self.ledger is not None
        return self.ledger.summary(capped=self.capped)

    def _checked_noise(self) -> CentralNoise:
        """The step's noise, after checking that every record's ledger multiplier is this noise
        seen at the record's own sensitivity C_i (nothing is drawn otherwise)."""
        assert self.ledger is not None
        charged = self.ledger.noise_multipliers
        for c in np.unique(self.clips[self.clips > 0]):
            first = int(np.flatnonzero(self.clips == c)[0])
            seen = (
                self.noise.for_sensitivity(float(c))
                if isinstance(self.noise, GaussianNoise)
                else GaussianNoise(record_multiplier(self.noise, float(c)), float(c))
            )
            check_charged(seen, float(charged[first]), what=f"silo {self.client_id}")
        return self.noise

    def step(self, global_params: Params, plan: RoundPlan) -> Contribution:
        """τ steps: sample at q, clip record i to C_i, add N(0, σ²C²), divide by B; Δx."""
        import torch

        from pdpfl.dp import PersonalizedDPSGD, clipped_grad_sum, make_optimizer
        from pdpfl.models import get_params, loss_fn, set_params

        set_params(self.model, global_params)
        opt = make_optimizer(
            self.optimizer_name,
            self.model.parameters(),
            lr=self.lr,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
        )
        engine = PersonalizedDPSGD(
            self.model,
            opt,
            noise=self._checked_noise(),
            physical_batch_size=self.physical_batch_size,
        )
        rates = np.where(plan.active, self.rates, 0.0)
        clips = torch.as_tensor(self.clips, dtype=torch.float64)
        stream = self.randomness.stream("local-training", plan.round_index, self.client_id)
        loss_sum, drawn = 0.0, 0
        for _ in range(self.setup.local_steps):
            idx = engine.sample(rates, stream)
            res = clipped_grad_sum(
                self.model,
                self.x_train.index_select(0, idx),
                self.y_train.index_select(0, idx),
                loss_fn,
                clips.index_select(0, idx),
                engine.grad_sampler,
                self.physical_batch_size,
            )
            if self.extra_rows is not None:  # canaries: after the records, before the noise
                self.extra_rows.add_sampled(res.sums, stream, self.setup.max_grad_norm)
            engine.apply(engine.noisy_gradient(res.sums, self.normalizer, stream))
            loss_sum, drawn = loss_sum + res.loss_sum, drawn + int(idx.numel())
        self.last_train_loss = loss_sum / max(drawn, 1)
        delta = [
            (np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).astype(np.float32)
            for a, b in zip(get_params(self.model), global_params, strict=True)
        ]
        return Contribution(update=delta, weight=1.0)

    def test(self, params: Params) -> Scalars:
        from pdpfl.dp import evaluate
        from pdpfl.models import set_params

        set_params(self.model, params)
        res = evaluate(self.model, self.x_test, self.y_test)
        return {"loss": float(res["loss"]), "accuracy": float(res["accuracy"]), "n": int(res["n"])}

    def extra_state(self) -> dict[str, Any]:
        return {}
