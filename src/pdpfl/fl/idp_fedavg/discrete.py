"""IDP-FedAvg ``variant: distributed`` with discrete noise shares (``privacy.noise_shares:
discrete``, the default).

A client's continuous release is its update clipped to C_t·f_g (f_g = C_g/C, SCALE's group
factor) + N(0, σ_v²C_t²/t), and with adaptive clipping the count (1[‖Δ‖ ≤ C_t·f_g] − ½) +
N(0, σ_b²/t): two Gaussian queries charged as one (:class:`~pdpfl.privacy.noise.JointGaussian`).
The discrete release encodes both as **one integer vector** in units where C_t = 1, which keeps
γ·C_t fixed across rounds (the encoding's N and the plan never change with C_t):

    u = [ Clip(Δ, C_t·f_g)/C_t ,  λ·(b − ½) ],   λ = σ_v/σ_b,

so that one discrete Gaussian share of std σ_v (normalised) per coordinate is σ_v·C_t on the
update and σ_b on the count (÷λ). The vector's L2 norm is at most c_g = √(f_g² + λ²/4), and the
multiplier σ_v/c_g = (σ_{v,g}⁻² + (2σ_b)⁻²)^{-1/2} is exactly the continuous joint one. The
encoding (:class:`~pdpfl.fl.aggregation.discrete_shares.ShareEncoding`) is built for the largest
c = max_g c_g; a client of group g rounds at its own bound N_g =
:meth:`~pdpfl.dp.discrete_params.DiscreteShareParams.part_bound_sq` (c_g/c), and its ledger
charges the distributed discrete Gaussian with the shares actually added and sensitivity N_g
(:func:`group_plan`; :meth:`SampledDiscreteGaussianPlan.with_noise` rounds N up). The server
decodes (×C_t for the update, ÷λ for the count: ``metric_factors``).

Everything is derived from the published :class:`~pdpfl.fl.idp_fedavg.mechanism.IdpSetup`
(``noise_shares``, ``share_bits``, ``share_rotation``, ``share_max_wrap``, ``model_size``).
"""

from __future__ import annotations

import math
from typing import Any

from pdpfl.dp.discrete_params import discrete_share_params
from pdpfl.fl.aggregation.discrete_shares import ShareEncoding
from pdpfl.privacy.discrete_plan import SampledDiscreteGaussianPlan

#: An :class:`~pdpfl.fl.idp_fedavg.mechanism.IdpSetup` (not imported: the mechanism module
#: builds its ledgers' plans from this one).
IdpSetup = Any

__all__ = ["count_factor", "encoding", "group_bound_sq", "group_norm", "group_plan"]


def count_factor(setup: IdpSetup) -> float | None:
    """λ = σ_v/σ_b (None: fixed clipping, no count coordinate)."""
    if not setup.adaptive or setup.count_noise_std is None:
        return None
    sigma_v = float(setup.value_noise_multiplier or 0.0)
    return sigma_v / float(setup.count_noise_std)


def group_norm(setup: IdpSetup, group: int) -> float:
    """c_g = √(f_g² + λ²/4): the normalised L2 bound of group g's vector."""
    f = float(setup.clip_factors[group])
    lam = count_factor(setup)
    return math.sqrt(f * f + (0.0 if lam is None else lam * lam / 4.0))


def encoding(setup: IdpSetup) -> ShareEncoding | None:
    """The clients' discrete share encoding (None: continuous shares or no DP)."""
    if setup.noise_shares != "discrete" or setup.value_noise_multiplier is None:
        return None
    lam = count_factor(setup)
    clip = max(group_norm(setup, g) for g in range(len(setup.budgets)))
    size = int(setup.model_size)
    params = discrete_share_params(
        clip=clip,
        noise_multiplier=float(setup.value_noise_multiplier) / clip,
        silos=int(setup.asked_per_round),
        survivors=int(setup.survivors),
        dimension=size + (0 if lam is None else 1),
        bits=int(setup.share_bits),
        rotation=bool(setup.share_rotation),
        contributors=int(setup.asked_per_round),
        max_wrap=float(setup.share_max_wrap),
        max_inflation=float(setup.share_max_inflation),
    )
    if lam is None:
        return ShareEncoding(params, size)
    return ShareEncoding(params, size, ("clip_count",), (lam,))


def group_bound_sq(enc: ShareEncoding, setup: IdpSetup, group: int) -> int:
    """N_g: the integer bound a client of group g rounds at (N for the largest group)."""
    params = enc.params
    w = min(1.0, group_norm(setup, group) / params.clip)
    return params.part_bound_sq(w)


def group_plan(setup: IdpSetup, group: int) -> SampledDiscreteGaussianPlan:
    """What group g's clients are charged per round: the shares added (σ_s², t) over N_g."""
    enc = encoding(setup)
    if enc is None:
        raise ValueError("privacy.noise_shares: this setup has no discrete shares")
    plan = enc.params.plan("client", setup.delta, setup.rounds, tuple(setup.observers))
    n_g = group_bound_sq(enc, setup, group)
    if n_g >= plan.l2_sensitivity_sq:
        return plan
    return plan.with_noise(math.sqrt(plan.shares * plan.share_variance / n_g))


def refit_rates(setup: IdpSetup) -> IdpSetup:
    """SAMPLE's sampling rates re-fitted to the discrete plan: SAMPLE calibrates q_g against
    the continuous Gaussian, whose ε the distributed discrete bound exceeds by up to a few per
    cent under sub-sampling (``docs/discrete_noise.md``), so a client would be stopped by its
    pre-check before the last rounds. Each accounted group's rate is lowered to the largest q
    (bisection, 40 steps) whose planned ε of T rounds under the group's discrete plan is at most
    its assigned ε, against every observer; the public denominator follows the rates."""
    import dataclasses

    import numpy as np

    from pdpfl.privacy import mechanism_epsilon

    if encoding(setup) is None:
        return setup
    rates = [float(r) for r in setup.rates]
    for g, assigned in enumerate(setup.assigned):
        if assigned is None or not setup.accounted(g) or rates[g] <= 0.0:
            continue
        plan = group_plan(setup, g)
        target = float(assigned) * (1.0 - 1e-9)

        def eps(q: float, plan: SampledDiscreteGaussianPlan = plan) -> float:
            return max(
                float(
                    mechanism_epsilon(
                        plan, np.array([q]), obs, plan.rounds, accountant=setup.accountant
                    )[0][0]
                )
                for obs in plan.observers
            )

        if eps(rates[g]) <= target:
            continue
        lo, hi = 0.0, rates[g]
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            if eps(mid) <= target:
                lo = mid
            else:
                hi = mid
        rates[g] = lo
    sizes = np.asarray(setup.sizes, dtype=np.float64)
    weights = sizes / sizes.sum() * setup.num_clients
    return dataclasses.replace(
        setup, rates=tuple(rates), denominator=float(np.dot(weights, np.asarray(rates)))
    )
