"""Offline datasets shipped with scikit-learn: ``digits`` and ``breast-cancer``.

They need no files and no network, so the demo and most tests use them.
"""

from __future__ import annotations

import numpy as np

from pdpfl.data.pool import Pool


def digits_pool(*, flat: bool = True) -> Pool:
    """The 1,797 8x8 handwritten digits, pixel values scaled from 0..16 to [0, 1]."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.asarray(d.data, dtype=np.float32) / 16.0
    shape: tuple[int, ...] = (64,)
    names: list[str] | None = [f"pixel_{r}_{c}" for r in range(8) for c in range(8)]
    if not flat:
        x = x.reshape(-1, 1, 8, 8)
        shape, names = (1, 8, 8), None
    return Pool(
        name="digits",
        x=x,
        y=np.asarray(d.target, dtype=np.int64),
        record_ids=np.arange(len(x), dtype=np.int64),
        input_shape=shape,
        num_classes=10,
        feature_names=names,
        class_names=[str(k) for k in range(10)],
    )


def breast_cancer_pool() -> Pool:
    """Wisconsin diagnostic breast cancer: 569 records, 30 features, malignant/benign."""
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    return Pool(
        name="breast-cancer",
        x=np.asarray(d.data, dtype=np.float64),
        y=np.asarray(d.target, dtype=np.int64),
        record_ids=np.arange(len(d.target), dtype=np.int64),
        input_shape=(30,),
        num_classes=2,
        feature_names=[str(f) for f in d.feature_names],
        class_names=[str(c) for c in d.target_names],
    )
