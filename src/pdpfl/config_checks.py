"""Checks of raw config values that pydantic's lax mode would otherwise accept silently.

* **Non-finite numbers** -- NaN and ±inf are refused in every section, free-form mappings
  (``data.options``, ``budgets.params``, ``model.options``) included: ``training.lr: must be a
  finite number, got nan``. A field that declares ``json_schema_extra={"allow_infinity":
  True}`` (IDP-FedAvg's ``algorithm.group_budgets``, where ``.inf`` marks non-private clients)
  may hold +inf; NaN is never accepted. In algorithm sections (whose models are registered by
  plug-ins), text such as ``"inf"`` or ``"nan"`` that pydantic would turn into a float is
  refused the same way; the built-in sections refuse it with ``allow_inf_nan=False``.
* **Booleans as numbers** -- ``rounds: true`` would be T = 1 and ``lr: true`` 1.0: a boolean
  given to a numeric field is refused (``expected a number, got true``).

Used by :func:`pdpfl.config.config_from_dict` before pydantic validation.
"""

from __future__ import annotations

import math
import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

__all__ = ["raw_value_problems"]

#: Text that pydantic would read as a non-finite float.
_NON_FINITE_TEXT = re.compile(r"^\s*[-+]?(inf|infinity|nan)\s*$", re.IGNORECASE)


def _types(annotation: object) -> set[object]:
    """The plain types an annotation accepts (unions, Optional, lists, Annotated flattened)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _types(get_args(annotation)[0])
    if origin in (Union, types.UnionType, list, tuple):
        out: set[object] = set()
        for arg in get_args(annotation):
            if arg is not Ellipsis:
                out |= _types(arg)
        return out
    if origin is Literal:
        return {type(v) for v in get_args(annotation)}
    if origin is dict:
        return {dict}
    return {annotation}


def _allows_infinity(field: object) -> bool:
    extra = getattr(field, "json_schema_extra", None)
    return isinstance(extra, dict) and bool(extra.get("allow_infinity"))


def raw_value_problems(
    raw: dict[str, Any],
    fields: dict[str, dict[str, Any]],
    text_sections: tuple[str, ...] = ("algorithm",),
) -> list[str]:
    """One ``dotted.field: message`` per non-finite number or boolean given as a number.

    ``fields`` maps each section (``""`` for top-level keys) to its pydantic ``model_fields``;
    unknown keys are left to pydantic (``unknown key``).
    """
    problems: list[str] = []

    def walk(
        value: object, path: list[str], allowed: set[object], allow_inf: bool, text_too: bool
    ) -> None:
        where = ".".join(path)
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, [*path, str(k)], {Any}, allow_inf, text_too)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, [*path, str(i)], allowed, allow_inf, text_too)
        elif isinstance(value, bool):
            if allowed & {int, float} and bool not in allowed and Any not in allowed:
                problems.append(
                    f"{where}: expected a number, got {str(value).lower()} "
                    "(a boolean is not a number)"
                )
        elif isinstance(value, float) and not math.isfinite(value):
            if not (allow_inf and value > 0):
                problems.append(f"{where}: must be a finite number, got {value}")
        elif text_too and isinstance(value, str) and _NON_FINITE_TEXT.match(value):
            if not (allow_inf and value.strip().lstrip("+").lower().startswith("inf")):
                problems.append(f"{where}: must be a finite number, got {value!r}")

    for section, value in raw.items():
        key = str(section)
        if key in fields.get("", {}) and key not in fields:
            field = fields[""][key]
            walk(value, [key], _types(field.annotation), _allows_infinity(field), False)
            continue
        own = fields.get(key)
        if own is None or not isinstance(value, dict):
            walk(value, [key], {Any}, False, False)
            continue
        for name, v in value.items():
            field = own.get(str(name))
            allowed: set[object] = _types(field.annotation) if field is not None else {Any}
            walk(
                v,
                [key, str(name)],
                allowed,
                field is not None and _allows_infinity(field),
                key in text_sections,
            )
    return problems
