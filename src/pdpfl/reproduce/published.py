"""The papers' published numbers, as data (``published/<paper>.json``), each cited.

Every entry names where the number is printed (``cite``: table, figure, section) and carries
either a ``value`` (a number, optionally with the ``spread`` over the paper's seeds, a per-round
``curve``, and the ``source`` it was read from when the figure prints no digits) or a ``claim``
(a qualitative statement, for results the paper gives only in words). The reports print these
beside pdpfl's measurements; nothing in pdpfl's code or tests treats them as expected outputs.

Schema ``pdpfl.published/1``::

    {"schema": "pdpfl.published/1",
     "paper": {"key", "title", "authors", "venue", "text", "reference_code"},
     "entries": [{"id": "fig8/heart/three-levels/rpdp", "cite": "rPDP-FL Figure 8, ...",
                  "value": 0.7299, "spread": 0.0077, "seeds": 5, "curve": [...], ...}, ...]}
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

__all__ = [
    "PAPER_KEYS",
    "SCHEMA",
    "PublishedEntry",
    "PublishedPaper",
    "check_document",
    "load_published",
]

#: Version of the JSON form of the published values.
SCHEMA = "pdpfl.published/1"

#: The papers whose values ship with pdpfl (file ``published/<key>.json``).
PAPER_KEYS: tuple[str, ...] = ("rpdp-fl", "idp-fedavg", "uldp-fl", "prifedsync")

_PAPER_FIELDS = ("key", "title", "authors", "venue", "text")


@dataclass(frozen=True)
class PublishedEntry:
    """One published number (or qualitative claim), with where it is printed."""

    id: str
    cite: str
    value: float | None = None
    spread: float | None = None
    seeds: int | None = None
    curve: tuple[float, ...] = ()
    claim: str | None = None
    quantity: str = ""
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_number(self) -> bool:
        return self.value is not None


@dataclass(frozen=True)
class PublishedPaper:
    """The published values of one paper (see the module docstring)."""

    key: str
    title: str
    authors: str
    venue: str
    text: str
    reference_code: str
    entries: dict[str, PublishedEntry]

    def get(self, entry_id: str) -> PublishedEntry | None:
        return self.entries.get(entry_id)

    def value(self, entry_id: str) -> float | None:
        e = self.entries.get(entry_id)
        return None if e is None else e.value

    def matching(self, prefix: str) -> list[PublishedEntry]:
        """Entries whose id starts with ``prefix`` (file order)."""
        return [e for k, e in self.entries.items() if k.startswith(prefix)]

    def citation(self) -> str:
        return f"{self.authors}, *{self.title}*, {self.venue}"


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def check_document(doc: object, key: str) -> list[str]:
    """Problems of a published-values document (empty if it is valid)."""
    problems: list[str] = []
    if not isinstance(doc, dict):
        return [f"{key}: the document is not a JSON object"]
    if doc.get("schema") != SCHEMA:
        problems.append(f"{key}: schema must be {SCHEMA!r}, got {doc.get('schema')!r}")
    paper = doc.get("paper")
    if not isinstance(paper, dict):
        problems.append(f"{key}: 'paper' must be an object")
    else:
        problems += [
            f"{key}: paper.{f} is missing"
            for f in _PAPER_FIELDS
            if not str(paper.get(f, "")).strip()
        ]
        if paper.get("key") != key:
            problems.append(f"{key}: paper.key is {paper.get('key')!r}")
    entries = doc.get("entries")
    if not isinstance(entries, list) or not entries:
        return [*problems, f"{key}: 'entries' must be a non-empty list"]
    seen: set[str] = set()
    for i, e in enumerate(entries):
        where = f"{key}: entries[{i}]"
        if not isinstance(e, dict):
            problems.append(f"{where}: not an object")
            continue
        eid = e.get("id")
        if not isinstance(eid, str) or not eid:
            problems.append(f"{where}: 'id' must be a non-empty string")
            continue
        where = f"{key}: {eid}"
        if eid in seen:
            problems.append(f"{where}: duplicate id")
        seen.add(eid)
        cite = e.get("cite")
        if not isinstance(cite, str) or not any(
            w in cite for w in ("Table", "Figure", "Fig.", "§")
        ):
            problems.append(f"{where}: 'cite' must name the table, figure or section")
        if ("value" in e) == ("claim" in e):
            problems.append(f"{where}: give exactly one of 'value' and 'claim'")
        try:
            if "value" in e:
                _number(e["value"], f"{where}: value")
            if "spread" in e:
                if _number(e["spread"], f"{where}: spread") < 0:
                    problems.append(f"{where}: spread must be >= 0")
            for k, v in enumerate(e.get("curve", [])):
                _number(v, f"{where}: curve[{k}]")
        except ValueError as err:
            problems.append(str(err))
        if "curve" in e and "value" in e and e["curve"] and e["curve"][-1] != e["value"]:
            problems.append(f"{where}: value must be the curve's last point")
    return problems


def _entry(e: dict[str, Any]) -> PublishedEntry:
    known = {"id", "cite", "value", "spread", "seeds", "curve", "claim", "quantity", "source"}
    return PublishedEntry(
        id=str(e["id"]),
        cite=str(e["cite"]),
        value=None if e.get("value") is None else float(e["value"]),
        spread=None if e.get("spread") is None else float(e["spread"]),
        seeds=None if e.get("seeds") is None else int(e["seeds"]),
        curve=tuple(float(v) for v in e.get("curve", ())),
        claim=None if e.get("claim") is None else str(e["claim"]),
        quantity=str(e.get("quantity", "")),
        source=str(e.get("source", "")),
        extra={k: v for k, v in e.items() if k not in known},
    )


@cache
def load_published(key: str) -> PublishedPaper:
    """The published values of paper ``key`` (ValueError if the file is invalid)."""
    if key not in PAPER_KEYS:
        raise ValueError(f"unknown paper {key!r}; choose from {', '.join(PAPER_KEYS)}")
    text = (
        resources.files("pdpfl.reproduce")
        .joinpath("published", f"{key}.json")
        .read_text(encoding="utf-8")
    )
    doc = json.loads(text)
    problems = check_document(doc, key)
    if problems:
        raise ValueError("; ".join(problems))
    p = doc["paper"]
    return PublishedPaper(
        key=key,
        title=str(p["title"]),
        authors=str(p["authors"]),
        venue=str(p["venue"]),
        text=str(p["text"]),
        reference_code=str(p.get("reference_code", "")),
        entries={str(e["id"]): _entry(e) for e in doc["entries"]},
    )
