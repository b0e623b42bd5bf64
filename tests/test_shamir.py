"""Shamir sharing of 16-byte seeds (``pdpfl.crypto.shamir``): any t shares reconstruct, fewer are
refused, and the shared-coefficient ``combine_many`` equals pycryptodome's ``Shamir.combine``."""

from __future__ import annotations

import os

import pytest
from Crypto.Protocol.SecretSharing import Shamir
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.crypto import shamir


@st.composite
def sharing(draw):
    n = draw(st.integers(1, 12))
    t = draw(st.integers(1, n))
    holders = draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n, unique=True))
    secrets = draw(st.lists(st.binary(min_size=16, max_size=16), min_size=1, max_size=4))
    subset = draw(st.lists(st.sampled_from(holders), min_size=t, max_size=n, unique=True))
    return t, holders, secrets, subset


@settings(max_examples=60)
@given(sharing())
def test_any_t_shares_reconstruct_every_secret(case) -> None:
    t, holders, secrets, subset = case
    shares = [shamir.split(s, t, holders) for s in secrets]
    assert all(set(sh) == set(holders) and all(len(v) == 16 for v in sh.values()) for sh in shares)
    picked = [{h: sh[h] for h in subset} for sh in shares]
    assert [shamir.combine(p, t, holders) for p in picked] == secrets
    assert shamir.combine_many(picked, t, holders) == secrets
    # bit for bit what pycryptodome's own combine gives for the same t shares
    index = {h: i + 1 for i, h in enumerate(holders)}
    first = sorted(subset, key=index.get)[:t]
    for p, s in zip(picked, secrets, strict=True):
        assert Shamir.combine([(index[h], p[h]) for h in first], ssss=False) == s


@settings(max_examples=30)
@given(st.integers(2, 8), st.data())
def test_fewer_than_t_shares_do_not_give_the_secret(t: int, data) -> None:
    n = data.draw(st.integers(t, 10))
    holders = list(range(n))
    secret = os.urandom(16)
    shares = shamir.split(secret, t, holders)
    few = {h: shares[h] for h in holders[: t - 1]}
    with pytest.raises(ValueError, match=f"threshold is {t}"):
        shamir.combine(few, t, holders)
    # interpolating the t - 1 shares as if the threshold were t - 1 gives another value
    assert shamir.combine(few, t - 1, holders) != secret


def test_shares_are_fresh_and_inputs_are_checked() -> None:
    secret = os.urandom(16)
    a, b = shamir.split(secret, 2, [1, 2, 3]), shamir.split(secret, 2, [1, 2, 3])
    assert a != b  # random coefficients from the CSPRNG
    with pytest.raises(ValueError, match="16 bytes"):
        shamir.split(b"short", 2, [1, 2])
    with pytest.raises(ValueError, match="distinct"):
        shamir.split(secret, 2, [1, 1])
    with pytest.raises(ValueError, match="threshold must be in"):
        shamir.split(secret, 3, [1, 2])
    with pytest.raises(ValueError, match="non-holders"):
        shamir.combine({9: a[1], 1: a[1]}, 2, [1, 2, 3])
    with pytest.raises(ValueError, match="same holders"):
        shamir.combine_many([{1: a[1], 2: a[2]}, {1: b[1], 3: b[3]}], 2, [1, 2, 3])
