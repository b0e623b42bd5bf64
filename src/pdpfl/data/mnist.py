"""MNIST from the canonical IDX files.

Record ids: training image ``i`` → ``i``, test image ``i`` → ``60000 + i``, so ``mnist``
(training pool) and ``mnist-10k`` (the 10k test images, what many offline machines have)
share one id space. Pixels are scaled to [0, 1]; images are ``(n, 1, 28, 28)``.
"""

from __future__ import annotations

import os

import numpy as np

from pdpfl.data.idx import read_idx
from pdpfl.data.pool import Pool
from pdpfl.data.sources import FileSpec, resolve_file

BASE_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
NUM_TRAIN = 60_000

#: SHA-256 of the canonical files (the last three were computed from local canonical copies
#: whose MD5s match the published ones; train-images from the published reference).
_TRAIN_IMAGES = "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"
_TRAIN_LABELS = "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"
_TEST_IMAGES = "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"
_TEST_LABELS = "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"
SHA256 = {
    "train-images-idx3-ubyte.gz": _TRAIN_IMAGES,
    "train-labels-idx1-ubyte.gz": _TRAIN_LABELS,
    "t10k-images-idx3-ubyte.gz": _TEST_IMAGES,
    "t10k-labels-idx1-ubyte.gz": _TEST_LABELS,
}
POOLS = ("train", "test", "all")


def spec(filename: str) -> FileSpec:
    return FileSpec(filename, BASE_URL + filename, SHA256[filename], "mnist")


def load_split(
    split: str, data_dir: str | os.PathLike[str] | None = None, *, download: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 (n, 28, 28), labels int64)`` of the ``train`` or ``test`` split."""
    prefix = {"train": "train", "test": "t10k"}[split]
    images = read_idx(
        resolve_file(spec(f"{prefix}-images-idx3-ubyte.gz"), data_dir, download_missing=download)
    )
    labels = read_idx(
        resolve_file(spec(f"{prefix}-labels-idx1-ubyte.gz"), data_dir, download_missing=download)
    )
    if images.ndim != 3 or images.shape[1:] != (28, 28) or len(images) != len(labels):
        raise ValueError(f"MNIST {split}: unexpected shapes {images.shape}, {labels.shape}")
    return images, labels.astype(np.int64)


def mnist_pool(
    pool: str = "train",
    *,
    data_dir: str | os.PathLike[str] | None = None,
    name: str = "mnist",
    download: bool = True,
) -> Pool:
    """The records of ``pool`` (``train``: 60k, ``test``: 10k, ``all``: 70k) as a :class:`Pool`."""
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {list(POOLS)}, got {pool!r}")
    xs, ys, ids = [], [], []
    if pool in ("train", "all"):
        x, y = load_split("train", data_dir, download=download)
        xs.append(x)
        ys.append(y)
        ids.append(np.arange(len(y), dtype=np.int64))
    if pool in ("test", "all"):
        x, y = load_split("test", data_dir, download=download)
        xs.append(x)
        ys.append(y)
        ids.append(NUM_TRAIN + np.arange(len(y), dtype=np.int64))
    x = (np.concatenate(xs).astype(np.float32) / 255.0)[:, None, :, :]
    return Pool(
        name=name,
        x=x,
        y=np.concatenate(ys),
        record_ids=np.concatenate(ids),
        input_shape=(1, 28, 28),
        num_classes=10,
        class_names=[str(k) for k in range(10)],
        channel_stats=((0.1307,), (0.3081,)),
    )
