"""Stop signals end a command exactly as Ctrl-C does, and never split a round's files (issue #36
item 1), in-process: the mechanisms (:mod:`pdpfl.runtime.signals`, :func:`pdpfl.io.
signals_deferred`) and every command's exit path. ``tests/test_kill_matrix.py`` sends the
signals to real ``pdpfl`` processes.

Before: SIGTERM and SIGHUP killed the process where it stood (exit 143/129 from the shell, no
resume command, ``.checkpoint.npz.*.tmp`` left when it landed inside a write); a command without
its own Ctrl-C handling printed click's ``Aborted!`` and exited 1.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.io import signals_deferred, write_bytes
from pdpfl.runtime.signals import Interrupted, exit_code, stop_signals_interrupt

SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits_demo.yaml"


@pytest.fixture
def sigint_as_from_a_terminal() -> Iterator[None]:
    """SIGINT handled as Python does in a terminal, also where the test runner inherited it
    ignored (a shell's background job); pdpfl keeps an ignored signal ignored."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.mark.usefixtures("sigint_as_from_a_terminal")
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_each_stop_signal_raises_interrupted_with_its_exit_code(sig: int) -> None:
    with pytest.raises(Interrupted) as caught, stop_signals_interrupt():
        os.kill(os.getpid(), sig)
        for _ in range(1000):  # the handler runs between bytecodes
            pass
    assert caught.value.signum == sig
    assert isinstance(caught.value, KeyboardInterrupt)
    assert exit_code(caught.value) == 128 + sig
    assert exit_code(KeyboardInterrupt()) == 130


def test_handlers_are_restored_and_an_ignored_signal_stays_ignored() -> None:
    before = {s: signal.getsignal(s) for s in SIGNALS}
    old_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with stop_signals_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # ignored: nothing raised
            assert signal.getsignal(signal.SIGTERM) not in (before[signal.SIGTERM], None)
    finally:
        signal.signal(signal.SIGHUP, old_hup)
    assert {s: signal.getsignal(s) for s in SIGNALS} == before


def test_a_second_signal_while_unwinding_does_not_interrupt_the_clean_up(capfd) -> None:
    cleaned = False
    with pytest.raises(Interrupted), stop_signals_interrupt():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # the scheduler insists
            for _ in range(1000):
                pass
            cleaned = True
    assert cleaned
    assert "SIGTERM: already stopping" in capfd.readouterr().err


def test_a_signal_during_a_write_is_delivered_after_it(tmp_path: Path) -> None:
    target = tmp_path / "state.bin"
    with pytest.raises(Interrupted) as caught, stop_signals_interrupt():
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # would have raised here without the deferral
                pass
            write_bytes(target, b"complete")
        raise AssertionError("the held signal must be delivered when the block ends")
    assert caught.value.signum == signal.SIGTERM
    assert target.read_bytes() == b"complete"
    assert [p.name for p in tmp_path.iterdir()] == ["state.bin"]


def test_a_signal_inside_save_round_keeps_the_round_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal lands between ``metrics.jsonl`` and the checkpoint (the window in which
    SIGTERM used to leave a round half-saved): both are written, then the run stops."""
    import pdpfl.checkpoint as checkpoint

    real = checkpoint.save_checkpoint

    def save_checkpoint(out_dir: Path, state: dict) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
        real(out_dir, state)

    monkeypatch.setattr(checkpoint, "save_checkpoint", save_checkpoint)
    state = {
        "next_round": 1,
        "params": [np.ones(3, dtype=np.float32)],
        "run_id": os.urandom(16).hex(),  # the machine's high-water marks are kept per run id
        "seconds": 0.0,
    }
    with pytest.raises(Interrupted), stop_signals_interrupt():
        checkpoint.save_round(tmp_path, [{"round": 0, "accuracy": 0.5}], state)
    assert len(checkpoint.read_metrics(tmp_path)) == 1
    loaded = checkpoint.load_checkpoint(tmp_path)
    assert loaded is not None and loaded["next_round"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def _send(sig: int):
    def command(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), sig)
        for _ in range(1000):
            pass
        raise AssertionError("not interrupted")

    return command


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_command_without_its_own_clean_up_exits_128_plus_the_signal(
    sig: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pdpfl.cli.account as account

    monkeypatch.setattr(account, "print_json", _send(sig))
    res = CliRunner().invoke(
        app, ["account", "--sigma", "1", "--delta", "1e-5", "--q", "0.1", "--json"]
    )
    assert res.exit_code == 128 + sig, res.output
    assert f"interrupted ({signal.Signals(sig).name})" in res.output
    assert "Traceback" not in res.output and "Aborted" not in res.output


def test_an_interrupted_audit_writes_nothing_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pdpfl.cli.audit as audit

    class Session:  # the planted run, stopped while it trains
        execute = staticmethod(_send(signal.SIGTERM))

    monkeypatch.setattr(audit, "_session", lambda config, settings: Session())
    out = tmp_path / "audit"
    res = CliRunner().invoke(
        app,
        ["audit", str(EXAMPLE), "--set", "rounds=1", "--canaries", "4", "--out", str(out)],
    )
    assert res.exit_code == 143, res.output
    assert "interrupted (SIGTERM)" in res.output and "nothing was written" in res.output
    assert not out.exists()


def test_an_interrupted_reproduce_exits_143(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import pdpfl.reproduce

    monkeypatch.setattr(pdpfl.reproduce, "reproduce", _send(signal.SIGTERM))
    res = CliRunner().invoke(app, ["reproduce", "rpdp-fl", "--smoke", "--out", str(tmp_path)])
    assert res.exit_code == 143, res.output
    assert "interrupted (SIGTERM): the runs finished so far are under" in res.output


def test_an_interrupted_flower_run_reports_its_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("flwr")
    import pdpfl.runtime.flower as flower
    from pdpfl.runtime.flower.processes import FlowerInterrupted

    def stopped(config: object, out_dir: Path, *args: object, **kwargs: object) -> None:
        raise FlowerInterrupted(Path(out_dir), 2, signal.SIGHUP)

    monkeypatch.setattr(flower, "run_flower", stopped)
    res = CliRunner().invoke(
        app, ["run", str(EXAMPLE), "--runtime", "flower", "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 129, res.output
    assert "interrupted (SIGHUP) after 2 round(s)" in res.output
    assert "--resume" in res.output and "--runtime flower" in res.output


class _Privacy:
    """The part of a typed privacy summary the progress line reads."""

    private = True
    observers = ("third-party", "server")

    def spent_max(self, observer: str) -> float:
        return {"third-party": 0.25, "server": 0.5}[observer]


def test_progress_lines_without_a_terminal() -> None:
    """Item 7: plain lines, the first and last round always, otherwise one per interval."""
    import io

    from pdpfl.runtime.progress import ProgressLines

    now = [0.0]
    out = io.StringIO()
    lines = ProgressLines(5, interval_s=60.0, stream=out, clock=lambda: now[0])
    logged = []
    for r, t in zip(range(1, 6), (5.0, 30.0, 70.0, 90.0, 95.0), strict=True):
        now[0] = t
        logged.append(lines.round_done(r, 0.5 + r / 100, _Privacy() if r > 1 else None))
    assert [x is not None for x in logged] == [True, False, True, False, True]
    text = out.getvalue().splitlines()
    assert text[0] == "round 1/5 · 0:00:05 elapsed · accuracy 0.5100"
    assert text[1] == (
        "round 3/5 · 0:01:10 elapsed · accuracy 0.5300 · max ε 0.25 (third party), 0.5 (server)"
    )
    assert text[-1].startswith("round 5/5 · 0:01:35 elapsed")
