"""Input validation shared by every loader (in the spirit of scikit-learn's ``check_array``).

Data that would silently change is refused: a missing label that would become a class of its
own (``''`` or ``'nan'``), a record without a silo, repeated or non-integer record ids,
non-numeric or non-finite feature cells, labels of the wrong shape or type, and arrays whose
lengths differ. Each check raises :class:`DataValidationError` (a ``ValueError``) saying

* **what** is wrong (``2 label cells are empty``),
* **where** (``patients.csv, column 'label', rows 7 and 19`` / ``y at index 3`` /
  ``DataFrame column 'site' at index 'p17'``), and
* **how to fix it** (drop or fill those records, map labels to classes, ...).

Every loader -- :func:`pdpfl.data.load_federation`'s CSV reader and built-in files,
:func:`pdpfl.federation_from_arrays`, ``_dataframe`` and ``_silos`` -- goes through these
functions, so a problem reads the same wherever it is found. numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = [
    "MISSING_TEXT",
    "DataValidationError",
    "FederationArrays",
    "SiloArrays",
    "Where",
    "check_features",
    "check_federation_data",
    "check_label_values",
    "check_labels",
    "check_lengths",
    "check_record_ids",
    "check_silo_keys",
    "is_missing",
    "missing_mask",
    "non_finite_records",
]

#: Text cells read as "missing" (pandas' default NA strings): refused as labels, silos, ids.
MISSING_TEXT = frozenset(
    {
        "",
        "nan",
        "NaN",
        "NAN",
        "-nan",
        "-NaN",
        "NA",
        "N/A",
        "n/a",
        "na",
        "<NA>",
        "#N/A",
        "#NA",
        "null",
        "NULL",
        "Null",
        "None",
        "none",
        "NaT",
        "?",
    }
)

#: Largest magnitude a feature may have: training runs in float32.
FLOAT32_MAX = float(np.finfo(np.float32).max)


class DataValidationError(ValueError):
    """Input data that would silently change; the message says what, where and how to fix."""


@dataclass(frozen=True)
class Where:
    """How to name positions of one input in messages.

    ``source`` names the input (``"y"``, ``"patients.csv, column 'label'"``); ``rows`` maps a
    0-based position to what the user sees (CSV line numbers, a DataFrame's index), and
    ``word`` is what that is called (``"row"`` or ``"index"``).
    """

    source: str
    rows: Sequence[Any] | np.ndarray | None = None
    word: str = "index"

    def at(self, positions: Sequence[int] | np.ndarray, limit: int = 5) -> str:
        pos = [int(p) for p in list(positions)[:limit]]
        shown = [
            repr(self.rows[p])
            if self.rows is not None and isinstance(self.rows[p], str)
            else str(self.rows[p] if self.rows is not None else p)
            for p in pos
        ]
        more = len(positions) - len(pos)
        word = self.word if len(positions) == 1 else _plural(self.word)
        text = f"{word} {', '.join(shown)}"
        return text + (f" and {more} more" if more > 0 else "")

    def column(self, name: str) -> Where:
        """The same rows, one named column of a table."""
        return Where(f"{self.source}, column {name!r}", self.rows, self.word)


def _plural(word: str) -> str:
    return {"index": "indices", "row": "rows"}.get(word, word + "s")


def _where(where: Where | str) -> Where:
    return where if isinstance(where, Where) else Where(where)


# -------------------------------------------------------------------------- missing cells


def is_missing(value: object) -> bool:
    """True for None, NaN, pandas' NA/NaT and text such as ``''``, ``'nan'``, ``'NA'``."""
    if value is None:
        return True
    if isinstance(value, float | np.floating):
        return bool(np.isnan(value))
    if isinstance(value, str | np.str_):
        return value.strip() in MISSING_TEXT
    if isinstance(value, bytes):
        return value.strip().decode("utf-8", "replace") in MISSING_TEXT
    if isinstance(value, np.datetime64 | np.timedelta64):
        return bool(np.isnat(value))
    return type(value).__name__ in ("NAType", "NaTType")


def missing_mask(values: np.ndarray) -> np.ndarray:
    """Boolean mask of the missing entries of a 1-D array (see :func:`is_missing`)."""
    arr = np.asarray(values)
    kind = arr.dtype.kind
    mask: np.ndarray
    if kind in "biu":
        mask = np.zeros(arr.shape, dtype=bool)
    elif kind in "fc":
        mask = np.isnan(arr)
    elif kind in "mM":
        mask = np.isnat(arr)
    else:
        mask = np.frompyfunc(is_missing, 1, 1)(arr).astype(bool)
    return mask


# --------------------------------------------------------------------------------- shapes


def check_lengths(**lengths: int) -> int:
    """The common length of named inputs, or an error naming them (``x and y: ...``)."""
    values = list(lengths.values())
    if len(set(values)) > 1:
        names = " and ".join(lengths)
        got = " and ".join(str(v) for v in values)
        raise DataValidationError(
            f"{names}: different numbers of records ({got}); give one entry per record"
        )
    return values[0] if values else 0


def _one_per_record(values: object, where: Where, what: str) -> np.ndarray:
    try:
        arr = np.asarray(values)
    except ValueError as err:  # ragged nested lists
        raise DataValidationError(
            f"{where.source}: expected one {what} per record ({err})"
        ) from None
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        hint = (
            " -- one-hot labels? pass y.argmax(axis=1)" if what == "label" and arr.ndim == 2 else ""
        )
        raise DataValidationError(
            f"{where.source}: expected one {what} per record (shape (n,)), got shape "
            f"{arr.shape}{hint}"
        )
    return arr


def _refuse_missing(arr: np.ndarray, where: Where, what: str, fix: str) -> None:
    bad = np.flatnonzero(missing_mask(arr))
    if bad.size:
        example = arr[bad[0]]
        shown = (
            "empty"
            if isinstance(example, str) and not example.strip()
            else repr(example.item() if isinstance(example, np.generic) else example)
        )
        raise DataValidationError(
            f"{where.source}: {bad.size} record(s) have no {what} ({shown}) at "
            f"{where.at(bad)}; {fix}"
        )


# ------------------------------------------------------------------------------ features


def check_features(
    x: object, *, where: Where | str = "x", columns: Sequence[str] | None = None
) -> np.ndarray:
    """Features as a float64 array of shape ``(n, ...)`` (a 1-D input is one feature).

    Refused: non-numeric cells (text, dates, complex), NaN or infinite values, and magnitudes
    beyond float32 (training precision), each reported with the first positions and columns.
    """
    w = _where(where)
    try:
        arr = np.asarray(x)
    except ValueError as err:
        raise DataValidationError(f"{w.source}: not an array of numbers ({err})") from None
    if arr.ndim == 0:
        raise DataValidationError(
            f"{w.source}: expected an array of shape (n, features...), got a single value"
        )
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    kind = arr.dtype.kind
    if kind in "cmM" or kind not in "biufO":
        raise DataValidationError(
            f"{w.source}: features must be real numbers, got dtype {arr.dtype}; encode text "
            "and dates as numbers (e.g. pandas.get_dummies) or leave those columns out"
        )
    if kind == "O":
        arr = _object_features(arr, w, columns)
    out = arr.astype(np.float64)
    if int(np.prod(out.shape[1:])) == 0:
        raise DataValidationError(f"{w.source}: no features (shape {out.shape})")
    flat = out.reshape(len(out), int(np.prod(out.shape[1:])))
    if (np.abs(flat) <= FLOAT32_MAX).all():  # one pass: NaN, ±inf and overflow all fail it
        return out
    bad = ~np.isfinite(flat)
    if bad.any():
        raise DataValidationError(
            f"{w.source}: {int(bad.any(axis=1).sum())} record(s) have NaN or infinite features "
            f"({_cells(flat, bad, w, columns)}); remove those records or fill the values "
            "before building the federation"
        )
    big = np.abs(flat) > FLOAT32_MAX
    if big.any():
        raise DataValidationError(
            f"{w.source}: {int(big.any(axis=1).sum())} record(s) have features beyond "
            f"{FLOAT32_MAX:.4g} in magnitude ({_cells(flat, big, w, columns)}), which float32 "
            "training cannot hold; rescale those features"
        )
    return out


def _object_features(arr: np.ndarray, w: Where, columns: Sequence[str] | None) -> np.ndarray:
    flat = arr.reshape(len(arr), -1)
    out = np.empty(flat.shape, dtype=np.float64)
    for i, row in enumerate(flat):
        for j, v in enumerate(row):
            ok = isinstance(v, int | float | np.integer | np.floating | bool | np.bool_)
            if ok:
                out[i, j] = float(v)
                continue
            col = (
                f", column {columns[j]!r}"
                if columns is not None and j < len(columns)
                else (f", feature {j}" if flat.shape[1] > 1 else "")
            )
            raise DataValidationError(
                f"{w.source}: {w.at([i])}{col} is not a number: {v!r}; encode it or leave "
                "that column out"
            )
    return out.reshape(arr.shape)


def _cells(flat: np.ndarray, mask: np.ndarray, w: Where, columns: Sequence[str] | None) -> str:
    rows, cols = np.nonzero(mask)
    parts = []
    for r, c in list(zip(rows.tolist(), cols.tolist(), strict=True))[:3]:
        col = (
            f"column {columns[c]!r}"
            if columns is not None and c < len(columns)
            else (f"feature {c}" if flat.shape[1] > 1 else "")
        )
        parts.append(f"{w.at([r])}{', ' + col if col else ''}: {float(flat[r, c])!r}")
    more = int(mask.sum()) - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


# -------------------------------------------------------------------------------- labels


def check_labels(
    y: object,
    *,
    where: Where | str = "y",
    num_classes: int | None = None,
) -> tuple[np.ndarray, int, list[str]]:
    """Class indices (int64), number of classes and class names of the labels ``y``.

    Labels are text, integers, booleans or integral floats (``1.0`` is class ``1``), one per
    record. Without ``num_classes`` they are mapped to classes in sorted order; with it they
    must already be integers in ``[0, num_classes)``. Refused: missing labels (None, NaN,
    empty or ``'nan'`` cells), continuous values, mixed text and numbers, 2-D labels
    (one-hot), fewer than 2 classes.
    """
    w = _where(where)
    arr = check_label_values(y, where=w)
    if arr.size == 0:
        raise DataValidationError(f"{w.source}: no records")
    if num_classes is not None:
        if isinstance(num_classes, bool) or int(num_classes) != num_classes or num_classes < 2:
            raise DataValidationError(f"num_classes: expected an integer >= 2, got {num_classes!r}")
        k = int(num_classes)
        if arr.dtype.kind not in "iub":
            raise DataValidationError(
                f"{w.source}: with num_classes={k} labels must be integers in [0, {k}); leave "
                "num_classes out to map any labels to classes"
            )
        bad = np.flatnonzero((arr < 0) | (arr >= k))
        if bad.size:
            raise DataValidationError(
                f"{w.source}: label {_plain(arr[bad[0]])!r} at {w.at(bad)} is outside [0, {k}) "
                f"(num_classes={k}); leave num_classes out to map any labels to classes"
            )
        return arr.astype(np.int64), k, [str(c) for c in range(k)]
    classes, idx = np.unique(arr, return_inverse=True)
    if len(classes) < 2:
        raise DataValidationError(
            f"{w.source}: at least 2 classes are needed, found {len(classes)} "
            f"({', '.join(repr(_plain(c)) for c in classes)})"
        )
    return idx.astype(np.int64).reshape(-1), len(classes), [str(_plain(c)) for c in classes]


def check_label_values(y: object, *, where: Where | str = "y") -> np.ndarray:
    """Labels as one comparable 1-D array (text, integers or booleans), before mapping them
    to classes: the shape, missing-label and type checks of :func:`check_labels`."""
    w = _where(where)
    arr = _one_per_record(y, w, "label")
    if arr.size == 0:
        return arr
    _refuse_missing(arr, w, "label", "drop those records or give them a label")
    return _as_class_values(arr, w, "label")


def _plain(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


def _as_class_values(arr: np.ndarray, w: Where, what: str) -> np.ndarray:
    """Labels or silo keys as one comparable type: text, or integers (integral floats)."""
    kind = arr.dtype.kind
    if kind in "cmMV":
        raise DataValidationError(
            f"{w.source}: {what}s must be text or integers, got dtype {arr.dtype}"
        )
    if kind == "f":
        frac = np.flatnonzero(arr != np.round(arr))
        if frac.size:
            raise DataValidationError(
                f"{w.source}: {what} {_plain(arr[frac[0]])!r} at {w.at(frac)} is not a whole "
                f"number; {what}s name classes or silos (continuous values are not supported)"
            )
        huge = np.flatnonzero(np.abs(arr) >= 2.0**62)
        if huge.size:
            raise DataValidationError(
                f"{w.source}: {what} {_plain(arr[huge[0]])!r} at {w.at(huge)} is too large"
            )
        return arr.astype(np.int64)
    if kind != "O":
        return arr
    texts = np.array([isinstance(v, str | np.str_ | bytes) for v in arr])
    numbers = np.array(
        [isinstance(v, int | float | np.integer | np.floating) for v in arr]
    )  # bool is an int
    other = np.flatnonzero(~(texts | numbers))
    if other.size:
        v = arr[other[0]]
        raise DataValidationError(
            f"{w.source}: {what} {v!r} at {w.at(other)} is a {type(v).__name__}; {what}s must "
            "be text or numbers"
        )
    if texts.any() and numbers.any():
        t, n = np.flatnonzero(texts)[0], np.flatnonzero(numbers)[0]
        raise DataValidationError(
            f"{w.source}: {what}s mix text and numbers ({_plain(arr[t])!r} at {w.at([t])}, "
            f"{_plain(arr[n])!r} at {w.at([n])}); convert them to one type (e.g. all text)"
        )
    if texts.all():
        return np.array([v.decode() if isinstance(v, bytes) else str(v) for v in arr])
    flags = np.array([isinstance(v, bool | np.bool_) for v in arr])
    if flags.any() and not flags.all():
        b, n = np.flatnonzero(flags)[0], np.flatnonzero(~flags)[0]
        raise DataValidationError(
            f"{w.source}: {what}s mix booleans and numbers ({_plain(arr[b])!r} at {w.at([b])}, "
            f"{_plain(arr[n])!r} at {w.at([n])}); True would silently equal 1"
        )
    if flags.all():
        return arr.astype(bool)
    return _as_class_values(np.array(arr.tolist(), dtype=np.float64), w, what)


# ------------------------------------------------------------------------- silos and ids


def check_silo_keys(
    silos: object, *, n: int | None = None, where: Where | str = "silos"
) -> np.ndarray:
    """One silo label per record (text or integers); missing or mixed-type labels refused."""
    w = _where(where)
    arr = _one_per_record(silos, w, "silo")
    if n is not None and len(arr) != n:
        raise DataValidationError(f"{w.source}: expected one silo per record ({n}), got {len(arr)}")
    _refuse_missing(arr, w, "silo", "give every record its silo or drop those records")
    return _as_class_values(arr, w, "silo")


def check_record_ids(
    ids: object, *, n: int | None = None, where: Where | str = "record_ids"
) -> np.ndarray:
    """Unique int64 record ids, one per record (integral floats and digit strings accepted)."""
    w = _where(where)
    arr = _one_per_record(ids, w, "record id")
    if n is not None and len(arr) != n:
        raise DataValidationError(f"{w.source}: expected one id per record ({n}), got {len(arr)}")
    _refuse_missing(arr, w, "record id", "give every record a unique integer id")
    out = _as_int64(arr, w)
    uniq, inverse, counts = np.unique(out, return_inverse=True, return_counts=True)
    if len(uniq) != len(out):
        rep = int(np.flatnonzero(counts > 1)[0])
        rows = np.flatnonzero(inverse.reshape(-1) == rep)
        others = int((counts > 1).sum()) - 1
        raise DataValidationError(
            f"{w.source}: record ids must be unique; id {int(uniq[rep])} appears "
            f"{int(counts[rep])} times (at {w.at(rows)})"
            + (f", and {others} other id(s) repeat" if others else "")
            + "; privacy budgets and ledgers are keyed by id"
        )
    return out


def _as_int64(arr: np.ndarray, w: Where) -> np.ndarray:
    kind = arr.dtype.kind
    if kind == "b":
        raise DataValidationError(f"{w.source}: record ids must be integers, got booleans")
    if kind == "i":
        return arr.astype(np.int64)
    if kind == "u":
        big = np.flatnonzero(arr > np.iinfo(np.int64).max)
        if big.size:
            raise DataValidationError(
                f"{w.source}: id {arr[big[0]]} at {w.at(big)} does not fit in 64 bits"
            )
        return arr.astype(np.int64)
    out = np.empty(len(arr), dtype=np.int64)
    for i, v in enumerate(arr.tolist()):
        try:
            if isinstance(v, bool):
                raise ValueError
            value = int(v.strip()) if isinstance(v, str) else int(v)
            if isinstance(v, float) and value != v:
                raise ValueError
            if not -(2**63) <= value < 2**63:
                raise OverflowError
        except (TypeError, ValueError, OverflowError):
            raise DataValidationError(
                f"{w.source}: record id {v!r} at {w.at([i])} is not a 64-bit integer; map ids "
                "to integers first (e.g. with pandas.factorize)"
            ) from None
        out[i] = value
    return out


class SiloArrays(Protocol):
    """What :func:`check_federation_data` reads of a silo (a
    :class:`~pdpfl.data.federation.ClientData`, which imports this module)."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    record_ids: np.ndarray
    test_record_ids: np.ndarray | None


class FederationArrays(Protocol):
    """What :func:`check_federation_data` reads of a :class:`~pdpfl.data.federation.Federation`."""

    @property
    def num_classes(self) -> int: ...

    @property
    def clients(self) -> Sequence[SiloArrays]: ...


def check_federation_data(federation: FederationArrays) -> None:
    """Re-check a federation's arrays before training (they may have been changed after it
    was built): finite features and labels in ``[0, num_classes)``, naming the silo and the
    record ids."""
    k = int(federation.num_classes)
    for c in federation.clients:
        for side, x, y, ids in (
            ("training", c.x_train, c.y_train, c.record_ids),
            ("test", c.x_test, c.y_test, c.test_record_ids),
        ):
            x = np.asarray(x)
            y = np.asarray(y)
            if x.size:
                bad = non_finite_records(x)
                if bad.any():
                    raise DataValidationError(
                        f"silo {c.name!r}: {int(bad.sum())} {side} record(s) have NaN or "
                        f"infinite features ({_ids(ids, bad)}); clean the data before training"
                    )
            wrong = (y < 0) | (y >= k) if y.size else np.zeros(0, bool)
            if wrong.any():
                raise DataValidationError(
                    f"silo {c.name!r}: {int(wrong.sum())} {side} label(s) outside [0, {k}) "
                    f"({_ids(ids, wrong)})"
                )


def non_finite_records(x: np.ndarray) -> np.ndarray:
    """Mask of the records (first axis) with any NaN or infinite feature."""
    x = np.asarray(x)
    if not x.size:
        return np.zeros(len(x), dtype=bool)
    finite: np.ndarray = np.isfinite(x.reshape(len(x), -1)).all(axis=1)
    return ~finite


def record_ids_of(ids: object, mask: np.ndarray) -> str:
    """``record ids e.g. [...]`` of the masked records (positions when ids do not match)."""
    return _ids(ids, mask)


def _ids(ids: object, mask: np.ndarray) -> str:
    arr = None if ids is None else np.asarray(ids).reshape(-1)
    if arr is not None and len(arr) == len(mask):
        return f"record ids e.g. {arr[mask][:5].tolist()}"
    return f"positions e.g. {np.flatnonzero(mask)[:5].tolist()}"
