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

With ``algorithm.weights: private`` the private weighting protocol keeps its own encoding (Paillier
plaintexts on the grid P = ``secure.precision``) and each silo adds an exact discrete Gaussian on
the grid P' = 2^m·P (:mod:`pdpfl.fl.aggregation.private_weighting_core`, *Exact discrete
noise*): :func:`private_weighting_plan` is its ledger's plan (sensitivity N = (C/P' + 1.5√d)²,
t shares; the server decrypts only the sum, so it is charged like a third party) and
:func:`private_weighting_noise` the share every silo draws through the one noise adder.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.privacy.discrete_plan import SampledDiscreteGaussianPlan
from pdpfl.privacy.uldp_discrete import DiscreteUserLevelPlan

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.config import ExperimentConfig
    from pdpfl.dp.discrete_params import DiscreteShareParams
    from pdpfl.fl.aggregation.discrete_shares import ShareEncoding
    from pdpfl.fl.api import FederationInfo
    from pdpfl.fl.uldp.mechanism import UserLevelSetup
    from pdpfl.privacy.noise import DiscreteGaussianNoise

__all__ = [
    "calibrated_sigma",
    "discrete_plan",
    "encoding",
    "model_size",
    "private_weighting_noise",
    "private_weighting_plan",
    "private_weighting_summary",
    "share_params",
]


def model_size(config: ExperimentConfig, info: FederationInfo) -> int:
    """d: the model's coordinates (from the public initialisation)."""
    from pdpfl.fl.common import ModelSource, initial_params

    return int(
        sum(
            np.asarray(p).size
            for p in initial_params(
                ModelSource.of(config.model, seed=config.seed, device=config.training.device), info
            )
        )
    )


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


def _weighting_released(
    config: ExperimentConfig, sigma: float, survivors: int, size: int
) -> SampledDiscreteGaussianPlan:
    from pdpfl.fl.aggregation.private_weighting_core import discrete_sensitivity_sq

    n_sq = discrete_sensitivity_sq(
        float(config.training.max_grad_norm), float(config.secure.precision), int(size)
    )
    return SampledDiscreteGaussianPlan.for_multiplier(
        "user",
        float(sigma),
        int(survivors),
        n_sq,
        int(size),
        float(config.privacy.delta),
        int(config.training.rounds),
    )


def private_weighting_plan(
    config: ExperimentConfig, *, sigma: float, survivors: int, size: int, hidden_sampling: bool
) -> DiscreteUserLevelPlan:
    """The ledger's plan with private weights and discrete noise (module docstring): the
    released sum of t shares N_Z(0, σ²·N/t) on the grid P', N = (C/P' + 1.5√d)²; the server
    decrypts only that sum (its view is the released one), and does not know the users' coins
    under private sub-sampling (``hidden_sampling``)."""
    released = _weighting_released(config, sigma, survivors, size)
    return DiscreteUserLevelPlan(released, released, server_knows_sampling=not hidden_sampling)


def private_weighting_noise(
    config: ExperimentConfig, *, sigma: float, survivors: int, size: int
) -> tuple[DiscreteGaussianNoise, int]:
    """One silo's share of :func:`private_weighting_plan` (what the one noise adder draws) and
    the grid m of P' = 2^m·P: variance σ²·N/t exactly (≥ the plan's, which is rounded down),
    sized for t, multiplier σ (what the ledger charges)."""
    from pdpfl.fl.aggregation.private_weighting_core import discrete_sensitivity_sq, grid_bits
    from pdpfl.privacy.noise import DiscreteGaussianNoise

    clip, precision = float(config.training.max_grad_norm), float(config.secure.precision)
    n_sq = discrete_sensitivity_sq(clip, precision, int(size))
    variance = SampledDiscreteGaussianPlan.required_share_variance(sigma, survivors, n_sq)
    noise = DiscreteGaussianNoise(variance, float(sigma), int(survivors))
    return noise, grid_bits(clip, precision)


def private_weighting_summary(
    config: ExperimentConfig, *, sigma: float, survivors: int, size: int
) -> dict[str, Any]:
    """The ``summary.json`` description of the private weighting protocol's exact discrete noise
    (``aggregation.private_weighting_noise``): the grid P' = 2^m·P, the widened dither, the
    Paillier plaintext's bits and each silo's share (what :func:`private_weighting_noise`
    draws and :func:`private_weighting_plan` charges)."""
    from pdpfl.fl.aggregation.private_weighting_core import (
        GUARD_BITS,
        discrete_sensitivity_sq,
        divisor,
        grid_bits,
    )

    sec = config.secure
    clip, precision = float(config.training.max_grad_norm), float(sec.precision)
    noise, m = private_weighting_noise(config, sigma=sigma, survivors=survivors, size=size)
    div = divisor(int(sec.n_max), tuple(sec.allowed_totals) if sec.allowed_totals else None)
    n_sq = discrete_sensitivity_sq(clip, precision, int(size))
    assert m == grid_bits(clip, precision)
    return {
        "mechanism": "distributed discrete Gaussian on the grid P' = 2^m·P (exact integer "
        "sampler), dithered inside Paillier plaintexts",
        "precision": precision,
        "grid_log2": m,
        "grid": math.ldexp(precision, m),
        "clip": clip,
        "clip_on_grid": clip / math.ldexp(precision, m),
        "dimension": int(size),
        "divisor_bits": div.bit_length(),
        "dither": f"uniform on [-2^{m}·DIV/2, 2^{m}·DIV/2) per coordinate and silo",
        "paillier_bits": int(sec.paillier_bits),
        "value_bits": int(sec.paillier_bits) - 2 - GUARD_BITS - div.bit_length(),
        "l2_sensitivity_sq": n_sq,
        "accounted_sensitivity": math.sqrt(n_sq) * math.ldexp(precision, m),
        "sensitivity_inflation": math.sqrt(n_sq) / (clip / math.ldexp(precision, m)) - 1.0,
        "noise_multiplier": float(sigma),
        "survivors": int(survivors),
        "share_variance": float(noise.variance),
        "noise_std_at_survivors": math.sqrt(int(survivors) * float(noise.variance))
        * math.ldexp(precision, m),
    }


def calibrated_sigma(
    config: ExperimentConfig,
    *,
    epsilon: float,
    rate: float,
    silos: int,
    survivors: int,
    users: int,
    size: int,
    private_weighting: bool = False,
) -> float:
    """The smallest σ (to 10^-4 relative) whose third-party ε of T rounds at user rate
    ``rate`` is at most ``epsilon`` under the discrete plan (bisection; ε decreases in σ);
    ``private_weighting``: the plan of :func:`private_weighting_plan`."""
    delta, rounds = float(config.privacy.delta), int(config.training.rounds)

    def eps(sigma: float) -> float:
        if private_weighting:
            plan = _weighting_released(config, sigma, survivors, size)
        else:
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
