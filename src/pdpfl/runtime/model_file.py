"""The trained model as a named ``state_dict`` in safetensors, with the run's facts in its header.

``model.safetensors`` (and, with ``save_models: every-round``, ``models/round-NNNN.safetensors``)
holds the global model's trainable parameters under their torch names (``lin.weight``, ...), so
any tool that reads safetensors can load it. The header's metadata says what produced it: the
format, the pdpfl version, the config hash, the algorithm, the privacy unit, the round, the
headline ε, the typed privacy summary and the attack-risk card per budget group (JSON). No
pickle: safetensors stores raw arrays.

Integrity (issue #34): a run's model files carry, in their header, the run id, the round they
were written at (``sealed_round``) and ``seal``, an HMAC under the operator's key
(:func:`pdpfl.integrity.tag`) over the tensors and every other header value, under the identity
``<run id>@<round>``. :func:`verified_model` -- what ``pdpfl export`` and
:func:`pdpfl.load_model` read through -- refuses a model whose tensors or header (its ε) were
edited, a model of another run, and a final model older than the run's checkpoint; a model file
that names no run is loaded with a warning that it is unverified. The seal survives
``pdpfl export --format safetensors`` (the same tensors and header).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl._version import __version__
from pdpfl.checkpoint import finite
from pdpfl.io import write_bytes

__all__ = [
    "FORMAT",
    "MODEL_NAME",
    "model_digest",
    "model_metadata",
    "read_model",
    "verified_model",
    "write_model",
]

#: Header keys of the seal (excluded from the digest: ``seal`` only).
SEAL_KEY = "seal"

MODEL_NAME = "model.safetensors"
FORMAT = "pdpfl-model-v1"


def model_metadata(summary: dict[str, Any], round_index: int | None = None) -> dict[str, str]:
    """The header of a run's model file (every value a string, as safetensors requires; a
    value that is not a finite number, such as ε = ∞ without DP, is ``null``)."""
    privacy = finite(summary.get("privacy"))
    rounds = summary.get("rounds_completed") if round_index is None else round_index + 1
    meta = {
        "format": FORMAT,
        "pdpfl_version": __version__,
        "config_hash": str(summary.get("config_hash")),
        "algorithm": str(summary.get("algorithm")),
        "privacy_unit": str(summary.get("privacy_unit")),
        "rounds": str(rounds),
        "epsilon": json.dumps(finite(summary.get("epsilon"))),
        "adversary": str(summary.get("adversary")),
    }
    if privacy is not None and round_index is None:
        meta["privacy"] = json.dumps(privacy, allow_nan=False)
    risk = finite(summary.get("risk"))
    if risk is not None and round_index is None:  # attack risk per budget group (ledger.risk)
        meta["risk"] = json.dumps(risk, allow_nan=False)
    return meta


def model_digest(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> bytes:
    """SHA-256 over the header (without ``seal``, canonical JSON) and every tensor (name, dtype,
    shape, bytes) in name order: what a model's seal covers."""
    import hashlib

    h = hashlib.sha256()
    head = {k: str(v) for k, v in metadata.items() if k != SEAL_KEY}
    h.update(json.dumps(head, sort_keys=True, separators=(",", ":")).encode())
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        h.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode())
        h.update(a.tobytes())
    return h.digest()


def write_model(
    path: str | Path,
    params: list[np.ndarray],
    names: list[str] | None,
    metadata: dict[str, str],
    *,
    run_id: str | None = None,
    round_count: int | None = None,
) -> None:
    """Write ``params`` under ``names`` (default ``param.0``, ...) atomically; with ``run_id``
    and ``round_count`` (rounds done when it was written) the header is sealed (module
    docstring)."""
    from safetensors.numpy import save

    if names is None:
        names = [f"param.{i}" for i in range(len(params))]
    if len(names) != len(params) or len(set(names)) != len(names):
        raise ValueError(f"model: {len(params)} parameters need as many distinct names")
    tensors = {
        n: np.ascontiguousarray(np.asarray(p, dtype=np.float32))
        for n, p in zip(names, params, strict=True)
    }
    metadata = {k: str(v) for k, v in metadata.items()}  # a copy keeps its seal (export)
    if run_id is not None and round_count is not None:
        metadata.pop(SEAL_KEY, None)
        from pdpfl.integrity import tag

        metadata.update(run_id=str(run_id), sealed_round=str(int(round_count)))
        metadata[SEAL_KEY] = tag(
            model_digest(tensors, metadata),
            purpose="model",
            identity=f"{run_id}@{int(round_count)}",
        ).hex()
    write_bytes(path, save(tensors, metadata=metadata))


def read_model(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The named parameters and the header metadata of a model file (ValueError otherwise)."""
    from safetensors import safe_open

    p = Path(path)
    try:
        with safe_open(str(p), framework="numpy") as f:
            metadata = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (no iteration)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{p}: not a readable safetensors model file ({exc})") from None
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{p}: not a pdpfl model file (format {metadata.get('format')!r})")
    return tensors, metadata


def _run_folder(path: Path) -> Path:
    """The run folder a model file sits in (``models/round-*`` one level down)."""
    parent = path.parent
    return parent.parent if parent.name == "models" else parent


def verified_model(
    path: str | Path, *, final: bool = True
) -> tuple[dict[str, np.ndarray], dict[str, str], str]:
    """``(tensors, header, note)`` of a model file, verified (module docstring).

    In a run folder (one with a checkpoint, or whose ``summary.json`` names a run) the model
    must be sealed by that run -- the final model (``final``) at the round its checkpoint
    records, a per-round model at most there -- else :class:`~pdpfl.integrity.IntegrityError`
    naming the file. Outside a run folder a sealed model is checked with this machine's key
    when it can be; a model that cannot be verified is returned with a warning
    (:class:`~pdpfl.ledger.runfolder.UnverifiedRunWarning`) and a ``note`` saying so.
    """
    import warnings

    from pdpfl.checkpoint import run_identity
    from pdpfl.integrity import IntegrityError, check_tag
    from pdpfl.ledger.runfolder import UnverifiedRunWarning, summary_run_id

    p = Path(path)
    tensors, metadata = read_model(p)
    run_dir = _run_folder(p)
    ident = run_identity(run_dir)
    named = metadata.get("run_id")
    seal = metadata.get(SEAL_KEY)
    if ident is None:
        in_run = summary_run_id(run_dir)
        if in_run is not None:
            raise IntegrityError(
                f"{p}: its run folder's summary.json names run {in_run}, but the checkpoint "
                f"({run_dir / 'checkpoint.npz'}) is missing: the model cannot be verified"
            )
        if named and seal and "sealed_round" in metadata:
            try:
                check_tag(
                    model_digest(tensors, metadata),
                    bytes.fromhex(seal),
                    purpose="model",
                    identity=f"{named}@{metadata['sealed_round']}",
                    what=str(p),
                )
                return (
                    tensors,
                    metadata,
                    (
                        f"sealed by run {named} at round {metadata['sealed_round']} (checked with "
                        "this machine's key; the run folder is not beside it)"
                    ),
                )
            except (IntegrityError, ValueError):
                pass
        note = f"NOT VERIFIED: {p} is not in a run folder pdpfl can check it against"
        warnings.warn(note, UnverifiedRunWarning, stacklevel=2)
        return tensors, metadata, note
    run_id, next_round = ident
    if not seal or not named or "sealed_round" not in metadata:
        raise IntegrityError(
            f"{p}: not sealed -- run {run_id} seals its models; this file was written or "
            "replaced by something else; refusing"
        )
    if named != run_id:
        raise IntegrityError(
            f"{p}: the model of another run ({named}); this folder's checkpoint is run {run_id}"
        )
    try:
        at = int(metadata["sealed_round"])
        found = bytes.fromhex(seal)
    except ValueError:
        raise IntegrityError(f"{p}: malformed seal") from None
    check_tag(
        model_digest(tensors, metadata),
        found,
        purpose="model",
        identity=f"{run_id}@{at}",
        what=str(p),
    )
    if (final and at != next_round) or at > next_round:
        raise IntegrityError(
            f"{p}: stale -- written at round {at}, but the run's checkpoint records round "
            f"{next_round}; refusing"
        )
    return tensors, metadata, f"verified: the model of run {run_id} at round {at}"
