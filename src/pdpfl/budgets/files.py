"""Budgets read from a ``.npy`` or ``.csv`` file, validated (:mod:`pdpfl.budgets`)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from pdpfl.budgets.scenarios import MIN_BUDGET, below_minimum, validate_budgets


def is_number(text: str) -> bool:
    """Whether ``text`` parses as a float (``inf`` and ``nan`` included): a budget cell, not a
    header."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def load_budgets(path: str | Path, column: str | int | None = None) -> np.ndarray:
    """Read budgets from ``.npy`` (1-D array) or ``.csv`` and validate them.

    CSV: either a single column of numbers (an optional header line is skipped), or a table
    with a header row from which ``column`` (name or 0-based index) is taken.

    Raises
    ------
    ValueError
        Empty file, wrong shape, non-numeric cells, or any ε that is NaN, infinite or below
        :data:`~pdpfl.budgets.MIN_BUDGET` (named by line and column).
    FileNotFoundError
        When ``path`` does not exist.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"budgets file not found: {p}")
    suffix = p.suffix.lower()
    if suffix == ".npy":
        try:
            arr = np.load(p, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise ValueError(f"budgets file {p.name}: not a readable .npy array ({exc})") from None
        if column is not None:
            raise ValueError("column: only applies to .csv budget files")
        return validate_budgets(arr, name=f"budgets file {p.name}", minimum=MIN_BUDGET)
    if suffix == ".csv":
        return validate_budgets(
            _read_csv_column(p, column), name=f"budgets file {p.name}", minimum=MIN_BUDGET
        )
    raise ValueError(f"budgets file {p.name}: unsupported extension {suffix!r} (use .npy or .csv)")


def _read_csv_column(p: Path, column: str | int | None) -> list[float]:
    try:
        with p.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            numbered = [(reader.line_num, row) for row in reader]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"budgets file {p.name}: not a readable UTF-8 CSV ({exc})") from None
    blank = [n for n, row in numbered if not any(cell.strip() for cell in row)]
    filled = [n for n, row in numbered if any(cell.strip() for cell in row)]
    inside = [n for n in blank if filled and filled[0] < n < filled[-1]]
    if inside:  # budgets are in record order: a gap would shift every later record's ε
        raise ValueError(
            f"budgets file {p.name}: line {inside[0]} is empty; every line between the first "
            "and the last holds one record's ε (remove the empty line or fill it)"
        )
    lines = filled
    rows = [row for _, row in numbered if any(cell.strip() for cell in row)]
    if not rows:
        raise ValueError(f"budgets file {p.name}: empty file")

    header = None if all(is_number(c) for c in rows[0]) else [c.strip() for c in rows[0]]
    body = rows[1:] if header is not None else rows
    if column is None:
        width = len(header) if header is not None else len(rows[0])
        if width != 1:
            raise ValueError(
                f"budgets file {p.name}: {width} columns; name the budget column (column=...)"
            )
        idx = 0
    elif isinstance(column, int):
        idx = column
    else:
        if header is None or column not in header:
            raise ValueError(f"column: {column!r} not in the header of {p.name} ({header})")
        idx = header.index(column)
    values: list[float] = []
    for lineno, row in zip(lines[1:] if header is not None else lines, body, strict=True):
        if idx >= len(row):
            raise ValueError(f"budgets file {p.name}: line {lineno} has no column {idx}")
        try:
            value = float(row[idx])
        except ValueError:
            raise ValueError(
                f"budgets file {p.name}: line {lineno}: {row[idx]!r} is not a number"
            ) from None
        if not (math.isfinite(value) and value > 0):
            what = "is NaN or infinite" if not math.isfinite(value) else "is <= 0"
            raise ValueError(
                f"budgets file {p.name}: line {lineno}: ε {row[idx].strip()!r} "
                f"{what}; every ε must be a finite number > 0"
            )
        low = below_minimum(value)
        if low is not None:
            name = header[idx] if header is not None else f"{idx + 1}"
            raise ValueError(f"budgets file {p.name}: line {lineno}, column {name!r}: {low}")
        values.append(value)
    if not values:
        raise ValueError(f"budgets file {p.name}: no budget values (only a header)")
    return values
