"""`pdpfl run` on data and budgets that would silently change: exit 2 naming the file, row and
column, no traceback, nothing written -- or, where the config opts in, a warning in the headline
and in summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from pdpfl.cli import app


def _csv(tmp_path: Path, edit: tuple[int, int, str] | None = None) -> Path:
    rng = np.random.default_rng(0)
    rows = [["pid", "site", "f1", "f2", "label"]]
    for i in range(60):
        f1 = rng.normal()
        rows.append(
            [str(i), "ab"[i % 2], f"{f1:.3f}", f"{rng.normal():.3f}", "yes" if f1 > 0 else "no"]
        )
    if edit is not None:
        rows[edit[0]][edit[1]] = edit[2]
    p = tmp_path / "patients.csv"
    p.write_text("\n".join(",".join(r) for r in rows) + "\n")
    return p


def _config(tmp_path: Path, csv: Path, **sections) -> Path:
    raw = {
        "name": "cli-data",
        "seed": 1,
        "threads": 1,
        "randomness": "reproducible",
        "data": {
            "dataset": "csv",
            "options": {
                "path": str(csv),
                "label_column": "label",
                "silo_column": "site",
                "record_id_column": "pid",
            },
        },
        "privacy": {"epsilon_max": 5.0, "delta": 1e-3},
        "training": {"rounds": 1, "local_steps": 1, "lr": 0.3, "batch_size": 8},
        **sections,
    }
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def _budgets(tmp_path: Path, values: dict[int, str]) -> Path:
    p = tmp_path / "budgets.csv"
    p.write_text("record_id,epsilon\n" + "".join(f"{i},{v}\n" for i, v in values.items()))
    return p


def _run(cfg: Path, out: Path, *args: str):
    return CliRunner().invoke(app, ["run", str(cfg), "--out", str(out), "--quiet", *args])


def _refused(res, out: Path, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    for needle in needles:
        assert needle in res.output, res.output
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    ("edit", "needles"),
    [
        ((5, 4, ""), ["error: data:", "column 'label'", "no label (empty) at row 6"]),
        ((5, 4, "nan"), ["column 'label'", "no label ('nan') at row 6"]),
        ((5, 1, ""), ["column 'site'", "no silo (empty) at row 6"]),
        ((5, 2, "inf"), ["NaN or infinite features (row 6, column 'f1': inf)"]),
        ((5, 0, "1"), ["column 'pid'", "id 1 appears 2 times (at rows 3, 6)"]),
    ],
    ids=["empty-label", "nan-label", "empty-silo", "inf-feature", "duplicate-id"],
)
def test_run_refuses_csv_cells_that_would_change_silently(tmp_path: Path, edit, needles) -> None:
    csv = _csv(tmp_path, edit)
    out = tmp_path / "out"
    _refused(_run(_config(tmp_path, csv), out), out, str(csv), *needles)


def test_unmatched_budget_ids_are_an_error_unless_the_config_opts_in(tmp_path: Path) -> None:
    csv = _csv(tmp_path)
    table = _budgets(tmp_path, {**{i: "1.0" for i in range(60)}, 999: "2.0"})
    cfg = _config(tmp_path, csv, budgets={"file": str(table)})
    out = tmp_path / "out"
    _refused(
        _run(cfg, out), out, "error: budgets.file:", "999", "row 62", "budgets.on_unmatched: ignore"
    )
    res = _run(cfg, out, "--set", "budgets.on_unmatched=ignore")
    assert res.exit_code == 0, res.output
    assert "1 budget(s)" in res.output and "were ignored" in res.output  # the headline
    summary = json.loads((out / "summary.json").read_text())
    assert any("not in the data (e.g. 999" in w for w in summary["warnings"])


def test_nan_budget_is_reported_as_nan_not_as_a_missing_row(tmp_path: Path) -> None:
    csv = _csv(tmp_path)
    table = _budgets(tmp_path, {i: ("nan" if i == 7 else "1.0") for i in range(60)})
    out = tmp_path / "out"
    _refused(
        _run(_config(tmp_path, csv, budgets={"file": str(table)}), out),
        out,
        "column 'epsilon': record id 7 (row 9) has no ε ('nan')",
    )


def test_budgets_above_epsilon_max_are_an_error_unless_capping_is_opted_in(tmp_path: Path) -> None:
    csv = _csv(tmp_path)
    table = _budgets(tmp_path, {i: ("50.0" if i % 3 == 0 else "1.0") for i in range(60)})
    cfg = _config(tmp_path, csv, budgets={"file": str(table)})
    out = tmp_path / "out"
    _refused(
        _run(cfg, out),
        out,
        "error: budgets: silo",
        "above ε_max = 5",
        "budgets.cap_at_epsilon_max: true",
    )
    res = _run(cfg, out, "--set", "budgets.cap_at_epsilon_max=true")
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    capped = summary["units_capped"]  # (records: the run's unit)
    train = summary["data"]["train_records"]
    assert 0 < capped < train
    assert f"{capped} record(s) have budgets above ε_max" in res.output
    assert any("above ε_max" in w for w in summary["warnings"])


def test_bad_budget_file_template_is_a_config_error(tmp_path: Path) -> None:
    cfg = _config(tmp_path, _csv(tmp_path), budgets={"file": "b_{silo}.csv"})
    out = tmp_path / "out"
    _refused(_run(cfg, out), out, "error: budgets.file: placeholder {silo} is not supported")


def test_python_train_refuses_unknown_budget_ids_before_writing_anything(tmp_path: Path) -> None:
    import pdpfl
    from pdpfl.data.validation import DataValidationError

    rng = np.random.default_rng(4)
    x = rng.normal(size=(60, 2))
    fed = pdpfl.federation_from_arrays(
        x, (x[:, 0] > 0).astype(int), ["a", "b"] * 30, record_ids=np.arange(500, 560)
    )
    eps = {**{i: 1.0 for i in range(500, 560)}, 9999: 1.0}
    settings = dict(
        rounds=1, local_steps=1, batch_size=8, epsilon_max=5.0, threads=1, randomness="reproducible"
    )
    with pytest.raises(DataValidationError, match=r"not in the data \(e.g. 9999"):
        pdpfl.train(fed, budgets=eps, out=tmp_path / "a", **settings)
    assert not (tmp_path / "a").exists()
    summary = pdpfl.train(fed, budgets=eps, out=tmp_path / "b", on_unmatched="ignore", **settings)
    assert summary["config"]["budgets"]["on_unmatched"] == "ignore"
    assert any("9999" in w and "were ignored" in w for w in summary["warnings"])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--option", "undersample=NaN"], "--option undersample: must be a finite number"),
        (["--option", "undersample=1e999"], "--option undersample: must be a finite number"),
        (
            ["--partition", "dirichlet", "--param", "beta=Infinity"],
            "--param beta: must be a finite number",
        ),
    ],
)
def test_data_describe_refuses_non_finite_option_values(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    csv = _csv(tmp_path)
    res = CliRunner().invoke(app, ["data", "describe", "csv", "--option", f"path={csv}", *args])
    assert res.exit_code == 2 and expected in res.output, res.output


def test_dirichlet_beta_must_be_finite() -> None:
    from pdpfl.data import load_federation

    with pytest.raises(ValueError, match="'beta' must be a finite number > 0"):
        load_federation(
            "digits", num_clients=3, partition="dirichlet", partition_params={"beta": float("inf")}
        )


def test_train_rechecks_a_federation_changed_after_it_was_built(tmp_path: Path) -> None:
    import pdpfl
    from pdpfl.data.validation import DataValidationError

    rng = np.random.default_rng(5)
    x = rng.normal(size=(40, 2))
    fed = pdpfl.federation_from_arrays(x, (x[:, 0] > 0).astype(int), ["a", "b"] * 20)
    fed.clients[1].x_train[2, 1] = np.nan
    bad_id = int(fed.clients[1].record_ids[2])
    with pytest.raises(
        DataValidationError,
        match=rf"silo 'b': 1 training record\(s\) have NaN "
        rf"or infinite features \(record ids e.g. \[{bad_id}\]\)",
    ):
        pdpfl.train(
            fed, rounds=1, local_steps=1, batch_size=8, epsilon_max=5.0, out=tmp_path / "run"
        )
    assert not (tmp_path / "run").exists()


def test_python_train_refused_for_capping_leaves_no_output(tmp_path: Path) -> None:
    import pdpfl

    rng = np.random.default_rng(6)
    x = rng.normal(size=(40, 2))
    fed = pdpfl.federation_from_arrays(x, (x[:, 0] > 0).astype(int), ["a", "b"] * 20)
    eps = {i: 50.0 for i in range(40)}
    with pytest.raises(ValueError, match=r"above ε_max = 5 .*budgets.cap_at_epsilon_max"):
        pdpfl.train(
            fed,
            budgets=eps,
            rounds=1,
            local_steps=1,
            batch_size=8,
            epsilon_max=5.0,
            threads=1,
            out=tmp_path / "run",
        )
    assert not (tmp_path / "run").exists()
