"""User allocation across silos covers every record exactly once; every user has a record."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdpfl.data import assign_users
from pdpfl.data._rng import numpy_generator


@given(
    n=st.integers(1, 400),
    data=st.data(),
    silos=st.integers(1, 8),
    dist=st.sampled_from(["uniform", "zipf"]),
    seed=st.integers(0, 2**31),
)
def test_allocation_covers_every_record(n, data, silos, dist, seed) -> None:
    users = data.draw(st.integers(1, n))
    a = assign_users(n, users, silos, distribution=dist, rng=np.random.default_rng(seed))
    assert a.user_ids.shape == (n,) and a.silo_ids.shape == (n,)
    assert a.records_per_user().min() >= 1
    assert a.records_per_user().sum() == n
    assert set(a.user_ids.tolist()) == set(range(users))
    assert a.silo_ids.min() >= 0 and a.silo_ids.max() < silos
    assert a.histogram().sum() == n


@given(
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=5),
    data=st.data(),
    dist=st.sampled_from(["uniform", "zipf"]),
    seed=st.integers(0, 2**31),
)
def test_fixed_silos_keep_their_records(sizes, data, dist, seed) -> None:
    silos = np.repeat(np.arange(len(sizes)), sizes)
    n = len(silos)
    users = data.draw(st.integers(1, n))
    a = assign_users(n, users, silo_ids=silos, distribution=dist, rng=np.random.default_rng(seed))
    np.testing.assert_array_equal(a.silo_ids, silos)
    assert np.bincount(a.user_ids, minlength=users).min() >= 1
    assert len(a.user_ids) == n


def test_zipf_is_skewed_and_home_silo_dominates() -> None:
    rng = numpy_generator(0, "test")
    silos = np.repeat(np.arange(4), [300, 260, 50, 130])
    a = assign_users(740, 40, silo_ids=silos, distribution="zipf", rng=rng)
    h = a.histogram()
    share_home = h.max(axis=1).sum() / h.sum()
    assert share_home > 0.6
    b = assign_users(
        5000, 100, 5, distribution="zipf", alpha_user=1.0, rng=numpy_generator(1, "test")
    )
    counts = np.sort(b.records_per_user())[::-1]
    assert counts[0] > 5 * np.median(counts)
    per_user_top = b.histogram().max(axis=1) / b.records_per_user()
    assert per_user_top.mean() > 0.5


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"distribution": "pareto"}, "distribution"),
        ({"num_users": 0}, "num_users"),
        ({"num_users": 11}, "num_users"),
        ({"alpha_user": -1.0}, "alpha_user"),
        ({"num_silos": 0}, "num_silos"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, field) -> None:
    args = {"num_records": 10, "num_users": 3, "num_silos": 2, **kwargs}
    with pytest.raises(ValueError, match=field):
        assign_users(rng=np.random.default_rng(0), **args)
