"""Your own data as a federation: numpy arrays, a pandas DataFrame, or a list of silos.

Every record keeps a **record id** (an integer you choose, or its row position), so that
per-record privacy budgets are matched by id -- never by pdpfl's internal order of silos or of
records inside a silo (which the per-silo train/test split changes)::

    import pdpfl
    fed = pdpfl.federation_from_dataframe(df, silo="hospital", label="disease",
                                          record_id="patient_id", drop=["epsilon"])
    eps = dict(zip(df.patient_id, df.epsilon))       # ε of each patient, by id
    pdpfl.align_budgets(fed, eps)                    # one array per silo, in its train order

Labels of any type are mapped to class indices in sorted order (kept as ``class_names``).
Each silo is split into train and test records (stratified, ``test_fraction`` of each silo, the
split seeded by ``seed``) unless you mark the test records yourself (``test=``). numpy only: no
torch, no pandas import (a DataFrame is read through its public methods).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.data._rng import numpy_generator
from pdpfl.data.budget_table import (
    BUDGET_TABLE_COLUMNS,
    align_budgets,
    is_budget_table,
    read_budget_table,
    silo_budgets,
)
from pdpfl.data.federation import ClientData, Federation
from pdpfl.data.pool import _zscore
from pdpfl.data.splits import DEFAULT_TEST_FRACTION, stratified_split

if TYPE_CHECKING:  # read through its public methods: pandas is never imported here
    import pandas as pd

from pdpfl.data.validation import (
    DataValidationError,
    Where,
    check_features,
    check_label_values,
    check_labels,
    check_lengths,
    check_record_ids,
    check_silo_keys,
    missing_mask,
)

__all__ = [
    "BUDGET_TABLE_COLUMNS",
    "align_budgets",
    "is_budget_table",
    "read_budget_table",
    "silo_budgets",
    "federation_from_arrays",
    "federation_from_dataframe",
    "federation_from_silos",
]


def _labels(
    y: object, num_classes: int | None, where: Where | str = "y"
) -> tuple[np.ndarray, int, list[str]]:
    """Class indices, number of classes and class names of the raw labels ``y``."""
    return check_labels(y, where=where, num_classes=num_classes)


def _record_ids(record_ids: object, n: int, what: str | Where = "record_ids") -> np.ndarray:
    if record_ids is None:
        return np.arange(n, dtype=np.int64)
    return check_record_ids(record_ids, n=n, where=what)


def _normalize(x_tr: np.ndarray, x_te: np.ndarray, normalize: str) -> tuple[Any, Any]:
    if normalize == "zscore":
        return _zscore(x_tr, x_te)
    return x_tr, x_te


def _silo_keys(silos: np.ndarray) -> list[Any]:
    """Silo labels (validated: one type, none missing) in sorted order."""
    return [k.item() if hasattr(k, "item") else k for k in np.unique(silos)]


def _test_mask(test: object, n: int, where: Where | str = "test") -> np.ndarray:
    """One boolean per record (``True``: a test record); 0/1 numbers accepted, gaps refused."""
    w = where if isinstance(where, Where) else Where(where)
    arr = np.asarray(test)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1 or len(arr) != n:
        raise DataValidationError(
            f"{w.source}: expected one boolean per record ({n}), got shape {arr.shape}"
        )
    if arr.dtype == bool:
        return arr
    bad = np.flatnonzero(missing_mask(arr) | ~np.isin(arr, [0, 1, True, False]))
    if bad.size:
        raise DataValidationError(
            f"{w.source}: {bad.size} value(s) are not True/False (e.g. {arr[bad[0]]!r} at "
            f"{w.at(bad)}); mark every record as a test record (True) or not (False)"
        )
    return arr.astype(bool)


def _check_split_options(normalize: str, test_fraction: float, own_split: bool) -> None:
    if normalize not in ("none", "zscore"):
        raise ValueError(f"normalize: expected 'none' or 'zscore', got {normalize!r}")
    if not own_split and (
        isinstance(test_fraction, bool)
        or not isinstance(test_fraction, int | float)
        or not 0 <= float(test_fraction) < 1
    ):
        raise ValueError(f"test_fraction: expected a number in [0, 1), got {test_fraction!r}")


def federation_from_arrays(
    x: object,
    y: object,
    silos: object,
    *,
    record_ids: object = None,
    test: object = None,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    seed: int = 0,
    normalize: str = "none",
    num_classes: int | None = None,
    name: str = "user-data",
    feature_names: Sequence[str] | None = None,
) -> Federation:
    """A federation from one table of records and the silo each record belongs to.

    Parameters
    ----------
    x
        Features, shape ``(n, ...)`` (tabular ``(n, d)`` or images ``(n, C, H, W)``), numeric
        and finite.
    y
        One label per record (text, integers, booleans or whole floats: mapped to class
        indices in sorted order). Missing labels (None, NaN, empty text) are refused.
    silos
        One silo label per record (e.g. the hospital); silos are ordered by sorted label.
        Missing silo labels are refused.
    record_ids
        One unique integer id per record (default: the row position ``0..n-1``). Budgets are
        matched to records by this id (:func:`align_budgets`).
    test
        Optional boolean per record: ``True`` marks a test record (your own split). Without it,
        each silo is split stratified with ``test_fraction`` of its records for testing.
    test_fraction
        Share of each silo's records held out for testing, in ``[0, 1)`` (0: no test records).
    seed
        Seeds the per-silo split.
    normalize
        ``none`` (default) or ``zscore`` (each silo's own train mean/std, applied to its test
        records too).
    num_classes
        Give it when ``y`` already holds class indices ``0..K-1`` (some may be absent).

    Raises
    ------
    pdpfl.data.validation.DataValidationError
        Data that would silently change (see :mod:`pdpfl.data.validation`), naming where.
    """
    return _from_arrays(
        x,
        y,
        silos,
        record_ids=record_ids,
        test=test,
        test_fraction=test_fraction,
        seed=seed,
        normalize=normalize,
        num_classes=num_classes,
        name=name,
        feature_names=feature_names,
    )


def _from_arrays(
    x: object,
    y: object,
    silos: object,
    *,
    record_ids: object,
    test: object,
    test_fraction: float,
    seed: int,
    normalize: str,
    num_classes: int | None,
    name: str,
    feature_names: Sequence[str] | None,
    where: dict[str, Where] | None = None,
) -> Federation:
    w = where or {}
    _check_split_options(normalize, test_fraction, test is not None)
    columns = None if feature_names is None else [str(f) for f in feature_names]
    xx = check_features(x, where=w.get("x", Where("x")), columns=columns)
    labels, k, class_names = _labels(y, num_classes, w.get("y", Where("y")))
    n = check_lengths(x=len(xx), y=len(labels))
    silo_arr = check_silo_keys(silos, n=n, where=w.get("silos", Where("silos")))
    ids = _record_ids(record_ids, n, w.get("record_ids", Where("record_ids")))
    test_mask = None if test is None else _test_mask(test, n, w.get("test", Where("test")))
    clients = []
    for j, key in enumerate(_silo_keys(silo_arr)):
        rows = np.flatnonzero(silo_arr == key)
        if test_mask is not None:
            tr, te = rows[~test_mask[rows]], rows[test_mask[rows]]
        else:
            tr_pos, te_pos = stratified_split(
                labels[rows], float(test_fraction), numpy_generator(seed, f"split:{name}", j)
            )
            tr, te = rows[tr_pos], rows[te_pos]
        x_tr, x_te = _normalize(xx[tr], xx[te], normalize)
        clients.append(
            ClientData(
                name=str(key),
                x_train=x_tr,
                y_train=labels[tr],
                x_test=x_te,
                y_test=labels[te],
                record_ids=ids[tr],
                test_record_ids=ids[te],
            )
        )
    return Federation(
        name=name,
        clients=clients,
        input_shape=xx.shape[1:],
        num_classes=k,
        feature_names=columns,
        class_names=class_names,
        metadata={
            "partition": "user",
            "built_from": "arrays",
            "seed": int(seed),
            "test_fraction": None if test is not None else float(test_fraction),
            "normalize": normalize,
        },
    )


def federation_from_dataframe(
    df: pd.DataFrame,
    *,
    label: str,
    silo: str,
    record_id: str | None = None,
    features: Sequence[str] | None = None,
    drop: Sequence[str] = (),
    test: str | None = None,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    seed: int = 0,
    normalize: str = "zscore",
    name: str = "dataframe",
) -> Federation:
    """A federation from a pandas DataFrame with one row per record.

    Parameters
    ----------
    df
        The records (a ``pandas.DataFrame``).
    label, silo
        Column of the labels and column of the silo (institution) of each record.
    record_id
        Column of unique integer record ids; default: the DataFrame's index (a fresh
        ``RangeIndex`` gives the row positions). Budgets are matched by this id.
    features
        Feature columns (default: every other column, which must then be numeric).
    drop
        Columns that are neither features nor named above (e.g. the budget column, free text).
    test
        Optional boolean column marking your own test records.
    test_fraction, seed, normalize
        As in :func:`federation_from_arrays`; tabular data is z-scored per silo by default
        (``normalize="none"`` keeps values as they are).
    """
    columns = [str(c) for c in df.columns]
    if len(set(columns)) != len(columns):
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        raise DataValidationError(f"DataFrame: column names {repeated} appear more than once")
    named = {"label": label, "silo": silo, "record_id": record_id, "test": test}
    for what, col in named.items():
        if col is not None and col not in columns:
            raise ValueError(f"{what}: {col!r} is not a column; columns: {columns}")
    missing = [c for c in drop if c not in columns]
    if missing:
        raise ValueError(f"drop: {missing} are not columns; columns: {columns}")
    special = {c for c in named.values() if c is not None} | set(drop)
    if features is None:
        features = [c for c in columns if c not in special]
    else:
        features = list(features)
        bad = [c for c in features if c not in columns or c in special]
        if bad:
            raise ValueError(f"features: {bad} are not feature columns of the DataFrame")
    if not features:
        raise ValueError("features: no feature column left")
    non_numeric = [c for c in features if not _numeric(df[c])]
    if non_numeric:
        raise ValueError(
            f"features: columns {non_numeric} are not numeric; encode them (e.g. "
            "pandas.get_dummies) or leave them out with drop=[...]"
        )
    index = list(df.index)

    def arg(what: str, col: str | None) -> Where:
        where = f"{what} (DataFrame column {col!r})" if col is not None else what
        return Where(where, rows=index, word="index")

    ids = df[record_id].to_numpy() if record_id is not None else np.asarray(df.index)
    x = df[features].to_numpy(dtype=np.float64, na_value=np.nan)
    fed = _from_arrays(
        x,
        df[label].to_numpy(),
        df[silo].to_numpy(),
        record_ids=ids,
        test=None if test is None else df[test].to_numpy(),
        test_fraction=test_fraction,
        seed=seed,
        normalize=normalize,
        num_classes=None,
        name=name,
        feature_names=features,
        where={
            "x": arg("features (DataFrame)", None),
            "y": arg("label", label),
            "silos": arg("silo", silo),
            "record_ids": arg("record_id", record_id)
            if record_id is not None
            else arg("record_id (the DataFrame's index)", None),
            "test": arg("test", test),
        },
    )
    fed.metadata["built_from"] = "dataframe"
    return fed


def _numeric(column: object) -> bool:
    kind = getattr(getattr(column, "dtype", None), "kind", "O")
    return kind in "biuf"


def federation_from_silos(
    silos: Sequence[Any] | Mapping[str, Any],
    *,
    record_ids: Sequence[Any] | None = None,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    seed: int = 0,
    normalize: str = "none",
    num_classes: int | None = None,
    name: str = "user-data",
) -> Federation:
    """A federation from per-silo arrays: ``[(x, y), ...]`` or ``{"name": (x, y), ...}``.

    A silo given as ``(x_train, y_train, x_test, y_test)`` keeps your split; ``(x, y)`` is
    split with ``test_fraction``. ``record_ids`` (one array per silo, train records first then
    test records for 4-tuples) default to consecutive integers over the silos in order.
    """
    items = (
        list(silos.items())
        if isinstance(silos, Mapping)
        else [(f"silo-{j}", s) for j, s in enumerate(silos)]
    )
    if not items:
        raise ValueError("silos: at least one silo is required")
    names = [str(key) for key, _ in items]
    if len(set(names)) != len(names):
        raise DataValidationError(f"silos: silo names {names} are not unique as text")
    own_split = any(isinstance(p, tuple | list) and len(p) == 4 for _, p in items)
    xs, ys, silo_of, test_of = [], [], [], []
    for j, (key, parts) in enumerate(items):
        if not isinstance(parts, tuple | list) or len(parts) not in (2, 4):
            raise ValueError(
                f"silos[{key!r}]: expected (x, y) or (x_train, y_train, x_test, y_test)"
            )
        if own_split and len(parts) != 4:
            raise ValueError(
                "silos: give every silo as (x, y), or every silo as "
                "(x_train, y_train, x_test, y_test)"
            )
        pairs = (
            [(parts[0], parts[1], "", False)]
            if len(parts) == 2
            else [(parts[0], parts[1], " (train)", False), (parts[2], parts[3], " (test)", True)]
        )
        count = 0
        for xa, ya, side, is_test in pairs:
            where = f"silos[{key!r}]{side}"
            xa = check_features(xa, where=Where(f"{where} x"))
            ya = check_label_values(ya, where=Where(f"{where} y"))
            check_lengths(**{f"{where} x": len(xa), "y": len(ya)})
            xs.append(xa)
            ys.append(ya)
            silo_of.extend([j] * len(ya))
            test_of.extend([is_test] * len(ya))
            count += len(ya)
        if count == 0:
            raise DataValidationError(f"silos[{key!r}]: no records; leave that silo out")
    shapes = {a.shape[1:] for a in xs if len(a)}
    if len(shapes) > 1:
        raise ValueError(f"silos: every silo needs the same feature shape, got {sorted(shapes)}")
    kinds = {{"U": "text", "b": "booleans"}.get(a.dtype.kind, "numbers") for a in ys if len(a)}
    if len(kinds) > 1:
        raise DataValidationError(
            f"silos: the silos' labels mix {' and '.join(sorted(kinds))}; convert them to one type"
        )
    x = np.concatenate([a for a in xs if len(a)])
    y = np.concatenate([a for a in ys if len(a)])
    ids = None
    if record_ids is not None:
        if len(record_ids) != len(items):
            raise ValueError(f"record_ids: expected one array per silo ({len(items)})")
        parts_ids = []
        for (key, _), r, n_silo in zip(
            items,
            record_ids,
            np.bincount(np.asarray(silo_of, dtype=np.int64), minlength=len(items)),
            strict=True,
        ):
            arr = np.asarray(r).reshape(-1)
            if len(arr) != n_silo:
                raise DataValidationError(
                    f"record_ids[{key!r}]: {len(arr)} ids for {n_silo} records of that silo"
                )
            parts_ids.append(arr)
        ids = np.concatenate(parts_ids)
    fed = _from_arrays(
        x,
        y,
        np.asarray(silo_of),
        record_ids=ids,
        test=np.asarray(test_of, dtype=bool) if own_split else None,
        test_fraction=test_fraction,
        seed=seed,
        normalize=normalize,
        num_classes=num_classes,
        name=name,
        feature_names=None,
        where={"record_ids": Where("record_ids (all silos, in order)")},
    )
    for client, (key, _) in zip(fed.clients, items, strict=True):
        client.name = str(key)
    fed.metadata["built_from"] = "silos"
    return fed
