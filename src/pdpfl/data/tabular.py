"""User-supplied tabular CSV files (Creditcard-style, or one row per record of several silos).

The file has a header row; one column is the label (any values: they are mapped to class
indices in sorted order and kept as ``class_names``). Optional columns: ``silo_column`` (the
silo of each record: the silos come from the file instead of a partition), ``record_id_column``
(unique integer ids, default the 0-based data row), and ``drop_columns`` (ignored, e.g. free
text or the budget column). Every other column is a feature and must be numeric.

Nothing is guessed (see :mod:`pdpfl.data.validation`): an empty or ``nan`` label or silo cell,
a non-numeric, NaN or infinite feature cell, a repeated or non-integer record id, a row with
the wrong number of fields and a repeated column name are errors naming the file, row (line
number) and column.
Optional majority undersampling (``undersample=r``) keeps, for each class, at most
``r`` × (size of the smallest class) records, drawn at random before partitioning. Each silo is
z-scored with its own train statistics (the scaler never sees test records).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from pdpfl.data.pool import Pool
from pdpfl.data.validation import (
    Where,
    check_features,
    check_labels,
    check_record_ids,
    check_silo_keys,
)


def _undersample(y: np.ndarray, ratio: float, rng: np.random.Generator) -> np.ndarray:
    classes, counts = np.unique(y, return_counts=True)
    cap = int(np.floor(ratio * counts.min()))
    keep = []
    for c in classes:
        idx = np.flatnonzero(y == c)
        keep.append(idx if len(idx) <= cap else rng.choice(idx, size=cap, replace=False))
    return np.sort(np.concatenate(keep))


def _as_numbers(cells: np.ndarray) -> np.ndarray | None:
    """The cells as floats when every one is written as a number (NaN/inf are then refused by
    the label checks), else None (text labels)."""
    try:
        return np.array([float(c) for c in cells], dtype=np.float64)
    except ValueError:
        return None


def _col(where: Where, column: str, option: str) -> Where:
    return Where(f"{where.source}, column {column!r} (option {option!r})", where.rows, where.word)


def csv_pool(
    path: str | os.PathLike[str],
    *,
    label_column: str | None = None,
    delimiter: str = ",",
    undersample: float | bool | None = None,
    rng: np.random.Generator,
    silo_column: str | None = None,
    record_id_column: str | None = None,
    drop_columns: list[str] | tuple[str, ...] | None = None,
) -> Pool:
    """Read ``path`` into a :class:`Pool` (label column default: the last column).

    ``undersample``: ``None``/``False`` (keep all), ``True`` (balance classes, ratio 1), or
    a ratio >= 1 of majority to minority records. ``silo_column`` fills ``Pool.silos``;
    ``record_id_column`` gives the record ids; ``drop_columns`` are not read as features.
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"option 'path': CSV file {str(p)!r} does not exist")
    if not isinstance(delimiter, str) or len(delimiter) != 1:
        raise ValueError(f"option 'delimiter': expected one character, got {delimiter!r}")
    try:
        with open(p, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh, delimiter=delimiter)
            rows = [(reader.line_num, r) for r in reader]
    except UnicodeDecodeError as err:
        raise ValueError(
            f"option 'path': {p} is not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None
    except csv.Error as err:
        raise ValueError(f"option 'path': {p} is not a readable CSV file ({err})") from None
    rows = [(line, r) for line, r in rows if r]  # blank lines; a row of empty cells is checked
    if len(rows) < 2:
        raise ValueError(f"option 'path': {p} needs a header row and at least one record")
    header = [h.strip() for h in rows[0][1]]
    repeated = sorted({h for h in header if header.count(h) > 1})
    if repeated:
        raise ValueError(f"{p}: column names {repeated} appear more than once in the header")
    label = header[-1] if label_column is None else label_column
    if label not in header:
        raise ValueError(
            f"option 'label_column': {label!r} is not a column of {p}; columns: {header}"
        )
    j = header.index(label)
    if isinstance(drop_columns, str):  # "a,b" or "[a, b]" from a command line
        drop_columns = [c.strip() for c in drop_columns.strip("[]").split(",") if c.strip()]
    drop = list(drop_columns or [])
    special = {"silo_column": silo_column, "record_id_column": record_id_column}
    for option, col in [*special.items(), *(("drop_columns", d) for d in drop)]:
        if col is not None and col not in header:
            raise ValueError(
                f"option {option!r}: {col!r} is not a column of {p}; columns: {header}"
            )
        if col == label:
            raise ValueError(f"option {option!r}: {col!r} is the label column")
    skip = {j} | {header.index(c) for c in [*special.values(), *drop] if c is not None}
    lines = [line for line, _ in rows[1:]]
    body = [r for _, r in rows[1:]]
    bad = [line for line, r in rows[1:] if len(r) != len(header)]
    if bad:
        raise ValueError(
            f"{p}: rows {bad[:5]} do not have {len(header)} fields (the header's "
            f"count, split at {delimiter!r}; option 'delimiter' sets another)"
        )
    cols = [k for k in range(len(header)) if k not in skip]
    if not cols:
        raise ValueError(f"{p}: no feature column left after the label and drop_columns")
    features = [header[k] for k in cols]
    where = Where(str(p), rows=lines, word="row")
    x = np.empty((len(body), len(features)), dtype=np.float64)
    for i, r in enumerate(body):
        for out, k in enumerate(cols):
            try:
                x[i, out] = float(r[k])
            except ValueError:
                raise ValueError(
                    f"{p}: column {header[k]!r} row {lines[i]} is not numeric: "
                    f"{r[k]!r} (leave it out with option 'drop_columns')"
                ) from None
    x = check_features(x, where=where, columns=features)
    raw_labels: np.ndarray = np.asarray([r[j].strip().strip('"') for r in body])
    numeric = _as_numbers(raw_labels)
    if numeric is not None:  # "1" and "1.0" are one class; 0.5 is refused as continuous
        raw_labels = numeric
    y, num_classes, class_names = check_labels(raw_labels, where=_col(where, label, "label_column"))
    ids = np.arange(len(y), dtype=np.int64)
    if record_id_column is not None:
        k = header.index(record_id_column)
        ids = check_record_ids(
            [r[k] for r in body], where=_col(where, record_id_column, "record_id_column")
        )
    silos = None
    if silo_column is not None:
        k = header.index(silo_column)
        silos = check_silo_keys(
            np.asarray([r[k].strip().strip('"') for r in body]),
            where=_col(where, silo_column, "silo_column"),
        )
    if undersample not in (None, False):
        ratio = 1.0 if undersample is True else undersample
        if (
            isinstance(ratio, bool)
            or not isinstance(ratio, int | float)
            or not (1 <= ratio < float("inf"))
        ):
            raise ValueError(
                f"option 'undersample' must be True or a ratio >= 1, got {undersample!r}"
            )
        keep = _undersample(y, float(ratio), rng)
        x, y, ids = x[keep], y[keep], ids[keep]
        silos = None if silos is None else silos[keep]
    return Pool(
        name="csv",
        x=x,
        y=y.astype(np.int64),
        record_ids=ids,
        input_shape=(len(features),),
        num_classes=num_classes,
        feature_names=features,
        class_names=class_names,
        silos=silos,
    )
