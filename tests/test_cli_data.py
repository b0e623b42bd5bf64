"""`pdpfl data` commands."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from pdpfl.cli import app

runner = CliRunner()


def test_describe_json_digits() -> None:
    r = runner.invoke(
        app,
        [
            "data",
            "describe",
            "digits",
            "--num-clients",
            "3",
            "--partition",
            "n-way-k-shot",
            "-p",
            "n_way=2",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["name"] == "digits" and d["features"] == 64 and d["classes"] == 10
    assert len(d["clients"]) == 3
    for c in d["clients"]:
        assert {"train", "test", "label_counts"} <= set(c)
        assert sum(1 for v in c["label_counts"].values() if v) == 2


def test_describe_heart_table(shared_data_dir) -> None:
    r = runner.invoke(
        app, ["data", "describe", "heart-disease", "--data-dir", str(shared_data_dir)]
    )
    assert r.exit_code == 0, r.output
    assert "486" in r.stdout and "254" in r.stdout and "cleveland" in r.stdout


def test_bad_input_exits_2_with_message() -> None:
    r = runner.invoke(app, ["data", "describe", "digits", "--partition", "bogus"])
    assert r.exit_code == 2
    assert "partition" in r.output
    r = runner.invoke(app, ["data", "describe", "nope"])
    assert r.exit_code == 2 and "dataset" in r.output
    r = runner.invoke(app, ["data", "describe", "digits", "-p", "novalue"])
    assert r.exit_code == 2 and "--param" in r.output


def test_missing_files_exit_2(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PDPFL_NO_DOWNLOAD", "1")
    monkeypatch.setenv("PDPFL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PDPFL_DATA_DIR", raising=False)
    r = runner.invoke(app, ["data", "describe", "mnist-10k", "--data-dir", str(tmp_path)])
    assert r.exit_code == 2 and "t10k-images-idx3-ubyte.gz" in r.output


def test_list_json() -> None:
    r = runner.invoke(app, ["data", "list", "--json"])
    assert r.exit_code == 0
    d = json.loads(r.stdout)
    assert "heart-disease" in d["datasets"] and "dirichlet" in d["partitions"]
