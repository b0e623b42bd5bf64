"""load_federation: reproducibility, defaults, option validation, embedded datasets."""

from __future__ import annotations

import numpy as np
import pytest

from pdpfl.data import DATASETS, load_federation
from pdpfl.data._rng import numpy_generator


def _same(a, b) -> bool:
    return all(
        np.array_equal(x.record_ids, y.record_ids)
        and np.array_equal(x.x_train, y.x_train)
        and np.array_equal(x.y_test, y.y_test)
        and np.array_equal(x.x_test, y.x_test)
        for x, y in zip(a.clients, b.clients, strict=True)
    )


@pytest.mark.parametrize("partition", ["iid", "n-way-k-shot", "shards", "dirichlet"])
def test_same_seed_same_federation_different_seed_different(partition) -> None:
    a = load_federation("digits", num_clients=4, partition=partition, seed=1)
    b = load_federation("digits", num_clients=4, partition=partition, seed=1)
    c = load_federation("digits", num_clients=4, partition=partition, seed=2)
    assert _same(a, b)
    assert not _same(a, c)


def test_seed_changes_heart_split(shared_data_dir) -> None:
    a = load_federation("heart-disease", data_dir=shared_data_dir, seed=1)
    b = load_federation("heart-disease", data_dir=shared_data_dir, seed=2)
    assert not _same(a, b)


def test_digits_defaults() -> None:
    fed = load_federation("digits")
    assert fed.num_clients == 10 and fed.input_shape == (64,) and fed.num_classes == 10
    x = np.concatenate([c.x_train for c in fed.clients])
    assert x.min() >= 0 and x.max() <= 1
    assert sum(c.num_train + c.num_test for c in fed.clients) == 1797
    z = load_federation("digits", normalize="zscore").clients[0]
    np.testing.assert_allclose(z.x_train.mean(0), 0, atol=1e-5)
    img = load_federation("digits", flat=False)
    assert img.input_shape == (1, 8, 8)


def test_breast_cancer_defaults() -> None:
    fed = load_federation("breast-cancer")
    assert fed.num_clients == 4 and fed.input_shape == (30,) and fed.num_classes == 2
    assert sum(c.num_train + c.num_test for c in fed.clients) == 569
    for c in fed.clients:
        np.testing.assert_allclose(c.x_train.mean(0), 0, atol=1e-4)


def test_pooled_users_per_train_record() -> None:
    fed = load_federation("digits", num_clients=3, num_users=50, user_distribution="zipf")
    users = np.concatenate([c.user_ids for c in fed.clients])
    assert len(users) == sum(c.num_train for c in fed.clients)
    assert fed.pooled().user_ids is not None
    with pytest.raises(ValueError, match="partition"):
        load_federation("digits", num_users=50, partition="shards")


@pytest.mark.parametrize(
    ("name", "kwargs", "field"),
    [
        ("nope", {}, "dataset"),
        ("digits", {"colour": True}, "colour"),
        ("digits", {"normalize": "l2"}, "normalize"),
        ("digits", {"num_clients": 0}, "num_clients"),
        ("digits", {"test_fraction": 1.5}, "test_fraction"),
        ("digits", {"user_distribution": "zipf"}, "num_users"),
        ("digits", {"num_users": 10, "user_distribution": "x"}, "user_distribution"),
        ("csv", {}, "path"),
    ],
)
def test_bad_arguments_name_the_field(name, kwargs, field) -> None:
    with pytest.raises(ValueError, match=field):
        load_federation(name, **kwargs)


def test_registry_lists_all_issue_datasets() -> None:
    assert {
        "heart-disease",
        "mnist",
        "mnist-10k",
        "cifar10",
        "digits",
        "breast-cancer",
        "csv",
    } <= set(DATASETS)


def test_rng_matches_pdpfl_seeding() -> None:
    from pdpfl.seeding import numpy_generator as reference

    np.testing.assert_array_equal(
        numpy_generator(5, "x", 1, 2).random(5), reference(5, "x", 1, 2).random(5)
    )


@pytest.mark.slow
def test_data_layer_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, pdpfl.data; pdpfl.data.load_federation('digits'); "
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('pdpfl.fl')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_standard_normalization_uses_published_constants(shared_data_dir) -> None:
    raw = load_federation("mnist-10k", data_dir=shared_data_dir, num_clients=2, seed=4)
    std = load_federation(
        "mnist-10k", data_dir=shared_data_dir, num_clients=2, seed=4, normalize="standard"
    )
    np.testing.assert_allclose(
        std.clients[1].x_test, (raw.clients[1].x_test - 0.1307) / 0.3081, atol=1e-5
    )
    with pytest.raises(ValueError, match="standard"):
        load_federation("digits", normalize="standard")


def test_heart_without_normalization_keeps_raw_units(shared_data_dir) -> None:
    fed = load_federation("heart-disease", data_dir=shared_data_dir, normalize="none")
    age = fed.clients[0].x_train[:, fed.feature_names.index("age")]
    assert 25 < age.mean() < 80
    with pytest.raises(ValueError, match="normalize"):
        load_federation("heart-disease", data_dir=shared_data_dir, normalize="minmax")
