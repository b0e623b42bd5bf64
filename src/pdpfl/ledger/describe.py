"""Mechanism descriptions as JSON: what ledger files and budget stores keep of a mechanism.

Mechanism descriptions are frozen dataclasses of :mod:`pdpfl.privacy`; only classes from that
package are ever rebuilt (no pickle, no arbitrary import).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["mechanism_from_dict", "mechanism_to_dict"]

_ALLOWED_PREFIX = "pdpfl.privacy."


def _plain(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return mechanism_to_dict(value)
    return value


def mechanism_to_dict(mechanism: object) -> dict[str, object]:
    """A JSON description of a mechanism dataclass of :mod:`pdpfl.privacy`."""
    cls = type(mechanism)
    if not (dataclasses.is_dataclass(mechanism) and cls.__module__.startswith(_ALLOWED_PREFIX)):
        raise ValueError(
            f"mechanism: cannot save {cls.__name__}: only dataclasses of pdpfl.privacy are stored"
        )
    fields = {
        f.name: _plain(getattr(mechanism, f.name)) for f in dataclasses.fields(mechanism) if f.init
    }
    return {"type": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}


def _rebuild(value: object) -> object:
    if isinstance(value, dict) and set(value) == {"type", "fields"}:
        return mechanism_from_dict(value)
    return value


def mechanism_from_dict(data: Mapping[str, object]) -> Any:
    """Inverse of :func:`mechanism_to_dict` (refuses classes outside :mod:`pdpfl.privacy`)."""
    target = str(data.get("type", ""))
    module, _, name = target.partition(":")
    if not module.startswith(_ALLOWED_PREFIX) or not name or "." in name:
        raise ValueError(f"ledger file: mechanism type {target!r} is not a pdpfl.privacy class")
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"ledger file: unknown mechanism type {target!r}")
    given = data.get("fields", {})
    if not isinstance(given, dict):
        raise ValueError(f"ledger file: the fields of {target!r} are not a mapping")
    fields = {str(k): _rebuild(v) for k, v in given.items()}
    return cls(**fields)
