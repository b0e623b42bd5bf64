"""User-supplied tabular CSV files (Creditcard-style).

The file has a header row; one column is the label (any values: they are mapped to class
indices in sorted order and kept as ``class_names``), every other column must be numeric.
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


def _undersample(y: np.ndarray, ratio: float, rng: np.random.Generator) -> np.ndarray:
    classes, counts = np.unique(y, return_counts=True)
    cap = int(np.floor(ratio * counts.min()))
    keep = []
    for c in classes:
        idx = np.flatnonzero(y == c)
        keep.append(idx if len(idx) <= cap else rng.choice(idx, size=cap, replace=False))
    return np.sort(np.concatenate(keep))


def csv_pool(
    path: str | os.PathLike[str],
    *,
    label_column: str | None = None,
    delimiter: str = ",",
    undersample: float | bool | None = None,
    rng: np.random.Generator,
) -> Pool:
    """Read ``path`` into a :class:`Pool` (label column default: the last column).

    ``undersample``: ``None``/``False`` (keep all), ``True`` (balance classes, ratio 1), or
    a ratio >= 1 of majority to minority records.
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"option 'path': CSV file {str(p)!r} does not exist")
    with open(p, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh, delimiter=delimiter))
    if len(rows) < 2:
        raise ValueError(f"option 'path': {p} needs a header row and at least one record")
    header = [h.strip() for h in rows[0]]
    label = header[-1] if label_column is None else label_column
    if label not in header:
        raise ValueError(f"option 'label_column': {label!r} is not a column of {p}; "
                         f"columns: {header}")
    j = header.index(label)
    body = [r for r in rows[1:] if r]
    bad = [k + 2 for k, r in enumerate(body) if len(r) != len(header)]
    if bad:
        raise ValueError(f"{p}: rows {bad[:5]} do not have {len(header)} fields")
    features = [h for k, h in enumerate(header) if k != j]
    x = np.empty((len(body), len(features)), dtype=np.float64)
    cols = [k for k in range(len(header)) if k != j]
    for i, r in enumerate(body):
        for out, k in enumerate(cols):
            try:
                x[i, out] = float(r[k])
            except ValueError:
                raise ValueError(f"{p}: column {header[k]!r} row {i + 2} is not numeric: "
                                 f"{r[k]!r}") from None
    raw_labels = np.asarray([r[j].strip().strip('"') for r in body])
    class_names, y = np.unique(raw_labels, return_inverse=True)
    ids = np.arange(len(y), dtype=np.int64)
    if undersample not in (None, False):
        ratio = 1.0 if undersample is True else undersample
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or ratio < 1:
            raise ValueError(f"option 'undersample' must be True or a ratio >= 1, "
                             f"got {undersample!r}")
        keep = _undersample(y, float(ratio), rng)
        x, y, ids = x[keep], y[keep], ids[keep]
    return Pool(name="csv", x=x, y=y.astype(np.int64), record_ids=ids,
                input_shape=(len(features),), num_classes=len(class_names),
                feature_names=features, class_names=[str(c) for c in class_names])
