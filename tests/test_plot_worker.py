"""The plot worker of `pdpfl run` (pdpfl.runtime.plot_worker): the same PNG bytes as drawing
in-process, a fallback when the child fails, and no child left behind by a failed run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.runtime import plot_worker

TINY = {
    "name": "plot-worker",
    "seed": 5,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "breast-cancer", "num_clients": 2},
    "model": {"name": "logreg"},
    "privacy": {"epsilon_max": 5.0, "delta": 1e-3},
    "training": {"rounds": 2, "local_steps": 2, "lr": 0.3, "batch_size": 8},
}
PLOTS = ("accuracy.png", "epsilon.png")


def _run(tmp_path: Path, out: str, raw: dict = TINY):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    return CliRunner().invoke(app, ["run", str(cfg), "--out", str(tmp_path / out), "--quiet"])


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Record the child started and what draw() answered."""
    seen: dict = {"procs": [], "drawn": []}
    start, draw = plot_worker.start, plot_worker.draw

    def start_spy() -> None:
        start()
        seen["procs"].append(plot_worker._proc)

    def draw_spy(*args, **kwargs) -> bool:
        seen["drawn"].append(draw(*args, **kwargs))
        return seen["drawn"][-1]

    monkeypatch.setattr(plot_worker, "start", start_spy)
    monkeypatch.setattr(plot_worker, "draw", draw_spy)
    return seen


def test_worker_writes_the_bytes_the_run_would_write_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spy: dict
) -> None:
    monkeypatch.setenv(plot_worker.ENV, "1")
    assert _run(tmp_path, "worker").exit_code == 0
    assert spy["drawn"] == [True] and spy["procs"][0].returncode == 0
    monkeypatch.setenv(plot_worker.ENV, "0")
    assert _run(tmp_path, "inline").exit_code == 0
    assert spy["procs"][1] is None and spy["drawn"][1] is False
    for name in PLOTS:
        worker, inline = tmp_path / "worker" / name, tmp_path / "inline" / name
        assert worker.read_bytes() == inline.read_bytes()


def test_a_failing_child_falls_back_to_drawing_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_start() -> None:
        plot_worker._proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"],
            stdin=subprocess.PIPE,
        )

    monkeypatch.setattr(plot_worker, "start", broken_start)
    assert _run(tmp_path, "out").exit_code == 0
    for name in PLOTS:
        assert (tmp_path / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failed_run_ends_its_child_and_writes_no_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spy: dict
) -> None:
    monkeypatch.setenv(plot_worker.ENV, "1")
    bad = {**TINY, "training": {**TINY["training"], "rounds": -1}}
    res = _run(tmp_path, "out", bad)
    assert res.exit_code == 2 and "rounds" in res.output
    proc = spy["procs"][0]
    assert proc is not None and proc.returncode == 0  # stdin closed: exited, drew nothing
    assert plot_worker._proc is None and spy["drawn"] == []
    assert not any((tmp_path / "out" / name).exists() for name in PLOTS)
