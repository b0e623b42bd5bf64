"""One run per output folder: a second writer stops at once naming the holder; a lock left by
a killed process is taken over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pdpfl.runtime.lock import LOCK_NAME, FolderLocked, folder_lock


def _hold(folder, seconds: float) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import time
        from pdpfl.runtime.lock import folder_lock
        with folder_lock({str(folder)!r}):
            print("held", flush=True)
            time.sleep({seconds})
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_holder(tmp_path) -> None:
    proc = _hold(tmp_path / "run", 30)
    try:
        with (
            pytest.raises(FolderLocked, match=rf"in use by pid {proc.pid}"),
            folder_lock(tmp_path / "run"),
        ):
            pass
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_holders_lock_is_taken_over(tmp_path) -> None:
    proc = _hold(tmp_path / "run", 30)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (tmp_path / "run" / LOCK_NAME).read_text()  # the dead process's record is still there
    start = time.monotonic()
    with folder_lock(tmp_path / "run"):
        assert str(os.getpid()) in (tmp_path / "run" / LOCK_NAME).read_text()
    assert time.monotonic() - start < 5


def test_two_cli_runs_on_one_folder(tmp_path) -> None:
    from typer.testing import CliRunner

    from pdpfl.cli import app

    proc = _hold(tmp_path / "out", 30)
    try:
        example = str(Path(__file__).resolve().parents[1] / "examples" / "digits_demo.yaml")
        res = CliRunner().invoke(
            app, ["run", example, "--out", str(tmp_path / "out"), "--set", "rounds=1"]
        )
        assert res.exit_code == 2 and "in use by pid" in res.output
    finally:
        proc.kill()
        proc.wait()


def test_a_waiting_lock_gets_the_folder_once_it_is_free(tmp_path) -> None:
    """``wait_s``: a per-message silo process waits for the one before it (bounded)."""
    import threading

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with folder_lock(tmp_path):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(10)
        with pytest.raises(FolderLocked, match="in use by"), folder_lock(tmp_path, wait_s=0.2):
            pass
        threading.Timer(0.2, release.set).start()
        with folder_lock(tmp_path, wait_s=10):
            pass
    finally:
        release.set()
        thread.join(10)
