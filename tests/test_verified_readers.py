"""Every reader of a run folder verifies it (issue #34, item 1): the three tamperings the review
measured -- edited unsealed ledgers (``pdpfl privacy`` reported max ε 0.0), the same run's
sealed ledgers from an earlier round, another run's sealed ledgers -- and an edited, stale or
foreign model are refused by ``pdpfl privacy``, ``pdpfl export`` and the Python API, naming the
file; a folder that names no run says so in every report.

Each tampering is first shown to carry its payload (the files, read raw as the readers did
before, report a smaller ε), then refused.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import pdpfl
from pdpfl.cli import app
from pdpfl.config import config_from_dict
from pdpfl.integrity import IntegrityError
from pdpfl.ledger import load_ledger, save_ledger
from pdpfl.ledger.runfolder import RunFolderError, UnverifiedRunWarning
from pdpfl.runtime.model_file import read_model, write_model
from pdpfl.runtime.simulation import run_simulation

pytestmark = [
    pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning"),
    pytest.mark.slow,
]

TINY = {
    "name": "verified",
    "seed": 5,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "breast-cancer", "num_clients": 3},
    "model": {"name": "logreg"},
    "budgets": {
        "scenario": "three-levels",
        "params": {"values": [0.5, 2.0, 8.0], "ratios": [0.5, 0.3, 0.2]},
    },
    "privacy": {"epsilon_max": 8.0, "delta": 1e-3},
    "lifetime": {"allow_respend": True},  # public data, run several times on purpose
    "training": {"rounds": 3, "local_steps": 2, "client_rate": 1.0, "lr": 0.3, "batch_size": 8},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("verified")
    a, b = root / "a", root / "b"
    run_simulation(config_from_dict(TINY), a, progress=False, stop_after=2)
    shutil.copytree(a / "ledgers", root / "a-round2-ledgers")  # sealed at round 2
    shutil.copy(a / "model.safetensors", root / "a-round2-model.safetensors")
    run_simulation(config_from_dict(TINY), a, resume=True, progress=False)
    small = "budgets.params={values: [0.1, 0.2, 0.5], ratios: [0.5, 0.3, 0.2]}"
    run_simulation(config_from_dict(TINY, ["seed=6", "rounds=1", small]), b, progress=False)
    return {"a": a, "b": b, "root": root}


def _copy(runs: dict[str, Path], name: str) -> Path:
    target = runs["root"] / name
    shutil.copytree(runs["a"], target)
    return target


def _max_eps(folder: Path) -> float:
    """What the readers reported before issue #34: the files, unverified."""
    return max(float(np.max(load_ledger(f).spent_epsilon("both"))) for f in folder.glob("*.npz"))


def _refused(folder: Path, file: str, why: str) -> None:
    """``pdpfl privacy``, ``pdpfl export`` and the Python API all refuse, naming ``file``."""
    for args in (["privacy", str(folder)], ["export", str(folder), "--out",
                                              str(folder / "x.safetensors")]):  # fmt: skip
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert file in res.output and why in res.output, res.output
        assert "Traceback" not in res.output
    with pytest.raises(RunFolderError, match=why) as err:
        pdpfl.privacy_table(folder, as_frame=False)
    assert file in str(err.value)
    with pytest.raises(RunFolderError, match=why):
        pdpfl.verify_run(folder)


def test_a_run_folder_verifies_and_every_report_says_what_was_verified(runs) -> None:
    a = runs["a"]
    summary = json.loads((a / "summary.json").read_text())
    check = pdpfl.verify_run(a)
    assert check["verified"] and check["run_id"] == summary["run_id"] and check["round"] == 3
    assert check["ledgers"] == ["client_0", "client_1", "client_2"]
    res = CliRunner().invoke(app, ["privacy", str(a)])
    assert res.exit_code == 0 and f"verified: run {summary['run_id']} at round 3" in res.output
    res = CliRunner().invoke(app, ["privacy", str(a), "--json"])
    assert json.loads(res.output)["verification"]["verified"] is True
    out = runs["root"] / "exported.safetensors"
    res = CliRunner().invoke(app, ["export", str(a), "--out", str(out)])
    assert res.exit_code == 0 and "verified: the model of run" in res.output
    assert read_model(out)[1]["run_id"] == summary["run_id"]  # the seal travels with it


def test_edited_unsealed_ledgers_are_refused(runs) -> None:
    folder = _copy(runs, "unsealed")
    truth = _max_eps(folder / "ledgers")
    for f in sorted((folder / "ledgers").glob("*.npz")):
        ledger = load_ledger(f)
        state = ledger.state_dict()
        for key in state:
            if key.endswith("_rounds") and key != "sat_out_rounds":
                state[key] = np.zeros_like(state[key])
        ledger.load_state_dict(state)
        save_ledger(ledger, f)  # no seal: what anyone with write access can produce
    assert truth > 1.0 and _max_eps(folder / "ledgers") == 0.0  # the review's "max ε 0.0"
    _refused(folder, "client_0.npz", "not sealed")


def test_sealed_ledgers_of_an_earlier_round_are_refused(runs) -> None:
    folder = _copy(runs, "stale")
    truth = _max_eps(folder / "ledgers")
    shutil.rmtree(folder / "ledgers")
    shutil.copytree(runs["root"] / "a-round2-ledgers", folder / "ledgers")
    assert _max_eps(folder / "ledgers") < truth  # the review's 1.445 for 2.117
    _refused(folder, "manifest.sealed", "stale -- written at round 2")
    # the stale files alone, beside the current manifest
    shutil.copy(runs["a"] / "ledgers" / "manifest.sealed", folder / "ledgers")
    _refused(folder, "client_0.npz", "stale -- written at round 2")


def test_another_runs_sealed_ledgers_are_refused(runs) -> None:
    folder = _copy(runs, "foreign")
    shutil.rmtree(folder / "ledgers")
    shutil.copytree(runs["b"] / "ledgers", folder / "ledgers")
    assert _max_eps(folder / "ledgers") < _max_eps(runs["a"] / "ledgers")  # the review's 0.794
    _refused(folder, "manifest.sealed", "sealed for another run")
    shutil.copy(runs["a"] / "ledgers" / "manifest.sealed", folder / "ledgers")
    _refused(folder, "client_0.npz", "sealed for another run")


def test_a_deleted_or_an_added_ledger_is_refused(runs) -> None:
    folder = _copy(runs, "deleted")
    (folder / "ledgers" / "client_2.npz").unlink()
    _refused(folder, "client_2.npz", "missing")
    folder = _copy(runs, "added")
    shutil.copy(folder / "ledgers" / "client_2.npz", folder / "ledgers" / "client_9.npz")
    _refused(folder, "client_9.npz", "not written by run")


def test_an_edited_stale_or_foreign_model_is_refused(runs) -> None:
    cases = {}
    folder = _copy(runs, "model-edited")
    tensors, meta = read_model(folder / "model.safetensors")
    meta["epsilon"] = "0.01"  # a smaller headline ε in the header, seal kept
    write_model(folder / "model.safetensors", list(tensors.values()), list(tensors), meta)
    cases[folder] = "integrity tag does not verify"
    folder = _copy(runs, "model-stale")
    shutil.copy(runs["root"] / "a-round2-model.safetensors", folder / "model.safetensors")
    cases[folder] = "stale -- written at round 2"
    folder = _copy(runs, "model-foreign")
    shutil.copy(runs["b"] / "model.safetensors", folder / "model.safetensors")
    cases[folder] = "the model of another run"
    for folder, why in cases.items():
        res = CliRunner().invoke(app, ["export", str(folder), "--out", str(folder / "x.pt"),
                                       "--format", "torch"])  # fmt: skip
        assert res.exit_code == 2 and "model.safetensors" in res.output and why in res.output
        with pytest.raises(IntegrityError, match=why):
            pdpfl.load_model(folder)


def test_a_folder_without_a_run_id_says_so_and_one_without_its_checkpoint_is_refused(
    runs,
) -> None:
    folder = _copy(runs, "no-checkpoint")
    (folder / "checkpoint.npz").unlink()
    _refused(folder, "checkpoint.npz", "is missing")
    summary = json.loads((folder / "summary.json").read_text())
    del summary["run_id"]
    (folder / "summary.json").write_text(json.dumps(summary))
    res = CliRunner().invoke(app, ["privacy", str(folder)])
    assert res.exit_code == 0 and "NOT VERIFIED" in res.output
    res = CliRunner().invoke(app, ["privacy", str(folder), "--id", "0"])
    assert "NOT VERIFIED" in res.output
    with pytest.warns(UnverifiedRunWarning, match="NOT VERIFIED"):
        pdpfl.privacy_table(folder, as_frame=False)
    with pytest.warns(UnverifiedRunWarning):
        assert pdpfl.verify_run(folder)["verified"] is False
    res = CliRunner().invoke(app, ["export", str(folder), "--out", str(folder / "m.safetensors")])
    assert res.exit_code == 0 and "NOT VERIFIED" in res.output


def test_the_checkpoint_itself_cannot_be_rolled_back(runs) -> None:
    """Putting back an earlier checkpoint with its ledgers is refused by the run's high-water
    mark (the readers trust the checkpoint only once it verifies)."""
    folder = runs["root"] / "rollback"
    run_simulation(config_from_dict(TINY, ["seed=7"]), folder, progress=False, stop_after=1)
    saved = runs["root"] / "rollback-round1"
    shutil.copytree(folder, saved)
    run_simulation(config_from_dict(TINY, ["seed=7"]), folder, resume=True, progress=False)
    for name in ("checkpoint.npz", "ledgers", "model.safetensors", "summary.json"):
        target = folder / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
        src = saved / name
        shutil.copytree(src, target) if src.is_dir() else shutil.copy(src, target)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnverifiedRunWarning)
        with pytest.raises(IntegrityError, match="an older checkpoint was put back"):
            pdpfl.privacy_table(folder, as_frame=False)
    res = CliRunner().invoke(app, ["privacy", str(folder)])
    assert res.exit_code == 2 and "checkpoint.npz" in res.output


def test_a_record_receipt_is_signed_by_its_silo_and_an_edited_one_fails(runs) -> None:
    """`pdpfl privacy RUN --id X --receipt FILE` and `pdpfl verify-receipt`, record level."""
    a = runs["a"]
    table = pdpfl.privacy_table(a, as_frame=False)
    row = int(np.argmax(table["epsilon_server"]))
    pid, holder = str(table["id"][row]), str(table["holder"][row])
    silo = "silo-" + holder.split("_")[1]
    receipt = runs["root"] / "receipt.json"
    res = CliRunner().invoke(app, ["privacy", str(a), "--id", pid, "--receipt", str(receipt)])
    assert res.exit_code == 0, res.output
    data = json.loads(receipt.read_text())
    st = data["statement"]
    assert (st["unit"], st["id"], st["holder"]) == ("record", pid, silo)
    assert st["budget"] == pytest.approx(float(table["budget"][row]))
    assert st["epsilon"]["server"] == pytest.approx(float(table["epsilon_server"][row]))
    assert st["rounds_charged"]["third-party"] == int(table["rounds_third_party"][row])
    assert st["stopped"] == bool(table["stopped"][row]) and st["accountant"] == "rdp"
    assert st["run"]["run_id"] == json.loads((a / "summary.json").read_text())["run_id"]
    assert st["run"]["verified"] and len(st["mechanism_fingerprint"]) == 64
    assert st["lifetime"]["runs"] >= 1  # the silo's budget store
    # it names nobody else: no other record's id, budget or row anywhere in it
    others = {str(i) for i in table["id"]} - {pid}
    text = receipt.read_text()
    assert not any(f'"{o}"' in text for o in others)
    key = a / "keys" / f"{silo}.pub"
    ok = CliRunner().invoke(app, ["verify-receipt", str(receipt), "--key", str(key)])
    assert ok.exit_code == 0 and f"signed by {silo}" in ok.output, ok.output
    # an edited number, another silo's key, or not a receipt at all
    data["statement"]["epsilon"]["server"] = 0.01
    edited = runs["root"] / "edited.json"
    edited.write_text(json.dumps(data))
    bad = CliRunner().invoke(app, ["verify-receipt", str(edited)])
    assert bad.exit_code == 1 and "INVALID" in bad.output and "edited" in bad.output
    other = next(p for p in (a / "keys").glob("silo-*.pub") if p.stem != silo)
    wrong = CliRunner().invoke(app, ["verify-receipt", str(receipt), "--key", str(other)])
    assert wrong.exit_code == 1 and "not by" in wrong.output
    junk = CliRunner().invoke(app, ["verify-receipt", str(a / "summary.json")])
    assert junk.exit_code == 2 and "error: FILE" in junk.output
    missing = CliRunner().invoke(app, ["privacy", str(a), "--id", "nobody", "--receipt",
                                       str(runs["root"] / "none.json")])  # fmt: skip
    assert missing.exit_code == 2 and "--id" in missing.output
