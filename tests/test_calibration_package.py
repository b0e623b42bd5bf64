"""``pdpfl.calibration`` is the one calibration home: re-exports, the protocol, the shim.

``calibrate`` reads everything it reports from the estimator (``report_details``,
``rates_and_spent``), so a new method is one class in ``METHODS`` and no ``isinstance``
switch.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pdpfl.calibration as calibration
from pdpfl.calibration import (
    METHODS,
    BinarySearchEstimator,
    CertifiedEstimator,
    EstimatorDetails,
    RateEstimator,
    SCFEstimator,
    calibrate,
    fit_estimator,
)
from pdpfl.privacy import TrainingPlan

PLAN = TrainingPlan(noise_multiplier=3.5, delta=1e-3, steps=5, rounds=20, client_rate=0.5)


def test_every_public_name_is_exported_and_the_old_module_is_gone() -> None:
    import importlib

    for name in calibration.__all__:
        assert getattr(calibration, name) is not None
    with pytest.raises(ModuleNotFoundError):  # folded into pdpfl.calibration (issue #21)
        importlib.import_module("pdpfl.calibrate")


@pytest.mark.parametrize("cls", [CertifiedEstimator, SCFEstimator, BinarySearchEstimator])
def test_every_method_implements_the_one_protocol(cls: Any) -> None:
    est = fit_estimator(PLAN, next(k for k, v in METHODS.items() if v is cls))
    assert isinstance(est, RateEstimator)
    info = est.report_details()
    assert isinstance(info, EstimatorDetails)
    rates, spent = est.rates_and_spent(np.array([0.5, 1.0, 5.0]))
    assert rates.shape == (3,) and (spent is None or spent.shape == (3,))


def test_the_facade_has_no_isinstance_switch_on_estimators() -> None:
    src = Path(calibration.__file__).with_name("rates.py").read_text(encoding="utf-8")
    names = {"CertifiedEstimator", "SCFEstimator", "BinarySearchEstimator"}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            assert not names & {getattr(a, "id", None) for a in ast.walk(node)}


@dataclass(frozen=True)
class _HalfRate:
    """A toy method: q = 0.5 everywhere; reports its own details."""

    plan: TrainingPlan
    adversary: str
    method: str = "half"
    accountant: str = "rdp"

    @classmethod
    def fit(cls, plan: TrainingPlan, adversary: str = "third-party", **_: Any) -> _HalfRate:
        return cls(plan, adversary)

    def rates(self, budgets: np.ndarray) -> np.ndarray:
        return np.full(np.shape(budgets), 0.5)

    def rates_and_spent(self, budgets: np.ndarray) -> tuple[np.ndarray, None]:
        return self.rates(budgets), None

    def report_details(self) -> EstimatorDetails:
        return EstimatorDetails(None, None, {"toy": 1.0})

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> _HalfRate:
        raise NotImplementedError


def test_a_new_method_needs_no_change_to_calibrate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(METHODS, "half", _HalfRate)
    res = calibrate(np.array([0.1, 100.0]), PLAN, method="half")
    assert res.report.method == "half" and res.report.details == {"toy": 1.0}
    assert res.report.over_budget == 1  # 0.1 cannot afford q = 0.5; the report counts it
    assert np.all(res.rates == 0.5)
