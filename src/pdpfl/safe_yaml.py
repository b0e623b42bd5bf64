"""A hardened YAML reader for experiment configs and ``--set key=value`` values.

Configs are small, hand-written files, so anything unusual is refused with one message naming
the file, line and column instead of being guessed at:

* **Limits** -- at most :data:`MAX_BYTES` bytes of UTF-8 text, :data:`MAX_DEPTH` levels of
  nesting, :data:`MAX_NODES` values *after* alias expansion (a "billion laughs" file is refused
  before anything is expanded), :data:`MAX_ALIASES` aliases, scalars of at most
  :data:`MAX_SCALAR_CHARS` characters and integers that fit in 64 bits. Each check runs while
  the file is composed, so a hostile file is refused in a fraction of a second.
* **Plain data only** -- mappings, lists, text, integers, floats, booleans and null (the YAML
  1.2 core schema). Tags that build other objects (``!!python/object``, ``!!binary``,
  ``!!set``, ``!!timestamp``, ...) are errors, and YAML 1.1's surprising implicit types are
  not applied: ``yes``/``no``/``on``/``off`` stay text (only ``true``/``false`` are booleans),
  ``2024-01-01`` stays text (not a date), ``012`` is twelve (not octal ten) and ``1:30`` is
  text (not ninety); ``1e-5`` is a float.
* **No duplicate keys** -- a mapping that names a key twice is refused with both lines (YAML
  loaders usually keep the last value silently). Merge keys (``<<: *base``) still work.

:func:`load_yaml_file` and :func:`load_yaml_text` raise :class:`YamlError` (a ``ValueError``).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, ClassVar, NoReturn, TypeAlias

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import BaseResolver

__all__ = [
    "MAX_ALIASES",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "MAX_SCALAR_CHARS",
    "YamlError",
    "YamlValue",
    "load_yaml_file",
    "load_yaml_text",
]

#: A YAML document of plain data as read here: mappings (text or integer keys), lists, text,
#: integers, floats, booleans and null.
YamlValue: TypeAlias = (
    "None | bool | int | float | str | list[YamlValue] | dict[str | int, YamlValue]"
)

#: Largest config file read (bytes): hand-written configs are a few kilobytes.
MAX_BYTES = 256 * 1024
#: Deepest nesting of mappings and lists.
MAX_DEPTH = 32
#: Most values (mapping entries, list items, scalars) after expanding every alias.
MAX_NODES = 50_000
#: Most aliases (``*name``) in one document.
MAX_ALIASES = 100
#: Longest scalar (text or number) in characters.
MAX_SCALAR_CHARS = 16 * 1024
#: Integers must fit in a signed 64-bit integer.
_INT_LIMIT = 2**63

_TAG = "tag:yaml.org,2002:"


class YamlError(ValueError):
    """Malformed or refused YAML; the message names where (line, column) and why."""


# ------------------------------------------------------------------- YAML 1.2 core schema


class _CoreResolver(BaseResolver):
    """Implicit types of the YAML 1.2 core schema (plus ``<<`` merge keys)."""


#: The core schema's spelling of each plain type (also required under an explicit tag).
_PATTERNS = {
    "bool": re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    "int": re.compile(r"^(?:[-+]?[0-9]+|0x[0-9a-fA-F]+|0o[0-7]+)$"),
    "float": re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    "null": re.compile(r"^(?:~|null|Null|NULL|)$"),
    "merge": re.compile(r"^(?:<<)$"),
}
for _tag, _first in (
    ("bool", "tTfF"),
    ("int", "-+0123456789"),
    ("float", "-+.0123456789"),
    ("null", ["~", "n", "N", ""]),
    ("merge", "<"),
):
    _CoreResolver.add_implicit_resolver(_TAG + _tag, _PATTERNS[_tag], list(_first))


def _short(tag: str) -> str:
    return "!!" + tag[len(_TAG) :] if tag.startswith(_TAG) else tag


def _where(node: Node) -> str:
    mark = node.start_mark
    return f"line {mark.line + 1}, column {mark.column + 1}"


class _Constructor(SafeConstructor):
    """Plain data only; duplicate keys and out-of-range numbers are errors."""

    yaml_constructors: ClassVar[dict[Any, Any]] = {}

    def _text(self, node: ScalarNode, kind: str) -> str:
        """The scalar's text, which must spell a ``kind`` (also under an explicit tag)."""
        text = str(self.construct_scalar(node))
        if not _PATTERNS[kind].match(text):
            raise YamlError(
                f"{_where(node)}: {text[:40]!r} is not a valid {kind} for tag '!!{kind}'"
            )
        return text

    def construct_core_null(self, node: ScalarNode) -> None:
        self._text(node, "null")

    def construct_core_int(self, node: ScalarNode) -> int:
        text = self._text(node, "int")
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        if len(digits) > 40:
            raise YamlError(
                f"{_where(node)}: integer {text[:20]}... is too large (at most {_INT_LIMIT - 1})"
            )
        if digits.startswith("0x"):
            value = int(digits[2:], 16)
        elif digits.startswith("0o"):
            value = int(digits[2:], 8)
        else:
            value = int(digits, 10)
        value *= sign
        if not -_INT_LIMIT <= value < _INT_LIMIT:
            raise YamlError(
                f"{_where(node)}: integer {text} is out of range (at most "
                f"{_INT_LIMIT - 1} in absolute value)"
            )
        return value

    def construct_core_float(self, node: ScalarNode) -> float:
        text = self._text(node, "float")
        lowered = text.lower()
        if lowered.endswith(".inf"):
            return -math.inf if text.startswith("-") else math.inf
        if lowered == ".nan":
            return math.nan
        value = float(text)
        if not math.isfinite(value):
            raise YamlError(
                f"{_where(node)}: number {text} is too large for a float "
                "(write .inf if infinity is really meant)"
            )
        return value

    def construct_core_bool(self, node: ScalarNode) -> bool:
        return self._text(node, "bool").lower() == "true"

    def construct_refused(self, node: Node) -> NoReturn:
        raise YamlError(
            f"{_where(node)}: tag {_short(node.tag)!r} is not allowed; a config holds plain "
            "data only (mappings, lists, text, numbers, true/false, null) -- quote the value "
            "to keep it as text"
        )

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == _TAG + "merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, bool) or not isinstance(key, str | int):
                    raise YamlError(
                        f"{_where(key_node)}: mapping keys must be text or integers, got {key!r}"
                    )
                if key in seen:
                    first = seen[key].start_mark.line + 1
                    raise YamlError(
                        f"{_where(key_node)}: duplicate key {key!r} (first given on line "
                        f"{first}); give each key once"
                    )
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


for _name, _method in (
    ("null", _Constructor.construct_core_null),
    ("bool", _Constructor.construct_core_bool),
    ("int", _Constructor.construct_core_int),
    ("float", _Constructor.construct_core_float),
    ("str", SafeConstructor.construct_yaml_str),
    ("seq", SafeConstructor.construct_yaml_seq),
    ("map", SafeConstructor.construct_yaml_map),
):
    _Constructor.add_constructor(_TAG + _name, _method)  # type: ignore[type-var]
_Constructor.add_constructor(None, _Constructor.construct_refused)  # type: ignore[type-var]


class _Loader(
    yaml.reader.Reader,
    yaml.scanner.Scanner,
    yaml.parser.Parser,
    yaml.composer.Composer,
    _Constructor,
    _CoreResolver,
):
    """Pure-Python loader whose composer counts depth, nodes and aliases as it goes."""

    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _Constructor.__init__(self)
        _CoreResolver.__init__(self)
        self._depth = 0
        self._nodes = 0
        self._aliases = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()  # type: ignore[no-untyped-call]  # PyYAML: unannotated
        where = f"line {event.start_mark.line + 1}, column {event.start_mark.column + 1}"
        if isinstance(event, AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YamlError(f"{where}: more than {MAX_ALIASES} aliases (*name)")
        elif isinstance(event, ScalarEvent) and len(event.value) > MAX_SCALAR_CHARS:
            raise YamlError(
                f"{where}: a value of {len(event.value)} characters (at most {MAX_SCALAR_CHARS})"
            )
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise YamlError(f"{where}: more than {MAX_NODES} values")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlError(f"{where}: nested more than {MAX_DEPTH} levels deep")
            node = super().compose_node(parent, index)
            assert node is not None
            return node
        finally:
            self._depth -= 1


def _expanded_size(root: Node) -> None:
    """Refuse recursive aliases and documents that expand to more than MAX_NODES values."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise YamlError(
                f"{_where(node)}: an alias refers to a value that contains it (recursive alias)"
            )
        active.add(key)
        total = 1
        if isinstance(node, SequenceNode):
            children: list[Node] = list(node.value)
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > MAX_NODES:
                raise YamlError(
                    f"{_where(node)}: expands to more than {MAX_NODES} values "
                    "through its aliases (*name)"
                )
        active.discard(key)
        sizes[key] = total
        return total

    size(root)


def _message(err: yaml.YAMLError) -> str:
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        problem = err.problem or err.context or "invalid YAML"
        if err.context and err.problem:
            problem = f"{problem} ({err.context})"
        if mark is not None:
            return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
        return str(problem)
    return " ".join(str(err).split())


def load_yaml_text(text: str, source: str = "YAML") -> YamlValue:
    """Parse one YAML document of plain data (see the module docstring); ``None`` if empty.

    ``source`` prefixes every error message (e.g. the file name or ``--set key``).
    """
    if len(text) > MAX_BYTES:
        raise YamlError(f"{source}: {len(text)} characters (at most {MAX_BYTES})")
    loader = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        document: YamlValue = loader.construct_document(node)  # plain data only (_Constructor)
        return document
    except YamlError as err:
        raise YamlError(f"{source}: {err}") from None
    except yaml.YAMLError as err:
        raise YamlError(f"{source}: not valid YAML: {_message(err)}") from None
    except (RecursionError, ValueError, TypeError, OverflowError) as err:
        raise YamlError(f"{source}: not valid YAML ({type(err).__name__}: {err})") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml_file(path: str | Path) -> YamlValue:
    """Read and parse a YAML file with the limits above (``None`` for an empty file)."""
    p = Path(path)
    if not p.exists():
        raise YamlError(f"file not found: {p}")
    if not p.is_file():
        raise YamlError(f"{p} is not a regular file")
    try:
        with open(p, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as err:
        raise YamlError(f"{p}: cannot be read ({err.strerror or err})") from None
    if len(data) > MAX_BYTES:
        raise YamlError(
            f"{p}: larger than {MAX_BYTES // 1024} KiB; a config is a small hand-written file"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise YamlError(
            f"{p}: not UTF-8 text (byte 0x{data[err.start]:02x} on line {line}); save the "
            "config as UTF-8"
        ) from None
    return load_yaml_text(text.removeprefix("\ufeff"), source=str(p))
