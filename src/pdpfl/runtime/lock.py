"""One run per output folder: an exclusive lock held while a command writes into a folder.

The lock is an advisory ``flock`` on ``<folder>/.pdpfl.lock``, which also records who holds it
(pid, host, start time, command). The kernel releases it when the process ends however it ends,
so a lock file left by a killed process is stale by construction: the next command takes it
over (and logs that it did). A second command on a held folder stops at once with an error
naming the process that holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LOCK_NAME", "RUN_OUTPUTS", "FolderLocked", "folder_lock", "output_folder"]

LOCK_NAME = ".pdpfl.lock"
#: What a command writes into its output folder (a folder holding none of them after a refused
#: command had no trace of pdpfl before it either).
RUN_OUTPUTS = ("metrics.jsonl", "summary.json", "checkpoint.npz", "compare.csv", "audit.json")
log = logging.getLogger(__name__)


class FolderLocked(ValueError):
    """Another process is writing to this folder."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info.get("since", 0))))
    return f"pid {info.get('pid')} on {info.get('host')} since {since} ({info.get('command', '?')})"


@contextlib.contextmanager
def folder_lock(
    folder: str | os.PathLike[str],
    option: str = "--out",
    *,
    wait_s: float = 0.0,
    name: str = LOCK_NAME,
) -> Iterator[Path]:
    """Hold the folder's exclusive lock for the block (creating the folder if needed).

    Raises :class:`FolderLocked` naming ``option`` and the holder when another process has it
    (still has it after ``wait_s`` seconds). ``name``: the lock file, for a lock on one
    owner's files in a shared folder (a Flower silo's, ``.pdpfl-silo-<i>.lock``).
    """
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    lock_path = path / name
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise FolderLocked(
                        f"{option}: {path} is in use by {_holder(lock_path)}; wait for it to "
                        "finish or choose another folder"
                    ) from None
                time.sleep(0.05)
        stale = os.fstat(fd).st_size > 0
        if stale:
            log.info(
                "took over a stale lock of %s (that process is no longer running)",
                _holder(lock_path),
            )
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.time(),
            "command": " ".join(sys.argv[:4])[:200],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def output_folder(out_dir: Path, *, created: bool, option: str = "--out") -> Iterator[None]:
    """Hold ``out_dir``'s lock (one command per output folder) for the block, and leave no trace
    of a command that wrote nothing: the lock file goes from a folder that existed without one
    (removed while still held: a process that opened it meanwhile is refused), and a folder
    this command ``created`` that holds nothing else goes too.

    Raises ValueError naming ``option`` when ``out_dir`` is not a folder, :class:`FolderLocked`
    when another process holds it, OSError when it cannot be written.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{option}: {out_dir} exists and is not a folder")
    lock_file = out_dir / LOCK_NAME
    had_lock = lock_file.exists()
    lock = folder_lock(out_dir, option=option)
    lock.__enter__()
    try:
        yield
    finally:
        if (
            not created
            and not had_lock
            and not any((out_dir / name).exists() for name in RUN_OUTPUTS)
        ):
            lock_file.unlink(missing_ok=True)
        lock.__exit__(None, None, None)
        if created and out_dir.is_dir() and not any(p.name != LOCK_NAME for p in out_dir.iterdir()):
            shutil.rmtree(out_dir, ignore_errors=True)  # nothing of ours was written
