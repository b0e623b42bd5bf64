"""Issue #17 on the command line: no traceback, no lost work, output readable at 80 columns.

Every run here is toy-sized (breast-cancer over 2 silos, 2 rounds of 2 local steps).
"""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdpfl.cli import app

TINY = {
    "name": "nc-tiny",
    "seed": 3,
    "threads": 1,
    "data": {"dataset": "breast-cancer", "num_clients": 2},
    "model": {"name": "logreg"},
    "privacy": {"epsilon_max": 5.0, "delta": 1e-3},
    "training": {"rounds": 2, "local_steps": 2, "lr": 0.3, "batch_size": 8},
}


def _cfg(tmp_path: Path, raw: dict | None = None, name: str = "cfg.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(raw or TINY))
    return p


def _invoke(*args: str, columns: int = 80):
    return CliRunner(env={"COLUMNS": str(columns)}).invoke(app, list(args))


def _clean_exit_2(res, needle: str) -> None:
    """Exit 2 with an ``error: …`` line naming ``needle`` and no traceback."""
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    assert "error: " in res.output and needle in res.output, res.output


# ----------------------------------------------------------------------------- bad outputs


def test_out_that_is_a_file_or_under_a_file_exits_2(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    _clean_exit_2(_invoke("run", str(cfg), "--out", str(a_file)), "--out")
    assert a_file.read_text() == "mine"
    _clean_exit_2(_invoke("run", str(cfg), "--out", str(a_file / "sub")), "--out")


def test_unwritable_out_exits_2(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    if os.geteuid() == 0:  # root writes anywhere on disk: use a place no one can create folders
        target = Path("/proc/pdpfl-not-writable/run")
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        target = locked / "run"
    _clean_exit_2(_invoke("run", str(cfg), "--out", str(target)), "--out")


def test_missing_budgets_file_exits_2(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    out = tmp_path / "out"
    res = _invoke(
        "run", str(cfg), "--out", str(out), "--set", f"budgets.file={tmp_path / 'nope.npy'}"
    )
    _clean_exit_2(res, "budgets.file")
    assert not out.exists()


def test_centralized_with_flower_runtime_exits_2(tmp_path: Path) -> None:
    res = _invoke(
        "run",
        str(_cfg(tmp_path)),
        "--out",
        str(tmp_path / "o"),
        "--set",
        "algorithm.name=centralized",
        "--runtime",
        "flower",
    )
    _clean_exit_2(res, "algorithm.name")
    assert not (tmp_path / "o").exists()


def test_compare_csv_into_unwritable_place_fails_before_training(
    tmp_path: Path, monkeypatch
) -> None:
    import pdpfl.runtime.simulation as sim

    def no_training(*args, **kwargs):
        raise AssertionError("trained before validating --csv")

    monkeypatch.setattr(sim, "simulate_into", no_training)
    cfg = _cfg(tmp_path)
    _clean_exit_2(
        _invoke(
            "compare", str(cfg), "--methods", "rpdp", "--csv", "/proc/pdpfl-not-writable/rows.csv"
        ),
        "--csv",
    )
    (tmp_path / "folder.csv").mkdir()
    _clean_exit_2(
        _invoke("compare", str(cfg), "--methods", "rpdp", "--csv", str(tmp_path / "folder.csv")),
        "--csv",
    )
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    _clean_exit_2(
        _invoke(
            "compare",
            str(cfg),
            "--methods",
            "rpdp",
            "--csv",
            str(blocker / "rows.csv"),
            "--out",
            str(tmp_path / "cmp"),
        ),
        "--csv",
    )
    assert not (tmp_path / "cmp").exists()  # no half-made output folder either


def test_compare_writes_rows_as_runs_finish(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C during the second run: the first run's row is already in the CSV (exit 130)."""
    import pdpfl.runtime.simulation as sim

    real = sim.simulate_into
    calls = []

    def second_is_interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sim, "simulate_into", second_is_interrupted)
    table = tmp_path / "rows.csv"
    cfg = _cfg(tmp_path, {**TINY, "lifetime": {"allow_respend": True}})  # privacy-free: ε = ∞
    res = _invoke("compare", str(cfg), "--methods", "rpdp", "privacy-free", "--csv", str(table))
    assert res.exit_code == 130, res.output
    assert "interrupted" in res.output and str(table) in res.output
    rows = list(csv.DictReader(table.open()))
    assert [r["method"] for r in rows] == ["rpdp"]


# ------------------------------------------------------------------------ the output rule


def test_run_refuses_a_folder_holding_the_users_files(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "summary.json").write_text('{"my": "own"}')
    (out / "notes.txt").write_text("keep me")
    _clean_exit_2(_invoke("run", str(cfg), "--out", str(out)), "--force")
    assert json.loads((out / "summary.json").read_text()) == {"my": "own"}
    _clean_exit_2(_invoke("run", str(cfg), "--out", str(out), "--resume"), "nothing to resume")
    res = _invoke("run", str(cfg), "--out", str(out), "--force", "--quiet")
    assert res.exit_code == 0, res.output
    assert json.loads((out / "summary.json").read_text())["name"] == "nc-tiny"
    assert (out / "notes.txt").read_text() == "keep me"  # --force replaces pdpfl's outputs only
    _clean_exit_2(_invoke("run", str(cfg), "--out", str(out), "--force", "--resume"), "--resume")


@pytest.mark.slow
def test_compare_out_follows_the_same_rule(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    out = tmp_path / "cmp"
    res = _invoke("compare", str(cfg), "--methods", "rpdp", "--out", str(out))
    assert res.exit_code == 0, res.output
    png = out / "compare.png"
    assert png.is_file() and (out / "compare.csv").is_file()
    assert str(png) in res.output  # it says where its plot is
    assert (out / "rpdp" / "seed3" / "epsilon.png").is_file()
    _clean_exit_2(
        _invoke("compare", str(cfg), "--methods", "minimum", "--out", str(out)), "--force"
    )
    res = _invoke("compare", str(cfg), "--methods", "minimum", "--out", str(out), "--force")
    assert res.exit_code == 0, res.output
    assert not (out / "rpdp").exists()  # the previous comparison was replaced, not mixed in
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert [r["method"] for r in rows] == ["minimum"]
    existing = tmp_path / "rows.csv"
    existing.write_text("precious\n")
    _clean_exit_2(
        _invoke("compare", str(cfg), "--methods", "minimum", "--csv", str(existing)), "--csv"
    )
    assert existing.read_text() == "precious\n"


def test_ctrl_c_says_how_to_resume_and_resume_finishes(tmp_path: Path, monkeypatch) -> None:
    import pdpfl.checkpoint as checkpoint  # the round loop saves through pdpfl.checkpoint

    real = checkpoint.save_checkpoint
    state = {"n": 0}

    def interrupt_after_first_round(out_dir, st):
        real(out_dir, st)
        state["n"] += 1
        if state["n"] == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_checkpoint", interrupt_after_first_round)
    cfg = _cfg(tmp_path)
    out = tmp_path / "run"
    res = _invoke("run", str(cfg), "--out", str(out), "--quiet", "--set", "lr=0.3")
    assert res.exit_code == 130, res.output
    assert "1 of 2 rounds" in res.output
    hint = re.search(r"pdpfl run .*--resume.*", res.output)
    assert hint and "--set lr=0.3" in hint.group(0) and str(out) in hint.group(0)
    res = _invoke("run", str(cfg), "--out", str(out), "--quiet", "--set", "lr=0.3", "--resume")
    assert res.exit_code == 0, res.output
    assert json.loads((out / "summary.json").read_text())["rounds_completed"] == 2


# -------------------------------------------------------------------- 80-column readability


def _lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.splitlines()]


def test_compare_table_fits_80_columns_and_one_seed_shows_no_std(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, {**TINY, "lifetime": {"allow_respend": True}})  # privacy-free: ε = ∞
    res = _invoke("compare", str(cfg), "--methods", "rpdp", "privacy-free", "--seeds", "3")
    assert res.exit_code == 0, res.output
    table = res.stdout
    assert max(len(ln) for ln in _lines(table)) <= 80, table
    assert "±" not in table and "0.0000" not in table
    for method in ("rpdp", "privacy-free"):
        row = [ln for ln in _lines(table) if ln.strip().startswith(method)]
        assert len(row) == 1 and re.search(r"\d\.\d{4}", row[0]), table
    assert "…" not in table


def test_compare_table_with_seeds_keeps_mean_and_std_on_one_line(tmp_path: Path) -> None:
    res = _invoke("compare", str(_cfg(tmp_path)), "--methods", "minimum", "--seeds", "3", "4")
    assert res.exit_code == 0, res.output
    row = [ln for ln in _lines(res.stdout) if ln.strip().startswith("minimum")]
    assert len(row) == 1 and re.search(r"\d\.\d{4} ± \d\.\d{4}", row[0]), res.stdout
    assert max(len(ln) for ln in _lines(res.stdout)) <= 80


def test_run_tables_fit_80_columns(tmp_path: Path) -> None:
    res = _invoke("run", str(_cfg(tmp_path)), "--out", str(tmp_path / "o"), "--quiet")
    assert res.exit_code == 0, res.output
    lines = _lines(res.stdout)
    tables = [ln for ln in lines if str(tmp_path) not in ln]  # file paths are as long as they are
    assert max(len(ln) for ln in tables) <= 80, res.stdout
    assert "…" not in res.stdout
    for budget in ("0.1", "1", "5"):  # one line per budget group, label and counts together
        assert any(re.match(rf"\s*{re.escape(budget)}\s+\d+\s+\d", ln) for ln in lines), budget
    assert str(tmp_path / "o" / "epsilon.png") in res.stdout


def test_makefile_demo_keeps_its_outputs_and_prints_where() -> None:
    make = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    demo = make[make.index("\ndemo:") :].split("\n\n")[0]
    assert "compare examples/digits_demo.yaml" in demo
    assert "--out runs/digits_demo" in demo and "--force" in demo


# -------------------------------------------------------------- confusing settings, plugins


def test_rmsprop_is_accepted(tmp_path: Path) -> None:
    res = _invoke(
        "run",
        str(_cfg(tmp_path)),
        "--out",
        str(tmp_path / "o"),
        "--quiet",
        "--json",
        "--set",
        "optimizer=rmsprop",
        "--set",
        "lr=0.01",
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.splitlines()[-1])["config"]["training"]["optimizer"] == "rmsprop"


def test_huge_batch_size_gets_a_message(tmp_path: Path) -> None:
    res = _invoke(
        "run",
        str(_cfg(tmp_path)),
        "--out",
        str(tmp_path / "o"),
        "--quiet",
        "--json",
        "--set",
        "batch_size=1e8",
    )
    assert res.exit_code == 0, res.output
    assert "warning: training.batch_size" in res.stderr
    summary = json.loads(res.stdout.splitlines()[-1])
    assert any(w.startswith("training.batch_size: B = 1e+08") for w in summary["warnings"])


def test_import_registers_a_model_for_the_config(tmp_path: Path) -> None:
    plugin = tmp_path / "nc_models.py"
    plugin.write_text(
        "import torch\n"
        "from pdpfl.models import MODELS, register_model\n"
        "if 'nc-plugin-mlp' not in MODELS:\n"
        "    @register_model('nc-plugin-mlp')\n"
        "    def build(input_shape, num_classes, hidden=8):\n"
        "        return torch.nn.Sequential(torch.nn.Flatten(),\n"
        "            torch.nn.Linear(input_shape[0], hidden), torch.nn.Tanh(),\n"
        "            torch.nn.Linear(hidden, 1))\n"
    )
    raw = {**TINY, "model": {"name": "nc-plugin-mlp", "options": {"hidden": 4}}}
    res = _invoke(
        "run",
        str(_cfg(tmp_path, raw)),
        "--out",
        str(tmp_path / "o"),
        "--quiet",
        "--import",
        str(plugin),
    )
    assert res.exit_code == 0, res.output
    _clean_exit_2(
        _invoke("run", str(_cfg(tmp_path, raw)), "--import", str(tmp_path / "missing.py")),
        "--import",
    )
