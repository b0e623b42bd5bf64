"""The rPDP-FL two-stage bound: record-level Poisson sampling inside client-level sampling.

rPDP-FL (record-level personalized DP for FL), Lemma 6 and Theorem 1. A client takes part in a
round with probability λ; inside a round it runs τ DP-SGD steps, each sampling record j with its
own rate q_j. Per round, for each record (Lemma 6):

    ρ^{τ,λ}(α) = 1/(α−1) · ln(1 − λ + λ·exp((α−1)·τ·ρ_SGM(α, q_j)))

and over T rounds (Theorem 1), against a **third-party** adversary (Type II: other clients, model
consumers, who do not see which clients were sampled): T·ρ^{τ,λ}(α).

An **honest-but-curious server** (Type I) sees which clients were sampled, so there is no λ
amplification: k·τ·ρ_SGM(α, q_j), with k the number of rounds the record's client actually took
part in (the paper's λT is only an expectation; before training use k = T).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.accountant import RdpAccountant, mechanism_epsilon
from pdpfl.privacy.adversary import Adversary, as_adversary
from pdpfl.privacy.orders import DEFAULT_ORDERS, check_orders
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.rdp import check_rates, two_stage_rdp

__all__ = ["round_rdp", "plan_rdp", "plan_epsilon", "check_participations"]


def round_rdp(
    step_rdp: np.ndarray, steps: int, client_rate: float, orders: ArrayLike
) -> np.ndarray:
    """RDP of one rPDP-FL round, ρ^{τ,λ}(α) (rPDP-FL Lemma 6).

    Computed in log space: ``log1p(λ·expm1(x))`` for small x = (α−1)·τ·ρ and
    ``logaddexp(log(1−λ), log λ + x)`` otherwise, so it neither overflows nor loses the
    tiny values of small rates. λ = 1 gives exactly τ·ρ.

    Parameters
    ----------
    step_rdp
        Per-step RDP ρ_SGM, shape ``(..., n_orders)``.
    steps
        τ ≥ 1 local steps per round.
    client_rate
        λ in (0, 1].
    orders
        The orders of the last axis of ``step_rdp``.
    """
    a = check_orders(orders)
    rho = np.asarray(step_rdp, dtype=np.float64)
    if rho.ndim == 0 or rho.shape[-1] != a.size:
        raise ValueError(f"step_rdp: last axis must have {a.size} orders, got shape {rho.shape}")
    tau = int(steps)
    if tau != steps or tau < 1:
        raise ValueError(f"steps: must be an integer >= 1, got {steps!r}")
    lam = float(client_rate)
    if not (0.0 < lam <= 1.0):
        raise ValueError(f"client_rate: must be in (0, 1], got {client_rate!r}")
    return two_stage_rdp(rho, tau, lam, a)


def check_participations(
    participations: ArrayLike | int | None, n_rates: int, rounds: int
) -> np.ndarray:
    """Participations k per rate (broadcast to ``(n_rates,)``), integers in [0, rounds]."""
    if participations is None:
        return np.full(n_rates, rounds, dtype=np.int64)
    k = np.asarray(participations, dtype=np.float64)
    if np.any(np.isnan(k)) or np.any(k != np.floor(k)):
        raise ValueError("participations: must be integers")
    if np.any(k < 0) or np.any(k > rounds):
        raise ValueError(f"participations: must be in [0, rounds={rounds}]")
    try:
        return np.broadcast_to(k.astype(np.int64), (n_rates,)).copy()
    except ValueError:
        raise ValueError(
            f"participations: expected a scalar or {n_rates} values, got shape {k.shape}"
        ) from None


def _charged_rounds(
    plan: TrainingPlan, adv: Adversary, participations: ArrayLike | int | None, n: int
) -> np.ndarray:
    """Charged rounds per rate: T (third-party), k (server), 1 (centralized: all ``steps``)."""
    if not isinstance(plan, TrainingPlan):
        raise ValueError(f"plan: expected a TrainingPlan, got {type(plan).__name__}")
    if plan.rounds is None:
        if participations is not None:
            raise ValueError("participations: only meaningful for federated plans (rounds set)")
        return np.ones(n, dtype=np.int64)
    k = check_participations(participations, n, plan.rounds)
    if adv is Adversary.SERVER:
        return k
    return np.full(n, plan.rounds, dtype=np.int64)


def _same_for_both(
    plan: TrainingPlan, participations: ArrayLike | int | None, accountant: str
) -> bool:
    """True where the server's ε is, bit for bit, the third parties' ε (no need to compute it).

    A centralized plan has one event for both. With λ = 1 and every round charged to the
    server (no ``participations``), the RDP accountant composes the third-party round
    ``TwoStageRound(1, Composed(step, τ))`` as ``T·(τ·ρ)`` (:func:`two_stage_rdp` returns
    ``τ·ρ`` for λ = 1) and the server's ``Composed(step, τ)`` as ``k·(τ·ρ)`` with k = T: the
    same float operations on the same per-step RDP, so the same ε and order.
    """
    if not isinstance(plan, TrainingPlan) or participations is not None:
        return False
    if plan.rounds is None:
        return True
    return accountant == "rdp" and float(plan.client_rate) == 1.0


def plan_rdp(
    rates: ArrayLike,
    plan: TrainingPlan,
    adversary: Adversary | str = "third-party",
    participations: ArrayLike | int | None = None,
    orders: ArrayLike = DEFAULT_ORDERS,
) -> np.ndarray:
    """Total RDP of a training plan per record rate, shape ``(n_rates, n_orders)``.

    The plan's round event (:meth:`TrainingPlan.round_event`) times the charged rounds:

    * ``rounds is None`` (centralized DP-SGD): ``steps · ρ_SGM`` for every adversary;
    * third-party: ``T · ρ^{τ,λ}`` (rPDP-FL Theorem 1);
    * server: ``k · τ · ρ_SGM``, ``k = participations`` (per rate, broadcastable; default T).

    ``adversary="both"`` is rejected: the max of two RDP curves gives a looser ε than the max of
    the two ε — use :func:`plan_epsilon`.
    """
    adv = as_adversary(adversary)
    if adv is Adversary.BOTH:
        raise ValueError("adversary: 'both' has no single RDP curve; use plan_epsilon")
    q = check_rates(rates)
    k = _charged_rounds(plan, adv, participations, q.size)
    rows = RdpAccountant(orders).rdp(plan.round_event(q, adv.value))
    result: np.ndarray = k[:, None] * rows
    return result


def plan_epsilon(
    rates: ArrayLike,
    plan: TrainingPlan,
    adversary: Adversary | str = "third-party",
    participations: ArrayLike | int | None = None,
    orders: ArrayLike | None = None,
    *,
    accountant: str = "rdp",
    refine: bool | None = None,
    **options: object,
) -> tuple[np.ndarray, np.ndarray]:
    """ε per record rate at the plan's δ, and the order that attains it (shapes ``(n_rates,)``).

    For ``adversary="both"`` the larger ε of the two adversaries (and its order). Computed by
    :func:`pdpfl.privacy.accountant.mechanism_epsilon` (the plan's round event charged T times,
    or k times for the server) — the same path as the ledger and the calibration.

    Orders: without ``orders`` the minimum runs over :data:`DEFAULT_ORDERS` with the continuous
    refinement of the optimal order; ``orders`` given are honoured exactly (the minimum over
    exactly those orders, so integer-order numbers of Opacus, dp-accounting or a paper's code
    are reproduced), unless ``refine=True`` asks for the refinement explicitly.

    ``accountant="pld"`` uses the privacy-loss-distribution accountant
    (:class:`pdpfl.privacy.pld.PldAccountant`; ``orders``/``refine`` then configure its RDP
    fallback, ``options`` its discretization); the order returned is then NaN where the PLD
    bound was the smaller one.
    """
    adv = as_adversary(adversary)
    if adv is Adversary.BOTH:
        e_tp, o_tp = plan_epsilon(
            rates,
            plan,
            Adversary.THIRD_PARTY,
            participations,
            orders,
            accountant=accountant,
            refine=refine,
            **options,
        )
        if _same_for_both(plan, participations, accountant):
            return e_tp, o_tp
        e_sv, o_sv = plan_epsilon(
            rates,
            plan,
            Adversary.SERVER,
            participations,
            orders,
            accountant=accountant,
            refine=refine,
            **options,
        )
        take_sv = e_sv >= e_tp
        return np.where(take_sv, e_sv, e_tp), np.where(take_sv, o_sv, o_tp)
    q = check_rates(rates)
    k = _charged_rounds(plan, adv, participations, q.size)
    a = check_orders(DEFAULT_ORDERS if orders is None else orders)
    refine = orders is None if refine is None else bool(refine)
    if accountant == "rdp":
        options = {"orders": a, "refine": refine, **options}
    elif accountant == "pld":
        options = {"rdp_orders": a, "rdp_refine": refine, **options}
    # (any other registered accountant is built with its own defaults and the given options)
    return mechanism_epsilon(plan, q, adv, k, accountant=accountant, **options)
