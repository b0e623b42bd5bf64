"""BinarySearch: Boenisch et al. (NeurIPS'23) "Sample", getSampleRate (their Alg. 4).

For every *distinct* budget ε_p, bisect on q ∈ [0, 1] with the exact accountant until the
feasible end ``lo`` is within ``eps_tol`` of the target (ε(lo) ≥ ε_p − eps_tol) or the bracket is
narrower than ``q_tol``. We always return the feasible end (ε(lo) ≤ ε_p, q = 0 if nothing
positive is feasible), so unlike a midpoint return it never overspends. The distinct budgets
are bisected together (one vectorized accountant call per bisection step) -- the same
per-budget search, batched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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


def bisect_rates(
    targets: np.ndarray,
    epsilon_of_rates: Callable[[np.ndarray], np.ndarray],
    *,
    q_tol: float = 1e-6,
    eps_tol: float = 0.0,
    max_iter: int = 60,
) -> np.ndarray:
    """Largest feasible rate per target by bisection; ``epsilon_of_rates`` is vectorized."""
    t = np.asarray(targets, dtype=np.float64)
    lo = np.zeros_like(t)
    hi = np.ones_like(t)
    eps_lo = np.zeros_like(t)
    at_one = epsilon_of_rates(hi) <= t
    lo[at_one] = 1.0
    active = ~at_one
    for _ in range(max_iter):
        active &= (hi - lo > q_tol) & (eps_lo < t - eps_tol)
        if not active.any():
            break
        idx = np.flatnonzero(active)
        mid = 0.5 * (lo[idx] + hi[idx])
        e = epsilon_of_rates(mid)
        ok = e * (1.0 + SAFETY_MARGIN) <= t[idx]  # robust to last-bit re-evaluation noise
        lo[idx[ok]] = mid[ok]
        eps_lo[idx[ok]] = e[ok]
        hi[idx[~ok]] = mid[~ok]
    return lo


@dataclass(frozen=True)
class BinarySearchEstimator:
    """Per-distinct-budget bisection with the exact accountant (evaluated at apply time)."""

    plan: TrainingPlan
    adversary: str
    q_tol: float = 1e-6
    eps_tol: float = 0.0
    method: str = "binary-search"
    accountant: str = "rdp"

    @classmethod
    def fit(
        cls,
        plan: TrainingPlan,
        adversary: str = "third-party",
        *,
        q_tol: float = 1e-6,
        eps_tol: float = 0.0,
        accountant: str = "rdp",
    ) -> BinarySearchEstimator:
        if not (0 < q_tol < 1) or not (eps_tol >= 0):
            raise ValueError(f"q_tol must be in (0, 1) and eps_tol >= 0, got {q_tol}, {eps_tol}")
        return cls(
            plan,
            as_adversary(adversary).value,
            float(q_tol),
            float(eps_tol),
            accountant=as_accountant_name(accountant),
        )

    def rates(self, budgets: np.ndarray, orders: np.ndarray | None = None) -> np.ndarray:
        b = np.asarray(budgets, dtype=np.float64)
        distinct, inverse = np.unique(b, return_inverse=True)

        def eps_of(q: np.ndarray) -> np.ndarray:
            return exact_epsilon(q, self.plan, self.adversary, orders, self.accountant)

        q = bisect_rates(distinct, eps_of, q_tol=self.q_tol, eps_tol=self.eps_tol)
        return q[inverse].reshape(b.shape)

    def rates_and_spent(self, budgets: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Rates (:meth:`rates`); the spent ε is evaluated by the caller (None)."""
        return self.rates(budgets), None

    def report_details(self) -> EstimatorDetails:
        """ε at the search's resolution q_tol (the smallest positive rate it returns)."""
        min_eps = float(
            exact_epsilon(
                np.array([self.q_tol]), self.plan, self.adversary, accountant=self.accountant
            )[0]
        )
        return EstimatorDetails(min_eps, None, {"q_tol": self.q_tol, "eps_tol": self.eps_tol})

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "adversary": self.adversary,
            "accountant": self.accountant,
            "plan": plan_to_dict(self.plan),
            "q_tol": self.q_tol,
            "eps_tol": self.eps_tol,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BinarySearchEstimator:
        return cls.fit(
            plan_from_dict(d["plan"]),
            d["adversary"],
            q_tol=d["q_tol"],
            eps_tol=d["eps_tol"],
            accountant=d.get("accountant", "rdp"),
        )
