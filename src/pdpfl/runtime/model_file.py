"""The trained model as a named ``state_dict`` in safetensors, with the run's facts in its header.

``model.safetensors`` (and, with ``save_models: every-round``, ``models/round-NNNN.safetensors``)
holds the global model's trainable parameters under their torch names (``lin.weight``, ...), so
any tool that reads safetensors can load it. The header's metadata says what produced it: the
format, the pdpfl version, the config hash, the algorithm, the privacy unit, the round, the
headline ε, the typed privacy summary and the attack-risk card per budget group (JSON). No
pickle: safetensors stores raw arrays.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl._version import __version__
from pdpfl.checkpoint import finite
from pdpfl.io import write_bytes

__all__ = ["FORMAT", "MODEL_NAME", "model_metadata", "read_model", "write_model"]

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


def write_model(
    path: str | Path,
    params: list[np.ndarray],
    names: list[str] | None,
    metadata: dict[str, str],
) -> None:
    """Write ``params`` under ``names`` (default ``param.0``, ...) atomically."""
    from safetensors.numpy import save

    if names is None:
        names = [f"param.{i}" for i in range(len(params))]
    if len(names) != len(params) or len(set(names)) != len(names):
        raise ValueError(f"model: {len(params)} parameters need as many distinct names")
    tensors = {
        n: np.ascontiguousarray(np.asarray(p, dtype=np.float32))
        for n, p in zip(names, params, strict=True)
    }
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
