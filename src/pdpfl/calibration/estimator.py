"""The one protocol every budget → rate estimator implements (rPDP-FL §6.2's estimator F).

An estimator is computed by the server without any data, published (:meth:`to_dict`) and
applied by every silo to its own records' budgets. :func:`pdpfl.calibration.calibrate` reads
everything it reports from the estimator itself (:meth:`RateEstimator.report_details`), so a
new method needs no change to the façade.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["EstimatorDetails", "RateEstimator"]


@dataclass(frozen=True)
class EstimatorDetails:
    """What an estimator contributes to a :class:`~pdpfl.calibration.CalibrationReport`."""

    #: Smallest ε a positive rate can spend (budgets below get q = 0), if the method knows it.
    min_achievable_epsilon: float | None
    #: ε spent at q = 1 (budgets at or above get q = 1), if the method knows it.
    max_achievable_epsilon: float | None
    #: Method-specific numbers (grid size, fit parameters, tolerances), JSON-able.
    details: dict[str, Any] = field(default_factory=dict)
    #: True if a rate of 0 means "this budget is below the smallest achievable ε" (an
    #: infeasible budget: an error unless exclusion is allowed). False for SCF, whose fit
    #: clips to [0, 1] as the paper's F does.
    zero_means_infeasible: bool = True


@runtime_checkable
class RateEstimator(Protocol):
    """The sampling-probability estimator F: budgets → rates, JSON-serialisable."""

    method: str
    accountant: str

    def rates(self, budgets: np.ndarray) -> np.ndarray:
        """Sampling rate per budget."""
        ...

    def rates_and_spent(self, budgets: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Rates and, when the estimator knows it for free, the exact ε each spends (else
        None: the façade evaluates it with the exact accountant)."""
        ...

    def report_details(self) -> EstimatorDetails:
        """The estimator's part of the calibration report."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """JSON-able description (published to the silos)."""
        ...

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RateEstimator:
        """Rebuild from :meth:`to_dict`."""
        ...
