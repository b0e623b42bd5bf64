"""On Flower each silo issues receipts for its own people from its own state (issue #34): a run
of pdpfl's own apps -- secure summation with its consistency round, over the Flower codec and
the silos' identities in their state folders -- then ``pdpfl flower receipt`` at one silo, and
``pdpfl verify-receipt`` with the silo's published key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

pytestmark = [
    pytest.mark.flower,
    pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning"),
]

flwr = pytest.importorskip("flwr")

from test_flower_toy import task_identity  # noqa: E402, F401  (a fixture)


@pytest.mark.usefixtures("task_identity")
def test_a_flower_silo_signs_receipts_for_its_own_people(tmp_path: Path, monkeypatch: Any) -> None:
    from pdpfl.cli import app
    from pdpfl.config import config_from_dict, config_to_dict
    from pdpfl.ledger.runfolder import open_silo_state
    from pdpfl.runtime.flower.codec import encode_config
    from test_flower_toy import FakeGrid, serve

    config = config_from_dict(
        {
            "name": "flower-receipts",
            "seed": 3,
            "threads": 1,
            "randomness": "reproducible",
            "aggregation": "secure",
            "data": {"dataset": "breast-cancer", "num_clients": 3},
            "model": {"name": "logreg"},
            "privacy": {"epsilon_max": 8.0, "delta": 1e-3},
            "training": {"rounds": 1, "local_steps": 1, "batch_size": 8, "lr": 0.3},
        }
    )
    out = tmp_path / "flower"
    run_config = {
        "pdpfl-config": encode_config(config_to_dict(config)),
        "pdpfl-hooks": "pdpfl.runtime.flower.hooks:PDPFL_HOOKS",
        "pdpfl-out-dir": str(out),
        "pdpfl-resume": False,
        "pdpfl-round-timeout": 60.0,
        "pdpfl-startup-timeout": 30.0,
        "pdpfl-min-silos": 3,
    }
    silos = out / "silos"
    grid = FakeGrid(run_config, silos, 3, hooks=None, monkeypatch=monkeypatch)
    result = serve(grid, out)
    assert result["status"] == "ok", result
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["contributions"] == 3  # the secure round released, consistency included
    state = silos / "silo-1"
    (ledger,) = open_silo_state(next(state.glob("run-*"))).ledgers.values()
    person = str(ledger.ids[0])
    receipt = tmp_path / "receipt.json"
    res = CliRunner().invoke(
        app,
        [
            "flower",
            "receipt",
            "--state-dir",
            str(state),
            "--silo",
            "1",
            "--id",
            person,
            "--out",
            str(receipt),
        ],  # fmt: skip
    )
    assert res.exit_code == 0, res.output
    st = json.loads(receipt.read_text())["statement"]
    assert (st["unit"], st["id"], st["holder"]) == ("record", person, "silo-1")
    assert st["rounds_recorded"] == 1 and st["run"]["verified"]
    ok = CliRunner().invoke(
        app, ["verify-receipt", str(receipt), "--key", str(silos / "keys" / "silo-1.pub")]
    )
    assert ok.exit_code == 0 and "signed by silo-1" in ok.output, ok.output
    wrong = CliRunner().invoke(
        app, ["verify-receipt", str(receipt), "--key", str(silos / "keys" / "silo-0.pub")]
    )
    assert wrong.exit_code == 1
