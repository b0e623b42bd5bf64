"""A run that cannot go on says why and keeps what it finished (issue #36 items 4 and 5).

* A full disk while a round is saved, or while the final ledgers are written: the run stops
  cleanly (exit 1, ``error: --out: cannot write <file> ... (No space left on device)``), keeps
  every round its checkpoint holds, leaves no temporary file, and the printed command continues
  it. Before: an ``OSError`` traceback.
* A resume refused because the configuration changed names the fields that changed. Before:
  "written by a different config", nothing more.
* ``pdpfl calibrate --budgets`` reads the README's ``record_id,epsilon`` table as ``pdpfl run``
  reads ``budgets.file``. Before: refused, with a hint naming a Python keyword (``column=``).
"""

from __future__ import annotations

import errno
import shlex
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pdpfl.cli import app

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits_demo.yaml"
TOY = ["--set", "data.num_clients=3", "--set", "training.local_steps=2"]
runner = CliRunner()


def _run(out: Path, *args: str) -> object:
    return runner.invoke(app, ["run", str(EXAMPLE), "--out", str(out), "--quiet", *TOY, *args])


def _disk_full_at(monkeypatch: pytest.MonkeyPatch, prefix: str, after: int) -> None:
    """Writing a temporary file whose name starts with ``prefix`` fails with ENOSPC after
    ``after`` successful writes (the temporary file exists, as on a full disk)."""
    real = Path.write_bytes
    count = {"n": 0}

    def write_bytes(self: Path, data: bytes) -> int:
        if self.name.startswith(prefix):
            count["n"] += 1
            if count["n"] > after:
                raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)


def _resume(output: str) -> list[str]:
    line = next(x for x in output.splitlines() if x.strip().startswith("pdpfl run "))
    return shlex.split(line)[1:]


@pytest.mark.slow
def test_a_full_disk_during_a_round_stops_cleanly_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    _disk_full_at(monkeypatch, ".checkpoint.npz.", after=1)  # round 2's checkpoint
    res = _run(out, "--set", "rounds=3")
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    first = res.output.strip().splitlines()[0]
    assert first.startswith("error: --out: cannot write checkpoint.npz in ")
    assert "(No space left on device)" in first and "1 of 3 rounds are saved" in first
    assert not list(out.rglob("*.tmp"))
    monkeypatch.undo()
    again = runner.invoke(app, [*_resume(res.output), "--quiet"])
    assert again.exit_code == 0, again.output
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3


@pytest.mark.slow
def test_a_full_disk_while_saving_the_ledgers_keeps_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    _disk_full_at(monkeypatch, ".client_1.npz.", after=0)  # silo 1's ledger, after training
    res = _run(out, "--set", "rounds=2")
    assert res.exit_code == 1, res.output
    assert "cannot write client_1.npz" in res.output and "2 of 2 rounds are saved" in res.output
    assert "Traceback" not in res.output and not list(out.rglob("*.tmp"))
    monkeypatch.undo()
    again = runner.invoke(app, [*_resume(res.output), "--quiet"])  # writes the outputs
    assert again.exit_code == 0, again.output
    assert (out / "ledgers" / "client_1.npz").is_file() and (out / "summary.json").is_file()


@pytest.mark.slow
def test_a_resume_refused_for_a_changed_config_names_the_fields(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _run(out, "--set", "rounds=1").exit_code == 0
    res = _run(out, "--resume", "--set", "rounds=1", "--set", "training.lr=0.1", "--set", "seed=7")
    assert res.exit_code == 2, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("error: "))
    from pdpfl.config import load_config

    lr = load_config(EXAMPLE).training.lr  # the example's own step size
    assert f"changed: seed (42 → 7), training.lr ({lr:g} → 0.1)" in line
    assert "training.local_steps" not in line  # only what changed


def test_calibrate_reads_the_record_id_epsilon_table_as_run_does(tmp_path: Path) -> None:
    from pdpfl.data.budget_table import read_budget_table

    eps = [0.5, 2.0, 0.5, 8.0]
    ids = [17, 3, 99, 5]
    table = tmp_path / "budgets.csv"
    rows = "".join(f"{i},{e}\n" for i, e in zip(ids, eps, strict=True))
    table.write_text("record_id,epsilon\n" + rows)
    column = tmp_path / "eps.csv"
    column.write_text("epsilon\n" + "".join(f"{e}\n" for e in eps))
    assert read_budget_table(table) == dict(zip(ids, eps, strict=True))  # what run matches by id
    plan = ["--epsilon-max", "10", "--delta", "1e-3", "--steps", "5", "--rounds", "3"]
    rates = {}
    for path in (table, column):
        q = tmp_path / f"q-{path.stem}.npy"
        res = runner.invoke(app, ["calibrate", "--budgets", str(path), *plan, "--out", str(q)])
        assert res.exit_code == 0, res.output
        rates[path.stem] = np.load(q)
    np.testing.assert_array_equal(rates["budgets"], rates["eps"])  # row order, per record
    assert rates["budgets"][1] > rates["budgets"][0]  # a larger budget, a larger rate
