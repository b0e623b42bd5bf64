"""User CSV files: label column, undersampling, scaler fitted on train only."""

from __future__ import annotations

import numpy as np
import pytest

from pdpfl.data import load_federation


@pytest.fixture
def creditcard(tmp_path):
    rng = np.random.default_rng(0)
    n = 400
    y = (rng.random(n) < 0.1).astype(int)
    x = rng.normal(size=(n, 3)) * [1, 10, 100] + y[:, None]
    lines = ["Time,V1,Amount,Class"] + [
        f'{a:.4f},{b:.4f},{c:.4f},"{label}"' for (a, b, c), label in zip(x, y, strict=True)
    ]
    path = tmp_path / "cc.csv"
    path.write_text("\n".join(lines) + "\n")
    return path, y


def test_csv_federation(creditcard) -> None:
    path, y = creditcard
    fed = load_federation("csv", path=str(path), label_column="Class", num_clients=2)
    assert fed.feature_names == ["Time", "V1", "Amount"] and fed.class_names == ["0", "1"]
    assert sum(c.num_train + c.num_test for c in fed.clients) == len(y)
    for c in fed.clients:
        np.testing.assert_allclose(c.x_train.mean(0), 0, atol=1e-4)
        np.testing.assert_allclose(c.x_train.std(0), 1, atol=1e-3)
        assert np.abs(c.x_test.mean(0)).max() > 1e-3  # test set was not used for fitting


def test_undersampling_balances_classes(creditcard) -> None:
    path, y = creditcard
    fed = load_federation(
        "csv", path=str(path), label_column="Class", num_clients=1, undersample=True
    )
    counts = np.bincount(np.r_[fed.clients[0].y_train, fed.clients[0].y_test])
    assert counts[0] == counts[1] == int(np.sum(y == 1))
    fed2 = load_federation("csv", path=str(path), num_clients=1, undersample=2)
    counts2 = np.bincount(np.r_[fed2.clients[0].y_train, fed2.clients[0].y_test])
    assert counts2[0] == 2 * counts2[1]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"label_column": "Nope"}, "label_column"),
        ({"undersample": 0.5}, "undersample"),
    ],
)
def test_csv_bad_options(creditcard, kwargs, field) -> None:
    path, _ = creditcard
    with pytest.raises(ValueError, match=field):
        load_federation("csv", path=str(path), **kwargs)


def test_csv_missing_file(tmp_path) -> None:
    with pytest.raises(ValueError, match="path"):
        load_federation("csv", path=str(tmp_path / "none.csv"))


def test_csv_non_numeric_feature(tmp_path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("a,b,label\n1,x,0\n2,3,1\n")
    with pytest.raises(ValueError, match="'b'"):
        load_federation("csv", path=str(p), num_clients=1)
