"""CIFAR-10 from the official python-pickle archive (``cifar-10-python.tar.gz``).

The archive is read in place (no extraction); an already extracted ``cifar-10-batches-py/``
folder in a searched directory is accepted too. The batches are Python pickles: they are
only unpickled from the checksum-verified archive or from a folder the user pointed at.
Record ids: training image ``i`` → ``i``; test image ``i`` → ``50000 + i``. Pixels are scaled
to [0, 1]; images are ``(n, 3, 32, 32)``.
"""

from __future__ import annotations

import os
import pickle
import tarfile
from pathlib import Path

import numpy as np

from pdpfl.data.pool import Pool
from pdpfl.data.sources import FileSpec, resolve_file, search_dirs

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
MD5 = "c58f30108f718f92721af3b95e74349a"  # published on the CIFAR page
SHA256 = "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"
SPEC = FileSpec("cifar-10-python.tar.gz", URL, SHA256, "cifar10")
FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{k}" for k in range(1, 6))
TEST_BATCHES = ("test_batch",)
NUM_TRAIN = 50_000
CLASS_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
               "ship", "truck"]
POOLS = ("train", "test", "all")


def _decode(batch: dict) -> tuple[np.ndarray, np.ndarray]:
    data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    if len(data) != len(labels):
        raise ValueError("CIFAR-10 batch: data and labels differ in length")
    return data, labels


def _extracted_folder(data_dir: str | os.PathLike[str] | None) -> Path | None:
    for root in search_dirs(data_dir):
        for cand in (root / "cifar10" / FOLDER, root / FOLDER):
            if (cand / TEST_BATCHES[0]).is_file():
                return cand
    return None


def read_batches(names: tuple[str, ...], data_dir: str | os.PathLike[str] | None = None, *,
                 download: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ``(images uint8 (n, 3, 32, 32), labels)`` of the named batches."""
    batches: dict[str, dict] = {}
    folder = _extracted_folder(data_dir)
    if folder is not None:
        for n in names:
            with open(folder / n, "rb") as fh:
                batches[n] = pickle.load(fh, encoding="bytes")
    else:
        archive = resolve_file(SPEC, data_dir, download_missing=download)
        with tarfile.open(archive, "r:gz") as tar:
            for n in names:
                member = tar.extractfile(f"{FOLDER}/{n}")
                if member is None:
                    raise ValueError(f"{archive}: missing {FOLDER}/{n}")
                batches[n] = pickle.load(member, encoding="bytes")
    parts = [_decode(batches[n]) for n in names]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def cifar10_pool(pool: str = "train", *, data_dir: str | os.PathLike[str] | None = None,
                 download: bool = True) -> Pool:
    """The records of ``pool`` (``train``: 50k, ``test``: 10k, ``all``: 60k)."""
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {list(POOLS)}, got {pool!r}")
    xs, ys, ids = [], [], []
    if pool in ("train", "all"):
        x, y = read_batches(TRAIN_BATCHES, data_dir, download=download)
        xs.append(x)
        ys.append(y)
        ids.append(np.arange(len(y), dtype=np.int64))
    if pool in ("test", "all"):
        x, y = read_batches(TEST_BATCHES, data_dir, download=download)
        xs.append(x)
        ys.append(y)
        ids.append(NUM_TRAIN + np.arange(len(y), dtype=np.int64))
    return Pool(name="cifar10", x=np.concatenate(xs).astype(np.float32) / 255.0,
                y=np.concatenate(ys), record_ids=np.concatenate(ids),
                input_shape=(3, 32, 32), num_classes=10, class_names=list(CLASS_NAMES),
                channel_stats=((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)))
