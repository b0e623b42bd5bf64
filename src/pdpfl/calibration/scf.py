"""Simulation-CurveFitting (SCF), rPDP-FL Algorithm 2, in two variants.

Stage I (lines 1-6): for every q in a candidate list Π compute the plan's optimal ε*(q) over the
candidate orders 𝔸 (Theorem 1 for FL, Lemma 4 when centralized; then Lemma 1).
Stage II (line 7): fit ε ≈ f(q) = exp(a·q + b) + c with :func:`scipy.optimize.curve_fit` and
report R². Estimator (line 8): F(ε) = f⁻¹(ε) = (ln(ε − c) − b) / a clipped to [0, 1] for
0 < ε < ε*(1), and 1 for ε ≥ ε*(1).

* ``scf`` (:class:`SCFEstimator`, pdpfl's variant): Π = {0.01, …, 1}, ε*(q) with pdpfl's
  default orders and the continuous refinement of the optimal order, the fit started from a
  log-linear fit of ε − c₀.
* ``scf-paper`` (:class:`PaperSCFEstimator`, as the reference implementation Emory-AIMS/rPDP-FL
  ran it: ``myopacus/accountants/rpdp_utils.py`` ``PrivCostEstimator``): the integer orders
  ``int(1.07^i + 1)``, i = 0…102 (2…994, the reference accountant's ``generate_rdp_orders``)
  honoured exactly; Π = {0.01, …, 0.99} ∪ {0.001, …, 0.099} ∪ {1} stored as float32; the
  simulated ε stored as float32; ``curve_fit`` from its default start (1, 1, 1) with
  ``maxfev=5000``; F(ε) = 0 for ε at or below ε*(1e-5) and 1 at or above ε*(1).

The fit is **not** checked against the exact bound: F can hand a record a rate whose exact ε is
above its budget. :func:`pdpfl.calibration.calibrate` measures and reports those records
(``over_budget``); prefer the ``certified`` method unless reproducing the paper.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from pdpfl.calibration._accounting import (
    as_adversary,
    exact_epsilon,
    plan_from_dict,
    plan_to_dict,
)
from pdpfl.calibration.estimator import EstimatorDetails
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.registry import as_accountant_name

__all__ = ["PAPER_ORDERS", "PAPER_Q_CANDIDATES", "PaperSCFEstimator", "SCFEstimator"]

#: Default candidate list Π of sampling probabilities (Alg. 2 line 2).
DEFAULT_Q_CANDIDATES = np.round(np.arange(1, 101) / 100.0, 2)

#: The reference accountant's orders: unique int(1.07^i + 1), i = 0…⌊log_1.07 1000⌋ (2…994).
PAPER_ORDERS: np.ndarray = np.unique(
    [int(1.07**i + 1) for i in range(math.floor(math.log(1000, 1.07)) + 1)]
).astype(np.float64)
PAPER_ORDERS.setflags(write=False)

#: The reference's simulation grid (float32, as it stores it), rates ≤ 1e-5 removed.
_paper_q = np.unique(
    np.concatenate([np.arange(0, 1.0, 0.01), np.arange(0, 0.1, 0.001), [1.0]])
).astype(np.float32)
PAPER_Q_CANDIDATES: np.ndarray = _paper_q[_paper_q > 1e-5]
PAPER_Q_CANDIDATES.setflags(write=False)
#: The reference's lower end: budgets at or below ε*(q = 1e-5) get q = 0.
PAPER_MIN_RATE = 1e-5


def _model(q: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    return np.exp(a * q + b) + c


@dataclass(frozen=True)
class SCFEstimator:
    """The fitted sampling-probability estimator F of rPDP-FL Algorithm 2 (pdpfl's variant)."""

    plan: TrainingPlan
    adversary: str
    a: float
    b: float
    c: float
    eps_at_one: float
    r2: float
    method: str = "scf"
    accountant: str = "rdp"
    #: ε*(1e-5): budgets at or below get q = 0 (``scf-paper`` only; None: no lower cut).
    eps_at_min: float | None = None

    _FIELDS: ClassVar[tuple[str, ...]] = ("a", "b", "c", "eps_at_one", "r2")

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
        """Run Stage I (simulation) and Stage II (curve fitting), pdpfl's variant.

        ``orders=None``: pdpfl's default orders with the refinement of the optimal order;
        orders given are honoured exactly.
        """
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
        # scipy.optimize (~0.2 s to import) only when an SCF fit is run
        from scipy.optimize import OptimizeWarning, curve_fit

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OptimizeWarning)
            try:
                (a, b, c), _ = curve_fit(_model, q, eps, p0=(a0, b0, c0), maxfev=20_000)
            except RuntimeError:  # no convergence: keep the log-linear start, as a fit
                a, b, c = a0, b0, c0
        eps_one = float(exact_epsilon(np.array([1.0]), plan, adv, orders, acc)[0])
        return cls(
            plan,
            adv,
            float(a),
            float(b),
            float(c),
            eps_one,
            _r2(q, eps, a, b, c),
            accountant=acc,
        )

    def rates(self, budgets: np.ndarray) -> np.ndarray:
        """F(ε): inverse of the fit, clipped to [0, 1]; ε ≥ ε*(1) → 1 (Alg. 2 line 8); with
        :attr:`eps_at_min` (``scf-paper``), ε ≤ ε*(1e-5) → 0."""
        e = np.asarray(budgets, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = (np.log(e - self.c) - self.b) / self.a
        q = np.where(np.isfinite(q), q, 0.0)
        q = np.clip(q, 0.0, 1.0)
        if self.eps_at_min is not None:
            q = np.where(e <= self.eps_at_min, 0.0, q)
        return np.asarray(np.where(e >= self.eps_at_one, 1.0, q), dtype=np.float64)

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
        out: dict[str, Any] = {
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
        if self.eps_at_min is not None:
            out["eps_at_min"] = self.eps_at_min
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SCFEstimator:
        a, b, c, eps_one, r2 = (float(d[k]) for k in cls._FIELDS)
        low = d.get("eps_at_min")
        values = [a, b, c, eps_one, r2] + ([] if low is None else [float(low)])
        if not all(math.isfinite(v) for v in values):
            raise ValueError("scf estimator: a, b, c, eps_at_one, eps_at_min, r2 must be finite")
        return cls(
            plan_from_dict(d["plan"]),
            as_adversary(d["adversary"]).value,
            a,
            b,
            c,
            eps_one,
            r2,
            accountant=as_accountant_name(d.get("accountant", "rdp")),
            eps_at_min=None if low is None else float(low),
        )


def _r2(q: np.ndarray, eps: np.ndarray, a: float, b: float, c: float) -> float:
    resid = eps - _model(q, a, b, c)
    ss_tot = float(np.sum((eps - eps.mean()) ** 2))
    return 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else 1.0


@dataclass(frozen=True)
class PaperSCFEstimator(SCFEstimator):
    """rPDP-FL Algorithm 2 exactly as the reference implementation ran it (module docstring).

    Its fit can start far from the optimum (p0 = (1, 1, 1)); if ``curve_fit`` does not
    converge within ``maxfev=5000`` -- where the reference would stop with an error -- the fit
    raises a ValueError naming ``scf-paper``.
    """

    method: str = "scf-paper"

    @classmethod
    def fit(
        cls,
        plan: TrainingPlan,
        adversary: str = "third-party",
        *,
        q_candidates: np.ndarray | None = None,
        orders: np.ndarray | None = None,
        accountant: str = "rdp",
    ) -> PaperSCFEstimator:
        """Stage I on the reference's grid and orders, Stage II from its default start."""
        adv = as_adversary(adversary).value
        acc = as_accountant_name(accountant)
        q32 = (
            PAPER_Q_CANDIDATES
            if q_candidates is None
            else np.unique(np.asarray(q_candidates, dtype=np.float32))
        )
        if q32.ndim != 1 or q32.size < 3 or np.any((q32 <= 0) | (q32 > 1)):
            raise ValueError("q_candidates: need at least 3 rates in (0, 1]")
        a_orders = PAPER_ORDERS if orders is None else orders
        q = q32.astype(np.float64)  # the float32 rates, exactly as the reference evaluates them
        eps32 = exact_epsilon(q, plan, adv, a_orders, acc).astype(np.float32)
        # scipy.optimize (~0.2 s to import) only when an SCF fit is run
        from scipy.optimize import OptimizeWarning, curve_fit

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OptimizeWarning)
            warnings.simplefilter("ignore", RuntimeWarning)  # exp overflow while searching
            try:
                (a, b, c), _ = curve_fit(_model, q32, eps32, maxfev=5000)
            except RuntimeError as exc:
                raise ValueError(f"scf-paper: the reference's curve fit failed ({exc})") from None
        ends = exact_epsilon(np.array([PAPER_MIN_RATE, 1.0]), plan, adv, a_orders, acc)
        eps = eps32.astype(np.float64)
        return cls(
            plan,
            adv,
            float(a),
            float(b),
            float(c),
            float(ends[1]),
            _r2(q, eps, float(a), float(b), float(c)),
            accountant=acc,
            eps_at_min=float(ends[0]),
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PaperSCFEstimator:
        est = super().from_dict(d)
        assert isinstance(est, PaperSCFEstimator)
        return est
