"""ULDP-FL data: Creditcard preprocessing and loader, user-level non-IID labels, every user
trains, no index past the data (D13), and the reference's models (parameter counts)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from pdpfl.data import assign_users, load_federation
from pdpfl.data import creditcard as cc
from pdpfl.data.sources import ChecksumError, FileSpec
from pdpfl.models import create_model, num_parameters


def _synthetic(n: int = cc.NUM_RECORDS, frauds: int = 492, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 30)) * np.arange(1, 31) + np.arange(30)
    y = np.zeros(n, dtype=np.int64)
    y[rng.choice(n, size=frauds, replace=False)] = 1
    return x, y


def test_creditcard_preprocessing_on_data_of_the_real_shape() -> None:
    x, y = _synthetic()
    d = cc.preprocess(x, y, np.random.default_rng(1))
    n_test = len(d["y_test"])
    assert n_test == pytest.approx(0.15 * cc.NUM_RECORDS, abs=2)  # 42,722
    assert d["y_test"].sum() == pytest.approx(0.15 * 492, abs=1)  # stratified, not undersampled
    train_majority = cc.NUM_RECORDS - n_test - (492 - int(d["y_test"].sum()))
    assert (d["y_train"] == 0).sum() == int(0.1 * train_majority)  # majority cut to 10 %
    assert (d["y_train"] == 1).sum() == 492 - d["y_test"].sum()  # every training fraud kept
    assert len(d["y_train"]) == 24_584  # spec A.5.2 (the paper: "about 25K")
    assert not set(d["train_ids"]) & set(d["test_ids"])
    # The scaler was fitted on the training split (before undersampling) only.
    train_all = np.setdiff1d(np.arange(cc.NUM_RECORDS), d["test_ids"])
    mean, std = x[train_all].mean(0), x[train_all].std(0)
    np.testing.assert_allclose(d["x_test"], (x[d["test_ids"]] - mean) / std, rtol=1e-4, atol=1e-4)


def test_creditcard_federation_links_users_and_keeps_one_global_test_set() -> None:
    x, y = _synthetic(6000, 60)
    fed = cc.federation_from_arrays(
        x, y, num_clients=5, seed=3, users={"num_users": 40, "distribution": "zipf"}
    )
    assert fed.num_clients == 5 and fed.input_shape == (30,)
    users = np.concatenate([c.user_ids for c in fed.clients])
    assert set(users.tolist()) == set(range(40))
    test_ids = np.concatenate([c.test_record_ids for c in fed.clients])
    assert len(test_ids) == len(set(test_ids.tolist())) == int(np.ceil(0.15 * 6000 - 1e-9))


def _write_csv(path, n=40, quoted=True):
    x, y = _synthetic(n, 4, seed=2)
    q = '"' if quoted else ""
    lines = [",".join(f"{q}{c}{q}" for c in [*cc.FEATURES, "Class"])]
    for row, label in zip(x, y, strict=True):
        lines.append(",".join(f"{v:.6f}" for v in row) + f",{q}{label}{q}")
    path.write_text("\n".join(lines) + "\n")
    return x, y


def test_creditcard_download_is_verified_and_cached(tmp_path, monkeypatch) -> None:
    src = tmp_path / "mirror" / "creditcard.csv"
    src.parent.mkdir()
    x, y = _write_csv(src)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    monkeypatch.setenv("PDPFL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PDPFL_NO_DOWNLOAD", raising=False)
    monkeypatch.setattr(cc, "SPEC", FileSpec("creditcard.csv", src.as_uri(), digest, "creditcard"))
    fed = load_federation(
        "creditcard", num_clients=2, seed=0, test_fraction=0.25, majority_fraction=1.0
    )
    assert (tmp_path / "cache" / "creditcard" / "creditcard.csv").is_file()
    assert sum(c.num_train + c.num_test for c in fed.clients) == 40
    rx, ry = cc.read_csv(tmp_path / "cache" / "creditcard" / "creditcard.csv")
    np.testing.assert_allclose(rx, x, atol=1e-6)
    np.testing.assert_array_equal(ry, y)
    bad = FileSpec("creditcard.csv", src.as_uri(), "0" * 64, "other")
    monkeypatch.setattr(cc, "SPEC", bad)
    with pytest.raises(ChecksumError, match="SHA-256"):
        load_federation("creditcard", num_clients=2)


def test_creditcard_rejects_a_file_with_other_columns(tmp_path) -> None:
    path = tmp_path / "creditcard.csv"
    path.write_text("a,b,Class\n1,2,0\n")
    with pytest.raises(ValueError, match="columns"):
        cc.read_csv(path)


@pytest.mark.parametrize("dist", ["uniform", "zipf"])
def test_user_level_non_iid_labels(dist) -> None:
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(10), 503)  # 5030 records: 100 users do not divide them (D13)
    a = assign_users(len(y), 100, 5, distribution=dist, labels=y, labels_per_user=2, rng=rng)
    assert np.bincount(a.user_ids, minlength=100).min() >= 1
    assert a.user_ids.max() < 100 and a.silo_ids.max() < 5 and len(a.user_ids) == len(y)
    labels_per_user = [len(np.unique(y[a.user_ids == u])) for u in range(100)]
    assert np.mean(np.array(labels_per_user) <= 2) >= 0.9
    iid = assign_users(len(y), 100, 5, distribution=dist, rng=np.random.default_rng(0))
    assert np.mean([len(np.unique(y[iid.user_ids == u])) for u in range(100)]) > 5


def test_non_iid_needs_labels_and_pool_silos() -> None:
    with pytest.raises(ValueError, match="labels"):
        assign_users(10, 2, 2, labels_per_user=2, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="fixed silos"):
        assign_users(
            4,
            2,
            silo_ids=np.array([0, 0, 1, 1]),
            labels=np.zeros(4),
            labels_per_user=2,
            rng=np.random.default_rng(0),
        )


def test_every_user_has_a_training_record() -> None:
    fed = load_federation(
        "digits", num_clients=4, seed=1, num_users=600, user_distribution="zipf", labels_per_user=2
    )
    users = np.concatenate([c.user_ids for c in fed.clients])
    assert set(users.tolist()) == set(range(600))


def test_reference_models_have_the_reference_sizes() -> None:
    assert num_parameters(create_model("cnnmnist", (1, 28, 28), 10)) == 21_840
    assert num_parameters(create_model("private-fraud-net", (30,), 2)) == 5_012
