"""Data that would silently change is refused, by every loader, naming what, where and the fix.

Before these checks an empty label cell became a third class, a NaN label the class 'nan', an
empty silo cell a silo named '' (or 'nan'), inf/NaN feature cells trained to a non-finite model,
a budget for an unknown id was ignored and a NaN budget was reported as "no budget".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pdpfl.data import load_federation
from pdpfl.data.budget_table import (
    align_budgets,
    budget_table,
    check_budget_file,
    read_table,
)
from pdpfl.data.federation import ClientData
from pdpfl.data.user import (
    federation_from_arrays,
    federation_from_dataframe,
    federation_from_silos,
)
from pdpfl.data.validation import (
    DataValidationError,
    check_features,
    check_labels,
    check_record_ids,
    check_silo_keys,
    is_missing,
)

pd = pytest.importorskip("pandas")


# ------------------------------------------------------------------------------ the CSV file


def _csv(
    tmp_path: Path, edit: tuple[int, int, str] | None = None, n: int = 40, extra: str = ""
) -> Path:
    """pid,site,f1,f2,label with ``edit = (data row, column, value)`` applied."""
    rng = np.random.default_rng(0)
    rows = [["pid", "site", "f1", "f2", "label"]]
    for i in range(n):
        rows.append(
            [
                str(i),
                "ab"[i % 2],
                f"{rng.normal():.3f}",
                f"{rng.normal():.3f}",
                ["yes", "no"][i % 3 == 0],
            ]
        )
    if edit is not None:
        r, c, v = edit
        rows[r][c] = v
    p = tmp_path / "patients.csv"
    p.write_text("\n".join(",".join(r) for r in rows) + "\n" + extra, encoding="utf-8")
    return p


def _load_csv(path: Path, **options):
    base = {"label_column": "label", "silo_column": "site", "record_id_column": "pid"}
    return load_federation("csv", path=str(path), **{**base, **options})


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            (5, 4, ""),
            r"column 'label' \(option 'label_column'\): 1 record\(s\) have no label "
            r"\(empty\) at row 6",
        ),
        ((5, 4, "nan"), r"have no label \('nan'\) at row 6"),
        ((5, 4, "NA"), r"have no label \('NA'\) at row 6"),
        (
            (5, 1, ""),
            r"column 'site' \(option 'silo_column'\): 1 record\(s\) have no silo "
            r"\(empty\) at row 6",
        ),
        ((5, 1, "nan"), r"have no silo \('nan'\) at row 6"),
        (
            (5, 2, "inf"),
            r"1 record\(s\) have NaN or infinite features \(row 6, column 'f1': "
            r"inf\)",
        ),
        ((5, 3, "nan"), r"row 6, column 'f2': nan"),
        ((5, 3, "-1e300"), r"beyond 3.403e\+38 in magnitude \(row 6, column 'f2'"),
        ((5, 2, "abc"), r"column 'f1' row 6 is not numeric: 'abc'"),
        ((5, 2, ""), r"column 'f1' row 6 is not numeric: ''"),
        ((5, 0, "1"), r"record ids must be unique; id 1 appears 2 times \(at rows 3, 6\)"),
        ((5, 0, "1.5"), r"record id '1.5' at row 6 is not a 64-bit integer"),
        ((5, 0, ""), r"have no record id \(empty\) at row 6"),
        ((5, 0, "99999999999999999999"), r"is not a 64-bit integer"),
        ((0, 3, "f1"), r"column names \['f1'\] appear more than once"),
    ],
    ids=[
        "empty-label",
        "nan-label",
        "NA-label",
        "empty-silo",
        "nan-silo",
        "inf-feature",
        "nan-feature",
        "huge-feature",
        "text-feature",
        "empty-feature",
        "duplicate-id",
        "fractional-id",
        "empty-id",
        "huge-id",
        "duplicate-column",
    ],
)
def test_csv_cells_that_would_silently_change_are_refused_with_file_row_column(
    tmp_path: Path, edit: tuple[int, int, str], expected: str
) -> None:
    path = _csv(tmp_path, edit)
    with pytest.raises(ValueError, match=expected) as info:
        _load_csv(path)
    assert str(path) in str(info.value)


def test_csv_clean_file_keeps_every_record_and_two_classes(tmp_path: Path) -> None:
    fed = _load_csv(_csv(tmp_path))
    assert [c.name for c in fed.clients] == ["a", "b"] and fed.class_names == ["no", "yes"]
    assert sum(c.num_train + c.num_test for c in fed.clients) == 40


def test_csv_row_numbers_are_file_lines_and_short_rows_are_refused(tmp_path: Path) -> None:
    path = _csv(tmp_path, extra="\n40,a,0.1,0.2\n")  # a blank line, then a short row
    with pytest.raises(ValueError, match=r"rows \[43\] do not have 5 fields"):
        _load_csv(path)
    path = _csv(tmp_path, extra="\n41,a,inf,0.2,yes\n")
    with pytest.raises(ValueError, match=r"row 43, column 'f1': inf"):
        _load_csv(path)
    path = _csv(tmp_path, extra=",,,,\n")  # a row of empty cells is not silently dropped
    with pytest.raises(ValueError, match=r"row 42 is not numeric: ''"):
        _load_csv(path)


def test_csv_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes("f1,label\n1.0,caf\xe9\n2.0,th\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        load_federation("csv", path=str(path))


def test_csv_undersample_nan_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="option 'undersample'"):
        _load_csv(_csv(tmp_path), undersample=float("nan"))


# ------------------------------------------------------------------------------- DataFrames


def _frame(n: int = 60):
    rng = np.random.default_rng(1)
    df = pd.DataFrame(rng.normal(size=(n, 2)), columns=["f1", "f2"])
    df["y"] = rng.choice(["sick", "well"], size=n)
    df["site"] = rng.choice(["x", "y"], size=n)
    return df


def _from(df, **kw):
    return federation_from_dataframe(df, label="y", silo="site", **kw)


@pytest.mark.parametrize(
    ("column", "value", "expected"),
    [
        (
            "y",
            np.nan,
            r"label \(DataFrame column 'y'\): 1 record\(s\) have no label \(nan\) "
            r"at index 7",
        ),
        ("y", None, r"have no label \(None\) at index 7"),
        ("y", "", r"have no label \(empty\) at index 7"),
        (
            "site",
            np.nan,
            r"silo \(DataFrame column 'site'\): 1 record\(s\) have no silo \(nan\)"
            r" at index 7",
        ),
        ("site", None, r"have no silo \(None\)"),
        (
            "f1",
            np.inf,
            r"features \(DataFrame\): 1 record\(s\) have NaN or infinite features "
            r"\(index 7, column 'f1': inf\)",
        ),
        ("f2", np.nan, r"index 7, column 'f2': nan"),
    ],
)
def test_dataframe_missing_and_non_finite_cells_are_refused(
    column: str, value, expected: str
) -> None:
    df = _frame()
    df[column] = df[column].astype(object) if value is None or value == "" else df[column]
    df.loc[7, column] = value
    with pytest.raises(DataValidationError, match=expected):
        _from(df)


def test_dataframe_nullable_dtypes_and_string_index() -> None:
    df = _frame()
    df["f1"] = pd.array(np.arange(60), dtype="Int64")
    df.loc[4, "f1"] = pd.NA
    with pytest.raises(DataValidationError, match=r"index 4, column 'f1': nan"):
        _from(df)
    df = _frame()
    df["y"] = df["y"].astype("string")
    df.loc[4, "y"] = pd.NA
    df.index = [f"p{i}" for i in range(60)]
    with pytest.raises(DataValidationError, match=r"have no label \(<NA>\) at index 'p4'"):
        _from(df)


def test_dataframe_repeated_index_and_ids_name_the_rows() -> None:
    df = pd.concat([_frame(30), _frame(30)])  # forgot ignore_index=True
    with pytest.raises(
        DataValidationError,
        match=r"record_id \(the DataFrame's index\): "
        r"record ids must be unique; id 0 appears 2 times",
    ):
        _from(df)
    df = _frame()
    df["pid"] = np.arange(60.0)
    df.loc[3, "pid"] = np.nan
    with pytest.raises(
        DataValidationError,
        match=r"record_id \(DataFrame column 'pid'\): 1 "
        r"record\(s\) have no record id \(nan\) at index 3",
    ):
        _from(df, record_id="pid")


def test_dataframe_labels_of_the_wrong_kind_are_refused() -> None:
    df = _frame()
    df["y"] = np.linspace(0, 1, 60)
    with pytest.raises(DataValidationError, match="is not a whole number"):
        _from(df)
    df = _frame()
    df["y"] = [1 if i % 2 else "1" for i in range(60)]
    with pytest.raises(DataValidationError, match="mix text and numbers"):
        _from(df)
    df = _frame()
    df["y"] = [True if i % 2 else 1 for i in range(60)]
    with pytest.raises(DataValidationError, match="mix booleans and numbers"):
        _from(df)
    df = _frame()
    df["y"] = np.where(np.arange(60) % 2, 1.0, 0.0)  # whole floats are classes 0 and 1
    assert _from(df).class_names == ["0", "1"]


def test_dataframe_test_column_must_be_boolean() -> None:
    df = _frame()
    df["is_test"] = np.where(np.arange(60) % 4 == 0, 1.0, 0.0)
    df.loc[5, "is_test"] = np.nan  # to_numpy(dtype=bool) made this a test record
    with pytest.raises(
        DataValidationError,
        match=r"test \(DataFrame column 'is_test'\): 1 "
        r"value\(s\) are not True/False",
    ):
        _from(df, test="is_test")
    df.loc[5, "is_test"] = 0.0
    assert sum(c.num_test for c in _from(df, test="is_test").clients) == 15


def test_dataframe_duplicate_column_names_are_refused() -> None:
    df = _frame()
    df.columns = ["f1", "f1", "y", "site"]
    with pytest.raises(DataValidationError, match=r"column names \['f1'\] appear more"):
        _from(df)


# ----------------------------------------------------------------------------------- arrays


def _xy(n: int = 30):
    rng = np.random.default_rng(2)
    return rng.normal(size=(n, 3)), rng.integers(0, 2, n), rng.choice(["a", "b"], n)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda x, y, s: (x, np.eye(2)[y], s),
            r"y: expected one label per record \(shape "
            r"\(n,\)\), got shape \(30, 2\) -- one-hot labels\? pass y.argmax",
        ),
        (lambda x, y, s: (x[:-1], y, s), r"x and y: different numbers of records \(29 and 30\)"),
        (lambda x, y, s: (x, y, s[:-1]), r"silos: expected one silo per record \(30\), got 29"),
        (
            lambda x, y, s: (np.where(np.arange(90).reshape(30, 3) == 7, np.inf, x), y, s),
            r"x: 1 record\(s\) have NaN or infinite features \(index 2, feature 1: inf\)",
        ),
        (lambda x, y, s: (x.astype(complex), y, s), "features must be real numbers"),
        (
            lambda x, y, s: (np.array([["1", "2", "3"]] * 30, dtype=object), y, s),
            r"x: index 0, feature 0 is not a number: '1'",
        ),
        (
            lambda x, y, s: (x, np.where(np.arange(30) == 4, np.nan, y), s),
            r"y: 1 record\(s\) have no label \(nan\) at index 4",
        ),
        (
            lambda x, y, s: (x, np.array([None] + [1, 0] * 14 + [1], dtype=object), s),
            r"y: 1 record\(s\) have no label \(None\) at index 0",
        ),
        (
            lambda x, y, s: (x, y, np.where(np.arange(30) == 3, None, s)),
            r"silos: 1 record\(s\) have no silo \(None\) at index 3",
        ),
        (lambda x, y, s: (x, np.zeros(30), s), r"y: at least 2 classes are needed, found 1"),
    ],
    ids=[
        "one-hot",
        "x-y-length",
        "silo-length",
        "inf",
        "complex",
        "text-cells",
        "nan-label",
        "none-label",
        "none-silo",
        "one-class",
    ],
)
def test_arrays_that_would_silently_change_are_refused(change, expected: str) -> None:
    x, y, s = change(*_xy())
    with pytest.raises(DataValidationError, match=expected):
        federation_from_arrays(x, y, s)


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        (np.r_[np.arange(29), 3], r"id 3 appears 2 times \(at indices 3, 29\)"),
        (np.r_[np.arange(29.0), np.nan], r"have no record id \(nan\) at index 29"),
        (np.r_[np.arange(29.0), 29.5], r"record id 29.5 at index 29 is not a 64-bit integer"),
        (np.r_[np.arange(29, dtype=np.uint64), np.uint64(2**64 - 1)], "does not fit in 64"),
        (np.arange(30) % 2 == 0, "got booleans"),
        (np.arange(29), r"expected one id per record \(30\), got 29"),
    ],
)
def test_record_ids_must_be_unique_integers(ids, expected: str) -> None:
    x, y, s = _xy()
    with pytest.raises(DataValidationError, match=expected):
        federation_from_arrays(x, y, s, record_ids=ids)


def test_num_classes_out_of_range_names_the_index() -> None:
    x, _, s = _xy()
    with pytest.raises(DataValidationError, match=r"label 5 at index 0 is outside \[0, 3\)"):
        federation_from_arrays(x, np.r_[5, np.zeros(29, int)], s, num_classes=3)


def test_numpy_helpers_directly() -> None:
    assert is_missing(None) and is_missing(float("nan")) and is_missing(" NaN ")
    assert is_missing(pd.NA) and is_missing(pd.NaT) and not is_missing("0")
    assert check_features([1, 2, 3]).shape == (3, 1)
    with pytest.raises(DataValidationError, match="single value"):
        check_features(3.0)
    assert check_labels(["b", "a", "b"])[2] == ["a", "b"]
    assert check_silo_keys(np.array([1.0, 2.0])).tolist() == [1, 2]
    assert check_record_ids(["007", "8"]).tolist() == [7, 8]


# ------------------------------------------------------------------------------------ silos


def test_silos_name_the_silo_and_side() -> None:
    rng = np.random.default_rng(3)
    good = (rng.normal(size=(10, 2)), rng.integers(0, 2, 10))
    bad_x = good[0].copy()
    bad_x[4, 1] = np.nan
    with pytest.raises(
        DataValidationError,
        match=r"silos\['b'\] x: 1 record\(s\) have NaN or "
        r"infinite features \(index 4, feature 1: nan\)",
    ):
        federation_from_silos({"a": good, "b": (bad_x, good[1])})
    bad_y = np.array([0, 1] * 4 + [None, 1], dtype=object)
    with pytest.raises(
        DataValidationError,
        match=r"silos\['b'\] \(test\) y: 1 record\(s\) have"
        r" no label \(None\) at index 8",
    ):
        federation_from_silos({"a": (*good, *good), "b": (*good, good[0], bad_y)})
    with pytest.raises(DataValidationError, match=r"silos\['b'\]: no records"):
        federation_from_silos({"a": good, "b": (np.zeros((0, 2)), np.zeros(0))})
    with pytest.raises(DataValidationError, match="not unique as text"):
        federation_from_silos({1: good, "1": good})
    flags = (good[0], good[1].astype(bool))  # True would silently be class 1
    with pytest.raises(DataValidationError, match="labels mix booleans and numbers"):
        federation_from_silos({"a": good, "b": flags})
    with pytest.raises(DataValidationError, match=r"record_ids\['b'\]: 9 ids for 10 records"):
        federation_from_silos({"a": good, "b": good}, record_ids=[np.arange(10), np.arange(10, 19)])


def test_client_data_refuses_non_finite_features_as_a_backstop() -> None:
    x = np.zeros((3, 2))
    x[1, 0] = 1e39  # finite in float64, inf in float32
    with pytest.raises(
        ValueError,
        match=r"client 'c': 1 training record\(s\) have NaN or "
        r"infinite features as float32 \(record ids e.g. \[11\]\)",
    ):
        ClientData("c", x, np.zeros(3), np.zeros((0, 2)), np.zeros(0), np.array([10, 11, 12]))


def test_creditcard_and_heart_files_are_checked(tmp_path: Path) -> None:
    from pdpfl.data.creditcard import FEATURES, read_csv
    from pdpfl.data.heart import parse_processed

    path = tmp_path / "creditcard.csv"
    rows = [",".join([*FEATURES, "Class"])]
    rows += [",".join(["0.5"] * 30 + ["0"]) for _ in range(3)]
    rows[2] = ",".join(["0.5"] * 5 + ["nan"] + ["0.5"] * 24 + ["1"])
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(DataValidationError, match=r"row 3, column 'V5': nan"):
        read_csv(path)
    with pytest.raises(ValueError, match=r"line 2: a field is not a number or '\?'"):
        parse_processed("63,1,1,145,233,1,2,150,0,2.3,3,0,6,0\n63,1,x,1,1,1,1,1,1,1,1,1,1,1\n")


# ---------------------------------------------------------------------------------- budgets


def _fed():
    x, y, s = _xy(40)
    return federation_from_arrays(x, y, s, record_ids=np.arange(100, 140), test_fraction=0.25)


def test_budgets_for_unknown_ids_are_an_error_unless_ignored() -> None:
    fed = _fed()
    eps = {i: 1.0 for i in range(100, 140)}
    eps[999] = 2.0
    with pytest.raises(
        DataValidationError,
        match=r"1 budget\(s\) are for record ids that are "
        r"not in the data \(e.g. 999.*budgets.on_unmatched: ignore",
    ):
        align_budgets(fed, eps)
    out = align_budgets(fed, eps, on_unmatched="ignore")
    assert sum(len(v) for v in out) == sum(c.num_train for c in fed.clients)
    with pytest.raises(ValueError, match="on_unmatched"):
        align_budgets(fed, eps, on_unmatched="drop")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.nan, r"record id 117 \(entry 17\) has no ε \(nan\)"),
        (None, r"record id 117 \(entry 17\) has no ε \(None\)"),
        (np.inf, r"record id 117 \(entry 17\): ε = inf; every ε must be a finite number > 0"),
        (0.0, r"ε = 0.0"),
        ("high", r"ε 'high' is not a number"),
        (True, r"ε True is not a number"),
    ],
)
def test_a_bad_budget_is_reported_as_such_not_as_missing(value, expected: str) -> None:
    eps = {i: 1.0 for i in range(100, 140)}
    eps[117] = value
    with pytest.raises(DataValidationError, match=expected):
        align_budgets(_fed(), eps)


def test_budget_series_and_arrays_name_the_index() -> None:
    s = pd.Series(1.0, index=[f"{i}" for i in range(100, 140)])
    s.iloc[3] = np.nan
    with pytest.raises(
        DataValidationError,
        match=r"budgets \(Series\): record id 103 "
        r"\(index '103'\) has no ε \(nan\)",
    ):
        budget_table(s)
    with pytest.raises(DataValidationError, match=r"id 5 appears 2 times"):
        budget_table(([5, 6, 5], [1.0, 1.0, 1.0]))


def _table(tmp_path: Path, rows: list[str]) -> Path:
    p = tmp_path / "budgets.csv"
    p.write_text("record_id,epsilon\n" + "\n".join(rows) + "\n")
    return p


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ("117,", r"column 'epsilon': record id 117 \(row 19\) has no ε \(empty\)"),
        ("117,nan", r"record id 117 \(row 19\) has no ε \('nan'\)"),
        ("117,inf", r"ε = inf"),
        ("117,-1", r"ε = -1.0"),
        ("117,abc", r"ε 'abc' is not a number"),
        (",1.0", r"column 'record_id': 1 record\(s\) have no record id \(empty\) at row 19"),
        ("116,1.0", r"id 116 appears 2 times \(at rows 18, 19\)"),
        ("117", r"row 19 has fewer than 2 fields"),
    ],
)
def test_budget_table_rows_are_validated_with_their_row(
    tmp_path: Path, edit: str, expected: str
) -> None:
    rows = [f"{i},1.0" for i in range(100, 140)]
    rows[17] = edit
    with pytest.raises(DataValidationError, match=expected):
        read_table(_table(tmp_path, rows))


class _Cfg:
    class budgets:  # noqa: N801 - mimics config.budgets
        file: str | None = None
        on_unmatched = "error"


def test_budget_file_check_against_the_whole_federation(tmp_path: Path) -> None:
    fed = _fed()
    cfg = _Cfg()
    rows = [f"{i},1.0" for i in range(100, 140)] + ["7,1.0", "8,1.0"]
    cfg.budgets.file = str(_table(tmp_path, rows))
    with pytest.raises(
        DataValidationError,
        match=r"budgets.file: .*budgets.csv: 2 budget\(s\) "
        r"are for record ids that are not in the data \(e.g. 7, 8; rows 42, 43\)",
    ):
        check_budget_file(cfg, fed)
    cfg.budgets.on_unmatched = "ignore"
    (warning,) = check_budget_file(cfg, fed)
    assert "2 budget(s)" in warning and "ignored (budgets.on_unmatched: ignore)" in warning
    cfg.budgets.file = str(_table(tmp_path, [f"{i},1.0" for i in range(100, 140)]))
    assert check_budget_file(cfg, fed) == []


def test_no_feature_columns_and_malformed_budget_containers() -> None:
    x, y, s = _xy()
    with pytest.raises(DataValidationError, match=r"x: no features \(shape \(30, 0\)\)"):
        federation_from_arrays(np.zeros((30, 0)), y, s)
    fed = _fed()
    with pytest.raises(
        DataValidationError,
        match=r"expected a 1-D array indexed by record id, "
        r"got shape \(40, 2\)",
    ):
        align_budgets(fed, np.ones((40, 2)))
    for bad in ("1.0", None):
        with pytest.raises(DataValidationError, match="budgets file is given as budgets.file"):
            align_budgets(fed, bad)


def test_csv_numeric_labels_are_numbers(tmp_path: Path) -> None:
    """'1' and '1.0' are one class (not two); 0.5 is continuous; 'inf' and 'nan' are refused."""
    path = tmp_path / "num.csv"
    path.write_text(
        "f,label\n" + "".join(f"{i},{['0', '1', '1.0', '0.0'][i % 4]}\n" for i in range(20))
    )
    fed = load_federation("csv", path=str(path), num_clients=2)
    assert fed.class_names == ["0", "1"]
    for bad, expected in (
        ("0.5", "is not a whole number"),
        ("inf", "too large"),
        ("nan", r"have no label \(nan\) at row 4"),
    ):
        path.write_text(
            "f,label\n" + "".join(f"{i},{bad if i == 2 else i % 2}\n" for i in range(20))
        )
        with pytest.raises(DataValidationError, match=expected):
            load_federation("csv", path=str(path), num_clients=2)


def test_budget_table_written_by_excel_with_a_bom_is_a_table(tmp_path: Path) -> None:
    from pdpfl.data.budget_table import is_budget_table

    p = tmp_path / "bom.csv"
    p.write_text("\ufeffrecord_id,epsilon\n1,0.5\n2,1.0\n", encoding="utf-8")
    assert is_budget_table(p) and read_table(p).lookup() == {1: 0.5, 2: 1.0}


def test_positional_budget_file_with_a_gap_is_refused(tmp_path: Path) -> None:
    from pdpfl.budgets import load_budgets

    p = tmp_path / "eps.csv"
    p.write_text("0.5\n1.0\n\n2.0\n\n")  # a gap would shift every later record's ε
    with pytest.raises(ValueError, match="line 3 is empty"):
        load_budgets(p)
    p.write_text("0.5\nnan\n")
    with pytest.raises(ValueError, match=r"line 2: ε 'nan' is NaN or infinite"):
        load_budgets(p)
    p.write_text("0.5\n1.0\n\n")
    assert load_budgets(p).tolist() == [0.5, 1.0]


def test_a_silos_own_budget_file_is_checked_at_the_silo(tmp_path: Path) -> None:
    """Flower silos never see the other silos' ids: a per-silo file is checked where it is
    read (a shared file is checked against the whole federation by check_budget_file)."""
    from pdpfl.data.budget_table import silo_budgets

    fed = _fed()
    silo = fed.clients[0]
    own = np.r_[silo.record_ids, silo.test_record_ids]
    path = _table(tmp_path, [f"{i},1.0" for i in own] + ["555,2.0"])
    with pytest.raises(DataValidationError, match=r"not in the data \(e.g. 555"):
        silo_budgets(path, silo.record_ids, silo=silo)
    values = silo_budgets(path, silo.record_ids, silo=silo, on_unmatched="ignore")
    assert values.tolist() == [1.0] * silo.num_train
    assert silo_budgets(path, silo.record_ids).tolist() == [1.0] * silo.num_train
