"""IDX parsing (MNIST) and the CIFAR-10 binary archive reader, on synthetic files."""

from __future__ import annotations

import gzip
import struct
import tarfile

import numpy as np
import pytest

from pdpfl.data import load_federation
from pdpfl.data.idx import parse_idx, read_idx


def _idx(arr: np.ndarray) -> bytes:
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def test_idx_round_trip(tmp_path) -> None:
    arr = np.random.default_rng(0).integers(0, 256, size=(7, 4, 3), dtype=np.uint8)
    np.testing.assert_array_equal(parse_idx(_idx(arr)), arr)
    (tmp_path / "a.gz").write_bytes(gzip.compress(_idx(arr)))
    np.testing.assert_array_equal(read_idx(tmp_path / "a.gz"), arr)


def test_idx_rejects_bad_files() -> None:
    with pytest.raises(ValueError, match="magic"):
        parse_idx(b"\x01\x02\x08\x01")
    with pytest.raises(ValueError, match="payload"):
        parse_idx(_idx(np.zeros((3, 2), np.uint8))[:-1])


def test_mnist_10k_federation(shared_data_dir) -> None:
    fed = load_federation("mnist-10k", data_dir=shared_data_dir, num_clients=5)
    assert sum(c.num_train + c.num_test for c in fed.clients) == 10_000
    c = fed.clients[0]
    assert c.x_train.shape[1:] == (1, 28, 28) and c.x_train.dtype == np.float32
    assert 0.0 <= c.x_train.min() and c.x_train.max() <= 1.0
    assert c.record_ids.min() >= 60_000
    assert abs(c.num_test / (c.num_train + c.num_test) - 0.34) < 0.01


def _cifar_records(rng: np.random.Generator, n: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    """``n`` records of the official binary format: label byte + 3×1024 pixel bytes."""
    labels = rng.integers(0, 10, n).astype(np.uint8)
    pixels = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    raw = np.concatenate([labels[:, None], pixels], axis=1)
    return raw.tobytes(), pixels.reshape(n, 3, 32, 32), labels


def _cifar_folder(root, n_per_batch: int = 20) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written = {}
    for name in [f"data_batch_{k}.bin" for k in range(1, 6)] + ["test_batch.bin"]:
        data, images, labels = _cifar_records(rng, n_per_batch)
        (folder / name).write_bytes(data)
        written[name] = (images, labels)
    (folder / "batches.meta.txt").write_text(
        "\n".join(
            [
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
        )
        + "\n"
    )
    return written


def test_cifar10_from_extracted_folder(tmp_path) -> None:
    written = _cifar_folder(tmp_path)
    fed = load_federation("cifar10", data_dir=tmp_path, num_clients=2, download=False)
    assert fed.input_shape == (3, 32, 32) and fed.num_classes == 10
    assert sum(c.num_train + c.num_test for c in fed.clients) == 100
    images, labels = written["data_batch_1.bin"]
    first = images[0].astype(np.float32) / 255
    c = next(c for c in fed.clients if 0 in c.record_ids.tolist() + c.test_record_ids.tolist())
    if 0 in c.record_ids:
        k = int(np.flatnonzero(c.record_ids == 0)[0])
        np.testing.assert_allclose(c.x_train[k], first)
        assert c.y_train[k] == labels[0]


def test_cifar10_binary_decoding_is_exact_and_rejects_bad_files() -> None:
    from pdpfl.data import cifar

    data, images, labels = _cifar_records(np.random.default_rng(3), 5)
    x, y = cifar.decode_batch(data)
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, labels)
    # The red plane comes first, row-major: byte 1 of a record is pixel (R, 0, 0).
    assert x[0, 0, 0, 0] == data[1] and x[0, 2, 31, 31] == data[3072]
    with pytest.raises(ValueError, match="3073-byte"):
        cifar.decode_batch(data[:-1])
    bad = bytearray(data)
    bad[0] = 12
    with pytest.raises(ValueError, match="label 12"):
        cifar.decode_batch(bytes(bad))


def test_cifar10_archive_with_checksum_and_no_pickle(tmp_path, monkeypatch) -> None:
    import hashlib
    import pickle

    from pdpfl.data import cifar
    from pdpfl.data.sources import FileSpec

    assert cifar.SPEC.filename == "cifar-10-binary.tar.gz"
    assert cifar.SPEC.url == "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
    assert len(cifar.SPEC.sha256) == 64
    src = tmp_path / "src"
    written = _cifar_folder(src, n_per_batch=10)
    archive = tmp_path / "data" / "cifar-10-binary.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / "cifar-10-batches-bin", arcname="cifar-10-batches-bin")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    monkeypatch.setattr(cifar, "SPEC", FileSpec(archive.name, cifar.URL, digest, "cifar10"))
    monkeypatch.setenv("PDPFL_CACHE_DIR", str(tmp_path / "cache"))

    def no_pickle(*args, **kwargs):
        raise AssertionError("the CIFAR-10 loader must never unpickle")

    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(pickle, "loads", no_pickle)
    pool = cifar.cifar10_pool("all", data_dir=archive.parent, download=False)
    assert len(pool.y) == 60 and pool.record_ids[-1] == 50_000 + 9
    np.testing.assert_array_equal(pool.y[-10:], written["test_batch.bin"][1])
    np.testing.assert_allclose(pool.x[10], written["data_batch_2.bin"][0][0] / 255.0)
    monkeypatch.setattr(cifar, "SPEC", FileSpec(archive.name, cifar.URL, "f" * 64, "cifar10"))
    from pdpfl.data import ChecksumError

    with pytest.raises(ChecksumError):
        cifar.cifar10_pool("test", data_dir=archive.parent, download=False)
