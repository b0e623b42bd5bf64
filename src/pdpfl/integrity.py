"""Integrity of the state files pdpfl writes: sealed with an HMAC under a key the owning party
keeps outside its run folders, and a high-water mark that makes rollback visible.

Threat: someone who can write a run's output folder (or a silo's state folder) but is not the
party that owns it edits a checkpoint or a ledger -- zeroes the ledger counts, moves
``next_round`` back, swaps in an older checkpoint -- so that a resumed run under-counts ε or
skips rounds. Defence:

* every state file is *sealed*: its bytes are wrapped with ``HMAC-SHA256(key, purpose ‖
  run identity ‖ SHA-256(bytes))`` (:func:`seal`/:func:`unseal`); a file edited by anyone
  without the key fails verification, and a file of another run (or another purpose) too;
* the key is the owning party's (:func:`party_key`): 32 bytes from the OS CSPRNG in
  ``$PDPFL_KEY_DIR`` (default ``~/.local/share/pdpfl``, mode 0700/0600), never in a run
  folder, a config, a log or a message;
* a *high-water mark* per run (:func:`record_progress`/:func:`check_progress`), also kept in the
  key folder and sealed, holds the furthest round a run has checkpointed: a checkpoint older
  than the mark (a rollback that would make the ledgers forget charged rounds) is refused.

Someone who holds the key is the owner, against whom nothing can be protected; a corrupted or
truncated file is detected the same way. This module imports nothing of pdpfl.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

__all__ = [
    "IntegrityError",
    "check_progress",
    "check_tag",
    "is_sealed",
    "key_dir",
    "mark_id",
    "party_key",
    "record_progress",
    "seal",
    "tag",
    "unseal",
]

_MAGIC = b"PDPFL-SEALED-1\n"
_TAG = 32


class IntegrityError(ValueError):
    """A state file does not verify: tampered, corrupted, of another run, or rolled back."""


def key_dir() -> Path:
    """Where the keys and high-water marks of this machine's parties live."""
    base = os.environ.get("PDPFL_KEY_DIR")
    path = Path(base) if base else Path.home() / ".local" / "share" / "pdpfl"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def party_key(party: str = "operator") -> bytes:
    """The party's 32-byte sealing key (created from the OS CSPRNG on first use)."""
    if not party.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"party: {party!r} is not a plain name")
    path = key_dir() / f"{party}.key"
    if not path.exists():
        key = secrets.token_bytes(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, key)
        finally:
            os.close(fd)
    key = path.read_bytes()
    if len(key) != 32:
        raise IntegrityError(f"{path}: not a pdpfl key (expected 32 bytes)")
    return key


def _tag(key: bytes, purpose: str, identity: str, payload: bytes) -> bytes:
    header = json.dumps([purpose, identity]).encode()
    return hmac.new(key, header + hashlib.sha256(payload).digest(), hashlib.sha256).digest()


def tag(payload: bytes, *, purpose: str, identity: str, party: str = "operator") -> bytes:
    """The 32-byte integrity tag of ``payload`` alone (for a file that must keep its own format,
    e.g. a safetensors model, which carries it in its header)."""
    return _tag(party_key(party), purpose, identity, payload)


def check_tag(
    payload: bytes,
    found: bytes,
    *,
    purpose: str,
    identity: str,
    party: str = "operator",
    what: str = "file",
) -> None:
    """Raise :class:`IntegrityError` naming ``what`` unless ``found`` is :func:`tag` of it."""
    if not hmac.compare_digest(bytes(found), tag(payload, purpose=purpose, identity=identity,
                                                 party=party)):  # fmt: skip
        raise IntegrityError(
            f"{what}: its integrity tag does not verify -- it was edited, is corrupted, or was "
            f"sealed with another key than this machine's ({key_dir()})"
        )


def mark_id(identity: str) -> str:
    """The high-water mark name of a state that is not a plain run id (e.g. a Flower silo's)."""
    return hashlib.sha256(identity.encode()).hexdigest()[:32]


def seal(payload: bytes, *, purpose: str, identity: str, party: str = "operator") -> bytes:
    """``payload`` wrapped with its identity (in clear) and its tag (see the module docstring)."""
    ident = identity.encode()
    if len(ident) > 255:
        raise ValueError("identity: at most 255 bytes")
    tag = _tag(party_key(party), purpose, identity, payload)
    return _MAGIC + bytes([len(ident)]) + ident + tag + payload


def is_sealed(data: bytes) -> bool:
    """True if ``data`` starts like a sealed file."""
    return data.startswith(_MAGIC)


def unseal(
    data: bytes,
    *,
    purpose: str,
    identity: str | None = None,
    party: str = "operator",
    what: str = "state file",
) -> tuple[bytes, str]:
    """``(payload, identity)`` of a sealed file, verified with the party's key.

    ``identity``, when given, must be the one the file was sealed under (e.g. this run's id).
    Raises :class:`IntegrityError` naming ``what`` otherwise.
    """
    if not is_sealed(data) or len(data) < len(_MAGIC) + 1:
        raise IntegrityError(
            f"{what}: not sealed by pdpfl (tampered, corrupted, or written by "
            "a version without integrity tags)"
        )
    n = data[len(_MAGIC)]
    start = len(_MAGIC) + 1
    found = data[start : start + n].decode("utf-8", errors="replace")
    tag = data[start + n : start + n + _TAG]
    payload = data[start + n + _TAG :]
    if len(tag) != _TAG:
        raise IntegrityError(f"{what}: truncated")
    if identity is not None and found != identity:
        raise IntegrityError(f"{what}: it belongs to another run ({found}, not {identity})")
    if not hmac.compare_digest(tag, _tag(party_key(party), purpose, found, payload)):
        raise IntegrityError(
            f"{what}: its integrity tag does not verify -- it was edited, is corrupted, or was "
            f"sealed with another key than this machine's ({key_dir()})"
        )
    return payload, found


def _mark_path(run_id: str) -> Path:
    if not run_id.isalnum():
        raise ValueError(f"run id: {run_id!r} is not alphanumeric")
    folder = key_dir() / "runs"
    folder.mkdir(exist_ok=True, mode=0o700)
    return folder / f"{run_id}.mark"


def record_progress(run_id: str, next_round: int, party: str = "operator") -> None:
    """Raise the run's high-water mark to ``next_round`` (never lowers it)."""
    path = _mark_path(run_id)
    current = check_progress(run_id, None, party) if path.exists() else 0
    value = max(int(next_round), current)
    data = seal(str(value).encode(), purpose="high-water", identity=run_id, party=party)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def check_progress(run_id: str, next_round: int | None, party: str = "operator") -> int:
    """The run's high-water mark; with ``next_round``, refuse a checkpoint behind it."""
    path = _mark_path(run_id)
    if not path.exists():
        return 0
    payload, _ = unseal(
        path.read_bytes(),
        purpose="high-water",
        identity=run_id,
        party=party,
        what=f"high-water mark {path}",
    )
    mark = int(payload.decode())
    if next_round is not None and int(next_round) < mark:
        raise IntegrityError(
            f"the checkpoint is at round {int(next_round)} but this run already checkpointed "
            f"round {mark}: an older checkpoint was put back (its ledgers would forget charged "
            "rounds); refusing to resume"
        )
    return mark
