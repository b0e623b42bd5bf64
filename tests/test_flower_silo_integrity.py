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
    grid = FakeGrid(toy_run_config(config, out), out / "silo-state", 2, mode="per-message",
                    monkeypatch=monkeypatch)
    result = serve(grid, out)
    assert result["status"] == "ok", result.get("error")
    run_key = result["run_key"]
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
        (f / "silo-1.npz").read_bytes()[:40]),
    "zeroed, unsealed state": lambda f: (f / "silo-1.npz").write_bytes(encode_state(
        {"fits": 0, "fit_rounds": [], "evaluated_until": -1})),
    "edited releases": lambda f: _flip_last_byte(f / "releases-silo-1.npz"),
    "another silo's state": lambda f: shutil.copyfile(
        f.parents[1] / "silo-0" / f.name / "silo-0.npz", f / "silo-1.npz"),
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
