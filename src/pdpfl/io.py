"""Atomic file output: write to a temporary file in the same folder, then rename.

A crash or a validation error never leaves a half-written file behind, and neither does a stop
signal: while a file is written, SIGINT, SIGTERM and SIGHUP are held and delivered once it is
in place or removed (:func:`signals_deferred`; a scheduler's SIGTERM would otherwise kill the
process between the temporary file and its rename). SIGKILL cannot be held: a temporary file
``.<name>.<random>.tmp`` it leaves is never read (:func:`stale_temporaries` finds them).
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeAlias, TypeGuard

import numpy as np

#: A JSON value of plain data (what :func:`json.loads` returns; what :func:`write_json` writes).
JsonValue: TypeAlias = "None | bool | int | float | str | list[JsonValue] | dict[str, JsonValue]"

#: The signals that stop a command (Ctrl-C, a scheduler's stop, a closed terminal).
STOP_SIGNALS: tuple[int, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)

_deferring = threading.local()


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold :data:`STOP_SIGNALS` during the block, then deliver the first one that arrived.

    The signal reaches whatever handler was installed before the block (``KeyboardInterrupt``
    for SIGINT, :func:`pdpfl.runtime.signals.stop_signals_interrupt`'s, Flower's graceful exit,
    or the default action) right after the block, so a write is never cut in the middle.
    Nested blocks hold until the outermost ends. Only the main thread can install handlers;
    in other threads the block changes nothing.
    """
    if threading.current_thread() is not threading.main_thread() or getattr(
        _deferring, "active", False
    ):
        yield
        return
    arrived: list[int] = []

    def hold(signum: int, frame: object) -> None:
        arrived.append(signum)

    previous: dict[int, object] = {}
    _deferring.active = True
    try:
        for sig in STOP_SIGNALS:
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN or current is None:  # ignored, or not set from Python
                continue
            previous[sig] = current
            signal.signal(sig, hold)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        _deferring.active = False
        if arrived:
            signal.raise_signal(arrived[0])


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it is renamed onto ``path``.

    Stop signals are held until the file is in place or its temporary file is removed
    (:func:`signals_deferred`).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with signals_deferred():
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        try:
            yield tmp_path
            os.replace(tmp_path, target)
        finally:
            if tmp_path.exists():
                tmp_path.unlink()


def stale_temporaries(folder: str | os.PathLike[str], names: tuple[str, ...]) -> list[Path]:
    """Temporary files :func:`atomic_path` left in ``folder`` for the files ``names`` (only a
    process killed with SIGKILL, or a machine that lost power, leaves them)."""
    base = Path(folder)
    if not base.is_dir():
        return []
    return sorted(p for name in names for p in base.glob(f".{name}.*.tmp") if p.is_file())


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike[str], obj: object, indent: int | None = 2) -> None:
    write_text(path, json.dumps(obj, indent=indent, allow_nan=False) + "\n")


def save_npy(path: str | os.PathLike[str], array: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, np.asarray(array), allow_pickle=False)
    write_bytes(path, buf.getvalue())


def save_npz(path: str | os.PathLike[str], **arrays: np.ndarray) -> None:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})  # type: ignore[arg-type]
    write_bytes(path, buf.getvalue())


# --------------------------------------------------------------------------- state files


class _Tensor(Protocol):
    """What :func:`encode_state` reads of a torch tensor (torch is not imported here)."""

    def detach(self) -> _Tensor: ...
    def cpu(self) -> _Tensor: ...
    def numpy(self) -> np.ndarray: ...


def _is_tensor(obj: object) -> TypeGuard[_Tensor]:
    return type(obj).__module__ == "torch" and type(obj).__name__ == "Tensor"


def encode_state(state: object) -> bytes:
    """Serialise nested dicts/lists of scalars, NumPy arrays and torch tensors, without pickle.

    Dictionary keys keep their type (``int`` or ``str``); tuples come back as lists.
    """
    arrays: dict[str, np.ndarray] = {}

    def walk(obj: object) -> JsonValue:
        if isinstance(obj, dict):
            return {"__dict__": [[k, walk(v)] for k, v in obj.items()]}
        if isinstance(obj, list | tuple):
            return [walk(v) for v in obj]
        if isinstance(obj, np.ndarray):
            key = f"a{len(arrays)}"
            arrays[key] = obj
            return {"__array__": key}
        if _is_tensor(obj):
            key = f"a{len(arrays)}"
            arrays[key] = obj.detach().cpu().numpy()
            return {"__tensor__": key}
        if isinstance(obj, np.generic):
            obj = obj.item()
        if isinstance(obj, float) and not math.isfinite(obj):
            return {"__float__": repr(obj)}
        if obj is None or isinstance(obj, bool | int | float | str):
            return obj
        raise TypeError(f"cannot store a {type(obj).__name__} in a silo state file")

    skeleton = json.dumps(walk(state)).encode("utf-8")
    buf = io.BytesIO()
    arrays["__skeleton__"] = np.frombuffer(skeleton, dtype=np.uint8)
    np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy stubs: **kwds
    return buf.getvalue()


def decode_state(data: bytes) -> object:
    """Inverse of :func:`encode_state`; a truncated or tampered file raises ``ValueError``.

    Nothing in the file is executed: arrays are read with ``allow_pickle=False`` and the rest is
    JSON.
    """
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        skeleton = json.loads(arrays.pop("__skeleton__").tobytes().decode("utf-8"))
    except Exception as exc:  # zipfile/JSON/unicode/pickle-refusal errors alike
        raise ValueError(f"not a valid pdpfl state file ({type(exc).__name__}: {exc})") from None

    def walk(obj: object) -> object:
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if isinstance(obj, dict):
            if "__dict__" in obj:
                return {k: walk(v) for k, v in obj["__dict__"]}
            if "__array__" in obj:
                if obj["__array__"] not in arrays:
                    raise ValueError("not a valid pdpfl state file (missing array)")
                return arrays[obj["__array__"]]
            if "__tensor__" in obj:
                import torch

                return torch.from_numpy(arrays[obj["__tensor__"]].copy())
            if "__float__" in obj:
                return float(obj["__float__"])
        return obj

    return walk(skeleton)


def decode_state_dict(data: bytes) -> dict[str, Any]:
    """:func:`decode_state` of a state dictionary (``state_dict()``); ``ValueError`` if the file
    holds anything else."""
    state = decode_state(data)
    if not isinstance(state, dict):
        raise ValueError(f"not a valid pdpfl state file (a {type(state).__name__}, not a dict)")
    return state
