"""SVHN cropped digits (``train_32x32.mat``, ``test_32x32.mat``) over many clients.

The canonical files of http://ufldl.stanford.edu/housenumbers/ are MATLAB v5 files read with
:func:`scipy.io.loadmat` (no pickle): ``X`` is ``(32, 32, 3, n)`` uint8 and ``y`` is ``(n, 1)``
with label 10 for the digit 0 (mapped to 0 here). IDP-FedAvg's setting (spec B.5): the 73,257
training images assigned to 725 clients uniformly at random; the 26,032 test images are spread
over the same clients (pooled accuracy = test-set accuracy). Pixels are scaled to [0, 1];
images are ``(n, 3, 32, 32)``. Record ids: train image ``i`` → ``i``, test image ``i`` →
``73257 + i``.
"""

from __future__ import annotations

import os

import numpy as np

from pdpfl.data._rng import numpy_generator
from pdpfl.data.federation import Federation
from pdpfl.data.many_clients import federate_train_test, uniform_assignment
from pdpfl.data.pool import Pool
from pdpfl.data.sources import FileSpec, resolve_file

BASE_URL = "http://ufldl.stanford.edu/housenumbers/"
#: SHA-256 from TensorFlow Datasets' ``url_checksums/svhn_cropped.txt``.
SHA256 = {
    "train_32x32.mat": "435e94d69a87fde4fd4d7f3dd208dfc32cb6ae8af2240d066de1df7508d083b8",
    "test_32x32.mat": "cdce80dfb2a2c4c6160906d0bd7c68ec5a99d7ca4831afa54f09182025b6a75b",
}
NUM_TRAIN = 73_257


def spec(filename: str) -> FileSpec:
    return FileSpec(filename, BASE_URL + filename, SHA256[filename], "svhn")


def read_mat(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 (n, 3, 32, 32), labels int64 in 0..9)`` of one SVHN ``.mat`` file."""
    from scipy.io import loadmat

    try:
        mat = loadmat(str(path), variable_names=["X", "y"])
    except (ValueError, OSError, NotImplementedError) as exc:
        raise ValueError(f"{path}: not a readable SVHN .mat file ({exc})") from None
    if "X" not in mat or "y" not in mat:
        raise ValueError(f"{path}: expected variables X and y")
    x, y = np.asarray(mat["X"]), np.asarray(mat["y"]).reshape(-1).astype(np.int64)
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.shape[3] != len(y):
        raise ValueError(f"{path}: X has shape {x.shape}, expected (32, 32, 3, {len(y)})")
    if len(y) and (y.min() < 1 or y.max() > 10):
        raise ValueError(f"{path}: labels must lie in 1..10 (10 = digit 0)")
    return np.ascontiguousarray(np.transpose(x, (3, 2, 0, 1))), np.where(y == 10, 0, y)


def svhn_pool(
    split: str, *, data_dir: str | os.PathLike[str] | None = None, download: bool = True
) -> Pool:
    """The ``train`` (73,257) or ``test`` (26,032) images as a :class:`Pool`."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    x, y = read_mat(resolve_file(spec(f"{split}_32x32.mat"), data_dir, download_missing=download))
    offset = 0 if split == "train" else NUM_TRAIN
    return Pool(
        name="svhn",
        x=x.astype(np.float32) / 255.0,
        y=y,
        record_ids=offset + np.arange(len(y), dtype=np.int64),
        input_shape=(3, 32, 32),
        num_classes=10,
        class_names=[str(k) for k in range(10)],
    )


def load_svhn(
    *,
    num_clients: int = 725,
    partition: str = "iid",
    seed: int = 42,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
) -> Federation:
    """SVHN over ``num_clients`` clients, every training image to a uniformly random client."""
    if partition != "iid":
        raise ValueError(f"partition must be 'iid' for svhn (as in IDP-FedAvg), got {partition!r}")
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
        raise ValueError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    train = svhn_pool("train", data_dir=data_dir, download=download)
    test = svhn_pool("test", data_dir=data_dir, download=download)
    parts = uniform_assignment(len(train.y), num_clients, numpy_generator(seed, "partition:svhn"))
    return federate_train_test(
        train, test, parts, seed=seed, name="svhn", metadata={"partition": "iid"}
    )
