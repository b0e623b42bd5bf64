"""Calibration: personal budgets → sampling rates, and mechanism parameters → a target ε.

The public API (re-exported here, as ``dp_accounting/__init__.py`` does; import from
``pdpfl.calibration``):

* budgets → rates (rPDP-FL §6): :func:`calibrate`, :func:`fit_estimator`,
  :func:`estimator_from_dict`, the :class:`RateEstimator` protocol and its methods
  :class:`CertifiedEstimator` (default; no record over budget), :class:`SCFEstimator`
  (rPDP-FL Algorithm 2, pdpfl's variant), :class:`PaperSCFEstimator` (Algorithm 2 as the
  reference code ran it), :class:`BinarySearchEstimator` (Boenisch et al.), :data:`METHODS`,
  :class:`CalibrationResult`, :class:`CalibrationReport`, :class:`InfeasibleBudgetError`;
* parameters → ε: :func:`calibrate_parameter` (one entry point, continuous σ or integer
  steps), :func:`noise_for_epsilon`, :func:`steps_for_epsilon`, :class:`InfeasibleTargetError`;
* ε of a plan per sampling rate: :func:`exact_epsilon` (what every calibrator certifies);
* choosing σ for personal budgets: :func:`noise_for_max_budget` (rPDP-FL: q = 1 spends
  ε_max), :func:`noise_for_uniform_rate`, :func:`group_sampling_rates` (IDP-FedAvg
  Algorithm 1).

Modules: :mod:`.rates` (the façade), :mod:`.estimator` (the protocol), :mod:`.certified`,
:mod:`.scf`, :mod:`.binary_search`, :mod:`.noise`, :mod:`.parameter`.
"""

from pdpfl.calibration._accounting import exact_epsilon
from pdpfl.calibration.binary_search import BinarySearchEstimator
from pdpfl.calibration.certified import CertifiedEstimator
from pdpfl.calibration.estimator import EstimatorDetails, RateEstimator
from pdpfl.calibration.noise import (
    group_sampling_rates,
    noise_for_max_budget,
    noise_for_uniform_rate,
)
from pdpfl.calibration.parameter import (
    InfeasibleTargetError,
    calibrate_parameter,
    noise_for_epsilon,
    steps_for_epsilon,
)
from pdpfl.calibration.rates import (
    METHODS,
    CalibrationReport,
    CalibrationResult,
    InfeasibleBudgetError,
    calibrate,
    estimator_from_dict,
    fit_estimator,
)
from pdpfl.calibration.scf import PaperSCFEstimator, SCFEstimator

__all__ = [
    "METHODS",
    "BinarySearchEstimator",
    "CalibrationReport",
    "CalibrationResult",
    "CertifiedEstimator",
    "EstimatorDetails",
    "InfeasibleBudgetError",
    "InfeasibleTargetError",
    "PaperSCFEstimator",
    "RateEstimator",
    "SCFEstimator",
    "calibrate",
    "calibrate_parameter",
    "estimator_from_dict",
    "exact_epsilon",
    "fit_estimator",
    "group_sampling_rates",
    "noise_for_epsilon",
    "noise_for_max_budget",
    "noise_for_uniform_rate",
    "steps_for_epsilon",
]
