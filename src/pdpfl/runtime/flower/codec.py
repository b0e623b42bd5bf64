"""Lossless encodings of pdpfl values into Flower records and silo state files.

Flower messages carry three record types (``flwr.app``): :class:`ArrayRecord` for
:data:`~pdpfl.fl.api.Params` (bit-exact: arrays travel as ``.npy`` bytes),
:class:`ConfigRecord` for configuration and :class:`MetricRecord` for numeric metrics.
A silo's algorithm state (ledger, counters: nested dictionaries of arrays and scalars) is
written to its own disk as a ``.npz`` archive without pickle (:func:`encode_state`).
"""

from __future__ import annotations

import io
import json
import math
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from pdpfl.fl.api import Params, Scalars

#: ConfigRecord key holding the values a ConfigRecord cannot store natively (None, nested).
_JSON_KEY = "pdpfl.json"


def params_to_record(params: Params) -> ArrayRecord:
    """An ArrayRecord holding ``params`` in order (dtype and shape preserved)."""
    return ArrayRecord([np.ascontiguousarray(p) for p in params])


def record_to_params(record: ArrayRecord) -> Params:
    return [np.asarray(a) for a in record.to_numpy_ndarrays()]


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return value


def scalars_to_config(values: Scalars) -> ConfigRecord:
    """Encode ``values`` exactly; int/float/str/bool go natively, anything else as JSON."""
    native: dict[str, Any] = {}
    other: dict[str, Any] = {}
    for key, raw in values.items():
        value = _plain(raw)
        if isinstance(value, bool | int | str | bytes) or (
            isinstance(value, float) and math.isfinite(value)
        ):
            native[str(key)] = value
        else:
            other[str(key)] = value
    if other:
        native[_JSON_KEY] = json.dumps(other, default=json_default)
    return ConfigRecord(native)


def config_to_scalars(record: ConfigRecord) -> Scalars:
    out: Scalars = {}
    for key, value in record.items():
        if key == _JSON_KEY:
            out.update(json.loads(str(value)))
        else:
            out[key] = value
    return out


def scalars_to_records(values: Scalars) -> tuple[MetricRecord, ConfigRecord]:
    """Split metrics: finite numbers into a MetricRecord, the rest into a ConfigRecord."""
    numeric: dict[str, int | float] = {}
    rest: Scalars = {}
    for key, raw in values.items():
        value = _plain(raw)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            numeric[str(key)] = value
        else:
            rest[str(key)] = value
    return MetricRecord(numeric), scalars_to_config(rest)


def records_to_scalars(metrics: MetricRecord, rest: ConfigRecord | None) -> Scalars:
    out: Scalars = dict(metrics.items())
    if rest is not None:
        out.update(config_to_scalars(rest))
    return out


def json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, float):  # non-finite floats: JSON has no literal for them
        return repr(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} in a Flower record")


# --------------------------------------------------------------------------- state files


def encode_state(state: Any) -> bytes:
    """Serialise nested dicts/lists of scalars, NumPy arrays and torch tensors, without pickle.

    Dictionary keys keep their type (``int`` or ``str``); tuples come back as lists.
    """
    arrays: dict[str, np.ndarray] = {}

    def walk(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {"__dict__": [[k, walk(v)] for k, v in obj.items()]}
        if isinstance(obj, list | tuple):
            return [walk(v) for v in obj]
        if isinstance(obj, np.ndarray):
            key = f"a{len(arrays)}"
            arrays[key] = obj
            return {"__array__": key}
        if type(obj).__module__ == "torch" and type(obj).__name__ == "Tensor":
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
    np.savez(buf, __skeleton__=np.frombuffer(skeleton, dtype=np.uint8), **arrays)
    return buf.getvalue()


def decode_state(data: bytes) -> Any:
    """Inverse of :func:`encode_state`."""
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    skeleton = json.loads(arrays.pop("__skeleton__").tobytes().decode("utf-8"))

    def walk(obj: Any) -> Any:
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if isinstance(obj, dict):
            if "__dict__" in obj:
                return {k: walk(v) for k, v in obj["__dict__"]}
            if "__array__" in obj:
                return arrays[obj["__array__"]]
            if "__tensor__" in obj:
                import torch

                return torch.from_numpy(arrays[obj["__tensor__"]].copy())
            if "__float__" in obj:
                return float(obj["__float__"])
        return obj

    return walk(skeleton)
