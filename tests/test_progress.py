"""The one progress display (``pdpfl.runtime.progress.ProgressDisplay``) of every command."""

from __future__ import annotations

import io

import pytest

from pdpfl.runtime.progress import ProgressDisplay


def test_without_a_terminal_it_logs_plain_lines_first_and_last_round() -> None:
    out = io.StringIO()
    display = ProgressDisplay(3, enabled=True, terminal=False, stream=out)
    display.start("round")
    for r in (1, 2, 3):
        display.round_done(r, accuracy=0.25 * r)
    display.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("round 1/3") and "accuracy 0.2500" in lines[0]
    assert lines[-1].startswith("round 3/3") and "accuracy 0.7500" in lines[-1]
    assert len(lines) == 2  # round 2 came within the minute: not logged


def test_a_resumed_run_counts_from_its_checkpoint() -> None:
    out = io.StringIO()
    display = ProgressDisplay(5, 3, enabled=True, terminal=False, stream=out)
    display.start()
    display.round_done(4, accuracy=float("nan"), extra="ε max 1 (3rd)")
    assert out.getvalue().startswith("round 4/5") and "accuracy" not in out.getvalue()
    assert "ε max 1 (3rd)" in out.getvalue()


def test_disabled_it_shows_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    for terminal in (False, True):
        display = ProgressDisplay(2, enabled=False, terminal=terminal)
        display.start("silos", info="starting")
        display.update(completed=1, info="x")
        display.round_done(1, accuracy=0.5)
        assert not display.drawing
        display.close()
    assert capsys.readouterr().err == ""


def test_on_a_terminal_it_draws_one_bar_that_changes_phase(
    capsys: pytest.CaptureFixture[str],
) -> None:
    display = ProgressDisplay(4, enabled=True, terminal=True)
    display.start("silos", info="starting the federation")
    assert display.drawing and display.description == "silos"
    display.update(completed=4, info="4 connected")
    display.start("round", total=2, completed=0)
    assert display.description == "round"
    display.round_done(2, accuracy=0.5)
    display.close()
    display.close()  # idempotent
    assert not display.drawing
    err = capsys.readouterr().err
    assert "round" in err and "2/2" in err and "acc 0.500" in err
