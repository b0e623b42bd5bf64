"""The federation type: validation, summary, pooling."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pdpfl.data import ClientData, Federation


def _client(name: str, ids: list[int], d: int = 3) -> ClientData:
    n = len(ids)
    return ClientData(
        name, np.ones((n, d)), np.arange(n) % 2, np.zeros((2, d)), [0, 1], np.asarray(ids)
    )


def test_dtypes_are_normalized() -> None:
    c = _client("a", [0, 1, 2])
    assert c.x_train.dtype == np.float32 and c.y_train.dtype == np.int64
    assert c.record_ids.dtype == np.int64


def test_length_mismatch_is_rejected() -> None:
    with pytest.raises(ValueError, match="record_ids"):
        ClientData("a", np.ones((3, 2)), [0, 1, 0], np.ones((1, 2)), [0], [0, 1])
    with pytest.raises(ValueError, match="user_ids"):
        ClientData("a", np.ones((2, 2)), [0, 1], np.ones((1, 2)), [0], [0, 1], user_ids=[0])


def test_record_ids_must_be_unique_across_clients() -> None:
    with pytest.raises(ValueError, match="unique"):
        Federation("f", [_client("a", [0, 1]), _client("b", [1, 2])], (3,), 2)


def test_labels_and_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="labels"):
        Federation("f", [_client("a", [0, 1, 2])], (3,), 1)
    with pytest.raises(ValueError, match="input_shape"):
        Federation("f", [_client("a", [0, 1])], (4,), 2)


def test_describe_and_pooled() -> None:
    fed = Federation("f", [_client("a", [0, 1, 2]), _client("b", [5, 6])], (3,), 2)
    d = fed.describe()
    json.dumps(d)
    assert {"name", "clients", "features", "classes"} <= set(d)
    assert [(c["train"], c["test"]) for c in d["clients"]] == [(3, 2), (2, 2)]
    assert d["clients"][0]["label_counts"] == {"0": 2, "1": 1}
    pooled = fed.pooled()
    assert pooled.num_train == 5 and pooled.num_test == 4
    assert sorted(pooled.record_ids.tolist()) == [0, 1, 2, 5, 6]
