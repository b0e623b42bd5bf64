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
from typing import Any

import numpy as np

from pdpfl.data._rng import numpy_generator
from pdpfl.data.federation import ClientData, Federation
from pdpfl.data.pool import _zscore
from pdpfl.data.splits import DEFAULT_TEST_FRACTION, stratified_split

__all__ = [
    "align_budgets",
    "federation_from_arrays",
    "federation_from_dataframe",
    "federation_from_silos",
]


def _labels(y: np.ndarray, num_classes: int | None) -> tuple[np.ndarray, int, list[str]]:
    """Class indices, number of classes and class names of the raw labels ``y``."""
    y = np.asarray(y).reshape(-1)
    if num_classes is not None:
        if isinstance(num_classes, bool) or int(num_classes) != num_classes or num_classes < 2:
            raise ValueError(f"num_classes: expected an integer >= 2, got {num_classes!r}")
        if not np.issubdtype(y.dtype, np.integer) or (len(y) and (
                y.min() < 0 or y.max() >= num_classes)):
            raise ValueError(
                f"y: with num_classes={num_classes} labels must be integers in "
                f"[0, {num_classes}); leave num_classes out to map any labels to classes"
            )
        return y.astype(np.int64), int(num_classes), [str(c) for c in range(int(num_classes))]
    if len(y) and y.dtype == object and any(v is None for v in y):
        raise ValueError("y: missing labels (None); drop those records first")
    classes, idx = np.unique(y, return_inverse=True)
    if len(classes) < 2:
        raise ValueError(f"y: at least 2 classes are needed, found {len(classes)}")
    return idx.astype(np.int64), len(classes), [str(c) for c in classes]


def _record_ids(record_ids: Any, n: int, what: str = "record_ids") -> np.ndarray:
    if record_ids is None:
        return np.arange(n, dtype=np.int64)
    ids = np.asarray(record_ids).reshape(-1)
    if len(ids) != n:
        raise ValueError(f"{what}: expected one id per record ({n}), got {len(ids)}")
    if n and not np.issubdtype(ids.dtype, np.integer):
        try:
            as_int = ids.astype(np.int64)
        except (TypeError, ValueError):
            raise ValueError(
                f"{what}: record ids must be integers (got e.g. {ids[0]!r}); map them to "
                "integers first, e.g. with pandas.factorize"
            ) from None
        if not np.array_equal(as_int, ids.astype(float)):
            raise ValueError(f"{what}: record ids must be integers (got e.g. {ids[0]!r})")
        ids = as_int
    ids = ids.astype(np.int64)
    uniq, counts = np.unique(ids, return_counts=True)
    if len(uniq) != n:
        raise ValueError(f"{what}: record ids must be unique; repeated: {uniq[counts > 1][:5]}")
    return ids


def _features(x: Any, n: int | None = None) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number)
                                   or arr.dtype == bool):
        raise ValueError(f"x: features must be numeric, got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    if arr.ndim < 2:
        raise ValueError(f"x: expected an array of shape (n, features...), got {arr.shape}")
    if n is not None and len(arr) != n:
        raise ValueError(f"x and y: different numbers of records ({len(arr)} and {n})")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        bad = int((~np.isfinite(arr)).reshape(len(arr), -1).any(axis=1).sum())
        raise ValueError(f"x: {bad} record(s) have NaN or infinite features; clean them first")
    return arr


def _normalize(x_tr: np.ndarray, x_te: np.ndarray, normalize: str) -> tuple[Any, Any]:
    if normalize == "zscore":
        return _zscore(x_tr, x_te)
    return x_tr, x_te


def _silo_keys(silos: np.ndarray) -> list[Any]:
    """Silo labels in a stable order: sorted when comparable, else by first appearance."""
    try:
        return [k.item() if hasattr(k, "item") else k for k in np.unique(silos)]
    except TypeError:
        return list(dict.fromkeys(silos.tolist()))


def federation_from_arrays(
    x: Any,
    y: Any,
    silos: Any,
    *,
    record_ids: Any = None,
    test: Any = None,
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
        Features, shape ``(n, ...)`` (tabular ``(n, d)`` or images ``(n, C, H, W)``), numeric.
    y
        One label per record (any values: mapped to class indices in sorted order).
    silos
        One silo label per record (e.g. the hospital); silos are ordered by sorted label.
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
    """
    yy = np.asarray(y).reshape(-1)
    n = len(yy)
    if n == 0:
        raise ValueError("x, y: no records")
    xx = _features(x, n)
    labels, k, class_names = _labels(yy, num_classes)
    ids = _record_ids(record_ids, n)
    silo_arr = np.asarray(silos).reshape(-1)
    if len(silo_arr) != n:
        raise ValueError(f"silos: expected one silo per record ({n}), got {len(silo_arr)}")
    if normalize not in ("none", "zscore"):
        raise ValueError(f"normalize: expected 'none' or 'zscore', got {normalize!r}")
    if test is not None:
        test_mask = np.asarray(test).reshape(-1)
        if len(test_mask) != n or test_mask.dtype != bool:
            raise ValueError(f"test: expected one boolean per record ({n})")
    else:
        if isinstance(test_fraction, bool) or not 0 <= float(test_fraction) < 1:
            raise ValueError(f"test_fraction: expected a number in [0, 1), got {test_fraction!r}")
        test_mask = None
    clients = []
    for j, key in enumerate(_silo_keys(silo_arr)):
        rows = np.flatnonzero(silo_arr == key)
        if test_mask is not None:
            tr, te = rows[~test_mask[rows]], rows[test_mask[rows]]
        else:
            tr_pos, te_pos = stratified_split(labels[rows], float(test_fraction),
                                              numpy_generator(seed, f"split:{name}", j))
            tr, te = rows[tr_pos], rows[te_pos]
        x_tr, x_te = _normalize(xx[tr], xx[te], normalize)
        clients.append(ClientData(
            name=str(key), x_train=x_tr, y_train=labels[tr], x_test=x_te, y_test=labels[te],
            record_ids=ids[tr], test_record_ids=ids[te],
        ))
    return Federation(
        name=name, clients=clients, input_shape=xx.shape[1:], num_classes=k,
        feature_names=None if feature_names is None else [str(f) for f in feature_names],
        class_names=class_names,
        metadata={"partition": "user", "built_from": "arrays", "seed": int(seed),
                  "test_fraction": None if test is not None else float(test_fraction),
                  "normalize": normalize},
    )


def federation_from_dataframe(
    df: Any,
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
    ids = df[record_id].to_numpy() if record_id is not None else np.asarray(df.index)
    x = df[features].to_numpy(dtype=np.float64)
    fed = federation_from_arrays(
        x, df[label].to_numpy(), df[silo].to_numpy(),
        record_ids=_record_ids(ids, len(df), "record_id" if record_id else "the index"),
        test=None if test is None else df[test].to_numpy(dtype=bool),
        test_fraction=test_fraction, seed=seed, normalize=normalize, name=name,
        feature_names=features,
    )
    fed.metadata["built_from"] = "dataframe"
    return fed


def _numeric(column: Any) -> bool:
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
    items = list(silos.items()) if isinstance(silos, Mapping) else [
        (f"silo-{j}", s) for j, s in enumerate(silos)]
    if not items:
        raise ValueError("silos: at least one silo is required")
    xs, ys, silo_of, test_of = [], [], [], []
    for j, (key, parts) in enumerate(items):
        if not isinstance(parts, tuple | list) or len(parts) not in (2, 4):
            raise ValueError(f"silos[{key!r}]: expected (x, y) or (x_train, y_train, x_test, "
                             "y_test)")
        pairs = [(parts[0], parts[1], False)] if len(parts) == 2 else [
            (parts[0], parts[1], False), (parts[2], parts[3], True)]
        for xa, ya, is_test in pairs:
            ya = np.asarray(ya).reshape(-1)
            xa = np.asarray(xa)
            if len(xa) != len(ya):
                raise ValueError(f"silos[{key!r}]: x and y have {len(xa)} and {len(ya)} records")
            xs.append(xa.reshape(len(xa), -1) if xa.ndim == 1 else xa)
            ys.append(ya)
            silo_of.extend([j] * len(ya))
            test_of.extend([is_test] * len(ya))
    shapes = {a.shape[1:] for a in xs if len(a)}
    if len(shapes) > 1:
        raise ValueError(f"silos: every silo needs the same feature shape, got {sorted(shapes)}")
    x = np.concatenate(xs)
    y = np.concatenate(ys)
    ids = None
    if record_ids is not None:
        if len(record_ids) != len(items):
            raise ValueError(f"record_ids: expected one array per silo ({len(items)})")
        ids = np.concatenate([np.asarray(r).reshape(-1) for r in record_ids])
    own_split = any(len(parts) == 4 for _, parts in items)
    if own_split and not all(len(parts) == 4 for _, parts in items):
        raise ValueError("silos: give every silo as (x, y), or every silo as "
                         "(x_train, y_train, x_test, y_test)")
    fed = federation_from_arrays(
        x, y, np.asarray(silo_of), record_ids=ids,
        test=np.asarray(test_of, dtype=bool) if own_split else None,
        test_fraction=test_fraction, seed=seed, normalize=normalize, num_classes=num_classes,
        name=name,
    )
    for client, (key, _) in zip(fed.clients, items, strict=True):
        client.name = str(key)
    fed.metadata["built_from"] = "silos"
    return fed


def align_budgets(federation: Federation, budgets: Any) -> list[np.ndarray]:
    """Each silo's per-record budgets in its train order, matched by record id.

    ``budgets``: a mapping ``record id -> ε`` (a dict, or a pandas Series indexed by id), a
    pair ``(ids, values)``, or a 1-D array indexed by record id (``budgets[i]`` is the ε of
    record ``i``; natural when the ids are row positions). Ids of test records or of records
    not in the federation are ignored; a training record without a budget is an error.
    """
    lookup = _budget_lookup(budgets)
    out = []
    missing: list[int] = []
    for client in federation.clients:
        values = np.array([lookup.get(int(i), np.nan) for i in client.record_ids], dtype=float)
        missing.extend(int(i) for i in client.record_ids[np.isnan(values)][:5])
        out.append(values)
    n_missing = int(sum(np.isnan(v).sum() for v in out))
    if n_missing:
        raise ValueError(
            f"budgets: {n_missing} training record(s) have no budget (record ids e.g. "
            f"{missing[:5]}); give one ε per record id"
        )
    bad = [float(v) for arr in out for v in arr[~(np.isfinite(arr) & (arr > 0))][:3]]
    if bad:
        raise ValueError(f"budgets: every ε must be a finite number > 0, got e.g. {bad[:3]}")
    return out


def _budget_lookup(budgets: Any) -> dict[int, float]:
    if hasattr(budgets, "index") and hasattr(budgets, "to_numpy") and not isinstance(
            budgets, np.ndarray):  # a pandas Series indexed by record id
        keys, values = np.asarray(budgets.index), budgets.to_numpy(dtype=float)
    elif isinstance(budgets, Mapping):
        keys = np.asarray(list(budgets.keys()))
        values = np.asarray(list(budgets.values()), dtype=float)
    elif isinstance(budgets, tuple) and len(budgets) == 2:
        keys, values = np.asarray(budgets[0]), np.asarray(budgets[1], dtype=float)
    else:
        values = np.asarray(budgets, dtype=float).reshape(-1)
        keys = np.arange(len(values))
    if len(keys) != len(values):
        raise ValueError(f"budgets: {len(keys)} ids but {len(values)} values")
    keys = _record_ids(keys, len(keys), "budgets (record ids)")
    return dict(zip(keys.tolist(), values.tolist(), strict=True))



#: Header of a budgets table keyed by record id (``budgets.file`` may be such a ``.csv``).
BUDGET_TABLE_COLUMNS = ("record_id", "epsilon")


def is_budget_table(path: Any) -> bool:
    """True if ``path`` is a ``.csv`` whose header names ``record_id`` and ``epsilon``."""
    import csv
    from pathlib import Path

    p = Path(path)
    if p.suffix.lower() != ".csv" or not p.is_file():
        return False
    with open(p, newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh), [])
    return set(BUDGET_TABLE_COLUMNS) <= {h.strip() for h in header}


def read_budget_table(path: Any) -> dict[int, float]:
    """``record id -> ε`` from a ``.csv`` with the columns ``record_id`` and ``epsilon``."""
    import csv
    from pathlib import Path

    p = Path(path)
    with open(p, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    try:
        ids = [int(r["record_id"]) for r in rows]
        values = [float(r["epsilon"]) for r in rows]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"budgets file {p.name}: needs an integer record_id and a numeric "
                         f"epsilon on every row ({err})") from None
    return _budget_lookup((np.asarray(ids, dtype=np.int64), np.asarray(values)))


def silo_budgets(path: Any, record_ids: np.ndarray) -> np.ndarray:
    """One silo's budgets from a table keyed by record id, in the order of ``record_ids``."""
    lookup = read_budget_table(path)
    values = np.array([lookup.get(int(i), np.nan) for i in record_ids], dtype=float)
    missing = np.asarray(record_ids)[np.isnan(values)]
    if len(missing):
        raise ValueError(f"budgets.file: {len(missing)} training record(s) of this silo have no "
                         f"row in {path} (record ids e.g. {missing[:5].tolist()})")
    bad = values[~(np.isfinite(values) & (values > 0))]
    if len(bad):
        raise ValueError(f"budgets.file: every ε must be a finite number > 0, got e.g. "
                         f"{bad[:3].tolist()}")
    return values
