"""Fed-Heart-Disease (FLamby; rPDP-FL Table 1): four hospitals, binary label, 13 features.

Pipeline (every step is a test):

1. read ``processed.<centre>.data`` for Cleveland, Hungary, Switzerland, VA Long Beach;
   ``"?"`` is a missing value;
2. drop the mostly-missing columns ``slope``, ``ca``, ``thal``; drop rows still missing
   → 303 / 261 / 46 / 130 = 740 records;
3. label = ``num != 0`` (presence of heart disease);
4. per centre, a 66 % / 34 % stratified split with a fixed seed → 486 train / 254 test
   (``split="flamby"``: FLamby's own split -- scikit-learn's ``train_test_split`` with
   ``random_state=43``, stratified where both labels have more than 2 records -- the same
   test set for every experiment seed, as in the papers' runs);
5. one-hot ``cp`` (1-4) and ``restecg`` (0-2), dropping the first level → 13 features;
6. z-score each centre with the mean/std of its own *train* records only.

Record ids are row positions in the four raw files concatenated in centre order, so they are
stable and unique across the federation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from pdpfl.data._rng import numpy_generator
from pdpfl.data.federation import ClientData, Federation
from pdpfl.data.sources import FileSpec, resolve_file
from pdpfl.data.splits import DEFAULT_TEST_FRACTION, stratified_split
from pdpfl.data.validation import Where, check_features

BASE_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/heart-disease/"

#: (silo name, file stem, SHA-256 of the canonical UCI file).
CENTRES: tuple[tuple[str, str, str], ...] = (
    ("cleveland", "cleveland", "a74b7efa387bc9d108d7d0115d831fe9b414b29ae7124f331b622b4efa0427c8"),
    ("hungary", "hungarian", "d1ad108f785768cd3d7e82dc522e6f5a61eea93cccfb3a46ee8076f73fc3d796"),
    (
        "switzerland",
        "switzerland",
        "834a405ccf5b66ab4056bb77794adc8df0b7125186454c0a1d002d33c6c3b314",
    ),
    ("va-long-beach", "va", "e7c93d8d0d2acdadfa4c5e8de768e2191e7f618b952e29623f1f0d5949ff6b8f"),
)

RAW_COLUMNS = (
    "age",
    "sex",
    "cp",
    "trestbps",
    "chol",
    "fbs",
    "restecg",
    "thalach",
    "exang",
    "oldpeak",
    "slope",
    "ca",
    "thal",
    "num",
)
DROPPED_COLUMNS = ("slope", "ca", "thal")
FEATURE_NAMES = [
    "age",
    "sex",
    "cp_2",
    "cp_3",
    "cp_4",
    "trestbps",
    "chol",
    "fbs",
    "restecg_1",
    "restecg_2",
    "thalach",
    "exang",
    "oldpeak",
]
CLASS_NAMES = ["no-disease", "disease"]


def file_specs() -> list[FileSpec]:
    return [
        FileSpec(f"processed.{stem}.data", f"{BASE_URL}processed.{stem}.data", sha, "heart_disease")
        for _, stem, sha in CENTRES
    ]


@dataclass
class HeartCentre:
    """One centre after cleaning and one-hot encoding, before splitting/normalization."""

    name: str
    x: np.ndarray  # (n, 13) float64, unnormalized
    y: np.ndarray  # (n,) int64
    record_ids: np.ndarray  # (n,) int64


def parse_processed(text: str) -> np.ndarray:
    """Parse a UCI ``processed.*.data`` file into a float array with NaN for ``"?"``."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        fields = line.split(",")
        if len(fields) != len(RAW_COLUMNS):
            raise ValueError(f"expected {len(RAW_COLUMNS)} comma-separated fields, got: {line!r}")
        try:
            rows.append([np.nan if f.strip() == "?" else float(f) for f in fields])
        except ValueError:
            raise ValueError(
                f"line {len(rows) + 1}: a field is not a number or '?': {line!r}"
            ) from None
    return np.asarray(rows, dtype=np.float64)


def encode(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps 2, 3, 5: returns (features, labels, kept-row mask) for one centre's raw rows."""
    col = {c: i for i, c in enumerate(RAW_COLUMNS)}
    kept_cols = [i for c, i in col.items() if c not in DROPPED_COLUMNS]
    keep = ~np.isnan(raw[:, kept_cols]).any(axis=1)
    r = raw[keep]

    def onehot(name: str, levels: tuple[int, ...]) -> list[np.ndarray]:
        v = r[:, col[name]]
        bad = ~np.isin(v, levels)
        if bad.any():
            raise ValueError(f"column {name!r} has values outside {levels}: {np.unique(v[bad])}")
        return [(v == lv).astype(np.float64) for lv in levels[1:]]

    feats = [
        r[:, col["age"]],
        r[:, col["sex"]],
        *onehot("cp", (1, 2, 3, 4)),
        r[:, col["trestbps"]],
        r[:, col["chol"]],
        r[:, col["fbs"]],
        *onehot("restecg", (0, 1, 2)),
        r[:, col["thalach"]],
        r[:, col["exang"]],
        r[:, col["oldpeak"]],
    ]
    x = np.stack(feats, axis=1)
    y = (r[:, col["num"]] != 0).astype(np.int64)
    return x, y, keep


def load_centres(
    data_dir: str | os.PathLike[str] | None = None, *, download: bool = True
) -> list[HeartCentre]:
    """The four cleaned centres (steps 1-3 and 5), unsplit and unnormalized."""
    centres = []
    offset = 0
    for (name, _, _), spec in zip(CENTRES, file_specs(), strict=True):
        path = resolve_file(spec, data_dir, download_missing=download)
        raw = parse_processed(path.read_text(encoding="ascii"))
        x, y, keep = encode(raw)
        lines = np.flatnonzero(keep) + 1  # 1-based (non-empty) line of each kept record
        check_features(
            x, where=Where(str(path), rows=lines, word="line"), columns=list(FEATURE_NAMES)
        )
        ids = offset + np.flatnonzero(keep)
        centres.append(HeartCentre(name, x, y, ids.astype(np.int64)))
        offset += len(raw)
    return centres


def zscore(train: np.ndarray, *others: np.ndarray) -> tuple[np.ndarray, ...]:
    """Normalize with the mean/std of ``train`` only (std 0 → 1). Returns (train, *others)."""
    mean = train.mean(axis=0)
    std = train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return tuple((a - mean) / std for a in (train, *others))


#: ``seeded``: pdpfl's stratified split, drawn from the experiment seed; ``flamby``: FLamby's.
SPLITS: tuple[str, ...] = ("seeded", "flamby")
#: FLamby's Fed-Heart-Disease train fraction and split seed (``HeartDiseaseRaw``).
FLAMBY_TRAIN_FRACTION = 0.66
FLAMBY_RANDOM_STATE = 43


def flamby_split(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FLamby's split of one centre (sorted train and test positions): scikit-learn's
    ``train_test_split(arange(n), train_size=0.66, test_size=1 - 0.66, random_state=43)``,
    stratified by the binary label when both labels have more than 2 records."""
    from sklearn.model_selection import train_test_split

    y = np.asarray(y).reshape(-1)
    levels, counts = np.unique(y, return_counts=True)
    stratify = y if len(levels) > 1 and bool(np.all(counts > 2)) else None
    tr, te = train_test_split(
        np.arange(len(y)),
        test_size=1.0 - FLAMBY_TRAIN_FRACTION,
        train_size=FLAMBY_TRAIN_FRACTION,
        random_state=FLAMBY_RANDOM_STATE,
        shuffle=True,
        stratify=stratify,
    )
    return np.sort(tr).astype(np.int64), np.sort(te).astype(np.int64)


def load_heart_disease(
    *,
    seed: int = 42,
    data_dir: str | os.PathLike[str] | None = None,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    normalize: bool = True,
    download: bool = True,
    split: str = "seeded",
) -> Federation:
    """The Fed-Heart-Disease federation (4 fixed silos; see the module docstring)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)} for heart-disease, got {split!r}")
    clients = []
    for i, c in enumerate(load_centres(data_dir, download=download)):
        if split == "flamby":
            tr, te = flamby_split(c.y)
        else:
            tr, te = stratified_split(c.y, test_fraction, numpy_generator(seed, "heart-split", i))
        x_tr, x_te = c.x[tr], c.x[te]
        if normalize:
            x_tr, x_te = zscore(x_tr, x_te)
        clients.append(
            ClientData(
                name=c.name,
                x_train=x_tr,
                y_train=c.y[tr],
                x_test=x_te,
                y_test=c.y[te],
                record_ids=c.record_ids[tr],
                test_record_ids=c.record_ids[te],
            )
        )
    return Federation(
        name="heart-disease",
        clients=clients,
        input_shape=(len(FEATURE_NAMES),),
        num_classes=2,
        feature_names=list(FEATURE_NAMES),
        class_names=list(CLASS_NAMES),
        metadata={"fixed_silos": True, "test_fraction": test_fraction},
    )
