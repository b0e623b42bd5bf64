"""Lossless encodings of pdpfl values into Flower records and silo state files.

Flower messages carry three record types (``flwr.app``): :class:`ArrayRecord` for
:data:`~pdpfl.fl.api.Params` (bit-exact: arrays travel as ``.npy`` bytes),
:class:`ConfigRecord` for configuration and :class:`MetricRecord` for numeric metrics.
A silo's algorithm state (ledger, counters: nested dictionaries of arrays and scalars) is
written to its own disk as a ``.npz`` archive without pickle (:func:`encode_state`).
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from pdpfl.fl.api import Contribution, Params, PrivacyBoundaryError, Scalars
from pdpfl.fl.messages import (
    DIVERGED_REPLY,
    EVALUATE_REPLY,
    HELLO_REPLY,
    SILO_INFO,
    TRAIN_REPLY,
)

#: ConfigRecord key holding the values a ConfigRecord cannot store natively (None, nested).
_JSON_KEY = "pdpfl.json"


def params_to_record(params: Params) -> ArrayRecord:
    """An ArrayRecord holding ``params`` in order (dtype and shape preserved)."""
    return ArrayRecord([np.ascontiguousarray(p) for p in params])


def record_to_params(record: ArrayRecord) -> Params:
    return [np.asarray(a) for a in record.to_numpy_ndarrays()]


#: The record names of a train reply: exactly the fields of a Contribution.
CONTRIBUTION_RECORDS = frozenset({"update", "contribution"})
#: The record names of an evaluate reply (a MetricRecord with ``loss``, ``accuracy``, ``n``).
EVALUATION_RECORDS = frozenset({"metrics"})
#: The keys of that MetricRecord: aggregate test metrics only.
EVALUATION_METRICS = frozenset({"loss", "accuracy", "n"})
_WEIGHT = "weight"
_METRIC_PREFIX = "metric."


def contribution_to_records(contribution: Contribution) -> dict[str, Any]:
    """Encode exactly the fields of a :class:`Contribution` (no other field can travel): the
    training reply's ``update.{i}`` as one ArrayRecord, ``weight`` and ``metric.{k}`` as one
    MetricRecord (:func:`reply_messages` decodes them back)."""
    values: dict[str, int | float | list[int] | list[float]] = {_WEIGHT: float(contribution.weight)}
    for key, value in contribution.metrics.items():
        values[_METRIC_PREFIX + str(key)] = float(value)
    return {"update": params_to_record(contribution.update), "contribution": MetricRecord(values)}


def records_to_contribution(
    names: set[str] | frozenset[str], record_dict: RecordDict
) -> Contribution:
    """Decode a train reply; :class:`PrivacyBoundaryError` if it carries any other record."""
    if set(names) != CONTRIBUTION_RECORDS:
        raise PrivacyBoundaryError(
            f"a train reply must carry exactly {sorted(CONTRIBUTION_RECORDS)}, got {sorted(names)}"
        )
    values = dict(record_dict.metric_records["contribution"].items())
    weight = _number(values.pop(_WEIGHT), _WEIGHT)
    metrics = {}
    for key, value in values.items():
        if not key.startswith(_METRIC_PREFIX):
            raise PrivacyBoundaryError(f"a train reply carries the undeclared field {key!r}")
        metrics[key[len(_METRIC_PREFIX) :]] = _number(value, key)
    return Contribution(
        update=record_to_params(record_dict.array_records["update"]), weight=weight, metrics=metrics
    )


def _number(value: float | list[int] | list[float], key: str) -> float:
    """A train reply's number (a list there is refused, as ``float`` refuses it)."""
    if isinstance(value, list):
        raise TypeError(f"a train reply's {key!r} is a list, not a number")
    return float(value)


def _plain(value: object) -> object:
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
    numeric: dict[str, int | float | list[int] | list[float]] = {}
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


def json_default(obj: object) -> object:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, float):  # non-finite floats: JSON has no literal for them
        return repr(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} in a Flower record")


# ------------------------------------------------------------- multi-stage protocol payloads

#: Record names of a protocol-stage message (request and reply alike).
PAYLOAD_ARRAYS = "payload.arrays"
PAYLOAD_VALUES = "payload.values"
PAYLOAD_RECORDS = frozenset({PAYLOAD_ARRAYS, PAYLOAD_VALUES})


def payload_to_records(payload: dict[str, Any]) -> dict[str, Any]:
    """Encode a protocol stage's payload exactly (see :mod:`pdpfl.fl.aggregation`).

    NumPy arrays (any numeric or boolean dtype, any shape) go into one ``ArrayRecord`` by name;
    ``bytes``, ``str``, ``int``, ``float`` and ``bool`` into one ``ConfigRecord``. Anything else
    is a ``TypeError`` naming the key: a payload cannot smuggle other objects.
    """
    from flwr.app import Array

    arrays: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for key, raw in payload.items():
        if not isinstance(key, str):
            raise TypeError(f"payload key {key!r}: expected a str")
        if isinstance(raw, np.ndarray):
            if raw.dtype.kind not in "biuf":
                raise TypeError(f"payload[{key!r}]: arrays must be numeric, got dtype {raw.dtype}")
            arrays[key] = Array(np.ascontiguousarray(raw))
            continue
        value = raw.item() if isinstance(raw, np.generic) else raw
        if isinstance(value, bytearray):
            value = bytes(value)
        if not isinstance(value, bool | int | float | str | bytes):
            raise TypeError(
                f"payload[{key!r}]: a {type(raw).__name__} cannot travel in a protocol message "
                "(allowed: numpy arrays, bytes, str, int, float, bool)"
            )
        values[key] = value
    return {PAYLOAD_ARRAYS: ArrayRecord(arrays), PAYLOAD_VALUES: ConfigRecord(values)}


def records_to_payload(names: set[str] | frozenset[str], record_dict: RecordDict) -> dict[str, Any]:
    """Decode a protocol-stage message; :class:`PrivacyBoundaryError` on any other record."""
    extra = set(names) - PAYLOAD_RECORDS
    if extra:
        raise PrivacyBoundaryError(
            f"a protocol-stage message must carry only {sorted(PAYLOAD_RECORDS)}, "
            f"got {sorted(names)}"
        )
    out: dict[str, Any] = {}
    if PAYLOAD_ARRAYS in names:
        for key, array in record_dict.array_records[PAYLOAD_ARRAYS].items():
            out[key] = array.numpy()
    if PAYLOAD_VALUES in names:
        for key, value in record_dict.config_records[PAYLOAD_VALUES].items():
            if key in out:
                raise PrivacyBoundaryError(f"payload key {key!r} appears twice")
            out[key] = value
    return out


# ------------------------------------------------------- a reply as the messages it carries

#: Record names of a silo's replies besides a training reply's and a stage's payload.
HELLO_RECORDS = frozenset({"hello", "info"})
DIVERGED_RECORD = "diverged"


def reply_messages(
    record_dict: RecordDict, stage: tuple[str, str] | None = None, info: tuple[str, str] = SILO_INFO
) -> list[tuple[tuple[str, str], dict[str, Any]]]:
    """The declared messages (:mod:`pdpfl.fl.messages`) a silo's Flower reply carries, decoded
    as the silo's gate saw them: ``[(message id, payload), ...]``.

    ``stage``: the ``(protocol, stage)`` a protocol-stage reply answers; ``info``: the message
    id of the hooks' silo facts. A record of any other name is a :class:`PrivacyBoundaryError`.
    Check each with ``check_outgoing(message, payload, None)`` (the context-free gate).
    """
    names = set(record_dict.keys())
    out: list[tuple[tuple[str, str], dict[str, Any]]] = []
    if names & CONTRIBUTION_RECORDS:
        payload: dict[str, Any] = {
            f"update.{i}": a
            for i, a in enumerate(record_to_params(record_dict.array_records["update"]))
        }
        for key, value in record_dict.metric_records["contribution"].items():
            payload[key] = value
        out.append((TRAIN_REPLY, payload))
    if "metrics" in names:
        out.append((EVALUATE_REPLY, dict(record_dict.metric_records["metrics"].items())))
    if "hello" in names:
        out.append((HELLO_REPLY, dict(record_dict.config_records["hello"].items())))
    if "info" in names:
        out.append((info, config_to_scalars(record_dict.config_records["info"])))
    if DIVERGED_RECORD in names:
        out.append((DIVERGED_REPLY, dict(record_dict.config_records[DIVERGED_RECORD].items())))
    if names & PAYLOAD_RECORDS:
        if stage is None:
            raise PrivacyBoundaryError("a protocol-stage reply needs the stage it answers")
        out.append((stage, records_to_payload(names & PAYLOAD_RECORDS, record_dict)))
    known = CONTRIBUTION_RECORDS | EVALUATION_RECORDS | HELLO_RECORDS | PAYLOAD_RECORDS
    extra = names - known - {DIVERGED_RECORD}
    if extra:
        raise PrivacyBoundaryError(f"a silo's reply carries undeclared records {sorted(extra)}")
    return out


# --------------------------------------------------------------------------- state files
# (kept here for compatibility: the implementation lives in pdpfl.io)
from pdpfl.io import decode_state, encode_state  # noqa: E402,F401


def encode_config(config_dict: dict[str, Any]) -> str:
    """The experiment config as it travels in Flower's run config (base64 JSON)."""
    return base64.b64encode(json.dumps(config_dict).encode("utf-8")).decode("ascii")


def decode_config(text: str) -> dict[str, Any]:
    """Inverse of :func:`encode_config`."""
    return dict(json.loads(base64.b64decode(text.encode("ascii")).decode("utf-8")))
