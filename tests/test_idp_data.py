"""IDP-FedAvg's federations: Federated EMNIST digits, SVHN, CIFAR-10 label mixes, many clients.

Every loader is exercised on small synthetic files of the real format (TFF's LZMA-compressed
SQLite of tf.train.Example protos, MATLAB v5 .mat, the CIFAR-10 archive API); nothing is
downloaded (the download path is exercised with a ``file://`` URL).
"""

from __future__ import annotations

import hashlib
import lzma
import sqlite3
import struct

import numpy as np
import pytest

from pdpfl.data import ChecksumError, load_federation, svhn
from pdpfl.data import femnist as fem
from pdpfl.data.many_clients import label_mix_partition, uniform_assignment
from pdpfl.data.sources import FileSpec

# ------------------------------------------------------------------ a tiny protobuf encoder


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _ld(number: int, payload: bytes) -> bytes:  # length-delimited field
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _example(pixels: np.ndarray, label: int, packed: bool = True) -> bytes:
    px = np.asarray(pixels, dtype="<f4").ravel()
    if packed:
        float_list = _ld(1, px.tobytes())
    else:
        float_list = b"".join(_varint(1 << 3 | 5) + struct.pack("<f", v) for v in px)
    lab_list = _ld(1, _varint(label)) if packed else _varint(1 << 3 | 0) + _varint(label)
    feat_px, feat_lab = _ld(2, float_list), _ld(3, lab_list)
    features = _ld(1, _ld(1, b"label") + _ld(2, feat_lab))
    features += _ld(1, _ld(1, b"pixels") + _ld(2, feat_px))
    return _ld(1, features)


def _femnist_db(path, writers: dict[str, tuple[int, int]], seed: int = 0) -> dict:
    """A TFF-format database: writer → (train count, test count); returns the true arrays."""
    rng = np.random.default_rng(seed)
    con = sqlite3.connect(path)
    con.execute(
        "CREATE TABLE examples (split_name TEXT, client_id TEXT, serialized_example_proto BLOB)"
    )
    con.execute(
        "CREATE TABLE client_metadata (client_id TEXT, split_name TEXT, num_examples INTEGER)"
    )
    truth: dict = {}
    for k, (w, (n_tr, n_te)) in enumerate(writers.items()):
        for split, n in (("digits_only_train", n_tr), ("digits_only_test", n_te)):
            px = rng.random((n, 28, 28)).astype(np.float32)
            lab = rng.integers(0, 10, n)
            truth[w, split] = (px, lab)
            for i in range(n):
                con.execute(
                    "INSERT INTO examples VALUES (?, ?, ?)",
                    (split, w, _example(px[i], int(lab[i]), packed=(i + k) % 2 == 0)),
                )
            con.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (w, split, n))
        # rows of the 62-class split must be ignored
        con.execute(
            "INSERT INTO examples VALUES (?, ?, ?)",
            ("all_train", w, _example(np.zeros((28, 28)), 40)),
        )
    con.commit()
    con.close()
    return truth


def test_tf_example_parser_reads_packed_and_unpacked_fields():
    px = np.linspace(0, 1, 784, dtype=np.float32).reshape(28, 28)
    for packed in (True, False):
        ex = fem.parse_example(_example(px, 7, packed=packed))
        np.testing.assert_array_equal(ex["pixels"].reshape(28, 28), px)
        assert ex["label"].tolist() == [7]
    with pytest.raises(ValueError, match="truncated"):
        fem.parse_example(_example(px, 7)[:-5])


@pytest.mark.parametrize("fmt", [lzma.FORMAT_ALONE, lzma.FORMAT_XZ])
def test_femnist_digits_from_a_synthetic_tff_archive(tmp_path, monkeypatch, fmt):
    db = tmp_path / "src.sqlite"
    writers = {"f0001_00": (5, 2), "f0002_11": (3, 1), "f0000_45": (4, 2)}
    truth = _femnist_db(db, writers)
    raw = db.read_bytes()
    archive = tmp_path / "served" / "emnist_all.sqlite.lzma"
    archive.parent.mkdir()
    archive.write_bytes(lzma.compress(raw, format=fmt))
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    # The real download path (urllib) with a file:// URL, checksums of our synthetic files.
    monkeypatch.setattr(fem, "SPEC", FileSpec(archive.name, archive.as_uri(), digest, "femnist"))
    monkeypatch.setattr(
        fem,
        "DATABASE",
        FileSpec("emnist_all.sqlite", archive.as_uri(), hashlib.sha256(raw).hexdigest(), "femnist"),
    )
    monkeypatch.setenv("PDPFL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PDPFL_DATA_DIR", raising=False)
    monkeypatch.delenv("PDPFL_NO_DOWNLOAD", raising=False)
    fed = load_federation("femnist-digits", partition="natural", seed=1)
    assert (tmp_path / "cache" / "femnist" / "emnist_all.sqlite").is_file()
    assert [c.name for c in fed.clients] == sorted(writers)  # TFF sorts the writer ids
    for c in fed.clients:
        px_tr, y_tr = truth[c.name, "digits_only_train"]
        px_te, y_te = truth[c.name, "digits_only_test"]
        np.testing.assert_array_equal(c.x_train[:, 0], px_tr)
        np.testing.assert_array_equal(c.y_train, y_tr)
        np.testing.assert_array_equal(c.x_test[:, 0], px_te)
        np.testing.assert_array_equal(c.y_test, y_te)
    assert fed.input_shape == (1, 28, 28)
    ids = np.concatenate([c.record_ids for c in fed.clients])
    assert len(np.unique(ids)) == len(ids) == 12
    # invert: MNIST convention; iid: the same examples reassigned uniformly at random
    inv = load_federation("femnist-digits", partition="natural", seed=1, invert=True)
    np.testing.assert_allclose(inv.clients[0].x_train, 1.0 - fed.clients[0].x_train)
    iid = load_federation("femnist-digits", partition="iid", seed=1)
    assert sum(c.num_train for c in iid.clients) == 12 and iid.num_clients == 3
    sub = load_federation("femnist-digits", partition="natural", seed=1, num_clients=2)
    assert sub.num_clients == 2 and {c.name for c in sub.clients} <= set(writers)
    # A tampered cached database is refused.
    cached = tmp_path / "cache" / "femnist" / "emnist_all.sqlite"
    tampered = bytearray(raw)
    tampered[100] ^= 0xFF
    cached.write_bytes(bytes(tampered))
    with pytest.raises(ChecksumError):
        load_federation("femnist-digits", partition="natural")


def test_femnist_rejects_a_database_without_the_tff_tables(tmp_path):
    db = tmp_path / "x.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE other (a TEXT)")
    con.commit()
    con.close()
    with pytest.raises(ValueError, match="TFF"):
        fem.read_split(db, "train")


def _svhn_mat(path, n, seed):
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
    y = rng.integers(1, 11, (n, 1)).astype(np.uint8)
    savemat(str(path), {"X": x, "y": y})
    return x, y


def test_svhn_from_synthetic_mat_files(tmp_path, monkeypatch):
    folder = tmp_path / "svhn"
    folder.mkdir()
    x_tr, y_tr = _svhn_mat(folder / "train_32x32.mat", 60, 0)
    _svhn_mat(folder / "test_32x32.mat", 25, 1)
    digests = {
        f: hashlib.sha256((folder / f).read_bytes()).hexdigest()
        for f in ("train_32x32.mat", "test_32x32.mat")
    }
    monkeypatch.setattr(svhn, "SHA256", digests)
    fed = load_federation("svhn", num_clients=7, seed=3, data_dir=tmp_path, download=False)
    assert fed.num_clients == 7 and fed.input_shape == (3, 32, 32)
    assert sum(c.num_train for c in fed.clients) == 60
    assert sum(c.num_test for c in fed.clients) == 25
    # every training image appears once, with its label (10 → 0), pixels scaled to [0, 1]
    first = fed.clients[0]
    for img, lab, rid in zip(first.x_train, first.y_train, first.record_ids, strict=True):
        np.testing.assert_allclose(img, np.transpose(x_tr[..., rid], (2, 0, 1)) / 255.0, atol=1e-7)
        assert lab == (0 if y_tr[rid, 0] == 10 else y_tr[rid, 0])
    ids = np.concatenate([c.record_ids for c in fed.clients])
    assert sorted(ids.tolist()) == list(range(60))
    monkeypatch.setattr(svhn, "SHA256", {k: "0" * 64 for k in digests})
    with pytest.raises(ChecksumError):
        load_federation("svhn", num_clients=7, data_dir=tmp_path, download=False)


@pytest.mark.parametrize("concentration", [1.0, 0.2])
def test_label_mix_partition_is_disjoint_complete_and_skewed(concentration):
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(10), [500, 300, 700, 400, 400, 600, 500, 500, 300, 800])
    parts = label_mix_partition(y, 40, np.random.default_rng(5), concentration)
    allpos = np.concatenate(parts)
    assert len(allpos) == len(y) and len(np.unique(allpos)) == len(y)  # no image shared
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= len(y) // 40 - 1  # round-robin: near-equal sizes
    # label skew: most clients are dominated by few labels (vs ~0.1 share under IID)
    top = [np.bincount(y[p], minlength=10).max() / len(p) for p in parts]
    assert np.median(top) > 0.3
    del rng


def test_uniform_assignment_covers_everything_once():
    parts = uniform_assignment(1000, 30, np.random.default_rng(1))
    allpos = np.concatenate(parts)
    assert sorted(allpos.tolist()) == list(range(1000))


def test_cifar10_clients_on_the_cifar_loader_api(tmp_path, monkeypatch):
    from pdpfl.data import many_clients
    from pdpfl.data.pool import Pool

    def fake_pool(split, *, data_dir=None, download=True):
        n = 400 if split == "train" else 100
        rng = np.random.default_rng(0 if split == "train" else 1)
        offset = 0 if split == "train" else 50_000
        return Pool(
            name="cifar10",
            x=rng.random((n, 3, 32, 32), dtype=np.float32),
            y=np.arange(n) % 10,
            record_ids=offset + np.arange(n),
            input_shape=(3, 32, 32),
            num_classes=10,
        )

    import pdpfl.data.cifar as cifar

    monkeypatch.setattr(cifar, "cifar10_pool", fake_pool)
    fed = load_federation("cifar10-clients", num_clients=20, partition="label-mix", seed=2)
    assert fed.num_clients == 20
    tr = np.concatenate([c.record_ids for c in fed.clients])
    te = np.concatenate([c.test_record_ids for c in fed.clients])
    assert sorted(tr.tolist()) == list(range(400))
    assert sorted(te.tolist()) == list(range(50_000, 50_100))
    uni = load_federation("cifar10-clients", num_clients=20, partition="uniform", seed=2)
    assert sum(c.num_train for c in uni.clients) == 400
    with pytest.raises(ValueError, match="partition"):
        load_federation("cifar10-clients", num_clients=20, partition="pachinko")
    with pytest.raises(ValueError, match="does not apply"):
        load_federation("cifar10-clients", num_clients=20, test_fraction=0.2)
    del many_clients


@pytest.mark.parametrize(
    "partition, params",
    [
        ("iid", {}),
        ("dirichlet", {"beta": 1.0, "min_size": 2}),
        ("shards", {"shards_per_client": 2}),
    ],
)
def test_offline_digits_over_hundreds_of_clients(partition, params):
    fed = load_federation(
        "digits", num_clients=150, partition=partition, partition_params=params, seed=0
    )
    assert fed.num_clients == 150
    assert all(c.num_train >= 1 for c in fed.clients)
    ids = np.concatenate([c.record_ids for c in fed.clients])
    assert len(np.unique(ids)) == len(ids)


def test_offline_mnist10k_over_hundreds_of_clients(shared_data_dir):
    fed = load_federation(
        "mnist-10k", num_clients=300, partition="shards", data_dir=shared_data_dir, seed=0
    )
    assert fed.num_clients == 300
    assert sum(c.num_train + c.num_test for c in fed.clients) == 10_000
    assert np.median([len(np.unique(c.y_train)) for c in fed.clients]) <= 3  # non-IID
