"""PriFedSync's federations: single-label MNIST shards, disjoint Dirichlet CIFAR-10 silos."""

from __future__ import annotations

import gzip
import hashlib
import struct
import tarfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.data import load_federation, partition_indices
from pdpfl.data.prifedsync import dirichlet_disjoint


@settings(max_examples=40)
@given(
    m=st.integers(2, 30),
    s=st.integers(1, 5),
    k=st.integers(2, 10),
    seed=st.integers(0, 10_000),
)
def test_label_shards_give_at_most_s_labels_disjoint_and_balanced(m, s, k, seed) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, size=m * s * 20)
    parts = partition_indices(
        y, m, "label-shards", {"shards_per_client": s}, rng=np.random.default_rng(seed + 1)
    )
    assert len(parts) == m
    flat = np.concatenate(parts)
    assert len(flat) == len(np.unique(flat))  # disjoint
    for p in parts:
        assert len(np.unique(y[p])) <= s
    assert min(len(p) for p in parts) > 0
    counts = np.bincount(y, minlength=k)
    if counts[counts > 0].min() * m * s >= len(y):  # every label is worth one shard
        assert len(flat) == len(y)


def test_label_shards_refuse_too_many_shards() -> None:
    y = np.array([0] * 5 + [1] * 5)
    with pytest.raises(ValueError, match="shards_per_client"):
        partition_indices(
            y, 4, "label-shards", {"shards_per_client": 3}, rng=np.random.default_rng(0)
        )


def test_mnist_10k_layout_offline(shared_data_dir) -> None:
    fed = load_federation("prifedsync-mnist", data_dir=shared_data_dir, seed=2, layout="10k")
    assert fed.num_clients == 100 and fed.metadata["layout"] == "10k"
    sizes = [c.num_train + c.num_test for c in fed.clients]
    assert sum(sizes) == 10_000 and 90 <= min(sizes) and max(sizes) <= 110
    for c in fed.clients:
        assert len(np.unique(c.y_train)) <= 4
        assert set(np.unique(c.y_test)) <= set(np.unique(c.y_train))
    again = load_federation("prifedsync-mnist", data_dir=shared_data_dir, seed=2, layout="10k")
    np.testing.assert_array_equal(again.clients[7].record_ids, fed.clients[7].record_ids)


def _idx(arr: np.ndarray) -> bytes:
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return gzip.compress(header + arr.astype(np.uint8).tobytes())


def test_mnist_60k_layout_on_synthetic_files(tmp_path, monkeypatch) -> None:
    from pdpfl.data import mnist

    rng = np.random.default_rng(0)
    files = {
        "train-images-idx3-ubyte.gz": _idx(rng.integers(0, 256, (2000, 28, 28))),
        "train-labels-idx1-ubyte.gz": _idx(np.repeat(np.arange(10), 200)),
        "t10k-images-idx3-ubyte.gz": _idx(rng.integers(0, 256, (500, 28, 28))),
        "t10k-labels-idx1-ubyte.gz": _idx(rng.integers(0, 10, 500)),
    }
    digests = {}
    for name, blob in files.items():
        (tmp_path / name).write_bytes(blob)
        digests[name] = hashlib.sha256(blob).hexdigest()
    monkeypatch.setattr(mnist, "SHA256", digests)
    monkeypatch.setenv("PDPFL_CACHE_DIR", str(tmp_path / "cache"))
    fed = load_federation(
        "prifedsync-mnist", data_dir=tmp_path, num_clients=10, test_per_client=30, download=False
    )
    assert fed.metadata["layout"] == "60k"  # auto: the training files are present
    test_labels = mnist.read_idx(tmp_path / "t10k-labels-idx1-ubyte.gz")
    for c in fed.clients:
        assert c.num_train == 200 and len(np.unique(c.y_train)) <= 4
        assert c.num_test == 30
        assert len(np.unique(c.test_record_ids)) == 30  # drawn without replacement
        assert set(np.unique(c.y_test)) <= set(np.unique(c.y_train))
        np.testing.assert_array_equal(test_labels[c.test_record_ids - 60_000], c.y_test)
    train_ids = np.concatenate([c.record_ids for c in fed.clients])
    assert len(np.unique(train_ids)) == 2000
    # layout: 10k ignores the training files.
    small = load_federation(
        "prifedsync-mnist", data_dir=tmp_path, num_clients=5, layout="10k", download=False
    )
    assert small.metadata["layout"] == "10k"
    assert all(c.record_ids.min() >= 60_000 for c in small.clients)


def test_dirichlet_disjoint_uses_each_image_once() -> None:
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(10), 100)
    parts, mixes = dirichlet_disjoint(y, 10, 100, 0.5, rng)
    flat = np.concatenate(parts)
    assert sorted(flat.tolist()) == list(range(1000))  # every image exactly once
    assert all(len(p) == 100 for p in parts)
    assert np.allclose(mixes.sum(axis=1), 1.0)
    # Early clients follow their Dirichlet mix: the realised majority label is q's.
    first = np.bincount(y[parts[0]], minlength=10)
    assert np.argmax(first) == np.argmax(mixes[0])
    with pytest.raises(ValueError, match="train_per_client"):
        dirichlet_disjoint(y, 11, 100, 0.5, rng)


def _cifar_archive(path, n_train: int, n_test: int) -> None:
    rng = np.random.default_rng(2)
    folder = path.parent / "src" / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    names = [f"data_batch_{k}.bin" for k in range(1, 6)] + ["test_batch.bin"]
    for name in names:
        n = n_test if name == "test_batch.bin" else n_train
        labels = rng.integers(0, 10, n).astype(np.uint8)
        raw = np.concatenate(
            [labels[:, None], rng.integers(0, 256, (n, 3072), dtype=np.uint8)], axis=1
        )
        (folder / name).write_bytes(raw.tobytes())
    with tarfile.open(path, "w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-bin")


def test_cifar10_dirichlet_without_overlap_on_a_synthetic_binary_archive(
    tmp_path, monkeypatch
) -> None:
    from pdpfl.data import cifar
    from pdpfl.data.sources import FileSpec

    archive = tmp_path / "data" / "cifar-10-binary.tar.gz"
    archive.parent.mkdir()
    _cifar_archive(archive, n_train=100, n_test=200)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    monkeypatch.setattr(cifar, "SPEC", FileSpec(archive.name, cifar.URL, digest, "cifar10"))
    monkeypatch.setenv("PDPFL_CACHE_DIR", str(tmp_path / "cache"))
    fed = load_federation(
        "prifedsync-cifar10",
        data_dir=archive.parent,
        num_clients=10,
        train_per_client=50,
        test_per_client=20,
        download=False,
    )
    ids = np.concatenate([c.record_ids for c in fed.clients])
    assert len(ids) == 500 and len(np.unique(ids)) == 500  # no image on two clients
    for c in fed.clients:
        assert c.num_train == 50
        assert len(np.unique(c.test_record_ids)) == c.num_test  # no test image twice
        assert 0 < c.num_test <= 20
        assert set(np.unique(c.y_test)) <= set(np.unique(c.y_train))
    assert fed.metadata["beta"] == 0.5
    with pytest.raises(ValueError, match="partition"):
        load_federation(
            "prifedsync-cifar10", data_dir=archive.parent, partition="shards", download=False
        )
    with pytest.raises(ValueError, match="beta"):
        load_federation("prifedsync-cifar10", data_dir=archive.parent, beta=0, download=False)
