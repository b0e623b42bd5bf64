"""Bring your own data: arrays, a DataFrame with a silo column, per-silo arrays, the CSV dataset's
silo/record-id/drop columns, and budgets matched by record id (issue #17)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pdpfl.data import load_federation
from pdpfl.data.user import (
    align_budgets,
    federation_from_arrays,
    federation_from_dataframe,
    federation_from_silos,
    read_budget_table,
)

pd = pytest.importorskip("pandas")


def _frame(n: int = 240, seed: int = 0):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(rng.normal(size=(n, 3)), columns=["a", "b", "c"])
    df["label"] = rng.choice(["sick", "well"], size=n)
    df["site"] = rng.choice(["x", "y", "z"], size=n)
    df["pid"] = rng.permutation(10 * n)[:n] + 7
    df["eps"] = rng.choice([0.5, 1.0, 4.0], size=n)
    df["note"] = [f"free text {i}" for i in range(n)]
    return df


def test_dataframe_silo_column_ids_and_dropped_columns() -> None:
    df = _frame()
    fed = federation_from_dataframe(
        df,
        label="label",
        silo="site",
        record_id="pid",
        drop=["eps", "note"],
        test_fraction=0.25,
        seed=1,
    )
    assert [c.name for c in fed.clients] == ["x", "y", "z"]
    assert fed.feature_names == ["a", "b", "c"] and fed.class_names == ["sick", "well"]
    assert fed.input_shape == (3,) and fed.num_classes == 2
    for c in fed.clients:
        rows = df.set_index("pid").loc[np.r_[c.record_ids, c.test_record_ids]]
        assert set(rows["site"]) == {c.name}  # every record stayed in its own silo
        labels = (rows["label"] == "well").astype(int).to_numpy()
        np.testing.assert_array_equal(labels, np.r_[c.y_train, c.y_test])
        assert c.num_test == int(np.ceil(0.25 * len(rows) - 1e-9))
        np.testing.assert_allclose(c.x_train.mean(0), 0, atol=1e-5)  # z-scored per silo
    assert sum(c.num_train + c.num_test for c in fed.clients) == len(df)


def test_dataframe_problems_name_the_column() -> None:
    df = _frame()
    with pytest.raises(ValueError, match=r"features: columns \['note'\] are not numeric.*drop"):
        federation_from_dataframe(df.drop(columns=["eps"]), label="label", silo="site")
    with pytest.raises(ValueError, match="silo: 'hospital' is not a column"):
        federation_from_dataframe(df, label="label", silo="hospital")
    with pytest.raises(
        ValueError, match=r"record_id \(DataFrame column .pid.\): record ids must be unique"
    ):
        federation_from_dataframe(
            df.assign(pid=1), label="label", silo="site", record_id="pid", drop=["eps", "note"]
        )


def test_dataframe_index_is_the_default_record_id_and_own_test_split() -> None:
    df = _frame().drop(columns=["note"]).set_index("pid")
    df["is_test"] = np.arange(len(df)) % 4 == 0
    fed = federation_from_dataframe(df, label="label", silo="site", drop=["eps"], test="is_test")
    train_ids = np.concatenate([c.record_ids for c in fed.clients])
    test_ids = np.concatenate([c.test_record_ids for c in fed.clients])
    assert set(test_ids) == set(df.index[df.is_test]) and set(train_ids) == set(
        df.index[~df.is_test]
    )


def test_arrays_and_silos() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(90, 1, 4, 4))  # images keep their shape
    y = rng.integers(0, 3, 90)
    fed = federation_from_arrays(x, y, silos=np.repeat([2, 0, 1], 30))
    assert fed.input_shape == (1, 4, 4) and fed.num_classes == 3
    assert [c.name for c in fed.clients] == ["0", "1", "2"]
    # record ids default to row positions: silo "0" holds rows 30..59
    c0 = fed.clients[0]
    assert set(np.r_[c0.record_ids, c0.test_record_ids]) == set(range(30, 60))
    with pytest.raises(ValueError, match="silos: expected one silo per record"):
        federation_from_arrays(x, y, silos=[0, 1])
    with pytest.raises(ValueError, match="x: 1 record"):
        federation_from_arrays(np.r_[rng.normal(size=(89, 2)), [[np.nan, 0]]], y, np.zeros(90))

    a = (rng.normal(size=(20, 2)), rng.integers(0, 2, 20))
    b = (rng.normal(size=(12, 2)), rng.integers(0, 2, 12))
    fed = federation_from_silos({"north": a, "south": b}, test_fraction=0.25)
    assert [c.name for c in fed.clients] == ["north", "south"]
    ids_south = np.r_[fed.clients[1].record_ids, fed.clients[1].test_record_ids]
    assert set(ids_south) == set(range(20, 32))  # consecutive ids over the silos in order
    own = federation_from_silos(
        [(a[0], a[1], b[0][:3], b[1][:3]), (b[0], b[1], b[0][:0], b[1][:0])]
    )
    assert own.clients[0].num_train == 20 and own.clients[0].num_test == 3
    assert own.clients[1].num_test == 0


def test_budgets_are_matched_by_record_id_not_by_order() -> None:
    df = _frame()
    fed = federation_from_dataframe(
        df, label="label", silo="site", record_id="pid", drop=["eps", "note"]
    )
    by_id = dict(zip(df.pid, df.eps, strict=True))
    shuffled = df.sample(frac=1.0, random_state=3)
    for given in (
        by_id,
        pd.Series(shuffled.eps.to_numpy(), index=shuffled.pid),
        (shuffled.pid.to_numpy(), shuffled.eps.to_numpy()),
    ):
        per_silo = align_budgets(fed, given)
        for c, values in zip(fed.clients, per_silo, strict=True):
            np.testing.assert_array_equal(values, [by_id[i] for i in c.record_ids])
    with pytest.raises(ValueError, match=r"1 training record\(s\) have no budget"):
        align_budgets(fed, _without_train(fed, by_id))
    with pytest.raises(ValueError, match="finite number > 0"):
        align_budgets(fed, {k: -1.0 for k in by_id})


def _without_train(fed, by_id: dict) -> dict:
    drop = int(fed.clients[1].record_ids[0])
    return {k: v for k, v in by_id.items() if k != drop}


def test_array_budgets_are_indexed_by_row_id() -> None:
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(60, 2)), rng.integers(0, 2, 60)
    eps = rng.choice([0.5, 3.0], size=60)
    fed = federation_from_arrays(x, y, silos=rng.integers(0, 3, 60))
    for c, values in zip(fed.clients, align_budgets(fed, eps), strict=True):
        np.testing.assert_array_equal(values, eps[c.record_ids])


def test_budget_table_file_is_aligned_by_id(tmp_path: Path) -> None:
    from pdpfl.config import config_from_dict
    from pdpfl.fl.common import BudgetSource, client_budgets

    df = _frame()
    fed = federation_from_dataframe(
        df, label="label", silo="site", record_id="pid", drop=["eps", "note"]
    )
    table = tmp_path / "budgets.csv"
    rows = df.sample(frac=1.0, random_state=0)
    table.write_text(
        "record_id,epsilon\n"
        + "".join(f"{i},{e}\n" for i, e in zip(rows.pid, rows.eps, strict=True))
    )
    assert read_budget_table(table)[int(df.pid[0])] == df.eps[0]
    cfg = config_from_dict(
        {
            "data": {"dataset": "user"},
            "budgets": {"file": str(table)},
            "privacy": {"epsilon_max": 4.0},
            "training": {"rounds": 1, "local_steps": 1, "batch_size": 4},
        }
    )
    by_id = dict(zip(df.pid, df.eps, strict=True))
    source = BudgetSource.of(cfg.budgets, seed=cfg.seed)
    for k, c in enumerate(fed.clients):
        np.testing.assert_array_equal(
            client_budgets(source, k, c), [by_id[i] for i in c.record_ids]
        )
    table.write_text("record_id,epsilon\n" + f"{int(df.pid[0])},1.0\n")
    with pytest.raises(ValueError, match="budgets.file: .* have no row"):
        client_budgets(source, 0, fed.clients[0])


@pytest.fixture
def hospitals_csv(tmp_path: Path) -> Path:
    df = _frame(150, seed=5)
    path = tmp_path / "patients.csv"
    df.to_csv(path, index=False)
    return path


def test_csv_dataset_silo_record_id_and_drop_columns(hospitals_csv: Path) -> None:
    fed = load_federation(
        "csv",
        path=str(hospitals_csv),
        label_column="label",
        silo_column="site",
        record_id_column="pid",
        drop_columns=["eps", "note"],
    )
    assert [c.name for c in fed.clients] == ["x", "y", "z"]
    assert fed.feature_names == ["a", "b", "c"] and fed.metadata["partition"] == "silo-column"
    df = pd.read_csv(hospitals_csv).set_index("pid")
    for c in fed.clients:
        assert set(df.loc[np.r_[c.record_ids, c.test_record_ids], "site"]) == {c.name}
    same = load_federation(
        "csv",
        path=str(hospitals_csv),
        label_column="label",
        silo_column="site",
        record_id_column="pid",
        drop_columns="eps,note",
    )
    np.testing.assert_array_equal(same.clients[0].record_ids, fed.clients[0].record_ids)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"silo_column": "hospital"}, "silo_column"),
        ({"drop_columns": ["nope"]}, "drop_columns"),
        ({"silo_column": "site", "num_clients": 5}, "num_clients"),
        ({"silo_column": "site", "partition": "dirichlet"}, "partition"),
        ({"record_id_column": "site"}, "record_id_column"),
        ({}, "not numeric.*drop_columns"),
    ],
)
def test_csv_dataset_options_are_validated(hospitals_csv: Path, options: dict, needle: str) -> None:
    base = {"label_column": "label"}
    if "drop_columns" not in options and options != {}:
        base["drop_columns"] = ["eps", "note"]
    with pytest.raises(ValueError, match=needle):
        load_federation("csv", path=str(hospitals_csv), **base, **options)
