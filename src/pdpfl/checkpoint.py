"""What a run keeps on disk between rounds: ``metrics.jsonl`` and the sealed checkpoint.

After every round the round loop (:mod:`pdpfl.runtime.loop`) appends the round's line to
``metrics.jsonl`` and writes ``checkpoint.npz`` atomically (:func:`save_round`); a resumed run
reads both back. Checkpoints contain no pickle: arrays in an ``.npz`` read with
``allow_pickle=False`` and a JSON skeleton (:func:`pdpfl.io.encode_state`), sealed with the
operator's key (:mod:`pdpfl.integrity`: an HMAC over the run id and the bytes) and checked
against the run's high-water mark, so a truncated, tampered or rolled-back checkpoint is a clear
error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl.integrity import IntegrityError, check_progress, record_progress, seal, unseal
from pdpfl.io import decode_state, encode_state, signals_deferred, write_bytes, write_text

__all__ = [
    "CHECKPOINT_NAME",
    "config_changes",
    "LEGACY_CHECKPOINT_NAME",
    "METRICS_NAME",
    "finite",
    "finite_record",
    "has_checkpoint",
    "load_checkpoint",
    "read_metrics",
    "run_identity",
    "save_checkpoint",
    "save_round",
]

CHECKPOINT_NAME = "checkpoint.npz"
#: The first release's pickle checkpoint: never loaded (it could run code).
LEGACY_CHECKPOINT_NAME = "checkpoint.pkl"
METRICS_NAME = "metrics.jsonl"


def finite(obj: object) -> object:
    """JSON-safe copy: NaN/inf become None, numpy scalars become Python scalars."""
    if isinstance(obj, dict):
        return {str(k): finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def finite_record(record: Mapping[str, object]) -> dict[str, Any]:
    """A JSON record (``summary.json``) as :func:`finite` writes it: keys as text, NaN/inf as
    None, numpy scalars as Python scalars."""
    return {str(k): finite(v) for k, v in record.items()}


def read_metrics(out_dir: str | Path) -> list[dict[str, Any]]:
    """The per-round metrics lines written so far (empty list if none)."""
    path = Path(out_dir) / METRICS_NAME
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def save_round(out_dir: Path, metrics: list[dict[str, Any]], state: dict[str, Any]) -> None:
    """After a round: every metrics line so far to ``metrics.jsonl``, then the checkpoint
    (both atomic: a crash leaves the previous round's files, never half-written ones).

    A stop signal (Ctrl-C, SIGTERM, SIGHUP) that arrives meanwhile is delivered once both
    files and the run's high-water mark are written (:func:`pdpfl.io.signals_deferred`): an
    interrupted run keeps every round it finished."""
    with signals_deferred():
        write_text(
            out_dir / METRICS_NAME,
            "".join(json.dumps(finite(m), allow_nan=False) + "\n" for m in metrics),
        )
        save_checkpoint(out_dir, state)


def save_checkpoint(out_dir: Path, state: dict[str, Any]) -> None:
    """Write the round loop's state atomically as a pickle-free, sealed ``checkpoint.npz``
    (:mod:`pdpfl.integrity`: an HMAC under the operator's key over the run id and the bytes),
    then raise the run's high-water mark to its ``next_round``."""
    run_id = str(state["run_id"])
    write_bytes(
        out_dir / CHECKPOINT_NAME, seal(encode_state(state), purpose="checkpoint", identity=run_id)
    )
    record_progress(run_id, int(state["next_round"]))


def load_checkpoint(out_dir: str | Path) -> dict[str, Any] | None:
    """The last checkpoint written by the round loop, or None.

    Raises ``ValueError`` for a truncated or tampered file, and for a first-release
    ``checkpoint.pkl`` (pickle is never loaded: it could execute code).
    """
    out = Path(out_dir)
    path = out / CHECKPOINT_NAME
    if not path.exists():
        if (out / LEGACY_CHECKPOINT_NAME).exists():
            raise ValueError(
                f"cannot resume: {out / LEGACY_CHECKPOINT_NAME} is a pickle checkpoint, which "
                "pdpfl no longer loads (it could execute code); start the run again"
            )
        return None
    try:
        payload, run_id = unseal(path.read_bytes(), purpose="checkpoint", what=str(path))
        state = decode_state(payload)
        if not isinstance(state, dict) or "next_round" not in state or "params" not in state:
            raise ValueError("missing fields")
        if state.get("run_id") != run_id:
            raise IntegrityError("its run id does not match its seal")
        check_progress(run_id, int(state["next_round"]))
        state["params"] = [np.asarray(p, dtype=np.float32) for p in state["params"]]
        if not all(np.all(np.isfinite(p)) for p in state["params"]):
            raise ValueError("its model parameters are not finite")
        return state
    except IntegrityError as exc:
        raise IntegrityError(f"cannot resume: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"cannot resume: {path} is not a valid pdpfl checkpoint ({exc})") from None


def _top_level(payload: bytes, keys: tuple[str, ...]) -> dict[str, Any]:
    """The scalar top-level fields ``keys`` of an encoded state, reading only its JSON skeleton
    (no array is decoded)."""
    import io

    with np.load(io.BytesIO(payload), allow_pickle=False) as z:
        skeleton = json.loads(z["__skeleton__"].tobytes().decode("utf-8"))
    items = skeleton.get("__dict__") if isinstance(skeleton, dict) else None
    if not isinstance(items, list):
        raise ValueError("not a state dictionary")
    found = {k: v for k, v in items if k in keys}
    missing = [k for k in keys if k not in found]
    if missing:
        raise ValueError(f"missing fields {missing}")
    return found


def run_identity(out_dir: str | Path) -> tuple[str, int] | None:
    """``(run id, next round)`` that the run folder's checkpoint records, verified: its seal
    (the operator's key, the run id), its fields and the run's high-water mark (a checkpoint put
    back from an earlier round is refused). None when the folder holds no checkpoint.

    Raises :class:`~pdpfl.integrity.IntegrityError` naming the file otherwise. What a reader of
    a finished run trusts (``pdpfl privacy``, ``pdpfl export``, the Python API).
    """
    path = Path(out_dir) / CHECKPOINT_NAME
    if not path.is_file():
        return None
    payload, run_id = unseal(path.read_bytes(), purpose="checkpoint", what=str(path))
    try:
        fields = _top_level(payload, ("run_id", "next_round"))
        next_round = int(fields["next_round"])
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise IntegrityError(f"{path}: not a valid pdpfl checkpoint ({exc})") from None
    if fields["run_id"] != run_id:
        raise IntegrityError(f"{path}: its run id does not match its seal")
    try:
        check_progress(run_id, next_round)
    except IntegrityError as exc:
        raise IntegrityError(f"{path}: {exc}".replace("; refusing to resume", "")) from None
    return run_id, next_round


def _flat(obj: object, prefix: str = "") -> dict[str, object]:
    if isinstance(obj, dict) and obj:
        out: dict[str, object] = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def config_changes(before: object, now: object, limit: int = 6) -> list[str]:
    """``field (old → new)`` for every dotted field whose value differs between two config
    dictionaries (a field only one of them has counts as changed); at most ``limit`` entries,
    then ``...``."""
    if not isinstance(before, dict) or not isinstance(now, dict):
        return []
    a, b = _flat(before), _flat(now)
    out = []
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<unset>") != b.get(key, "<unset>"):
            old, new = (json.dumps(x.get(key, "<unset>")) for x in (a, b))
            out.append(f"{key} ({_short(old)} → {_short(new)})")
    return out[:limit] + (["..."] if len(out) > limit else [])


def _short(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def has_checkpoint(out_dir: str | Path) -> bool:
    """True if ``out_dir`` holds a run checkpoint (current or first-release format)."""
    out = Path(out_dir)
    return (out / CHECKPOINT_NAME).exists() or (out / LEGACY_CHECKPOINT_NAME).exists()
