"""Creditcard (ULB / Kaggle ``mlg-ulb/creditcardfraud``): 284,807 transactions × 30 features.

Columns ``Time, V1 … V28, Amount`` and the label ``Class`` (492 frauds). Preprocessing as in the
ULDP-FL reference (spec A.5.2, ``dataset.py``):

1. a 15 % stratified test split;
2. a standard scaler fitted on the training split only (applied to both splits);
3. the majority class (0) of the *training* split undersampled to 10 % (without replacement);
   the test split is not undersampled. 284,807 records give 24,584 training records (the paper:
   "about 25K") and 42,722 test records.

The training records are then linked to users and silos (:func:`pdpfl.data.users.assign_users`,
``uniform`` or ``zipf``); the test records are dealt to the silos at random, so the pooled test
metrics of a run are those of the one global test set. The reference reports balanced accuracy
("ROC-AUC of hard predictions", D17); pdpfl reports plain accuracy on the (imbalanced) test set.

The file is downloaded from a public mirror of the Kaggle CSV (no sign-in), verified by SHA-256
and cached (:mod:`pdpfl.data.sources`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from pdpfl.data._rng import numpy_generator
from pdpfl.data.federation import ClientData, Federation
from pdpfl.data.sources import FileSpec, resolve_file
from pdpfl.data.splits import stratified_split
from pdpfl.data.users import assign_users
from pdpfl.data.validation import Where, check_features

#: The Kaggle CSV (mlg-ulb/creditcardfraud, version 3) as mirrored by TensorFlow's tutorials.
URL = "https://storage.googleapis.com/download.tensorflow.org/data/creditcard.csv"
#: SHA-256 of the Kaggle ``creditcard.csv`` (version 3), as recorded by a third-party loader; not
#: re-verified against the mirror here (no network) -- a mismatch is a clear ChecksumError.
SHA256 = "76274b691b16a6c49d3f159c883398e03ccd6d1ee12d9d8ee38f4b4b98551a89"
SPEC = FileSpec("creditcard.csv", URL, SHA256, "creditcard")
FEATURES = ["Time", *(f"V{i}" for i in range(1, 29)), "Amount"]
NUM_RECORDS = 284_807


def file_specs() -> list[FileSpec]:
    return [SPEC]


def read_csv(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(x (n, 30) float64, y (n,) int64)`` from a Creditcard CSV (header row; quoted or bare)."""
    with open(path, encoding="utf-8") as fh:
        header = [h.strip().strip('"') for h in fh.readline().strip().split(",")]
    if header != [*FEATURES, "Class"]:
        raise ValueError(
            f"{path}: expected the columns {', '.join([*FEATURES, 'Class'])}, got {header}"
        )
    data = np.loadtxt(path, delimiter=",", skiprows=1, quotechar='"', dtype=np.float64, ndmin=2)
    if data.shape[1] != 31:
        raise ValueError(f"{path}: expected 31 columns, got {data.shape[1]}")
    rows = Where(str(path), rows=np.arange(2, len(data) + 2), word="row")
    check_features(data, where=rows, columns=[*FEATURES, "Class"])
    y = data[:, 30]
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError(f"{path}: Class must be 0 or 1")
    return data[:, :30], y.astype(np.int64)


def preprocess(
    x: np.ndarray,
    y: np.ndarray,
    rng: np.random.Generator,
    *,
    test_fraction: float = 0.15,
    majority_fraction: float = 0.1,
) -> dict[str, np.ndarray]:
    """Split, scale and undersample (the reference's order; see the module docstring).

    Returns ``x_train, y_train, train_ids, x_test, y_test, test_ids`` (ids index the rows of
    ``x``). The scaler sees the training split only; only the training majority is undersampled.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(f"x, y: expected (n, d) and (n,), got {x.shape} and {y.shape}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    if not 0 < majority_fraction <= 1:
        raise ValueError(f"majority_fraction must be in (0, 1], got {majority_fraction!r}")
    train, test = stratified_split(y, test_fraction, rng)
    mean = x[train].mean(axis=0)
    std = x[train].std(axis=0)
    std = np.where(std > 0, std, 1.0)
    majority = train[y[train] == 0]
    keep = rng.choice(majority, size=int(majority_fraction * len(majority)), replace=False)
    train = np.sort(np.concatenate([keep, train[y[train] != 0]]))
    test = np.sort(test)
    return {
        "x_train": ((x[train] - mean) / std).astype(np.float32),
        "y_train": y[train],
        "train_ids": train.astype(np.int64),
        "x_test": ((x[test] - mean) / std).astype(np.float32),
        "y_test": y[test],
        "test_ids": test.astype(np.int64),
    }


def federation_from_arrays(
    x: np.ndarray,
    y: np.ndarray,
    *,
    num_clients: int = 5,
    seed: int = 42,
    users: dict[str, Any] | None = None,
    test_fraction: float = 0.15,
    majority_fraction: float = 0.1,
    name: str = "creditcard",
) -> Federation:
    """The Creditcard federation from raw arrays (used by :func:`load_creditcard` and tests)."""
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
        raise ValueError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    d = preprocess(
        x,
        y,
        numpy_generator(seed, f"split:{name}"),
        test_fraction=test_fraction,
        majority_fraction=majority_fraction,
    )
    n = len(d["y_train"])
    if users is not None:
        alloc = assign_users(
            n, num_silos=num_clients, rng=numpy_generator(seed, f"users:{name}"), **users
        )
        silo_of, user_of = alloc.silo_ids, alloc.user_ids
    else:
        silo_of = numpy_generator(seed, f"partition:{name}").permutation(n) % num_clients
        user_of = None
    test_silo = numpy_generator(seed, f"test:{name}").permutation(len(d["y_test"])) % num_clients
    clients = []
    for k in range(num_clients):
        tr = np.flatnonzero(silo_of == k)
        te = np.flatnonzero(test_silo == k)
        clients.append(
            ClientData(
                name=f"client-{k}",
                x_train=d["x_train"][tr],
                y_train=d["y_train"][tr],
                x_test=d["x_test"][te],
                y_test=d["y_test"][te],
                record_ids=d["train_ids"][tr],
                user_ids=None if user_of is None else user_of[tr],
                test_record_ids=d["test_ids"][te],
            )
        )
    return Federation(
        name=name,
        clients=clients,
        input_shape=(x.shape[1],),
        num_classes=2,
        feature_names=list(FEATURES) if x.shape[1] == len(FEATURES) else None,
        class_names=["legitimate", "fraud"],
        metadata={
            "seed": seed,
            "test_fraction": test_fraction,
            "majority_fraction": majority_fraction,
            **({"users": dict(users)} if users else {}),
        },
    )


def load_creditcard(
    *,
    num_clients: int = 5,
    seed: int = 42,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    users: dict[str, Any] | None = None,
    test_fraction: float = 0.15,
    majority_fraction: float = 0.1,
) -> Federation:
    """Resolve (download, verify, cache) ``creditcard.csv`` and build the federation."""
    path = resolve_file(SPEC, data_dir, download_missing=download)
    x, y = read_csv(path)
    return federation_from_arrays(
        x,
        y,
        num_clients=num_clients,
        seed=seed,
        users=users,
        test_fraction=test_fraction,
        majority_fraction=majority_fraction,
    )
