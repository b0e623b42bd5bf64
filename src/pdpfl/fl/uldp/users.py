"""ULDP-AVG and ULDP-SGD silos (Algorithm 3, with Algorithm 4's user sub-sampling).

Per round a silo computes its release in separable steps:

1. :meth:`UserLevelSilo.user_vectors` -- for each of the round's users present here, Δ_{s,u}:
   a fresh copy of the global model trained Q epochs on u's records only (AVG,
   :class:`AvgSilo`), or u's *mean* gradient at x_t over its records (SGD, :class:`SgdSilo`;
   one mean, no double division, spec D7);
2. per-user clipping to C (float64 norms);
3. :meth:`UserLevelSilo.weighted_user_sum` -- Σ_u w_{s,u}·Clip(Δ_{s,u}, C) (line 16), the one
   step that needs the weights w_{s,u} (uniform 1/|S| or enhanced n_{s,u}/N_u, Eq. 4);
4. :meth:`~pdpfl.fl.uldp.silo.UldpSilo.privatize` -- this silo's noise share N(0, σ²C²/t) per
   coordinate (line 17 has σ²C²/|S|; t ≤ |S| is the fewest silos any released sum holds, or
   the smaller t a protocol announces: :meth:`UserLevelSilo.share_std`, so a dropout never
   leaves less than σ²C² in it), drawn from the silo's noise description
   ``GaussianNoise(σ, C, shares=t)``.

The round's users come from the server's mask in the round configuration (Algorithm 4);
a silo none of whose users was sampled still releases noise of the same shape.

Audit canaries (:mod:`pdpfl.audit.user_canaries`; None in every ordinary run): canary *users*
with records here, :attr:`UserLevelSilo.extra_rows`, enter step 3 like the silo's users -- each
sampled by its coin of the round (:attr:`~UserLevelSilo.extra_coins`: a stream of the server,
the same in every silo that holds the user), its vector clipped to C and weighted by
:attr:`~UserLevelSilo.extra_weight` (w_{s,u}), added to the weighted sum before the noise;
with discrete shares (:meth:`UserLevelSilo.discrete_step`) each is a unit of the integer vector,
rounded on its own at its part bound (:meth:`UserLevelSilo.rounded_canaries`).

With ``weights: private`` the private weighting protocol (Protocol 1,
:mod:`pdpfl.fl.aggregation.private_weighting`) replaces steps 3-4 and the summation: the silo
supplies :meth:`UserLevelSilo.user_histogram` (its own counts, which leave it only blinded and
masked) and, each round, :meth:`UserLevelSilo.user_updates` (steps 1-2 and its noise); ``fit``
is refused. The silo keeps no ledger (the users' is at the server).

Spec references: ``docs/uldp_spec.md``, Part A.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.fl.api import Contribution, Params, Scalars
from pdpfl.fl.template import RoundPlan
from pdpfl.fl.uldp.mechanism import UserLevelSetup, decode_mask
from pdpfl.fl.uldp.silo import UldpSilo
from pdpfl.fl.uldp.weights import silo_weights

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pdpfl.data.federation import ClientData
    from pdpfl.dp.batched import LocalTrainingSpec
    from pdpfl.dp.extra_rows import ExtraRows
    from pdpfl.fl.aggregation.private_weighting import UserUpdates
    from pdpfl.privacy.noise import DiscreteGaussianNoise
    from pdpfl.randomness import RandomStream

__all__ = ["AvgSilo", "SgdSilo", "UserLevelSilo"]


class UserLevelSilo(UldpSilo):
    """The steps ULDP-AVG and ULDP-SGD share (see the module docstring)."""

    needs_user_ids = True
    #: Audit canary users with records here (module docstring; None in ordinary runs) ...
    extra_rows: ExtraRows | None = None
    #: ... their weight w_{s,u} in this silo ...
    extra_weight: float = 1.0
    #: ... and the stream of round t's coins (the same for every silo holding them).
    extra_coins: Callable[[int], RandomStream] | None = None
    #: Private weights with discrete noise: the share N_Z(0, σ_s²) and the grid m of
    #: P' = 2^m·P (:func:`pdpfl.fl.uldp.discrete.private_weighting_noise`); None: continuous.
    weighting_noise: tuple[DiscreteGaussianNoise, int] | None = None

    def __init__(
        self,
        client_id: int,
        model: torch.nn.Module,
        data: ClientData,
        setup: UserLevelSetup,
        **kwargs: Any,
    ) -> None:
        super().__init__(client_id, model, data, setup, **kwargs)
        self.user_setup = setup
        #: w_{s,u} of this silo's users (None for private weights: only the protocol has them).
        self.user_weights = silo_weights(
            setup.weights,
            self.counts,
            self.users,
            self.num_silos,
            setup.user_totals,
            self.client_id,
        )

    def share_std(self, config: Scalars) -> float:
        """σC/√t: the std of this silo's noise share, sized for the t survivors of the setup or
        the smaller t a summation protocol announced for the round (``SURVIVORS_KEY``)."""
        from pdpfl.fl.aggregation.threshold import SURVIVORS_KEY

        announced = config.get(SURVIVORS_KEY)
        return self.checked_noise().std(None if announced is None else int(announced))

    # -- the round's users -------------------------------------------------------------------
    def selected_users(self, config: Scalars) -> np.ndarray:
        """Positions (into :attr:`users`) of this round's users: all, or the server's mask."""
        if "users" not in config:
            if self.user_setup.user_sampling:
                raise ValueError(f"silo {self.client_id}: the round config lacks the user mask")
            return np.arange(len(self.users))
        mask = decode_mask(str(config["users"]), self.num_users)
        return np.flatnonzero(mask[self.users])

    def training_spec(self) -> LocalTrainingSpec:
        """How one user's vector is trained (AVG: Q epochs; SGD: one full-batch gradient)."""
        return self.local_spec()

    def finish_vectors(self, deltas: list[torch.Tensor]) -> list[torch.Tensor]:
        """The user's vector from its trained delta (AVG: the delta itself)."""
        return deltas

    def user_vectors(
        self, global_params: Params, positions: np.ndarray, round_index: int
    ) -> list[torch.Tensor]:
        """Δ_{s,u} for the users at ``positions`` (step 1), stacked as one (K, *shape) tensor
        per parameter."""
        from pdpfl.dp.batched import train_copies
        from pdpfl.models import set_params

        set_params(self.model, global_params)
        datasets = [
            (self.x_train[self.user_index[p]], self.y_train[self.user_index[p]]) for p in positions
        ]
        deltas = train_copies(
            self.model,
            datasets,
            self.training_spec(),
            # One stream per user: a user's local training depends on its own coins only.
            stream=[
                self.randomness.stream("local-training", round_index, self.client_id, int(u))
                for u in self.users[positions]
            ],
            # up to 256 users per vectorized step; records per step capped by the default
            # (layer outputs near 16 MB: cache-friendly for convolutional models)
            group_size=256,
        )
        # trained on training.device; clipping, weighting and noise run on the CPU
        return self.finish_vectors([d.cpu() for d in deltas])

    def clipped_vectors(
        self, global_params: Params, positions: np.ndarray, round_index: int
    ) -> list[torch.Tensor]:
        """Steps 1-2: Clip(Δ_{s,u}, C) of the users at ``positions``."""
        from pdpfl.dp.steps import clip_vectors

        vectors = self.user_vectors(global_params, positions, round_index)
        clipped, _ = clip_vectors(vectors, float(self.setup.max_grad_norm))
        return list(clipped)

    @staticmethod
    def weighted_user_sum(clipped: list[torch.Tensor], weights: np.ndarray) -> list[torch.Tensor]:
        """Σ_u w_{s,u}·Clip(Δ_{s,u}) (Alg. 3 line 16), in float64 (step 3).

        The one step that needs the weights: the private weighting protocol (Paillier +
        masking, Sec. 4) replaces it with an encrypted weighted sum whose inputs are
        ``clipped``, this silo's counts n_{s,u} and the user mask.
        """
        import torch  # here: parsing a config never imports torch

        w = torch.as_tensor(np.asarray(weights, dtype=np.float64))
        return [torch.tensordot(w, c.to(torch.float64), dims=1) for c in clipped]

    # -- the template's step -----------------------------------------------------------------
    def fit(self, global_params: Params, round_index: int, config: Scalars) -> Contribution:
        if self.user_weights is None:  # refused before anything is accounted or trained
            raise ValueError(
                "algorithm.weights: private weights are computed only inside the private "
                "weighting protocol (aggregation by Protocol 1); this runtime called fit()"
            )
        return super().fit(global_params, round_index, config)

    def step(self, global_params: Params, plan: RoundPlan) -> Contribution:
        """Steps 1-4 for this round's users (noise only when none of them is here)."""
        import torch

        assert self.user_weights is not None
        if self.share_encoding is not None:
            return self.discrete_step(global_params, plan)
        positions = self.selected_users(plan.config)
        if len(positions):
            clipped = self.clipped_vectors(global_params, positions, plan.round_index)
            sums = self.weighted_user_sum(clipped, self.user_weights[positions])
        else:  # nobody of this silo was sampled: a noise-only release of the same shape
            sums = [torch.zeros(tuple(np.shape(p)), dtype=torch.float64) for p in global_params]
        if self.extra_rows is not None and self.extra_coins is not None:  # audit canary users
            bound = self.extra_weight * float(self.setup.max_grad_norm)  # w·Clip(Δ, C), Dirac
            self.extra_rows.add_sampled(sums, self.extra_coins(plan.round_index), bound)
        return Contribution(update=self.privatize(sums, plan.round_index, plan.config))

    def discrete_step(self, global_params: Params, plan: RoundPlan) -> Contribution:
        """Steps 1-4 with a discrete share (``privacy.noise_shares: discrete``): each user's
        w_{s,u}·Clip(Δ_{s,u}, C) scaled and rounded on its own (conditional randomized
        rounding at its part bound, :func:`~pdpfl.dp.discrete_encoding.round_units`), summed,
        + one exact discrete Gaussian share (the one noise adder), modulo 2^b."""
        import torch

        from pdpfl.dp.discrete_encoding import add_noise_share, round_units
        from pdpfl.fl.aggregation.discrete_shares import rotation_seed
        from pdpfl.fl.aggregation.threshold import SURVIVORS_KEY
        from pdpfl.privacy.noise import check_charged

        assert self.user_weights is not None and self.share_encoding is not None
        params = self.share_encoding.params
        noise = params.noise()
        check_charged(noise, float(self._charged or 0.0), what=f"silo {self.client_id}")
        announced = plan.config.get(SURVIVORS_KEY)
        noise.shares_for(None if announced is None else int(announced))  # never fewer than t
        t = plan.round_index
        positions = self.selected_users(plan.config)
        d = params.dimension
        rows = np.zeros((0, d))
        if len(positions):
            clipped = self.clipped_vectors(global_params, positions, t)
            rows = torch.cat(
                [c.to(torch.float64).reshape(len(positions), -1) for c in clipped], dim=1
            ).numpy()
        rounded = round_units(
            rows,
            self.user_weights[positions],
            params,
            self.randomness.stream("rounding", t, self.client_id),
            rotation_seed(t),
        )
        if self.extra_rows is not None and self.extra_coins is not None:  # audit canary users
            rounded = rounded + self.rounded_canaries(t)
        share = add_noise_share(
            rounded, params, self.randomness.stream("noise-share", t, self.client_id)
        )
        return Contribution(update=[share])

    def rounded_canaries(self, round_index: int) -> np.ndarray:
        """Σ x̃_u over the audit's canary users sampled this round, each a unit like a user of
        this silo (int64, d'): its coin from :attr:`extra_coins`, its vector clipped to C and
        weighted by :attr:`extra_weight`, rotated when the rotation is on, scaled and rounded
        on its own at its part bound N_p(w) (its own rounding stream). Without the rotation a
        zero coordinate rounds to zero exactly, so only each row's own coordinates are rounded
        (the same law as rounding the dense vector)."""
        from pdpfl.dp.discrete_encoding import conditional_round_rows, round_units
        from pdpfl.dp.steps import poisson_sample
        from pdpfl.fl.aggregation.discrete_shares import rotation_seed

        assert self.share_encoding is not None
        assert self.extra_rows is not None and self.extra_coins is not None
        params, rows = self.share_encoding.params, self.extra_rows
        total = np.zeros(params.padded_dimension, dtype=np.int64)
        idx = poisson_sample(rows.rates, self.extra_coins(round_index)).numpy()
        if idx.size == 0:
            return total
        np.add.at(rows.counts, idx, 1)
        coords, values = rows.coords[idx], rows.values[idx]
        if int(coords.max()) >= params.dimension:
            raise ValueError(
                f"extra rows: coordinate {int(coords.max())} is outside the "
                f"{params.dimension} coordinates of the share"
            )
        clip, w = float(params.clip), float(self.extra_weight)
        norms = np.sqrt(np.sum(values * values, axis=1, keepdims=True))
        factors = np.ones_like(norms)
        np.divide(clip, norms, out=factors, where=norms > clip)
        clipped = values * factors  # Clip(v, C); the weight w_{s,u} is applied below
        stream = self.randomness.stream("audit-canary-rounding", round_index, self.client_id)
        if not params.rotation:
            bound = params.part_bound_sq(w)
            rounded = conditional_round_rows(
                clipped * (w * params.scale), [bound] * len(idx), stream
            )
            np.add.at(total, coords.reshape(-1), rounded.reshape(-1))
            return total
        per = max(1, (1 << 22) // params.padded_dimension)  # dense rows, in batches
        for s in range(0, len(idx), per):
            dense = np.zeros((min(per, len(idx) - s), params.dimension))
            np.put_along_axis(dense, coords[s : s + per], clipped[s : s + per], axis=1)
            weights = np.full(dense.shape[0], w)
            total += round_units(dense, weights, params, stream, rotation_seed(round_index))
        return total

    # -- ULDP-FL private weighting (Protocol 1): what the silo supplies, never sent itself ---
    def user_histogram(self) -> np.ndarray:
        """n_{s,u} for every user u = 0..|U|-1: this silo's training records per user."""
        hist = np.zeros(self.num_users, dtype=np.int64)
        hist[self.users] = self.counts
        return hist

    def user_updates(self, global_params: Params, round_index: int, config: Scalars) -> UserUpdates:
        """Clip(Δ_{s,u}, C) of this round's users, flattened, and the silo's noise z_s
        (Alg. 3 lines 10-17 without the weighting, which the protocol does encrypted).

        The template's round duties run first (a round already done is refused)."""
        import torch

        from pdpfl.fl.aggregation.private_weighting import UserUpdates

        if self.user_setup.weights != "private":
            raise ValueError(
                "weights: private applies to uldp-avg / uldp-sgd configured with "
                "algorithm.weights: private"
            )
        plan = self.begin_round(round_index, config)
        t = plan.round_index
        shapes = [tuple(np.shape(p)) for p in global_params]
        d = int(sum(math.prod(s) for s in shapes))
        positions = self.selected_users(plan.config)
        if len(positions):
            clipped = self.clipped_vectors(global_params, positions, t)
            deltas = torch.cat(
                [c.to(torch.float64).reshape(len(positions), -1) for c in clipped], dim=1
            ).numpy()
        else:
            deltas = np.zeros((0, d))
        users = self.users[positions].astype(np.int64)
        if self.weighting_noise is not None:
            grid, m = self.weighting_share(d, t, plan.config)
            return UserUpdates(users, deltas, np.zeros(d), grid_noise=grid, grid=m)
        zeros = [torch.zeros(s, dtype=torch.float64) for s in shapes]
        noise = np.concatenate(
            [np.asarray(z, dtype=np.float64).ravel() for z in self.noisy(zeros, t, plan.config)]
        )
        return UserUpdates(users=users, deltas=deltas, noise=noise)

    def weighting_share(self, d: int, round_index: int, config: Scalars) -> tuple[np.ndarray, int]:
        """This silo's exact discrete Gaussian Z_s ~ N_Z(0, σ_s²)^d on the grid P' = 2^m·P
        (private weights, discrete noise), through the one noise adder from its own stream;
        refused unless the ledger charges its multiplier and the protocol announces ≥ t."""
        from pdpfl.dp.noise import add_noise
        from pdpfl.fl.aggregation.threshold import SURVIVORS_KEY
        from pdpfl.privacy.noise import check_charged

        assert self.weighting_noise is not None
        noise, m = self.weighting_noise
        check_charged(noise, float(self._charged or 0.0), what=f"silo {self.client_id}")
        announced = config.get(SURVIVORS_KEY)
        noise.shares_for(None if announced is None else int(announced))  # never fewer than t
        z = np.zeros(d, dtype=np.int64)
        add_noise(z, noise, self.randomness.stream("weighting-noise", round_index, self.client_id))
        return z, m


class AvgSilo(UserLevelSilo):
    """ULDP-AVG: Δ_{s,u} = a fresh model trained Q epochs on user u's records, minus x_t."""


class SgdSilo(UserLevelSilo):
    """ULDP-SGD: Δ_{s,u} = g_{s,u}, user u's mean gradient at x_t (one mean, spec D7)."""

    def training_spec(self) -> LocalTrainingSpec:
        """One full-batch step with lr 1: the trained delta is −g_{s,u}."""
        from pdpfl.dp.batched import LocalTrainingSpec

        return LocalTrainingSpec(epochs=1, batch_size=None, optimizer="sgd", lr=1.0, steps=1)

    def finish_vectors(self, deltas: list[torch.Tensor]) -> list[torch.Tensor]:
        return [-d for d in deltas]
