"""Certified budget → sampling-rate estimator: no record can exceed its budget.

Construction (once per plan, vectorized):

1. A fixed monotone grid of rates ``q_0 < q_1 < … < q_K = 1`` whose spacing is
   ``min(rel_step · q, abs_step)``: geometric from ``q_min`` up to ``q* = abs_step / rel_step``,
   linear above. Consecutive points satisfy ``q_{k+1} − q_k ≤ min(rel_step · q_k, abs_step)``.
2. The exact ε of the plan at every grid rate (:func:`pdpfl.privacy.two_stage.plan_epsilon`,
   third-party / server / both; RDP with the optimal order, or PLD with ``accountant="pld"``),
   made monotone by a running maximum and inflated by a relative
   safety margin of ``1e-10`` against last-bit differences between evaluations (except at
   q = 1, the closed-form Gaussian mechanism, so that budgets ≥ ε(1) get exactly q = 1).
3. For a budget ε_i the rate is the largest grid ``q_k`` whose certified ε is ≤ ε_i
   (``np.searchsorted``). Budgets ≥ ε(q=1) get ``q = 1``; budgets below the certified ε of the
   smallest positive grid rate get ``q = 0`` (the record is never sampled, spends nothing).

Guarantee (by construction): ``plan_epsilon(q_i) ≤ ε_i`` for every record. Resolution: if the
exact ε(q) is non-decreasing in q, the largest feasible rate q*_i satisfies
``q_i ≤ q*_i < q_{k+1} ≤ q_i + min(rel_step · q_i, abs_step)``. With the defaults
(``q_min = 1e-6``, ``rel_step = 0.01``, ``abs_step = 0.001``: 2,059 grid points) a record gets at
least 99 % of its largest feasible rate, or is within 0.001 of it.

The estimator is the grid itself (pairs (q, certified ε) plus plan and adversary): the server
publishes it (:meth:`CertifiedEstimator.to_dict`, exact JSON floats) and every silo maps its own
records' budgets to rates locally, as in rPDP-FL §6.2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdpfl.calibration._accounting import (
    SAFETY_MARGIN,
    as_adversary,
    exact_epsilon,
    plan_from_dict,
    plan_to_dict,
)
from pdpfl.calibration.estimator import EstimatorDetails
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.registry import as_accountant_name

_CACHE_SIZE = 16
_CACHE: dict[tuple[Any, ...], CertifiedEstimator] = {}


def rate_grid(q_min: float = 1e-6, rel_step: float = 0.01, abs_step: float = 1e-3) -> np.ndarray:
    """Strictly increasing rates from ``q_min`` to exactly 1.0, spacing ≤ min(rel·q, abs)."""
    if not (0 < q_min < 1):
        raise ValueError(f"q_min: must be in (0, 1), got {q_min!r}")
    if not (0 < rel_step < 1) or not (0 < abs_step < 1):
        raise ValueError(f"rel_step/abs_step: must be in (0, 1), got {rel_step!r}, {abs_step!r}")
    q_star = min(abs_step / rel_step, 1.0)
    parts = []
    if q_min < q_star:
        n_geo = math.ceil(math.log(q_star / q_min) / math.log1p(rel_step)) + 1
        parts.append(np.geomspace(q_min, q_star, n_geo))
    start = max(q_star, q_min)
    n_lin = max(2, math.ceil((1.0 - start) / abs_step) + 1)
    parts.append(np.linspace(start, 1.0, n_lin))
    grid = np.unique(np.concatenate(parts))
    grid[-1] = 1.0
    return grid


@dataclass(frozen=True)
class CertifiedEstimator:
    """Largest-grid-rate-within-budget estimator (see module docstring for the guarantee).

    Attributes
    ----------
    plan, adversary : what the ε values refer to.
    q_grid : increasing rates, ``q_grid[-1] == 1``.
    eps_exact : exact ε at each grid rate (for reports).
    eps_certified : running max of ``eps_exact`` × (1 + 1e-10); what :meth:`rates` compares to.
    """

    plan: TrainingPlan
    adversary: str
    q_grid: np.ndarray = field(repr=False)
    eps_exact: np.ndarray = field(repr=False)
    eps_certified: np.ndarray = field(repr=False)
    method: str = "certified"
    accountant: str = "rdp"

    @classmethod
    def fit(
        cls,
        plan: TrainingPlan,
        adversary: str = "third-party",
        *,
        q_min: float = 1e-6,
        rel_step: float = 0.01,
        abs_step: float = 1e-3,
        orders: np.ndarray | None = None,
        accountant: str = "rdp",
    ) -> CertifiedEstimator:
        """Evaluate the exact accountant once on the grid and build the estimator.

        Fits are memoized per (plan, adversary, grid, orders, accountant): the grid is
        data-independent, so every silo (or repeated calibration) with the same public plan
        reuses it. ``accountant="pld"`` certifies with the PLD accountant (its rate grid and
        discretization: :mod:`pdpfl.privacy.pld`); its one-time cost is the grid computation.
        """
        adv = as_adversary(adversary).value
        acc = as_accountant_name(accountant)
        orders_arr = None if orders is None else np.asarray(orders, dtype=np.float64)
        orders_key = None if orders_arr is None else orders_arr.tobytes()
        key = (plan, adv, float(q_min), float(rel_step), float(abs_step), orders_key, acc)
        cached = _CACHE.get(key)
        if cached is not None:
            return cached
        q = rate_grid(q_min, rel_step, abs_step)
        eps = exact_epsilon(q, plan, adv, orders_arr, acc)
        if not np.all(np.isfinite(eps)):
            raise ValueError("accountant returned non-finite ε on the rate grid")
        cummax = np.maximum.accumulate(eps)
        cert = cummax * (1.0 + SAFETY_MARGIN)
        # q = 1 is the plain Gaussian mechanism (closed form): no margin, so ε ≥ ε(1) → q = 1.
        cert[-1] = max(cummax[-1], cert[-2])
        for arr in (q, eps, cert):
            arr.setflags(write=False)
        est = cls(plan, adv, q, eps, cert, accountant=acc)
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = est
        return est

    @property
    def min_epsilon(self) -> float:
        """Smallest budget that gets a positive rate (smaller budgets get q = 0)."""
        return float(self.eps_certified[0])

    @property
    def max_epsilon(self) -> float:
        """ε spent at q = 1; budgets at or above it get q = 1."""
        return float(self.eps_certified[-1])

    def resolution(self, rates: np.ndarray) -> np.ndarray:
        """Gap to the next grid rate: the largest feasible q is below ``rate + resolution``."""
        q = np.asarray(rates, dtype=np.float64)
        idx = np.searchsorted(self.q_grid, q, side="right")
        nxt = np.where(
            idx < self.q_grid.size, self.q_grid[np.minimum(idx, self.q_grid.size - 1)], 1.0
        )
        return np.where(q >= 1.0, 0.0, nxt - q)

    def grid_index(self, budgets: np.ndarray) -> np.ndarray:
        """Index of the chosen grid rate per budget; ``-1`` when no positive rate is feasible."""
        b = np.asarray(budgets, dtype=np.float64)
        return np.searchsorted(self.eps_certified, b, side="right") - 1

    def rates(self, budgets: np.ndarray) -> np.ndarray:
        """Certified rate per budget (0 for budgets below :attr:`min_epsilon`)."""
        return self.rates_and_spent(budgets)[0]

    def rates_and_spent(self, budgets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Certified rates and the exact ε each one spends (0 for q = 0), in one lookup."""
        idx = self.grid_index(budgets)
        safe = np.maximum(idx, 0)
        chosen = idx >= 0
        return np.where(chosen, self.q_grid[safe], 0.0), np.where(chosen, self.eps_exact[safe], 0.0)

    def report_details(self) -> EstimatorDetails:
        """The plan's range on the grid and the grid size."""
        return EstimatorDetails(
            self.min_epsilon, self.max_epsilon, {"grid_points": int(self.q_grid.size)}
        )

    def verify(self, orders: np.ndarray | None = None) -> bool:
        """Re-evaluate the exact ε on the grid: True if every certified value bounds it.

        A silo that does not trust the published estimator can call this once (it costs one
        grid evaluation) before applying it to its records.
        """
        exact = exact_epsilon(self.q_grid, self.plan, self.adversary, orders, self.accountant)
        return bool(np.all(self.eps_certified >= np.maximum.accumulate(exact)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "adversary": self.adversary,
            "accountant": self.accountant,
            "plan": plan_to_dict(self.plan),
            "q_grid": self.q_grid.tolist(),
            "eps_exact": self.eps_exact.tolist(),
            "eps_certified": self.eps_certified.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CertifiedEstimator:
        q = np.asarray(d["q_grid"], dtype=np.float64)
        exact = np.asarray(d["eps_exact"], dtype=np.float64)
        cert = np.asarray(d["eps_certified"], dtype=np.float64)
        if not (q.ndim == 1 and q.shape == exact.shape == cert.shape and q.size >= 2):
            raise ValueError("certified estimator: q_grid/eps arrays must be 1-D of equal length")
        if not (np.all(np.diff(q) > 0) and np.all(np.diff(cert) >= 0) and q[-1] == 1.0):
            raise ValueError("certified estimator: grid must be increasing and end at q = 1")
        if not np.all(cert >= exact):
            raise ValueError("certified estimator: certified ε must not be below exact ε")
        return cls(
            plan_from_dict(d["plan"]),
            as_adversary(d["adversary"]).value,
            q,
            exact,
            cert,
            accountant=as_accountant_name(d.get("accountant", "rdp")),
        )
