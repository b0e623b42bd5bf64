"""Fed-Heart-Disease: counts, features, per-centre normalization with train statistics."""

from __future__ import annotations

import numpy as np
import pytest

from pdpfl.data import load_federation
from pdpfl.data.heart import FEATURE_NAMES, encode, load_centres, parse_processed


@pytest.fixture(scope="module")
def heart(shared_data_dir):
    return load_federation("heart-disease", data_dir=shared_data_dir)


def test_counts_and_features(heart) -> None:
    assert [c.name for c in heart.clients] == [
        "cleveland",
        "hungary",
        "switzerland",
        "va-long-beach",
    ]
    totals = [c.num_train + c.num_test for c in heart.clients]
    assert totals == [303, 261, 46, 130]
    assert sum(c.num_train for c in heart.clients) == 486
    assert sum(c.num_test for c in heart.clients) == 254
    assert heart.input_shape == (13,) and len(heart.feature_names) == 13
    assert heart.num_classes == 2


def test_split_is_stratified(heart, shared_data_dir) -> None:
    for c in heart.clients:
        n = c.num_train + c.num_test
        assert c.num_test == int(np.ceil(0.34 * n - 1e-9))
        for label in (0, 1):
            frac_all = (np.sum(c.y_train == label) + np.sum(c.y_test == label)) / n
            frac_test = np.mean(c.y_test == label)
            assert abs(frac_all - frac_test) < 0.1


def test_normalization_uses_own_train_statistics_only(heart, shared_data_dir) -> None:
    centres = load_centres(shared_data_dir)
    for c, raw in zip(heart.clients, centres, strict=True):
        pos = {int(r): k for k, r in enumerate(raw.record_ids)}
        x_tr = raw.x[[pos[int(r)] for r in c.record_ids]]
        x_te = raw.x[[pos[int(r)] for r in c.test_record_ids]]
        mean, std = x_tr.mean(0), x_tr.std(0)
        std = np.where(std > 0, std, 1.0)
        np.testing.assert_allclose(c.x_train, (x_tr - mean) / std, atol=1e-5)
        np.testing.assert_allclose(c.x_test, (x_te - mean) / std, atol=1e-5)
        # Test statistics must not leak: the test side is generally not standardized.
        varying = x_tr.std(0) > 0
        np.testing.assert_allclose(c.x_train.mean(0), 0, atol=1e-5)
        np.testing.assert_allclose(c.x_train.std(0)[varying], 1, atol=1e-4)


def test_labels_are_presence_of_disease(heart, shared_data_dir) -> None:
    centres = load_centres(shared_data_dir)
    for c, raw in zip(heart.clients, centres, strict=True):
        pos = {int(r): k for k, r in enumerate(raw.record_ids)}
        np.testing.assert_array_equal(c.y_train, raw.y[[pos[int(r)] for r in c.record_ids]])
    assert 0 < np.mean(np.concatenate([c.y_train for c in heart.clients])) < 1


def test_record_ids_stable_and_unique(heart, shared_data_dir) -> None:
    ids = np.concatenate([np.r_[c.record_ids, c.test_record_ids] for c in heart.clients])
    assert len(np.unique(ids)) == 740
    again = load_federation("heart-disease", data_dir=shared_data_dir)
    for a, b in zip(heart.clients, again.clients, strict=True):
        np.testing.assert_array_equal(a.record_ids, b.record_ids)
        np.testing.assert_array_equal(a.x_train, b.x_train)


def test_encoding_of_synthetic_rows() -> None:
    text = (
        "63,1,1,145,233,1,2,150,0,2.3,3,0,6,0\n"
        "50,0,3,120,?,0,0,140,1,1.0,?,?,?,2\n"  # chol missing -> dropped
        "40,0,4,110,200,0,1,160,0,0,?,?,?,3\n"
    )
    x, y, keep = encode(parse_processed(text))
    assert keep.tolist() == [True, False, True]
    assert y.tolist() == [0, 1]
    assert x.shape == (2, 13)
    row = dict(zip(FEATURE_NAMES, x[1], strict=True))
    assert (row["cp_2"], row["cp_3"], row["cp_4"]) == (0, 0, 1)
    assert (row["restecg_1"], row["restecg_2"]) == (1, 0)
    assert x[0, FEATURE_NAMES.index("cp_2") : FEATURE_NAMES.index("cp_4") + 1].sum() == 0


def test_heart_silos_cannot_be_repartitioned(shared_data_dir) -> None:
    with pytest.raises(ValueError, match="num_clients"):
        load_federation("heart-disease", num_clients=5, data_dir=shared_data_dir)
    with pytest.raises(ValueError, match="partition"):
        load_federation("heart-disease", partition="shards", data_dir=shared_data_dir)


def test_heart_users_within_fixed_silos(heart, shared_data_dir) -> None:
    fed = load_federation(
        "heart-disease", data_dir=shared_data_dir, num_users=60, user_distribution="zipf"
    )
    users = np.concatenate([c.user_ids for c in fed.clients])
    assert len(users) == 486 and set(users.tolist()) == set(range(60))
    for a, b in zip(heart.clients, fed.clients, strict=True):
        np.testing.assert_array_equal(a.record_ids, b.record_ids)


def test_flamby_split_is_flambys_and_the_same_for_every_seed(shared_data_dir) -> None:
    """``split: flamby`` is FLamby's per-centre split (its published train sizes 199/172/30/85
    and test sizes 104/89/16/45), independent of the experiment seed; the default split moves
    with the seed."""
    a, b = (
        load_federation("heart-disease", data_dir=shared_data_dir, seed=s, split="flamby")
        for s in (1, 2)
    )
    assert [c.num_train for c in a.clients] == [199, 172, 30, 85]
    assert [c.num_test for c in a.clients] == [104, 89, 16, 45]
    for x, y in zip(a.clients, b.clients, strict=True):
        np.testing.assert_array_equal(x.test_record_ids, y.test_record_ids)
    c, d = (load_federation("heart-disease", data_dir=shared_data_dir, seed=s) for s in (1, 2))
    assert any(
        not np.array_equal(x.test_record_ids, y.test_record_ids)
        for x, y in zip(c.clients, d.clients, strict=True)
    )
    with pytest.raises(ValueError, match="split"):
        load_federation("heart-disease", data_dir=shared_data_dir, split="random")
