"""Per-record privacy budgets keyed by record id: reading, validating and matching them.

A budget is a promise to one person, so nothing about it changes silently:

* every ε is a finite number of at least :data:`~pdpfl.budgets.MIN_BUDGET` -- a NaN, empty
  or vanishing ε (1e-300) is reported as such (with its record id, row and column), never as
  "no row" or as a choice;
* record ids are unique integers;
* every training record needs a budget, and a budget for an id that is **not in the data**
  (neither a training nor a test record of any silo: usually a typo or the wrong file) is an
  error unless the config opts in with ``budgets.on_unmatched: ignore`` -- then the run's
  headline and ``summary.json`` say how many rows were ignored.

:func:`align_budgets` matches budgets given in Python (a dict, a pandas Series, ``(ids,
values)`` or an array indexed by id); :func:`read_budget_table` reads a ``.csv`` with the
columns ``record_id`` and ``epsilon`` (``budgets.file``); :func:`check_budget_file` is the
run-level check of such a file against the whole federation.
"""

from __future__ import annotations

import csv
import os
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from pdpfl.budgets import below_minimum
from pdpfl.data.federation import ClientData, Federation
from pdpfl.data.validation import (
    DataValidationError,
    Where,
    check_record_ids,
    is_missing,
)

__all__ = [
    "BUDGET_TABLE_COLUMNS",
    "ON_UNMATCHED",
    "BudgetTable",
    "ConfigWithBudgets",
    "align_budgets",
    "budget_table",
    "check_budget_file",
    "file_placeholders",
    "is_budget_table",
    "read_budget_table",
    "silo_budgets",
]

#: Header of a budgets table keyed by record id (``budgets.file`` may be such a ``.csv``).
BUDGET_TABLE_COLUMNS = ("record_id", "epsilon")

#: What to do with budgets for record ids that are not in the data.
ON_UNMATCHED = ("error", "ignore")

#: Placeholders ``budgets.file`` may contain (replaced per silo).
FILE_PLACEHOLDERS = ("client_id", "client")


@dataclass(frozen=True)
class BudgetTable:
    """Validated budgets: unique int64 ``ids`` and their finite ε > 0 ``values``."""

    ids: np.ndarray
    values: np.ndarray
    where: Where

    def lookup(self) -> dict[int, float]:
        return dict(zip(self.ids.tolist(), self.values.tolist(), strict=True))

    def unmatched(self, known: np.ndarray) -> np.ndarray:
        """Positions of the ids that are not in ``known``."""
        return np.flatnonzero(~np.isin(self.ids, known))


def _epsilons(values: object, ids: np.ndarray, where: Where) -> np.ndarray:
    """Finite ε > 0 per id, or an error naming the id, the position and what is wrong."""
    raw = (
        list(np.asarray(values, dtype=object).reshape(-1))
        if not isinstance(values, list)
        else values
    )
    out = np.empty(len(raw), dtype=np.float64)
    for i, v in enumerate(raw):
        who = f"record id {int(ids[i])} ({where.at([i])})"
        if is_missing(v):
            shown = "empty" if isinstance(v, str) and not v.strip() else repr(v)
            raise DataValidationError(
                f"{where.source}: {who} has no ε ({shown}); give every record a finite ε > 0 "
                "or drop its row"
            )
        try:
            if isinstance(v, bool | np.bool_):
                raise TypeError
            eps = float(v.strip()) if isinstance(v, str) else float(v)
        except (TypeError, ValueError):
            raise DataValidationError(f"{where.source}: {who}: ε {v!r} is not a number") from None
        if not (np.isfinite(eps) and eps > 0):
            raise DataValidationError(
                f"{where.source}: {who}: ε = {eps!r}; every ε must be a finite number > 0"
            )
        low = below_minimum(eps)
        if low is not None:
            raise DataValidationError(f"{where.source}: {who}: {low}")
        out[i] = eps
    return out


def budget_table(budgets: object, *, source: str = "budgets") -> BudgetTable:
    """Validated budgets from a dict ``id -> ε``, a pandas Series indexed by id, a pair
    ``(ids, values)`` or a 1-D array indexed by id (``budgets[i]`` is the ε of record ``i``)."""
    if (
        hasattr(budgets, "index")
        and hasattr(budgets, "to_numpy")
        and not isinstance(budgets, np.ndarray)
    ):  # a pandas Series indexed by record id
        keys: Any = np.asarray(budgets.index)
        values: Any = list(budgets.to_numpy(dtype=object))
        where = Where(f"{source} (Series)", rows=list(keys), word="index")
    elif isinstance(budgets, Mapping):
        keys, values = list(budgets.keys()), list(budgets.values())
        where = Where(f"{source} (mapping)", rows=None, word="entry")
    elif isinstance(budgets, tuple) and len(budgets) == 2:
        keys, values = budgets
        values = list(np.asarray(values, dtype=object).reshape(-1))
        where = Where(f"{source} (ids, values)", word="position")
    else:
        if budgets is None or isinstance(budgets, str | bytes | Path):
            raise DataValidationError(
                f"{source}: expected a mapping id -> ε, a pandas Series, (ids, values) or a 1-D "
                f"array indexed by record id, got {type(budgets).__name__} (a budgets file is "
                "given as budgets.file, or pdpfl.train(budgets=path))"
            )
        array = np.asarray(budgets, dtype=object)
        if array.ndim != 1:
            raise DataValidationError(
                f"{source}: expected a 1-D array indexed by record id, got shape {array.shape}"
            )
        values = list(array)
        keys = np.arange(len(values))
        where = Where(f"{source} (array indexed by record id)", word="index")
    if len(keys) != len(values):
        raise DataValidationError(f"{source}: {len(keys)} ids but {len(values)} values")
    if not len(values):
        raise DataValidationError(f"{source}: no budgets given")
    ids = check_record_ids(keys, where=Where(f"{source} (record ids)", where.rows, where.word))
    return BudgetTable(ids, _epsilons(values, ids, where), where)


def is_budget_table(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a ``.csv`` whose header names ``record_id`` and ``epsilon``."""
    p = Path(path)
    if p.suffix.lower() != ".csv" or not p.is_file():
        return False
    try:
        with open(p, newline="", encoding="utf-8-sig") as fh:
            header = next(csv.reader(fh), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return set(BUDGET_TABLE_COLUMNS) <= {h.strip() for h in header}


def read_table(path: str | os.PathLike[str]) -> BudgetTable:
    """The validated ``record_id``/``epsilon`` table of a ``.csv`` (rows named by line)."""
    p = Path(path)
    try:
        with open(p, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = [h.strip() for h in next(reader, [])]
            rows = [(reader.line_num, r) for r in reader if any(c.strip() for c in r)]
    except UnicodeDecodeError:
        raise DataValidationError(f"budgets.file: {p}: not UTF-8 text") from None
    except csv.Error as err:
        raise DataValidationError(f"budgets.file: {p}: not a readable CSV ({err})") from None
    missing = [c for c in BUDGET_TABLE_COLUMNS if c not in header]
    if missing:
        raise DataValidationError(
            f"budgets.file: {p}: no column {missing[0]!r} in the header {header}"
        )
    if not rows:
        raise DataValidationError(f"budgets.file: {p}: no rows after the header")
    j_id, j_eps = (header.index(c) for c in BUDGET_TABLE_COLUMNS)
    short = [line for line, r in rows if len(r) <= max(j_id, j_eps)]
    if short:
        raise DataValidationError(
            f"budgets.file: {p}: row {short[0]} has fewer than {max(j_id, j_eps) + 1} fields"
        )
    lines = [line for line, _ in rows]
    ids = check_record_ids(
        [r[j_id] for _, r in rows],
        where=Where(f"budgets.file: {p}, column 'record_id'", lines, "row"),
    )
    values = _epsilons(
        [r[j_eps] for _, r in rows],
        ids,
        Where(f"budgets.file: {p}, column 'epsilon'", lines, "row"),
    )
    return BudgetTable(ids, values, Where(f"budgets.file: {p}", lines, "row"))


def read_budget_table(path: str | os.PathLike[str]) -> dict[int, float]:
    """``record id -> ε`` from a ``.csv`` with the columns ``record_id`` and ``epsilon``."""
    return read_table(path).lookup()


def _known_ids(clients: list[ClientData]) -> np.ndarray:
    parts = [np.asarray(c.record_ids, dtype=np.int64) for c in clients]
    parts += [
        np.asarray(c.test_record_ids, dtype=np.int64)
        for c in clients
        if getattr(c, "test_record_ids", None) is not None
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _unmatched_message(table: BudgetTable, pos: np.ndarray, *, ignore: bool) -> str:
    example = ", ".join(f"{int(table.ids[i])}" for i in pos[:5])
    where = table.where.at(pos)
    if ignore:
        return (
            f"budgets: {pos.size} budget(s) of {table.where.source} are for record ids "
            f"that are not in the data (e.g. {example}; {where}); they were ignored "
            "(budgets.on_unmatched: ignore)"
        )
    return (
        f"{table.where.source}: {pos.size} budget(s) are for record ids that are not in "
        f"the data (e.g. {example}; {where}); fix those ids (a typo or another data set?) "
        "or set budgets.on_unmatched: ignore to train without them"
    )


def _check_on_unmatched(on_unmatched: str) -> bool:
    if on_unmatched not in ON_UNMATCHED:
        raise ValueError(
            f"on_unmatched: expected one of {list(ON_UNMATCHED)}, got {on_unmatched!r}"
        )
    return on_unmatched == "ignore"


def _train_values(table: BudgetTable, client: ClientData, k: int) -> np.ndarray:
    lookup = table.lookup()
    values = np.array([lookup.get(int(i), np.nan) for i in client.record_ids], dtype=float)
    missing = np.asarray(client.record_ids)[np.isnan(values)]
    if missing.size:
        raise DataValidationError(
            f"{table.where.source}: {missing.size} training record(s) have no budget (silo "
            f"{k} {client.name!r}, record ids e.g. {missing[:5].tolist()}); give one ε per "
            "record id"
        )
    return values


def align_budgets(
    federation: Federation, budgets: object, *, on_unmatched: str = "error"
) -> list[np.ndarray]:
    """Each silo's per-record budgets in its train order, matched by record id.

    ``budgets``: a mapping ``record id -> ε`` (a dict, or a pandas Series indexed by id), a
    pair ``(ids, values)``, or a 1-D array indexed by record id (``budgets[i]`` is the ε of
    record ``i``; natural when the ids are row positions). Budgets of test records are
    accepted (and unused). A training record without a budget, an ε that is NaN, infinite or
    <= 0, and (unless ``on_unmatched="ignore"``) a budget for an id that is not in the
    federation are errors.
    """
    ignore = _check_on_unmatched(on_unmatched)
    table = budget_table(budgets)
    pos = table.unmatched(_known_ids(federation.clients))
    if pos.size and not ignore:
        raise DataValidationError(_unmatched_message(table, pos, ignore=False))
    return [_train_values(table, c, k) for k, c in enumerate(federation.clients)]


def unmatched_budgets_warning(federation: Federation, budgets: object) -> str | None:
    """The warning of budgets for ids not in ``federation`` (None when every id is known)."""
    table = budget_table(budgets)
    pos = table.unmatched(_known_ids(federation.clients))
    return _unmatched_message(table, pos, ignore=True) if pos.size else None


def silo_budgets(
    path: str | os.PathLike[str],
    record_ids: np.ndarray,
    *,
    silo: ClientData | None = None,
    on_unmatched: str = "error",
) -> np.ndarray:
    """One silo's budgets from a table keyed by record id, in the order of ``record_ids``.

    With ``silo`` (its :class:`~pdpfl.data.federation.ClientData`; give it when the file is this
    silo's own, e.g. ``budgets_{client_id}.csv``), rows for ids that are none of the silo's
    training or test records are an error unless ``on_unmatched="ignore"`` (the run-level
    :func:`check_budget_file` reports ignored rows; a file shared by all silos is checked
    against the whole federation there).
    """
    table = read_table(path)
    if silo is not None and not _check_on_unmatched(on_unmatched):
        pos = table.unmatched(_known_ids([silo]))
        if pos.size:
            raise DataValidationError(_unmatched_message(table, pos, ignore=False))
    lookup = table.lookup()
    values = np.array([lookup.get(int(i), np.nan) for i in record_ids], dtype=float)
    missing = np.asarray(record_ids)[np.isnan(values)]
    if len(missing):
        raise DataValidationError(
            f"budgets.file: {len(missing)} training record(s) of this silo have no row in "
            f"{path} (record ids e.g. {missing[:5].tolist()}); give one ε per record id"
        )
    return values


def file_placeholders(template: str) -> list[str]:
    """The ``{name}`` placeholders of a ``budgets.file`` template (ValueError if malformed)."""
    names = []
    for _, field, spec, conv in string.Formatter().parse(template):
        if field is None:
            continue
        if field not in FILE_PLACEHOLDERS or spec or conv:
            raise ValueError(
                f"placeholder {{{field}{'!' + conv if conv else ''}{':' + spec if spec else ''}}}"
                f" is not supported; use {{client_id}} or {{client}} (write {{{{ and }}}} for "
                "literal braces)"
            )
        names.append(field)
    return names


class ConfigWithBudgets(Protocol):
    """What :func:`check_budget_file` reads of an experiment config (its ``budgets`` section,
    whose ``file`` and ``on_unmatched`` it looks up); the config layer sits above data/."""

    @property
    def budgets(self) -> object: ...


def check_budget_file(config: ConfigWithBudgets, federation: Federation) -> list[str]:
    """Run-level check of a ``budgets.file`` table against the whole federation.

    Returns the warnings to show (budgets for unknown ids ignored under
    ``budgets.on_unmatched: ignore``); raises ``ValueError`` for them otherwise. Files that
    are not ``record_id``/``epsilon`` tables (one ε per training record, in order) have no
    ids to check.
    """
    template = getattr(config.budgets, "file", None)
    if template is None:
        return []
    ignore = _check_on_unmatched(getattr(config.budgets, "on_unmatched", "error"))
    users: dict[str, list[ClientData]] = {}
    for k, c in enumerate(federation.clients):
        users.setdefault(template.format(client_id=k, client=c.name), []).append(c)
    warnings = []
    for path, clients in users.items():
        if not is_budget_table(path):
            continue
        table = read_table(path)
        pos = table.unmatched(_known_ids(clients))
        if pos.size:
            if not ignore:
                raise DataValidationError(_unmatched_message(table, pos, ignore=False))
            warnings.append(_unmatched_message(table, pos, ignore=True))
    return warnings
