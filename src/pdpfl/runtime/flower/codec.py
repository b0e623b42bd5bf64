"""Lossless encodings of pdpfl values into Flower records and silo state files.

Flower messages carry three record types (``flwr.app``): :class:`ArrayRecord` for
:data:`~pdpfl.fl.api.Params` (bit-exact: arrays travel as ``.npy`` bytes),
:class:`ConfigRecord` for configuration and :class:`MetricRecord` for numeric metrics.
A silo's algorithm state (ledger, counters: nested dictionaries of arrays and scalars) is
written to its own disk as a ``.npz`` archive without pickle (:func:`encode_state`).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from pdpfl.fl.api import Contribution, Params, PrivacyBoundaryError, Scalars

#: ConfigRecord key holding the values a ConfigRecord cannot store natively (None, nested).
_JSON_KEY = "pdpfl.json"


def params_to_record(params: Params) -> ArrayRecord:
    """An ArrayRecord holding ``params`` in order (dtype and shape preserved)."""
    return ArrayRecord([np.ascontiguousarray(p) for p in params])


def record_to_params(record: ArrayRecord) -> Params:
    return [np.asarray(a) for a in record.to_numpy_ndarrays()]


#: The record names of a train reply: exactly the fields of a Contribution.
CONTRIBUTION_RECORDS = frozenset({"update", "contribution"})
#: The record names of an evaluate reply.
EVALUATION_RECORDS = frozenset({"metrics", "metrics.extra"})
_WEIGHT = "weight"
_METRIC_PREFIX = "metric."


def contribution_to_records(contribution: Contribution) -> dict[str, Any]:
    """Encode exactly the fields of a :class:`Contribution` (no other field can travel)."""
    values: dict[str, float] = {_WEIGHT: float(contribution.weight)}
    for key, value in contribution.metrics.items():
        values[_METRIC_PREFIX + str(key)] = float(value)
    return {"update": params_to_record(contribution.update), "contribution": MetricRecord(values)}


def records_to_contribution(names: set[str] | frozenset[str], record_dict: Any) -> Contribution:
    """Decode a train reply; :class:`PrivacyBoundaryError` if it carries any other record."""
    if set(names) != CONTRIBUTION_RECORDS:
        raise PrivacyBoundaryError(
            f"a train reply must carry exactly {sorted(CONTRIBUTION_RECORDS)}, got {sorted(names)}"
        )
    values = dict(record_dict.metric_records["contribution"].items())
    weight = float(values.pop(_WEIGHT))
    metrics = {}
    for key, value in values.items():
        if not key.startswith(_METRIC_PREFIX):
            raise PrivacyBoundaryError(f"a train reply carries the undeclared field {key!r}")
        metrics[key[len(_METRIC_PREFIX):]] = float(value)
    return Contribution(
        update=record_to_params(record_dict.array_records["update"]), weight=weight, metrics=metrics
    )


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
# (kept here for compatibility: the implementation lives in pdpfl.io)
from pdpfl.io import decode_state, encode_state  # noqa: E402,F401
