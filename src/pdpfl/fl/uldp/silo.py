"""ULDP-FL silos on the silo template: NAIVE (Alg. 1), GROUP-k (Alg. 2) and DEFAULT.

A ULDP-FL silo holds its records and their global user ids. It keeps **no ledger**: the unit
is a user with records in several silos, whose rounds are decided and charged by the server
(the user-level ledger lives there, :mod:`pdpfl.fl.uldp.server`). The template
(:class:`pdpfl.fl.template.Silo`) still owns the round duties -- which round is next, refusing
one already done, catch-up, checking the release -- and each variant overrides one step:

* :class:`NaiveSilo` -- Q epochs of SGD on all its records, the delta clipped to C, Gaussian
  noise of std σκC√|S| (Algorithm 1 lines 8-14; κ = 2 is the rigorous sensitivity, spec D29);
* :class:`DefaultSilo` -- the same training without clipping or noise (no DP);
* :class:`GroupSilo` -- DP-SGD (public record rate, τ steps, clip C, noise σC, normaliser B)
  on the records its fixed flags keep (Algorithm 2 lines 8-10);
* ULDP-AVG/SGD (Algorithm 3) are in :mod:`pdpfl.fl.uldp.users`.

Every silo's noise is one description (:class:`~pdpfl.privacy.noise.GaussianNoise`, from the
algorithm's ``noise(setup)``, or with ``privacy.central_noise: discrete`` the exact
:class:`~pdpfl.privacy.noise.CentralDiscreteGaussianNoise` on a grid: NAIVE's silo noise, GROUP's
DP-SGD steps, :mod:`pdpfl.privacy.uldp_central`), the one the server's user-level plan is built
from; the silo draws it with :func:`pdpfl.dp.noise.add_noise` (through
:func:`pdpfl.dp.steps.noisy_normalised_sum` or the DP-SGD engine), after checking it is
unchanged since the silo was built.

Spec references: ``docs/uldp_spec.md``, Part A.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pdpfl.fl.api import Contribution, Params, Scalars
from pdpfl.fl.template import RoundPlan, Silo
from pdpfl.fl.uldp.mechanism import GroupSetup, UldpSetup
from pdpfl.privacy.noise import CentralDiscreteGaussianNoise, GaussianNoise, check_charged
from pdpfl.randomness import Randomness

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pdpfl.data.federation import ClientData
    from pdpfl.dp.batched import LocalTrainingSpec

__all__ = ["DefaultSilo", "GroupSilo", "NaiveSilo", "SiloLevelSilo", "UldpSilo"]


class UldpSilo(Silo):
    """What every ULDP-FL silo shares: its data, the user index, noise and the test step.

    Parameters
    ----------
    client_id
        The silo's index s.
    model
        A torch model with the public initialisation (weights overwritten every round).
    data
        The silo's :class:`~pdpfl.data.federation.ClientData` (``user_ids``: global ids in
        0..|U|-1); it never leaves the silo.
    setup
        What the server published.
    randomness
        The silo's own mechanism randomness (training shuffles and noise).
    noise
        What the silo adds (the algorithm's ``silo_noise``: the description the server's
        ledger is built from -- a Gaussian, or with ``privacy.central_noise: discrete`` the
        exact discrete Gaussian on a grid, NAIVE and GROUP); None: no DP.
    batch_size
        B: minibatch size of local SGD (DEFAULT/NAIVE/AVG) or DP-SGD's public normaliser
        (GROUP).
    lr, momentum, weight_decay, optimizer, physical_batch_size
        The local optimiser η_l (and DP-SGD's physical batch).
    """

    public_metrics: ClassVar[frozenset[str]] = frozenset()
    #: Whether the variant needs the records' user ids (AVG, SGD, GROUP).
    needs_user_ids: ClassVar[bool] = False

    def __init__(
        self,
        client_id: int,
        model: torch.nn.Module,
        data: ClientData,
        setup: UldpSetup,
        *,
        randomness: Randomness,
        noise: GaussianNoise | CentralDiscreteGaussianNoise | None = None,
        batch_size: float | None,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        optimizer: str = "sgd",
        physical_batch_size: int = 512,
    ) -> None:
        super().__init__(client_id, None)  # users are accounted at the server (module doc)
        self.model = model
        self.setup = setup
        self.randomness = randomness
        #: What this silo adds (None: no DP) and the multiplier the server charges for it.
        self.noise = noise
        self._charged = None if noise is None else noise.noise_multiplier
        self.batch_size = None if batch_size is None else max(1, int(round(float(batch_size))))
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.optimizer = optimizer
        self.physical_batch_size = int(physical_batch_size)
        import torch  # here: parsing a config never imports torch

        self.x_train = torch.as_tensor(np.asarray(data.x_train, dtype=np.float32))
        self.y_train = torch.as_tensor(np.asarray(data.y_train, dtype=np.int64))
        self.x_test = torch.as_tensor(np.asarray(data.x_test, dtype=np.float32))
        self.y_test = torch.as_tensor(np.asarray(data.y_test, dtype=np.int64))
        self.num_users = int(setup.num_users)
        self.num_silos = int(setup.num_silos)
        #: Mean training loss of the silo's last round (stays at the silo).
        self.last_train_loss: float | None = None
        #: The user ids present here (sorted), their records (dataset order) and counts n_{s,u}.
        self.users = np.zeros(0, dtype=np.int64)
        self.user_index: list[np.ndarray] = []
        self.counts = np.zeros(0, dtype=np.int64)
        if self.needs_user_ids:
            self._index_users(getattr(data, "user_ids", None))

    # -- setup at the silo ---------------------------------------------------------------
    def _index_users(self, user_ids: np.ndarray | None) -> None:
        if user_ids is None:
            raise ValueError(
                f"silo {self.client_id}: user-level DP needs user ids (data.options.num_users)"
            )
        ids = np.asarray(user_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_users):
            raise ValueError(
                f"silo {self.client_id}: user ids must lie in [0, {self.num_users}) "
                "(data.options.num_users)"
            )
        order = np.argsort(ids, kind="stable")  # dataset order within each user
        self.users, starts, self.counts = np.unique(
            ids[order], return_index=True, return_counts=True
        )
        self.user_index = [order[s : s + c] for s, c in zip(starts, self.counts, strict=True)]

    def local_spec(self) -> LocalTrainingSpec:
        """Q epochs of the local optimiser in minibatches of B (a ``LocalTrainingSpec``)."""
        from pdpfl.dp.batched import LocalTrainingSpec

        return LocalTrainingSpec(
            epochs=int(self.setup.local_epochs),
            batch_size=self.batch_size,
            optimizer=self.optimizer,
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
        )

    # -- noise ---------------------------------------------------------------------------
    def checked_noise(self) -> GaussianNoise | CentralDiscreteGaussianNoise:
        """The silo's noise description, checked unchanged since the silo was built (the server
        charges its multiplier)."""
        if self.noise is None or self._charged is None:
            raise ValueError(f"silo {self.client_id}: {type(self).__name__} has no noise to add")
        check_charged(self.noise, self._charged, what=f"silo {self.client_id}")
        return self.noise

    def privatize(
        self, sums: list[torch.Tensor], round_index: int, config: Scalars | None = None
    ) -> list[np.ndarray]:
        """Add this silo's noise in float64 (its own stream) and round once to float32."""
        import torch

        return [o.to(torch.float32).numpy() for o in self.noisy(sums, round_index, config)]

    def noisy(
        self, sums: list[torch.Tensor], round_index: int, config: Scalars | None = None
    ) -> list[torch.Tensor]:
        """``sums`` + this silo's noise per coordinate (std σC, or its share σC/√t for the t
        of the setup or the smaller t a protocol announced in the round ``config``), in float64
        from the silo's own stream."""
        import torch

        from pdpfl.dp.steps import noisy_normalised_sum
        from pdpfl.fl.aggregation.threshold import SURVIVORS_KEY

        announced = None if config is None else config.get(SURVIVORS_KEY)
        return noisy_normalised_sum(
            [s.to(torch.float64) for s in sums],
            self.checked_noise(),
            1.0,
            self.randomness.stream("noise", round_index, self.client_id),
            announced_survivors=None if announced is None else int(announced),
        )

    # -- the template's test step ----------------------------------------------------------
    def test(self, params: Params) -> Scalars:
        from pdpfl.dp.engine import evaluate
        from pdpfl.models import set_params

        set_params(self.model, params)
        res = evaluate(self.model, self.x_test, self.y_test)
        return {"loss": float(res["loss"]), "accuracy": float(res["accuracy"]), "n": int(res["n"])}


class SiloLevelSilo(UldpSilo):
    """NAIVE and DEFAULT: one local model per silo, trained on all of the silo's records."""

    def local_delta(self, global_params: Params, t: int) -> list[torch.Tensor]:
        """Q epochs of SGD(η_l) on all of the silo's records (Alg. 1 lines 8-12)."""
        from pdpfl.dp.batched import train_copies
        from pdpfl.models import set_params

        set_params(self.model, global_params)
        deltas = train_copies(
            self.model,
            [(self.x_train, self.y_train)],
            self.local_spec(),
            stream=self.randomness.stream("local-training", t, self.client_id),
        )
        return [d[0].cpu() for d in deltas]  # trained on training.device; released from the CPU


class DefaultSilo(SiloLevelSilo):
    """DEFAULT (no DP): Q epochs of SGD(η_l) on all the silo's records; releases Δ_s."""

    def step(self, global_params: Params, plan: RoundPlan) -> Contribution:
        import torch

        delta = self.local_delta(global_params, plan.round_index)
        return Contribution(update=[d.to(torch.float32).numpy() for d in delta])


class NaiveSilo(SiloLevelSilo):
    """ULDP-NAIVE (Algorithm 1): Clip(Δ_s, C) + N(0, σ²κ²C²|S|) (line 14)."""

    def step(self, global_params: Params, plan: RoundPlan) -> Contribution:
        import torch

        from pdpfl.dp.steps import clip_vectors

        delta = self.local_delta(global_params, plan.round_index)
        clipped, _ = clip_vectors([d.unsqueeze(0) for d in delta], self.setup.max_grad_norm)
        update = self.privatize([c[0].to(torch.float64) for c in clipped], plan.round_index)
        return Contribution(update=update)


class GroupSilo(UldpSilo):
    """ULDP-GROUP-k (Algorithm 2): DP-SGD on the records its fixed flags keep.

    The flags are the published quotas: the silo keeps the first n̂_{s,u} of user u's records
    (dataset order), computed once and never changed, so each user has at most k records in
    the union of the silos' training sets (Proposition 2, Theorem 4).
    """

    needs_user_ids = True

    def __init__(
        self,
        client_id: int,
        model: torch.nn.Module,
        data: ClientData,
        setup: GroupSetup,
        **kwargs: Any,
    ) -> None:
        super().__init__(client_id, model, data, setup, **kwargs)
        self.group_setup = setup
        quota = np.asarray(setup.group_quota, dtype=np.int64)
        if quota.shape != (self.num_silos, self.num_users):
            raise ValueError(
                f"setup: group_quota must be ({self.num_silos}, {self.num_users}), got "
                f"{quota.shape}"
            )
        mine = quota[self.client_id]
        parts = [idx[: int(mine[u])] for u, idx in zip(self.users, self.user_index, strict=True)]
        kept = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        #: Indices of the kept training records D̂_s (fixed for the whole run).
        self.kept = np.sort(kept)

    def step(self, global_params: Params, plan: RoundPlan) -> Contribution:
        """Alg. 2 lines 8-10: τ DP-SGD steps on D̂_s; releases x_s − x_t."""
        import torch

        from pdpfl.dp.engine import make_optimizer, train_steps
        from pdpfl.models import get_params, set_params

        set_params(self.model, global_params)
        opt = make_optimizer(
            self.optimizer,
            self.model.parameters(),
            lr=self.lr,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
        )
        idx = torch.as_tensor(self.kept, dtype=torch.long)
        result = train_steps(
            self.model,
            self.x_train[idx],
            self.y_train[idx],
            rates=torch.full((len(idx),), self.group_setup.record_rate, dtype=torch.float64),
            steps=int(self.setup.local_steps),
            noise=self.checked_noise(),
            optimizer=opt,
            stream=self.randomness.stream("local-training", plan.round_index, self.client_id),
            normalizer=float(self.batch_size or 0) or None,
            private=True,
            physical_batch_size=self.physical_batch_size,
        )
        self.last_train_loss = float(result.mean_loss)
        new = get_params(self.model)
        return Contribution(
            update=[
                (np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).astype(
                    np.float32
                )
                for a, b in zip(new, global_params, strict=True)
            ]
        )
