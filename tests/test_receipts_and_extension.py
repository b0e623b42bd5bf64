"""Privacy receipts for every algorithm's unit (issue #34) -- clients (IDP-FedAvg) and users
(ULDP-FL, whose ledger the coordinator keeps); records are in test_verified_readers.py, a
Flower silo's own receipts in test_flower_receipts.py -- and extending a run past its plan
(item 2): ULDP-AVG without personal budgets cannot make its users sit out, so an extension that
would take them over budget is refused unless the user opts in, and then says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import pdpfl
from pdpfl.cli import app
from pdpfl.config import config_from_dict
from pdpfl.crypto.signing import read_public_key
from pdpfl.ledger.receipts import Receipt, verify_receipt
from pdpfl.runtime.simulation import run_simulation

pytestmark = [
    pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning"),
    pytest.mark.slow,
]

ULDP = {
    "name": "uldp-extend",
    "seed": 3,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 3, "options": {"num_users": 15}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "uldp-avg"},
    "privacy": {"epsilon_max": 2.0, "delta": 1e-5},
    "training": {"rounds": 2, "local_steps": 2, "lr": 0.3, "batch_size": 8, "max_grad_norm": 1.0},
}

IDP = {
    "name": "idp-receipts",
    "seed": 3,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 12, "partition": "iid"},
    "model": {"name": "logreg"},
    "algorithm": {
        "name": "idp-fedavg",
        "clients_per_round": 6,
        "group_budgets": [1.0, 2.0, 3.0],
        "group_ratios": [0.5, 0.25, 0.25],
        "assignment": "exact",
        "local_epochs": 1,
        "local_batch_size": 16,
        "clipping": "fixed",
    },
    "privacy": {"delta": 1e-3},
    "training": {"rounds": 2, "local_steps": 1, "optimizer": "sgd", "lr": 0.5},
}


def _receipt(run: Path, unit_id: str, target: Path) -> dict:
    res = CliRunner().invoke(app, ["privacy", str(run), "--id", unit_id, "--receipt", str(target)])
    assert res.exit_code == 0, res.output
    return json.loads(target.read_text())


def test_a_client_receipt_from_idp_fedavg(tmp_path: Path) -> None:
    out = tmp_path / "idp"
    run_simulation(config_from_dict(IDP), out, progress=False)
    table = pdpfl.privacy_table(out, as_frame=False)
    i = int(np.argmax(table["epsilon_third_party"]))
    data = _receipt(out, str(table["id"][i]), tmp_path / "client.json")
    st = data["statement"]
    assert st["unit"] == "client" and st["id"] == str(table["id"][i])
    # the simulator's one client ledger (clients.npz): signed by the party "clients" that
    # holds it; reports show each client as holding its own row
    assert st["holder"] == "clients" and str(table["holder"][i]) == st["id"]
    assert not (out / "keys" / "silo-0.pub").exists()  # no per-client identity
    assert st["epsilon"]["third-party"] == pytest.approx(float(table["epsilon_third_party"][i]))
    key = read_public_key(out / "keys" / f"{st['holder']}.pub")
    assert verify_receipt(Receipt.from_dict(data), key).party == st["holder"]


@pytest.fixture(scope="module")
def uldp(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A ULDP-AVG run planned for T = 2, then asked for T = 3 without and with the opt-in."""
    out = tmp_path_factory.mktemp("uldp") / "run"
    first = run_simulation(config_from_dict(ULDP), out, progress=False)
    before = pdpfl.privacy_table(out, as_frame=False)
    with pytest.raises(ValueError) as refused:
        run_simulation(config_from_dict(ULDP, ["rounds=3"]), out, resume=True, progress=False)
    kept = json.loads((out / "summary.json").read_text())
    extended = run_simulation(
        config_from_dict(ULDP, ["rounds=3"]),
        out,
        resume=True,
        progress=False,
        allow_over_budget=True,
    )
    return {"out": out, "first": first, "before": before, "refused": str(refused.value),
            "kept": kept, "extended": extended}  # fmt: skip


def test_extending_uldp_avg_past_its_plan_is_refused_without_the_opt_in(uldp) -> None:
    """Before issue #34: exit 0, every user at 125 % (the review: 50 of 50 at 146 %), and the
    warning claimed that units over budget sit out."""
    assert uldp["first"]["over_budget"] == 0 and uldp["first"]["extension"] is None
    msg = uldp["refused"]
    assert msg.startswith("training.rounds: extending this run from T = 2 to 3 rounds")
    assert "would take 15 of 15 users over their budget" in msg
    assert "uldp-avg cannot make its users sit out" in msg and "At most 2 rounds" in msg
    assert "--allow-over-budget" in msg
    assert uldp["kept"]["rounds_completed"] == 2  # nothing ran, nothing was charged
    assert pdpfl.verify_run(uldp["out"])["round"] == 3  # (after the opt-in run below)


def test_with_the_opt_in_the_summary_says_plainly_that_budgets_are_exceeded(uldp) -> None:
    s = uldp["extended"]
    assert s["rounds_completed"] == 3 and s["over_budget"] == 15
    assert s["extension"] == {
        "planned_rounds": 2,
        "rounds": 3,
        "over_budget_allowed": True,
        "over_budget": 15,
        "warnings": s["extension"]["warnings"],
    }
    (warning,) = s["extension"]["warnings"]
    assert warning.startswith("budgets EXCEEDED") and warning in s["warnings"]
    assert "sit out" in warning and "cannot make its users sit out" in warning
    on_disk = json.loads((uldp["out"] / "summary.json").read_text())
    assert on_disk["extension"]["over_budget"] == 15 and on_disk["epsilon"] > 2.0


def test_a_user_receipt_is_signed_by_the_coordinator_and_shows_the_overspend(
    uldp, tmp_path: Path
) -> None:
    out = uldp["out"]
    data = _receipt(out, "7", tmp_path / "user.json")
    st = data["statement"]
    assert (st["unit"], st["id"], st["holder"]) == ("user", "7", "server")
    assert st["epsilon"]["third-party"] > st["budget"]  # the opted-in overspend, stated
    assert st["rounds_charged"]["third-party"] == 3 and not st["stopped"]
    res = CliRunner().invoke(
        app, ["verify-receipt", str(tmp_path / "user.json"), "--key", str(out / "keys")]
    )
    assert res.exit_code == 0 and "signed by server" in res.output, res.output
