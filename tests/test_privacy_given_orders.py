"""Orders a user asks for are honoured exactly (issue #24, item 2).

``pdpfl account --orders 2 3 4`` and ``exact_epsilon(..., orders=...)`` minimize over exactly
those orders (no continuous refinement unless asked for), so integer-order numbers of
dp-accounting, Opacus or a paper's code are reproduced; without orders the refined default
stays (never looser).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from pdpfl.calibration._accounting import exact_epsilon
from pdpfl.cli import app
from pdpfl.privacy import TrainingPlan, plan_epsilon

dpa = pytest.importorskip("dp_accounting")
dpa_rdp = pytest.importorskip("dp_accounting.rdp")

runner = CliRunner()
ORDERS = [2.0, 3.0, 4.0]
#: An interior optimum (at 8 for q = 0.01): the old refinement moved off it, to α = 8.82.
SPREAD = [2.0, 4.0, 8.0, 16.0, 32.0]


def _dp_accounting(q: float, sigma: float, steps: int, delta: float, orders: list[float]) -> float:
    acc = dpa_rdp.RdpAccountant(orders)
    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
    return float(acc.get_epsilon(delta))


@pytest.mark.parametrize("orders", [ORDERS, SPREAD, [5.0]])
def test_cli_orders_equal_dp_accounting_at_the_same_integer_orders(orders) -> None:
    args = [
        "account",
        "--sigma",
        "1.0",
        "--delta",
        "1e-5",
        "--steps",
        "100",
        "--json",
        "--q",
        "0.2",
        "0.01",
        "--orders",
        *[str(int(a)) for a in orders],
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    ref = [_dp_accounting(q, 1.0, 100, 1e-5, orders) for q in (0.2, 0.01)]
    np.testing.assert_allclose(out["epsilon"], ref, rtol=1e-9)
    assert set(out["order"]) <= set(orders) and out["mechanism"]["refine"] is False
    # --refine asks for the refinement explicitly: never looser, off the given grid
    refined = json.loads(runner.invoke(app, [*args, "--refine"]).stdout)
    assert all(r <= e for r, e in zip(refined["epsilon"], out["epsilon"], strict=True))


def test_exact_epsilon_and_plan_epsilon_honour_given_orders() -> None:
    plan = TrainingPlan(noise_multiplier=1.0, delta=1e-5, steps=100)
    q = np.array([0.2, 0.01])
    ref = [_dp_accounting(float(x), 1.0, 100, 1e-5, SPREAD) for x in q]
    np.testing.assert_allclose(exact_epsilon(q, plan, orders=SPREAD), ref, rtol=1e-9)
    eps, order = plan_epsilon(q, plan, orders=SPREAD)
    np.testing.assert_allclose(eps, ref, rtol=1e-9)
    assert set(order.tolist()) <= set(SPREAD)
    # without orders: the default grid, refined -- and never looser than the grid alone
    default, _ = plan_epsilon(q, plan)
    grid, _ = plan_epsilon(q, plan, refine=False)
    assert np.all(default <= grid) and np.all(default <= eps)
    assert np.array_equal(exact_epsilon(q, plan), default)


def test_without_orders_the_cli_keeps_the_refined_default() -> None:
    res = runner.invoke(
        app,
        ["account", "--sigma", "1.0", "--delta", "1e-5", "--steps", "100", "--q", "0.2", "--json"],
    )
    out = json.loads(res.stdout)
    plan = TrainingPlan(noise_multiplier=1.0, delta=1e-5, steps=100)
    assert out["epsilon"] == list(plan_epsilon([0.2], plan)[0])
    assert out["mechanism"]["refine"] is True
