"""The console-script entry point ends the process lightly, and only when nothing is lost
(issue #26 item 4).

:func:`pdpfl.cli.main` freezes the module graph after a command (so that the interpreter's
exit does not traverse it again), but only when no object has a finalizer that exit would have
to run: an unflushed file or a user's ``__del__`` keeps the normal exit. Each end-to-end case
runs in a fresh interpreter: ``main`` is meant to end its process.
"""

from __future__ import annotations

import gc
import io
import subprocess
import sys
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from pdpfl import __version__
from pdpfl.cli._process import exit_needs_collector

MAIN = (
    "import atexit, gc, sys\n"
    "from pdpfl.cli import main\n"
    "sys.argv = ['pdpfl', '--version']\n"
    "atexit.register(lambda: open('atexit.txt', 'w').write('ran'))\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    sys.stderr.write(f'frozen={gc.get_freeze_count()}\\n')\n"
)


def _run(setup: str, tmp_path: Path) -> int:
    """Run ``setup`` then ``pdpfl --version`` through ``main``; the frozen-object count."""
    res = subprocess.run(
        [sys.executable, "-c", setup + MAIN],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == __version__
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    return int(res.stderr.strip().splitlines()[-1].removeprefix("frozen="))


def test_a_clean_exit_freezes_the_module_graph(tmp_path: Path) -> None:
    assert _run("", tmp_path) > 1000


def test_an_unflushed_file_keeps_the_normal_exit(tmp_path: Path) -> None:
    # left open and unflushed in a module whose globals are in a cycle (the function): only
    # the exit's collector flushes it, so nothing may be frozen
    setup = "log = open('buffered.txt', 'w')\nlog.write('flushed')\ndef f(): pass\n"
    assert _run(setup, tmp_path) == 0
    assert (tmp_path / "buffered.txt").read_text() == "flushed"


def test_a_finalizer_in_a_cycle_keeps_the_normal_exit(tmp_path: Path) -> None:
    setup = (
        "class Holder:\n"
        "    def __del__(self, _open=open):\n"  # builtins may be gone when it runs
        "        _open('finalized.txt', 'w').write('yes')\n"
        "a, b = Holder(), Holder()\n"
        "a.other, b.other = b, a\n"
    )
    assert _run(setup, tmp_path) == 0
    assert (tmp_path / "finalized.txt").read_text() == "yes"


def test_main_keeps_the_exit_code_of_a_bad_input(tmp_path: Path) -> None:
    code = "import sys\nfrom pdpfl.cli import main\nsys.argv = ['pdpfl', 'run']\nmain()\n"
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=tmp_path,
    )
    assert res.returncode == 2
    assert res.stderr.startswith("error: ")
    assert "Traceback" not in res.stderr


def _plain() -> Iterator[int]:
    yield 1


def _cleanup() -> Generator[int, None, None]:
    try:
        yield 1
    finally:
        pass


class _UserFinalizer:
    def __del__(self) -> None:
        pass


def test_which_finalizers_need_the_collector(tmp_path: Path) -> None:
    from pyparsing import Forward

    plain, cleanup = _plain(), _cleanup()
    next(plain)
    next(cleanup)
    closed = open(tmp_path / "closed.txt", "w")  # noqa: SIM115
    closed.close()
    (tmp_path / "read.txt").write_text("x")
    with open(tmp_path / "read.txt") as read, open(tmp_path / "w.txt", "w") as written:
        assert not exit_needs_collector(
            [
                plain,
                closed,
                read,
                io.BytesIO(),
                io.StringIO(),
                Forward(),
                sys.stdout,
                sys.stderr.buffer,
                object(),
            ]
        )
        assert exit_needs_collector([cleanup])
        assert exit_needs_collector([written])
        assert exit_needs_collector([_UserFinalizer()])
    cleanup.close()


def test_the_collector_pauses_only_for_a_console_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pdpfl.cli import _process

    with _process.collector_paused() as paused:  # under CliRunner / embedded: nothing changes
        assert not paused
        assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    monkeypatch.setattr(_process, "ENDS_PROCESS", True)
    try:
        try:
            with _process.collector_paused() as paused:
                assert paused
                assert not gc.isenabled()
                raise ValueError("bad config")
        except ValueError:
            pass
        assert gc.isenabled()  # on again however the block ended ...
        assert gc.get_freeze_count() > 0  # ... with what the block built frozen
    finally:
        gc.unfreeze()


def test_a_refused_run_leaves_the_collector_on(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("algorithm:\n  name: nope\n")
    code = (
        "import gc, sys\n"
        "from pdpfl.cli import main\n"
        "sys.argv = ['pdpfl', 'run', 'bad.yaml']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as stop:\n"
        "    print(stop.code, gc.isenabled())\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=tmp_path,
    )
    assert res.stdout.split() == ["2", "True"], res.stderr
    assert res.stderr.startswith("error: ")
    assert "algorithm.name: unknown algorithm 'nope'" in res.stderr


def test_a_failing_check_keeps_the_normal_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    from pdpfl.cli import _process

    def broken(objects: object) -> bool:
        raise RuntimeError("an object that cannot be inspected")

    monkeypatch.setattr(_process, "exit_needs_collector", broken)
    _process.lighten_exit()  # no exception: the command's own exit code stands
    assert gc.get_freeze_count() == 0
