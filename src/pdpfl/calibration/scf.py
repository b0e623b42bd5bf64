"""Simulation-CurveFitting (SCF), rPDP-FL Algorithm 2, as published.

Stage I (lines 1-6): for every q in a candidate list Π compute the plan's optimal ε*(q) over the
candidate orders 𝔸 (Theorem 1 for FL, Lemma 4 when centralized; then Lemma 1).
Stage II (line 7): fit ε ≈ f(q) = exp(a·q + b) + c with :func:`scipy.optimize.curve_fit` and
report R². Estimator (line 8): F(ε) = f⁻¹(ε) = (ln(ε − c) − b) / a clipped to [0, 1] for
0 < ε < ε*(1), and 1 for ε ≥ ε*(1).

The fit is **not** checked against the exact bound: F can hand a record a rate whose exact ε is
above its budget. :func:`pdpfl.calibration.calibrate` measures and reports those records
(``over_budget``); prefer the ``certified`` method unless reproducing the paper.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit

from pdpfl.calibration._accounting import (
    as_adversary,
    exact_epsilon,
    plan_from_dict,
    plan_to_dict,
)
from pdpfl.calibration.estimator import EstimatorDetails
from pdpfl.privacy.registry import as_accountant_name
from pdpfl.privacy.plan import TrainingPlan

#: Default candidate list Π of sampling probabilities (Alg. 2 line 2).
DEFAULT_Q_CANDIDATES = np.round(np.arange(1, 101) / 100.0, 2)


def _model(q: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    return np.exp(a * q + b) + c


@dataclass(frozen=True)
class SCFEstimator:
    """The fitted sampling-probability estimator F of rPDP-FL Algorithm 2."""

    plan: TrainingPlan
    adversary: str
    a: float
    b: float
    c: float
    eps_at_one: float
    r2: float
    method: str = "scf"
    accountant: str = "rdp"

    @classmethod
    def fit(
        cls,
        plan: TrainingPlan,
        adversary: str = "third-party",
        *,
        q_candidates: np.ndarray | None = None,
        orders: np.ndarray | None = None,
        accountant: str = "rdp",
    ) -> SCFEstimator:
        """Run Stage I (simulation) and Stage II (curve fitting)."""
        adv = as_adversary(adversary).value
        acc = as_accountant_name(accountant)
        q = DEFAULT_Q_CANDIDATES if q_candidates is None else np.asarray(q_candidates, float)
        if q.ndim != 1 or q.size < 3 or np.any((q <= 0) | (q > 1)):
            raise ValueError("q_candidates: need at least 3 rates in (0, 1]")
        q = np.unique(q)
        eps = exact_epsilon(q, plan, adv, orders, acc)  # ε*(δ, q) = min over 𝔸 (lines 3-6)
        # Line 7: least-squares fit of exp(a q + b) + c. Start from a log-linear fit of ε − c0.
        c0 = float(eps.min()) - 1e-3 * max(float(np.ptp(eps)), 1e-12)
        a0, b0 = np.polyfit(q, np.log(np.maximum(eps - c0, 1e-300)), 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OptimizeWarning)
            try:
                (a, b, c), _ = curve_fit(_model, q, eps, p0=(a0, b0, c0), maxfev=20_000)
            except RuntimeError:  # no convergence: keep the log-linear start, as a fit
                a, b, c = a0, b0, c0
        resid = eps - _model(q, a, b, c)
        ss_tot = float(np.sum((eps - eps.mean()) ** 2))
        r2 = 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else 1.0
        eps_one = float(exact_epsilon(np.array([1.0]), plan, adv, orders, acc)[0])
        return cls(plan, adv, float(a), float(b), float(c), eps_one, r2, accountant=acc)

    def rates(self, budgets: np.ndarray) -> np.ndarray:
        """F(ε): inverse of the fit, clipped to [0, 1]; ε ≥ ε*(1) → 1 (Alg. 2 line 8)."""
        e = np.asarray(budgets, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = (np.log(e - self.c) - self.b) / self.a
        q = np.where(np.isfinite(q), q, 0.0)
        q = np.clip(q, 0.0, 1.0)
        return np.where(e >= self.eps_at_one, 1.0, q)

    def rates_and_spent(self, budgets: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Rates (:meth:`rates`); the spent ε is not known without the accountant (None)."""
        return self.rates(budgets), None

    def report_details(self) -> EstimatorDetails:
        """ε at q = 1 and the fit (a, b, c, R²); F clips to [0, 1], so q = 0 is no error."""
        return EstimatorDetails(
            None,
            self.eps_at_one,
            {"a": self.a, "b": self.b, "c": self.c, "r2": self.r2},
            zero_means_infeasible=False,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "adversary": self.adversary,
            "accountant": self.accountant,
            "plan": plan_to_dict(self.plan),
            "a": self.a,
            "b": self.b,
            "c": self.c,
            "eps_at_one": self.eps_at_one,
            "r2": self.r2,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SCFEstimator:
        vals = [float(d[k]) for k in ("a", "b", "c", "eps_at_one", "r2")]
        if not all(math.isfinite(v) for v in vals):
            raise ValueError("scf estimator: a, b, c, eps_at_one, r2 must be finite")
        return cls(
            plan_from_dict(d["plan"]),
            as_adversary(d["adversary"]).value,
            *vals,
            accountant=as_accountant_name(d.get("accountant", "rdp")),
        )
