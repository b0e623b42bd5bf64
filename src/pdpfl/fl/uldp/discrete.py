"""ULDP-AVG/SGD with discrete noise shares (``privacy.noise_shares: discrete``, the default).

Everything here is derived from public values -- the configuration, the number of silos and
users, the model's size and the published σ -- so the server and every silo build the same
:class:`~pdpfl.fl.aggregation.discrete_shares.ShareEncoding`:

* clip C = ``training.max_grad_norm``; σ the setup's; n = |S| silos, t = the setup's survivors;
* K = |U| contributors (the users whose rounded vectors one sum can hold) and P = |S| parts (a
  user's records may sit in every silo; each silo rounds its weighted vector w_{s,u}·Clip(Δ, C)
  at its own bound, :func:`pdpfl.dp.discrete_encoding.round_units`);
* the rotation is off unless ``secure.rotation: on`` (per-user rounding would rotate every user's
  vector: +35 % of a silo's round instead of +7 %, ``docs/discrete_noise.md``).

The ledger charges :class:`~pdpfl.privacy.uldp_discrete.DiscreteUserLevelPlan`; with
``privacy.epsilon_max`` σ is calibrated against that plan (:func:`calibrated_sigma`), so a
discrete run and a continuous one are planned at the same ε.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from pdpfl.privacy.discrete_plan import SampledDiscreteGaussianPlan
from pdpfl.privacy.uldp_discrete import DiscreteUserLevelPlan

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.config import ExperimentConfig
    from pdpfl.dp.discrete_params import DiscreteShareParams
    from pdpfl.fl.aggregation.discrete_shares import ShareEncoding
    from pdpfl.fl.api import FederationInfo
    from pdpfl.fl.uldp.mechanism import UserLevelSetup

__all__ = ["calibrated_sigma", "discrete_plan", "encoding", "model_size", "share_params"]


def model_size(config: ExperimentConfig, info: FederationInfo) -> int:
    """d: the model's coordinates (from the public initialisation)."""
    from pdpfl.fl.common import initial_params

    return int(sum(np.asarray(p).size for p in initial_params(config, info)))


def share_params(
    config: ExperimentConfig, *, sigma: float, silos: int, survivors: int, users: int, size: int
) -> DiscreteShareParams:
    """The integer encoding of one round's shares (module docstring); ValueError naming the
    ``secure.`` field when the bit width cannot work."""
    from pdpfl.dp.discrete_params import discrete_share_params  # pdpfl.dp loads torch

    sec = config.secure
    return discrete_share_params(
        clip=float(config.training.max_grad_norm),
        noise_multiplier=float(sigma),
        silos=int(silos),
        survivors=int(survivors),
        dimension=int(size),
        bits=int(sec.bits),
        rotation=sec.rotation == "on",
        contributors=max(1, int(users)),
        parts=int(silos),
        max_wrap=float(sec.max_wrap),
        max_inflation=float(sec.max_inflation),
    )


def encoding(config: ExperimentConfig, setup: UserLevelSetup, size: int) -> ShareEncoding:
    """The :class:`ShareEncoding` of a published ULDP-AVG/SGD setup."""
    from pdpfl.fl.aggregation.discrete_shares import ShareEncoding

    params = share_params(
        config,
        sigma=setup.noise_multiplier,
        silos=setup.num_silos,
        survivors=setup.survivors,
        users=setup.num_users,
        size=size,
    )
    return ShareEncoding(params, size)


def discrete_plan(
    params: DiscreteShareParams, delta: float, rounds: int, *, plain: bool, uniform: bool
) -> DiscreteUserLevelPlan:
    """The user-level ledger's plan: the released sum, and the server's view (the sum under
    secure summation; each silo's share under plain summation)."""
    released = params.plan("user", delta, rounds)
    view = released
    if plain:
        view = SampledDiscreteGaussianPlan(
            released.unit,
            released.share_variance,
            1,
            params.parts_view_sq(uniform),
            released.dimension,
            delta,
            rounds,
        )
    return DiscreteUserLevelPlan(released, view)


def calibrated_sigma(
    config: ExperimentConfig,
    *,
    epsilon: float,
    rate: float,
    silos: int,
    survivors: int,
    users: int,
    size: int,
) -> float:
    """The smallest σ (to 10^-4 relative) whose third-party ε of T rounds at user rate
    ``rate`` is at most ``epsilon`` under the discrete plan (bisection; ε decreases in σ)."""
    delta, rounds = float(config.privacy.delta), int(config.training.rounds)

    def eps(sigma: float) -> float:
        params = share_params(
            config, sigma=sigma, silos=silos, survivors=survivors, users=users, size=size
        )
        plan = params.plan("user", delta, rounds, ("third-party",))
        from pdpfl.privacy import mechanism_epsilon

        e, _ = mechanism_epsilon(plan, np.array([float(rate)]), "third-party")
        return float(e[0])

    lo, hi = 0.05, 1.0
    while eps(hi) > epsilon:
        lo, hi = hi, hi * 2.0
        if hi > 1e6:
            raise ValueError(
                f"privacy.epsilon_max: no σ up to 10^6 gives ε <= {epsilon:g} with discrete shares"
            )
    if eps(lo) <= epsilon:
        raise ValueError(
            f"privacy.epsilon_max: {epsilon:g} is reached with σ < {lo:g}; set "
            "privacy.noise_multiplier instead"
        )
    while hi / lo > 1.0 + 1e-4:
        mid = math.sqrt(lo * hi)
        if eps(mid) > epsilon:
            lo = mid
        else:
            hi = mid
    return hi
