"""A person's budget is for life on Flower too: the SuperNodes' silos charge the same budget
store as the simulator (one operator, loopback) and make spent records sit out."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from pdpfl.runtime.flower.processes import flower_binary  # noqa: E402
from pdpfl.runtime.flower.transport import FlowerRunError  # noqa: E402

try:
    for _name in ("flower-superlink", "flower-supernode", "flwr"):
        flower_binary(_name)
except FlowerRunError as _err:  # pragma: no cover - depends on the installation
    pytest.skip(f"Flower binaries missing: {_err}", allow_module_level=True)

TESTS_DIR = Path(__file__).resolve().parent


@pytest.mark.flower
@pytest.mark.slow
def test_flower_silos_charge_the_simulators_store_and_spent_records_sit_out(
    tmp_path: Path,
) -> None:
    from pdpfl.config import config_from_dict
    from pdpfl.ledger.lifetime import lifetime_table
    from pdpfl.runtime.flower import run_flower
    from pdpfl.runtime.simulation import run_simulation
    from test_lifetime_runs import BASE

    small = ["data.num_clients=2", "rounds=2"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_simulation(config_from_dict(BASE, small), tmp_path / "sim", progress=False)
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS_DIR.parent / "src"), *sys.path])}
    summary = run_flower(
        config_from_dict(BASE, [*small, "algorithm.name=rpdp"]), tmp_path / "flower", env=env
    )
    groups = summary["per_group"]
    # the ε = 1 records spent their budget in the simulator's run: they sat out every round
    assert groups["1"]["stopped"] == groups["1"]["count"] > 0
    assert groups["1"]["max_spent_third_party"] == 0
    # the ε = 8 records stopped when one more round would have exceeded 8 for life
    assert groups["8"]["stopped"] == groups["8"]["count"] > 0
    assert summary["lifetime"]["enforced"] and summary["lifetime"]["over_budget"] == 0
    assert summary["lifetime"]["prior_units"] == summary["units"]
    table = lifetime_table(os.environ["PDPFL_BUDGET_DIR"])
    assert set(table["party"].tolist()) == {"silo-0", "silo-1"}
    assert max(table["runs"].tolist()) == 2  # the simulator's run and the Flower run
    for label in ("1", "8", "15"):
        assert groups[label]["lifetime_max_third_party"] <= float(label) * (1 + 1e-9)
