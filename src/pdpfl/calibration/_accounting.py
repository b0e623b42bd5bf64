"""Thin, chunked wrappers around the exact accountant (:mod:`pdpfl.privacy`).

Nothing here does privacy math: it only calls :func:`pdpfl.privacy.two_stage.plan_epsilon`
(which calls :func:`pdpfl.privacy.accountant.mechanism_epsilon`, the ledger's path too), in chunks
so that evaluating 10⁶ distinct rates never allocates a rates × orders matrix. ``accountant``
selects ``rdp`` (default) or ``pld``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.adversary import (
    Adversary,
)
from pdpfl.privacy.adversary import (
    as_adversary as as_adversary,  # re-exported for the calibrators
)
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.registry import as_accountant_name
from pdpfl.privacy.two_stage import plan_epsilon

#: Relative inflation applied to ε before comparing it with a budget, so that a rate accepted
#: here stays within budget even if ε is re-evaluated in another batch (last-bit differences).
SAFETY_MARGIN = 1e-10

#: Rates evaluated per accountant call (bounds memory at CHUNK × n_orders floats).
CHUNK = 65_536


def exact_epsilon(
    rates: np.ndarray,
    plan: TrainingPlan,
    adversary: str | Adversary = "third-party",
    orders: ArrayLike | None = None,
    accountant: str = "rdp",
) -> np.ndarray:
    """ε of the whole plan (before training, k = T participations) for each sampling rate.

    Without ``orders``: the default grid with the continuous refinement of the optimal order;
    ``orders`` given are honoured exactly (the minimum over exactly those orders).
    """
    q = np.asarray(rates, dtype=np.float64).ravel()
    adv = as_adversary(adversary)
    acc = as_accountant_name(accountant)
    out = np.empty(q.size, dtype=np.float64)
    for start in range(0, q.size, CHUNK):
        stop = min(start + CHUNK, q.size)
        eps, _ = plan_epsilon(q[start:stop], plan, adv, orders=orders, accountant=acc)
        out[start:stop] = np.asarray(eps, dtype=np.float64).reshape(-1)
    return out


def plan_to_dict(plan: TrainingPlan) -> dict[str, Any]:
    """JSON-friendly dict of a :class:`TrainingPlan` (plain Python numbers)."""
    d = dataclasses.asdict(plan)
    if d.get("noise") == "continuous":
        del d["noise"]  # the default: estimators written before the field read the same
    if d.get("discrete_step", 0) is None:
        del d["discrete_step"]
    return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in d.items()}


def plan_from_dict(d: dict[str, Any]) -> TrainingPlan:
    return TrainingPlan(**d)


def as_training_plan(plan: object, adversary: str) -> TrainingPlan:
    """A :class:`TrainingPlan` for the calibrators: itself, or a client/user-level
    :class:`~pdpfl.privacy.unit.SampledGaussianPlan` as its equivalent plan (T rounds of one
    Poisson-sampled Gaussian step, λ = 1), after checking that it is accounted against
    ``adversary``."""
    from pdpfl.privacy.unit import SampledGaussianPlan

    if isinstance(plan, TrainingPlan):
        return plan
    if isinstance(plan, SampledGaussianPlan):
        adv = as_adversary(adversary).value
        wanted = ("third-party", "server") if adv == "both" else (adv,)
        missing = [o for o in wanted if o not in plan.observers]
        if missing:
            raise ValueError(
                f"adversary: this {plan.unit.value}-level mechanism is accounted against "
                f"{', '.join(plan.observers)}, not {', '.join(missing)}"
            )
        return plan.as_training_plan()
    raise ValueError(
        f"plan: expected a TrainingPlan or a SampledGaussianPlan, got {type(plan).__name__}"
    )
