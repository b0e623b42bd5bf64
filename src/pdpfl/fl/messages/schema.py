"""The schema machinery of :mod:`pdpfl.fl.messages`: field types, fields, message schemas,
the registry and the gate (:func:`check_outgoing`).

A :class:`Rule` is a value computed from the public facts of a message (:class:`Outgoing`), with
the words the docs show for it; a type's ``check`` returns what is wrong (never the value) or
None; :meth:`MessageSchema.check` raises :class:`PrivacyBoundaryError` on the first problem.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeGuard

import numpy as np

__all__ = [
    "CLASSIFICATIONS",
    "Array",
    "Bool",
    "Bytes",
    "Field",
    "Float",
    "Int",
    "MessageId",
    "MessageSchema",
    "Outgoing",
    "PrivacyBoundaryError",
    "Rule",
    "ShareLayout",
    "Str",
    "check_outgoing",
    "declared",
    "register_schema",
    "render_table",
    "schema_of",
]


class ShareLayout(Protocol):
    """What the gate reads of a discrete share encoding
    (:class:`~pdpfl.fl.aggregation.discrete_shares.ShareEncoding`, which sits above the gate):
    the share's length and its ring's bits."""

    @property
    def length(self) -> int: ...

    @property
    def bits(self) -> int: ...


#: ``(topic, kind)``: ``("train", "reply")``, or ``(protocol, stage)`` for a protocol stage.
MessageId = tuple[str, str]
Classification = Literal["dp-output", "public", "crypto"]
CLASSIFICATIONS: tuple[str, ...] = ("dp-output", "public", "crypto")


class PrivacyBoundaryError(RuntimeError):
    """Something other than the mechanism's output was about to leave a silo."""


# ----------------------------------------------------------------------------- the context


@dataclass(frozen=True)
class Outgoing:
    """The public facts a message is sized by (the receiver knows every one of them).

    Attributes
    ----------
    round_index
        The round the message belongs to.
    silo_id
        The sending silo (None: unknown, e.g. the server re-checking a reply).
    request
        The request this message answers (what the server sent).
    params
        The model parameters of the request (their shapes size a training reply).
    public_metrics
        The Contribution metric keys the silo's algorithm declares public.
    config
        The experiment configuration (public to every party).
    state
        The protocol's silo-side state, for the rules of that protocol only; they read its
        public parts (the server's public key, the participant list), never its secrets.
    key
        The member of a field family being checked (set by the gate).
    reply
        The message under check (set by the gate).
    encoding
        The algorithm's discrete share encoding (``share_encoding``: public, derived from the
        configuration and the model's size), or None: a training reply is then one integer
        share (``length`` coordinates of dtype ``dtype``, values below 2^``bits``).
    """

    round_index: int = 0
    silo_id: int | None = None
    request: Mapping[str, Any] = field(default_factory=dict)
    params: Sequence[Any] | None = None
    public_metrics: frozenset[str] = frozenset()
    config: Any = None
    state: Any = None
    key: Any = None
    reply: Mapping[str, Any] = field(default_factory=dict)
    encoding: ShareLayout | None = None

    def with_(self, **changes: object) -> Outgoing:
        """A copy with ``changes`` (the gate sets ``key`` and ``reply``; cheaper than
        :func:`dataclasses.replace`, which re-runs the constructor)."""
        new = object.__new__(Outgoing)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new


@dataclass(frozen=True)
class Rule:
    """A value computed from public facts, with the words the docs show for it."""

    text: str
    fn: Callable[[Outgoing], Any]

    def __call__(self, context: Outgoing) -> Any:
        return self.fn(context)


def _resolve(value: object, context: Outgoing | None) -> Any:
    """A constant, or a rule's value (None without a context: not checked then)."""
    if isinstance(value, Rule):
        return None if context is None else value(context)
    return value


def _shown(value: object) -> str:
    return value.text if isinstance(value, Rule) else str(value)


# ----------------------------------------------------------------------------- field types


def _is_int(value: object) -> TypeGuard[int | np.integer[Any]]:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


@dataclass(frozen=True)
class Array:
    """A NumPy array: its dtype one of ``dtypes`` (exactly), its shape ``shape``.

    Float arrays must be finite. ``bits`` (integer arrays): every value in [0, 2^bits) -- e.g.
    a share in Z_{2^b} sent as uint32 or uint64.
    """

    dtypes: tuple[str, ...]
    shape: Rule | tuple[int, ...] | None = None
    bits: Rule | int | None = None

    def __post_init__(self) -> None:
        types = frozenset(np.dtype(d).type for d in self.dtypes)
        if any(np.dtype(d).name != d for d in self.dtypes):
            raise ValueError(f"Array: dtypes must be canonical names, got {self.dtypes}")
        object.__setattr__(self, "_types", types)

    def describe(self) -> str:
        text = f"array {'|'.join(self.dtypes)}"
        if self.shape is not None:
            text += f", shape {_shown(self.shape)}"
        if self.bits is not None:
            text += f", values < 2^{_shown(self.bits)}"
        return text

    def check(self, value: object, context: Outgoing | None) -> str | None:
        if not isinstance(value, np.ndarray):
            return f"expected an array of {'|'.join(self.dtypes)}, got a {type(value).__name__}"
        if value.dtype.type not in self._types:  # type: ignore[attr-defined]
            return f"expected dtype {'|'.join(self.dtypes)}, got {value.dtype.name}"
        shape = _resolve(self.shape, context)
        if shape is not None and tuple(value.shape) != tuple(int(s) for s in shape):
            return f"expected shape {tuple(int(s) for s in shape)}, got {tuple(value.shape)}"
        if value.dtype.kind == "f" and value.size and not bool(np.isfinite(value).all()):
            return "holds non-finite values"
        bits = _resolve(self.bits, context)
        if bits is not None and value.size and value.dtype.kind in "iu":
            if value.dtype.kind == "i" and int(value.min()) < 0:
                return f"holds values outside [0, 2^{int(bits)})"
            if int(value.max()) >> int(bits):
                return f"holds values outside [0, 2^{int(bits)})"
        return None


@dataclass(frozen=True)
class Bytes:
    """``bytes`` of exactly ``length`` bytes."""

    length: Rule | int | None

    def describe(self) -> str:
        return "bytes" if self.length is None else f"bytes, {_shown(self.length)}"

    def check(self, value: object, context: Outgoing | None) -> str | None:
        if not isinstance(value, bytes | bytearray):
            return f"expected bytes, got a {type(value).__name__}"
        length = _resolve(self.length, context)
        if length is not None and len(value) != int(length):
            return f"expected {int(length)} bytes, got {len(value)}"
        return None


def _range_text(low: object, high: object) -> str:
    if low is not None and low is high:
        return f"= {_shown(low)}"
    if low is not None and high is not None:
        return f"in [{_shown(low)}, {_shown(high)}]"
    if low is not None:
        return f">= {_shown(low)}"
    return "" if high is None else f"<= {_shown(high)}"


@dataclass(frozen=True)
class Int:
    """An integer (Python or NumPy; never a float, not even 3.0, nor a bool) in [low, high]."""

    low: Rule | int | None = None
    high: Rule | int | None = None

    def describe(self) -> str:
        return " ".join(["int", _range_text(self.low, self.high)]).strip()

    def check(self, value: object, context: Outgoing | None) -> str | None:
        if not _is_int(value):
            return f"expected an integer, got a {type(value).__name__}"
        low, high = _resolve(self.low, context), _resolve(self.high, context)
        if (low is not None and int(value) < int(low)) or (
            high is not None and int(value) > int(high)
        ):
            return f"expected an integer {_range_text(low, high)}"
        return None


@dataclass(frozen=True)
class Float:
    """A real number (a float, or an integer) in [low, high]; finite unless ``finite=False``
    (then NaN and infinities that the range allows pass too)."""

    low: float | None = None
    high: float | None = None
    finite: bool = True

    def describe(self) -> str:
        parts = ["finite float" if self.finite else "float", _range_text(self.low, self.high)]
        if not self.finite:  # NaN, and the infinities the range does not exclude
            extra = ["NaN"] + ["-inf"] * (self.low is None) + ["+inf"] * (self.high is None)
            parts.append("or " + ", ".join(extra))
        return " ".join(p for p in parts if p)

    def check(self, value: object, context: Outgoing | None) -> str | None:
        if isinstance(value, bool | np.bool_) or not isinstance(
            value, int | float | np.integer | np.floating
        ):
            return f"expected a number, got a {type(value).__name__}"
        v = float(value)
        if math.isnan(v) or (self.finite and not math.isfinite(v)):
            return None if not self.finite else "expected a finite number"
        if (self.low is not None and v < self.low) or (self.high is not None and v > self.high):
            return f"expected a number {_range_text(self.low, self.high)}"
        return None


@dataclass(frozen=True)
class Bool:
    """A bool (``value``: the only one allowed)."""

    value: bool | None = None

    def describe(self) -> str:
        return "bool" if self.value is None else f"bool, always {self.value}"

    def check(self, value: object, context: Outgoing | None) -> str | None:
        if not isinstance(value, bool | np.bool_):
            return f"expected a bool, got a {type(value).__name__}"
        if self.value is not None and bool(value) is not self.value:
            return f"expected {self.value}"
        return None


@dataclass(frozen=True)
class Str:
    """A string from the closed set ``choices``, or matching ``pattern`` (``re.fullmatch``)."""

    choices: frozenset[str] | None = None
    pattern: str | None = None
    max_length: int = 256
    #: How the docs describe the pattern (default: the pattern itself).
    text: str = ""

    def __post_init__(self) -> None:
        if (self.choices is None) == (self.pattern is None):
            raise ValueError("Str: give exactly one of choices and pattern")

    def describe(self) -> str:
        if self.text:
            return f"str: {self.text}"
        if self.choices is not None:
            return "str in {" + ", ".join(sorted(self.choices)) + "}"
        return f"str matching {self.pattern}"

    def check(self, value: object, context: Outgoing | None) -> str | None:
        if not isinstance(value, str):
            return f"expected a str, got a {type(value).__name__}"
        if len(value) > self.max_length:
            return f"expected at most {self.max_length} characters"
        if self.choices is not None and value not in self.choices:
            return f"expected one of {sorted(self.choices)}"
        if self.pattern is not None and re.fullmatch(self.pattern, value) is None:
            return "does not have the declared form"
        return None


FieldType = Array | Bytes | Int | Float | Bool | Str
Presence = Literal["required", "optional"] | Rule
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Field:
    """One field of a message.

    ``name`` is a plain name, or a family with one ``{placeholder}`` (``"update.{i}"``) whose
    members are ``keys``, a :class:`Rule`. ``presence``: ``required``, ``optional``, or a Rule
    (present exactly when it holds). ``public_by`` (``public`` fields): the configuration
    setting or fact that makes the field public.
    """

    name: str
    type: FieldType
    classification: Classification
    doc: str = ""
    public_by: str = ""
    keys: Rule | None = None
    presence: Presence = "required"

    def __post_init__(self) -> None:
        if self.classification not in CLASSIFICATIONS:
            raise ValueError(
                f"field {self.name!r}: classification must be one of {CLASSIFICATIONS}"
            )
        if self.classification == "public" and not self.public_by:
            raise ValueError(f"field {self.name!r}: a public field names what makes it public")
        if (self.keys is None) != (len(_PLACEHOLDER.findall(self.name)) == 0):
            raise ValueError(f"field {self.name!r}: a family needs one {{placeholder}} and keys")

    def member(self, key: object) -> str:
        return _PLACEHOLDER.sub(str(key), self.name, count=1)

    def matches(self, name: str) -> bool:
        """Context-free: ``name`` is a member of this family."""
        prefix, _, suffix = _PLACEHOLDER.split(self.name, maxsplit=1)
        return (
            name.startswith(prefix)
            and name.endswith(suffix)
            and len(name) > len(prefix) + len(suffix)
        )


@dataclass(frozen=True)
class MessageSchema:
    """The declared fields of one message id."""

    message: MessageId
    fields: tuple[Field, ...]
    doc: str = ""

    def _members(
        self, f: Field, names: set[str], context: Outgoing | None
    ) -> Iterable[tuple[str, Outgoing | None]]:
        if f.keys is None:
            return [(f.name, context)]
        if context is None:
            return [(n, None) for n in sorted(names) if f.matches(n)]
        return [(f.member(k), context.with_(key=k)) for k in f.keys(context)]

    def check(self, payload: object, context: Outgoing | None) -> None:
        """Raise :class:`PrivacyBoundaryError` unless ``payload`` is exactly this message."""
        where = _Where(self.message, context)
        if not isinstance(payload, Mapping):
            raise PrivacyBoundaryError(f"{where}: expected named fields, got a {type(payload)}")
        names = set(payload)
        if not all(isinstance(n, str) for n in names):
            raise PrivacyBoundaryError(f"{where}: every field name must be a str")
        if context is not None:
            context = context.with_(reply=payload)
        seen: set[str] = set()
        for f in self.fields:
            try:
                self._check_field(f, payload, names, context, where, seen)
            except PrivacyBoundaryError:
                raise
            except Exception as err:  # a rule that cannot be evaluated: refuse, never guess
                raise PrivacyBoundaryError(
                    f"{where}: field {f.name!r} cannot be sized from the public context "
                    f"({type(err).__name__})"
                ) from None
        extra = names - seen
        if extra:
            shown = sorted(n[:64] for n in extra)[:8]
            raise PrivacyBoundaryError(
                f"{where}: undeclared field(s) {shown}; declared: {[f.name for f in self.fields]}"
            )

    def _check_field(
        self,
        f: Field,
        payload: Mapping[str, Any],
        names: set[str],
        context: Outgoing | None,
        where: _Where,
        seen: set[str],
    ) -> None:
        for name, ctx in self._members(f, names, context):
            present = name in names
            if isinstance(f.presence, Rule):
                wanted = None if ctx is None else bool(f.presence(ctx))
            else:
                wanted = True if f.presence == "required" else None
            if wanted is True and not present:
                raise PrivacyBoundaryError(f"{where}: missing field {name!r}")
            if wanted is False and present:
                raise PrivacyBoundaryError(
                    f"{where}: field {name!r} must be absent here "
                    f"(present only when {_shown(f.presence)})"
                )
            if not present:
                continue
            seen.add(name)
            problem = f.type.check(payload[name], ctx)
            if problem is not None:
                raise PrivacyBoundaryError(f"{where}: field {name!r} {problem}")


def _where(message: MessageId, context: Outgoing | None) -> str:
    silo = "" if context is None or context.silo_id is None else f"silo {context.silo_id}, "
    return f"{silo}message {message[0]}/{message[1]}"


class _Where:
    """Where a message is going, formatted only when a refusal needs it."""

    __slots__ = ("context", "message")

    def __init__(self, message: MessageId, context: Outgoing | None) -> None:
        self.message, self.context = message, context

    def __format__(self, spec: str) -> str:
        return _where(self.message, self.context)


# ----------------------------------------------------------------------------- the registry

#: The module that declares the messages of every run (listed first).
_CORE_OWNER = "pdpfl.fl.messages.core"
_SCHEMAS: dict[MessageId, MessageSchema] = {}
_OWNERS: dict[MessageId, str] = {}
_ORDER: dict[MessageId, int] = {}


def register_schema(schema: MessageSchema, *, owner: str = "") -> None:
    """Declare ``schema`` (once per message id). ``owner``: the module that sends it."""
    if schema.message in _SCHEMAS:
        raise ValueError(f"message {schema.message} already has a schema")
    _SCHEMAS[schema.message] = schema
    _OWNERS[schema.message] = owner or __name__
    _ORDER[schema.message] = len(_ORDER)


def schema_of(message: MessageId) -> MessageSchema | None:
    """The schema of ``message`` (None: undeclared)."""
    return _SCHEMAS.get((str(message[0]), str(message[1])))


def declared(owner_prefix: str = "") -> list[MessageSchema]:
    """Every registered schema whose owner starts with ``owner_prefix``: the messages of every
    run first, then each protocol's (by name) in the order of its stages."""

    def order(m: MessageId) -> tuple[int, str, int]:
        core = _OWNERS[m] == _CORE_OWNER
        return (0 if core else 1, "" if core else m[0], _ORDER[m])

    return [
        _SCHEMAS[m]
        for m in sorted(_SCHEMAS, key=order)
        if _OWNERS.get(m, "").startswith(owner_prefix)
    ]


def check_outgoing(
    message: MessageId, payload: Mapping[str, Any], context: Outgoing | None
) -> Mapping[str, Any]:
    """The gate: ``payload`` is exactly the declared ``message``, else
    :class:`PrivacyBoundaryError` (raised before anything leaves). Returns ``payload``."""
    schema = schema_of(message)
    if schema is None:
        raise PrivacyBoundaryError(
            f"{_where(message, context)}: undeclared message; declare its schema "
            "(pdpfl.fl.messages.register_schema, or register_silo_handler(..., schemas=...))"
        )
    schema.check(payload, context)
    return payload


def render_table(schemas: Sequence[MessageSchema]) -> str:
    """The schemas as one Markdown table (the threat model's list of what leaves a silo)."""
    rows = [
        "| message | field | type | class | public by / what it is |",
        "| --- | --- | --- | --- | --- |",
    ]
    for schema in schemas:
        for f in schema.fields:
            name = f"`{f.name}`"
            if f.keys is not None:
                name += f" for {f.keys.text}"
            if isinstance(f.presence, Rule):
                name += f" (when {f.presence.text})"
            elif f.presence == "optional":
                name += " (optional)"
            text = f.public_by if f.classification == "public" else f.doc
            cells = [f"`{schema.message[0]}/{schema.message[1]}`", name, f.type.describe()]
            cells += [f.classification, text]
            rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"
