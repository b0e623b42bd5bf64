"""Partitions: disjoint, label-preserving, exactly N labels per client for n-way k-shot."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdpfl.data import load_federation, partition_indices, stratified_split
from pdpfl.data.embedded import digits_pool


def _labels(draw_counts: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(draw_counts)), draw_counts)


@given(
    counts=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    m=st.integers(1, 6),
    seed=st.integers(0, 2**31),
    method=st.sampled_from(["iid", "shards"]),
)
def test_iid_and_shards_cover_every_record_once(counts, m, seed, method) -> None:
    y = _labels(counts)
    if m > len(y):
        m = len(y)
    parts = partition_indices(y, m, method, rng=np.random.default_rng(seed))
    assert len(parts) == m
    allidx = np.concatenate(parts)
    assert sorted(allidx.tolist()) == list(range(len(y)))


@given(
    counts=st.lists(st.integers(4, 30), min_size=2, max_size=8),
    m=st.integers(1, 6),
    data=st.data(),
    seed=st.integers(0, 2**31),
)
def test_n_way_k_shot_gives_exactly_n_labels(counts, m, data, seed) -> None:
    y = _labels(counts)
    n_way = data.draw(st.integers(1, len(counts)))
    holders = -(-m * n_way // len(counts))  # round-robin: at most ceil(m n / C) per label
    try:
        parts = partition_indices(
            y, m, "n-way-k-shot", {"n_way": n_way}, rng=np.random.default_rng(seed)
        )
    except ValueError as exc:  # only when some label is too rare for its holders
        assert "n_way" in str(exc) and holders > min(counts)
        return
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx)  # disjoint
    sizes = {len(p) for p in parts}
    assert len(sizes) == 1  # every client: n_way * k_shot records
    for p in parts:
        labels, per = np.unique(y[p], return_counts=True)
        assert len(labels) == n_way
        assert len(set(per.tolist())) == 1


@given(
    counts=st.lists(st.integers(5, 40), min_size=2, max_size=6),
    m=st.integers(2, 5),
    beta=st.floats(0.05, 10.0),
    seed=st.integers(0, 2**31),
)
def test_dirichlet_covers_every_record(counts, m, beta, seed) -> None:
    y = _labels(counts)
    parts = partition_indices(
        y, m, "dirichlet", {"beta": beta, "min_size": 0}, rng=np.random.default_rng(seed)
    )
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(y)))


def test_shards_give_few_labels_per_client() -> None:
    y = np.repeat(np.arange(10), 100)
    parts = partition_indices(
        y, 10, "shards", {"shards_per_client": 2}, rng=np.random.default_rng(0)
    )
    assert all(len(np.unique(y[p])) <= 2 for p in parts)


def test_small_beta_is_more_skewed_than_large() -> None:
    y = np.repeat(np.arange(10), 200)

    def skew(beta: float) -> float:
        parts = partition_indices(y, 10, "dirichlet", {"beta": beta}, rng=np.random.default_rng(3))
        return float(np.mean([np.bincount(y[p], minlength=10).max() / len(p) for p in parts]))

    assert skew(0.1) > skew(100.0) + 0.2


def _check_pairs_preserved(fed, pool) -> None:
    pos = {int(r): k for k, r in enumerate(pool.record_ids)}
    for c in fed.clients:
        for ids, x, y in (
            (c.record_ids, c.x_train, c.y_train),
            (c.test_record_ids, c.x_test, c.y_test),
        ):
            rows = np.asarray([pos[int(r)] for r in ids], dtype=np.int64)
            np.testing.assert_array_equal(y, pool.y[rows])
            np.testing.assert_array_equal(x, pool.x[rows].astype(np.float32))


@pytest.mark.parametrize(
    ("partition", "params"),
    [
        ("iid", None),
        ("n-way-k-shot", {"n_way": 3, "k_shot": 30}),
        ("shards", {"shards_per_client": 3}),
        ("dirichlet", {"beta": 0.3}),
    ],
)
def test_every_image_keeps_its_true_label_digits(partition, params) -> None:
    fed = load_federation(
        "digits", num_clients=6, partition=partition, partition_params=params, seed=7
    )
    _check_pairs_preserved(fed, digits_pool())
    if partition == "n-way-k-shot":
        for c in fed.clients:
            assert len(np.unique(c.y_train)) == 3
            assert set(np.unique(c.y_test)) <= set(np.unique(c.y_train))
            assert c.num_train + c.num_test == 90


def test_every_image_keeps_its_true_label_mnist_10k(shared_data_dir) -> None:
    from pdpfl.data.mnist import mnist_pool

    fed = load_federation(
        "mnist-10k",
        data_dir=shared_data_dir,
        partition="n-way-k-shot",
        partition_params={"classes_per_client": 2, "k_shot": 200},
        seed=3,
    )
    pool = mnist_pool("test", data_dir=shared_data_dir)
    _check_pairs_preserved(fed, pool)
    for c in fed.clients:
        assert len(np.unique(c.y_train)) == 2
    assert fed.input_shape == (1, 28, 28)


def test_stratified_split_keeps_each_class_in_train() -> None:
    y = np.array([0, 1, 1, 2, 2, 2])
    tr, te = stratified_split(y, 0.5, np.random.default_rng(0))
    assert set(y[tr].tolist()) == {0, 1, 2}
    assert sorted(np.r_[tr, te].tolist()) == list(range(6))
    assert len(te) == 3


@pytest.mark.parametrize(
    ("partition", "params", "field"),
    [
        ("bogus", None, "partition"),
        ("iid", {"beta": 1.0}, "beta"),
        ("n-way-k-shot", {"n_way": 11}, "n_way"),
        ("n-way-k-shot", {"n_way": 2, "k_shot": 10_000}, "k_shot"),
        ("shards", {"shards_per_client": 0}, "shards_per_client"),
        ("dirichlet", {"beta": -1}, "beta"),
    ],
)
def test_bad_partition_arguments(partition, params, field) -> None:
    with pytest.raises(ValueError, match=field):
        load_federation("digits", partition=partition, partition_params=params)
