"""A Flower silo's state folder cannot be edited, swapped or rolled back (issue #23, item 3).

The toy federation (:mod:`test_flower_toy`) runs through the real ServerApp and ClientApp over
the in-memory grid; then the silo's state folder is attacked as someone who can write it (but
does not hold the silo's key) would, and a process that rebuilds the silo must refuse it with an
error naming the file. Every case was accepted silently before the state files were sealed.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flwr")

from pdpfl.integrity import IntegrityError  # noqa: E402
from pdpfl.io import encode_state  # noqa: E402
from pdpfl.runtime.flower.hooks import WARM_ENV  # noqa: E402
from test_flower_toy import (  # noqa: E402,F401
    FakeGrid,
    serve,
    task_identity,
    toy_config,
    toy_run_config,
)


def _run(tmp_path: Path, monkeypatch: Any) -> tuple[FakeGrid, str, Path]:
    config = toy_config(num_silos=2, rounds=2)
    out = tmp_path / "flower"
    grid = FakeGrid(
        toy_run_config(config, out),
        out / "silo-state",
        2,
        mode="per-message",
        monkeypatch=monkeypatch,
    )
    result = serve(grid, out)
    assert result["status"] == "ok", result.get("error")
    run_key = result["run_key"]
    from pdpfl.runtime.flower.silo import HOST

    HOST.clear()  # the run is over: its silo processes are gone (their locks released)
    return grid, run_key, out / "silo-state" / "silo-1" / f"run-{run_key}"


def _rebuild(grid: FakeGrid, run_key: str, silo: int = 1) -> Any:
    """What a fresh process does for a message to ``silo``: rebuild it from its folder."""
    from pdpfl.runtime.flower.silo import HOST

    HOST.clear()
    built = HOST.silo(grid.run_config, grid.node_configs[grid.node_of(silo)], run_key)
    built.ensure_client("{}")
    return built


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.usefixtures("task_identity")
def test_an_untouched_folder_loads(tmp_path: Path, monkeypatch: Any) -> None:
    grid, run_key, _ = _run(tmp_path, monkeypatch)
    silo = _rebuild(grid, run_key)
    assert silo.client.fits == 2 and silo.generation > 0


ATTACKS = {
    "edited state": lambda f: _flip_last_byte(f / "silo-1.npz"),
    "truncated state": lambda f: (f / "silo-1.npz").write_bytes(
        (f / "silo-1.npz").read_bytes()[:40]
    ),
    "zeroed, unsealed state": lambda f: (f / "silo-1.npz").write_bytes(
        encode_state({"fits": 0, "fit_rounds": [], "evaluated_until": -1})
    ),
    "edited releases": lambda f: _flip_last_byte(f / "releases-silo-1.npz"),
    "another silo's state": lambda f: shutil.copyfile(
        f.parents[1] / "silo-0" / f.name / "silo-0.npz", f / "silo-1.npz"
    ),
    "state folder deleted": lambda f: shutil.rmtree(f),
}
MESSAGES = {
    "edited state": "silo-1.npz: its integrity tag does not verify",
    "truncated state": "silo-1.npz: truncated",
    "zeroed, unsealed state": "silo-1.npz: not sealed by pdpfl",
    "edited releases": "releases-silo-1.npz: its integrity tag does not verify",
    "another silo's state": "silo-1.npz: its integrity tag does not verify",
    "state folder deleted": "the state folder was deleted or replaced",
}


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_tampered_silo_state_is_refused_naming_the_file(
    tmp_path: Path, monkeypatch: Any, attack: str
) -> None:
    grid, run_key, folder = _run(tmp_path, monkeypatch)
    ATTACKS[attack](folder)
    with pytest.raises(IntegrityError, match=MESSAGES[attack]):
        _rebuild(grid, run_key)


@pytest.mark.usefixtures("task_identity")
def test_a_rolled_back_state_folder_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    """An older (validly sealed) copy of the folder put back would make the ledger forget."""
    grid, run_key, folder = _run(tmp_path, monkeypatch)
    backup = tmp_path / "backup"
    shutil.copytree(folder, backup)
    silo = _rebuild(grid, run_key)
    silo.save("fit", 2, 0.0, None)  # the silo goes on (e.g. a resumed run's round)
    shutil.rmtree(folder)
    shutil.copytree(backup, folder)
    with pytest.raises(IntegrityError, match="an older copy of the state folder was put back"):
        _rebuild(grid, run_key)


@pytest.mark.usefixtures("task_identity")
def test_files_of_different_copies_are_not_mixed(tmp_path: Path, monkeypatch: Any) -> None:
    grid, run_key, folder = _run(tmp_path, monkeypatch)
    old_releases = (folder / "releases-silo-1.npz").read_bytes()
    silo = _rebuild(grid, run_key)
    silo.save("fit", 2, 0.0, None)
    silo.save("fit", 3, 0.0, None)
    (folder / "releases-silo-1.npz").write_bytes(old_releases)
    with pytest.raises(IntegrityError, match="releases-silo-1.npz: it was written at state gen"):
        _rebuild(grid, run_key)


# ------------------------------------------------------------ one process per silo state


@pytest.mark.usefixtures("task_identity")
def test_a_silo_state_folder_in_use_by_another_process_is_refused(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Two SuperNodes with the same --state-dir: the second one is refused, naming the first;
    once the first is gone (killed: the kernel drops its lock) the folder is taken over."""
    import subprocess
    import sys

    from pdpfl.runtime.lock import FolderLocked

    grid, run_key, folder = _run(tmp_path, monkeypatch)
    monkeypatch.setenv(WARM_ENV, "1")  # a warm worker: refused at once (no wait)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pdpfl.runtime.lock import folder_lock\n"
            "with folder_lock(sys.argv[1], option='--state-dir', name='.pdpfl-silo-1.lock'):\n"
            "    print('held', flush=True); time.sleep(60)",
            str(folder),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderLocked, match=rf"--state-dir: .* in use by pid {holder.pid}"):
            _rebuild(grid, run_key)
    finally:
        holder.kill()
        holder.wait(10)
    assert (folder / ".pdpfl-silo-1.lock").read_text()  # the killed holder's record is left
    silo = _rebuild(grid, run_key)  # ... and taken over
    assert silo.client.fits == 2


@pytest.mark.usefixtures("task_identity")
def test_a_warm_process_holds_the_lock_across_messages(tmp_path: Path, monkeypatch: Any) -> None:
    from pdpfl.runtime.flower.silo import HOST
    from pdpfl.runtime.lock import FolderLocked, folder_lock

    grid, run_key, folder = _run(tmp_path, monkeypatch)
    _rebuild(grid, run_key)
    # the same process, a second message: served (the lock is per folder, not per message)
    node_config = grid.node_configs[grid.node_of(1)]
    assert HOST.silo(grid.run_config, node_config, run_key).client is not None
    lock = ".pdpfl-silo-1.lock"
    with pytest.raises(FolderLocked), folder_lock(folder, name=lock):  # anyone else: refused
        pass
    with folder_lock(folder, name=".pdpfl-silo-0.lock"):  # another silo's state: its own lock
        pass
    HOST.clear()  # the silo leaves memory: its state is free again
    with folder_lock(folder, name=lock):
        pass
