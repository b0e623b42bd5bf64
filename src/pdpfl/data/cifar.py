"""CIFAR-10 from the official *binary* archive (``cifar-10-binary.tar.gz``; no pickle).

Format (https://www.cs.toronto.edu/~kriz/cifar.html, "binary version"): five training files
``data_batch_1.bin`` … ``data_batch_5.bin`` and ``test_batch.bin`` in ``cifar-10-batches-bin/``,
each 10,000 records of 3,073 bytes -- one label byte (0–9) followed by the 32×32 red, green and
blue planes (1,024 bytes each, row-major). The archive is read in place (no extraction) after its
SHA-256 is verified; an already extracted ``cifar-10-batches-bin/`` folder in a searched
directory is accepted too. Nothing is unpickled: the python-pickle archive the first release read
is no longer used (pickle can execute code).

Record ids: training image ``i`` → ``i``; test image ``i`` → ``50000 + i``. Pixels are scaled
to [0, 1]; images are ``(n, 3, 32, 32)``.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import numpy as np

from pdpfl.data.pool import Pool
from pdpfl.data.sources import FileSpec, resolve_file, search_dirs

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
MD5 = "c32a1d4ab5d03f1284b67883e8d87530"  # published on the CIFAR page
#: SHA-256 of the canonical archive (170,052,171 bytes; matches the published MD5).
SHA256 = "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd"
SPEC = FileSpec("cifar-10-binary.tar.gz", URL, SHA256, "cifar10")
FOLDER = "cifar-10-batches-bin"
TRAIN_BATCHES = tuple(f"data_batch_{k}.bin" for k in range(1, 6))
TEST_BATCHES = ("test_batch.bin",)
RECORD_BYTES = 1 + 3 * 32 * 32
NUM_TRAIN = 50_000
CLASS_NAMES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]
POOLS = ("train", "test", "all")


def decode_batch(data: bytes, name: str = "batch") -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 (n, 3, 32, 32), labels int64)`` of one binary batch file's bytes."""
    if len(data) == 0 or len(data) % RECORD_BYTES:
        raise ValueError(
            f"CIFAR-10 {name}: {len(data)} bytes is not a whole number of {RECORD_BYTES}-byte "
            "records (label byte + 3×32×32 pixels); the file is truncated or not the binary version"
        )
    raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, RECORD_BYTES)
    labels = raw[:, 0].astype(np.int64)
    if labels.max() > 9:
        raise ValueError(f"CIFAR-10 {name}: label {int(labels.max())} outside 0–9")
    return raw[:, 1:].reshape(-1, 3, 32, 32).copy(), labels


def _extracted_folder(data_dir: str | os.PathLike[str] | None) -> Path | None:
    for root in search_dirs(data_dir):
        for cand in (root / "cifar10" / FOLDER, root / FOLDER):
            if (cand / TEST_BATCHES[0]).is_file():
                return cand
    return None


def read_batches(
    names: tuple[str, ...], data_dir: str | os.PathLike[str] | None = None, *, download: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ``(images uint8 (n, 3, 32, 32), labels)`` of the named batch files."""
    blobs: dict[str, bytes] = {}
    folder = _extracted_folder(data_dir)
    if folder is not None:
        for n in names:
            blobs[n] = (folder / n).read_bytes()
    else:
        archive = resolve_file(SPEC, data_dir, download_missing=download)
        with tarfile.open(archive, "r:gz") as tar:
            for n in names:
                try:
                    member = tar.extractfile(f"{FOLDER}/{n}")
                except KeyError:
                    member = None
                if member is None:
                    raise ValueError(f"{archive}: missing {FOLDER}/{n}")
                blobs[n] = member.read()
    parts = [decode_batch(blobs[n], n) for n in names]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def cifar10_pool(
    pool: str = "train", *, data_dir: str | os.PathLike[str] | None = None, download: bool = True
) -> Pool:
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
    return Pool(
        name="cifar10",
        x=np.concatenate(xs).astype(np.float32) / 255.0,
        y=np.concatenate(ys),
        record_ids=np.concatenate(ids),
        input_shape=(3, 32, 32),
        num_classes=10,
        class_names=list(CLASS_NAMES),
        channel_stats=((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    )
