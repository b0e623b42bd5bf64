"""Personal budgets → per-record sampling rates (rPDP-FL §6), with a report.

Given each record's budget ε_i and a :class:`~pdpfl.privacy.plan.TrainingPlan` (σ, δ, τ, T, λ),
find q_i, the record's Poisson sampling probability, so that the plan's ε for that record is at
most ε_i. The methods share one interface (:class:`~pdpfl.calibration.estimator.RateEstimator`):

``certified`` (default)
    Exact ε on a fine monotone rate grid, largest grid rate within budget. **No record can
    exceed its budget**; resolution documented in :mod:`pdpfl.calibration.certified`.
``scf``
    rPDP-FL Algorithm 2 (exp(a·q+b)+c fit), pdpfl's variant; can overspend -- the report counts
    it.
``scf-paper``
    rPDP-FL Algorithm 2 exactly as the reference code ran it (integer orders 2…994, its
    simulation grid and fit initialisation); can overspend.
``binary-search``
    Boenisch et al. "Sample": bisection per distinct budget with the exact accountant.

The estimator F is computed by the server without any data and published
(:meth:`RateEstimator.to_dict` / :func:`estimator_from_dict`); each silo applies it to its own
records' budgets locally (rPDP-FL §6.2). Adversaries: ``third-party`` (default), ``server``, or
``both`` (the stricter of the two). Accountants (keyword ``accountant``): ``rdp`` (default,
optimal order) or ``pld`` (privacy-loss distributions: tighter, so larger rates at the same
budgets; a one-time grid computation, :mod:`pdpfl.privacy.pld`). Client- and user-level units
calibrate through their :class:`~pdpfl.privacy.unit.SampledGaussianPlan`.

Example
-------
>>> import numpy as np
>>> from pdpfl.privacy.plan import TrainingPlan
>>> from pdpfl.calibration import calibrate
>>> plan = TrainingPlan(noise_multiplier=3.5, delta=1e-3, steps=5, rounds=20, client_rate=0.5)
>>> result = calibrate(np.array([0.5, 1.0, 5.0]), plan)  # doctest: +SKIP
>>> result.rates, result.report.over_budget  # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from pdpfl.budgets import validate_budgets
from pdpfl.calibration._accounting import as_adversary, as_training_plan, exact_epsilon
from pdpfl.calibration.binary_search import BinarySearchEstimator
from pdpfl.calibration.certified import CertifiedEstimator
from pdpfl.calibration.estimator import RateEstimator
from pdpfl.calibration.scf import PaperSCFEstimator, SCFEstimator
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.registry import as_accountant_name

__all__ = [
    "METHODS",
    "POOR_UTILIZATION",
    "CalibrationReport",
    "CalibrationResult",
    "InfeasibleBudgetError",
    "calibrate",
    "estimator_from_dict",
    "fit_estimator",
]

#: The calibration methods by name (each a :class:`RateEstimator` with ``fit``/``from_dict``).
METHODS: dict[str, Any] = {
    "certified": CertifiedEstimator,
    "scf": SCFEstimator,
    "scf-paper": PaperSCFEstimator,
    "binary-search": BinarySearchEstimator,
}


class InfeasibleBudgetError(ValueError):
    """Some budgets are below the smallest ε any positive sampling rate can achieve."""

    def __init__(self, count: int, min_epsilon: float, smallest_budget: float) -> None:
        self.count = count
        self.min_epsilon = min_epsilon
        super().__init__(
            f"budgets: {count} record(s) have ε below the smallest achievable "
            f"ε = {min_epsilon:.6g} for this plan (smallest budget {smallest_budget:.6g}); "
            "raise those budgets, add noise (larger σ), or pass allow_exclusion=True to give "
            "them q = 0 (never sampled)"
        )


def _method(name: str) -> Any:
    key = str(name).strip().lower().replace("_", "-")
    if key not in METHODS:
        raise ValueError(f"method: {name!r} is not one of {', '.join(METHODS)}")
    return METHODS[key]


def fit_estimator(
    plan: object,
    method: str = "certified",
    adversary: str = "third-party",
    **options: object,
) -> RateEstimator:
    """Build the estimator F for ``plan`` (no data needed).

    ``plan`` is a :class:`TrainingPlan` or a client/user-level
    :class:`~pdpfl.privacy.unit.SampledGaussianPlan` (calibrated as its equivalent plan).
    ``options`` go to the method's ``fit``: every method ``accountant`` (``rdp`` default, or
    ``pld``); certified ``q_min, rel_step, abs_step, orders``; scf ``q_candidates, orders``;
    binary-search ``q_tol, eps_tol``.
    """
    cls = _method(method)
    adv = as_adversary(adversary).value
    estimator: RateEstimator = cls.fit(as_training_plan(plan, adv), adv, **options)
    return estimator


def estimator_from_dict(d: dict[str, Any]) -> RateEstimator:
    """Rebuild any estimator from :meth:`RateEstimator.to_dict` output (dispatch on ``method``)."""
    if not isinstance(d, dict) or "method" not in d:
        raise ValueError("estimator: expected a dict with a 'method' key")
    estimator: RateEstimator = _method(d["method"]).from_dict(d)
    return estimator


@dataclass
class CalibrationReport:
    """What a calibration did and how well it used the budgets (all ε exact)."""

    method: str
    adversary: str
    accountant: str
    n: int
    distinct_budgets: int
    seconds: float
    over_budget: int
    excluded: int
    min_utilization: float | None
    median_utilization: float | None
    sigma: float
    #: The plan's range: smallest ε a positive rate can spend (certified grid's first point,
    #: binary search's q_tol) and ε at q = 1 -- properties of the plan, not of the records.
    min_achievable_epsilon: float | None
    max_achievable_epsilon: float | None
    #: What the calibrated records spend (exact accountant), over records with q > 0.
    min_spent_epsilon: float | None = None
    max_spent_epsilon: float | None = None
    expected_batch_size: dict[str, float] | None = None
    details: dict[str, Any] = field(default_factory=dict)
    #: Records at the δ-only floor: a positive rate whose ε is 0 (δ alone covers it), per
    #: budget value -- they contribute almost nothing to training at that budget.
    floor: dict[str, int] = field(default_factory=dict)
    #: Plain-language problems with this calibration (over-budget records, budgets left unused).
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CalibrationResult:
    rates: np.ndarray
    report: CalibrationReport
    estimator: RateEstimator | None = None


def _spent(rates: np.ndarray, plan: TrainingPlan, adv: str, accountant: str) -> np.ndarray:
    """Exact ε at each rate (0 for q = 0), one accountant evaluation per distinct rate."""
    distinct, inverse = np.unique(rates, return_inverse=True)
    eps = np.zeros_like(distinct)
    pos = distinct > 0
    if pos.any():
        eps[pos] = exact_epsilon(distinct[pos], plan, adv, accountant=accountant)
    return np.asarray(eps[inverse.reshape(-1)], dtype=np.float64)


#: Median utilization (spent ε / budget) below which a calibration is reported as poor.
POOR_UTILIZATION = 0.5


def _warnings(method: str, over: int, util: np.ndarray, n: int) -> list[str]:
    out = []
    if over:
        hint = (
            " (this method's fit is a heuristic; method 'certified' never overspends)"
            if method != "certified"
            else ""
        )
        out.append(f"{over} of {n} record(s) are over budget at their calibrated rates{hint}")
    if util.size and float(np.median(util)) < POOR_UTILIZATION:
        out.append(
            f"median utilization is {float(np.median(util)):.2f}: most records spend less than "
            f"{POOR_UTILIZATION:.0%} of their budget (the plan's ε(q) rises too steeply for "
            "these budgets; more noise σ or fewer steps/rounds give them usable rates)"
        )
    return out


def calibrate(
    budgets: np.ndarray,
    plan: object,
    method: str = "certified",
    adversary: str = "third-party",
    allow_exclusion: bool = False,
    client_ids: np.ndarray | None = None,
    **options: object,
) -> CalibrationResult:
    """Sampling rate per record for ``budgets`` under ``plan``, plus a :class:`CalibrationReport`.

    Raises
    ------
    ValueError
        Invalid budgets (empty, not 1-D, NaN/inf, ≤ 0), unknown method/adversary.
    InfeasibleBudgetError
        (certified, binary-search) some budgets are below the smallest achievable ε and
        ``allow_exclusion`` is False. With ``allow_exclusion=True`` they get q = 0 and are
        counted in ``report.excluded``. SCF never excludes (the paper's F clips to [0, 1]).
    """
    b = validate_budgets(budgets)
    adv = as_adversary(adversary).value
    plan = as_training_plan(plan, adv)
    accountant = as_accountant_name(options.get("accountant", "rdp"))
    if client_ids is not None:
        client_ids = np.asarray(client_ids)
        if client_ids.shape != b.shape:
            raise ValueError(f"client_ids: expected shape {b.shape}, got {client_ids.shape}")
    start = time.perf_counter()
    estimator = fit_estimator(plan, method, adv, **options)
    rates, spent = estimator.rates_and_spent(b)
    rates = np.asarray(rates, dtype=np.float64)
    seconds = time.perf_counter() - start
    info = estimator.report_details()

    excluded_mask = rates <= 0
    if excluded_mask.any() and info.zero_means_infeasible and not allow_exclusion:
        raise InfeasibleBudgetError(
            int(excluded_mask.sum()),
            float(info.min_achievable_epsilon or 0.0),
            float(b[excluded_mask].min()),
        )

    if spent is None:
        spent = _spent(rates, plan, adv, accountant)
    over = int(np.count_nonzero(spent > b))
    used = ~excluded_mask
    util = spent[used] / b[used]
    batch = None
    if client_ids is not None:
        ids, inv = np.unique(client_ids, return_inverse=True)
        sums = np.bincount(inv.ravel(), weights=rates, minlength=ids.size)
        batch = {str(i): float(s) for i, s in zip(ids.tolist(), sums.tolist(), strict=True)}
    warnings = _warnings(estimator.method, over, util, b.size)
    at_floor = used & (spent <= 0)
    floor = {
        f"{v:g}": int(c) for v, c in zip(*np.unique(b[at_floor], return_counts=True), strict=True)
    }
    for label, count in floor.items():
        warnings.append(
            f"{count} record(s) contribute almost nothing at ε = {label} for this plan: their "
            "calibrated rate is the δ-only floor (ε = 0: δ alone covers it); more noise σ or "
            "fewer steps/rounds give them usable rates"
        )
    report = CalibrationReport(
        method=estimator.method,
        adversary=adv,
        accountant=accountant,
        n=int(b.size),
        distinct_budgets=int(np.unique(b).size),
        seconds=float(seconds),
        over_budget=over,
        excluded=int(excluded_mask.sum()),
        min_utilization=float(util.min()) if util.size else None,
        median_utilization=float(np.median(util)) if util.size else None,
        sigma=float(plan.noise_multiplier),
        min_achievable_epsilon=info.min_achievable_epsilon,
        max_achievable_epsilon=info.max_achievable_epsilon,
        min_spent_epsilon=float(spent[used].min()) if used.any() else None,
        max_spent_epsilon=float(spent[used].max()) if used.any() else None,
        expected_batch_size=batch,
        details=dict(info.details),
        floor=floor,
        warnings=warnings,
    )
    return CalibrationResult(rates=rates, report=report, estimator=estimator)
