"""A hostile tester's sweep of the CLI (issue #23, "tried again as a hostile tester would").

Every case is a bad input to a pdpfl command -- bad flags, bad config values of every section,
bad or malicious data and budget files, wrong types, negative/inf/nan/huge numbers, missing
files, folders instead of files and files instead of folders -- and must end the same way:
``error: <field>: ...`` on the terminal, exit code 2, no traceback, and nothing left behind in
the folder the command was run from. Cases marked "was" failed before this sweep (how is in the
comment): a traceback, a silently ignored value, or a run that trained nothing and reported
success.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pdpfl.cli import app

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits_demo.yaml"
runner = CliRunner()

CSV_CONFIG = EXAMPLE.read_text().replace(
    "  dataset: digits\n  num_clients: 3\n  partition: iid\n",
    "  dataset: csv\n  options: {path: @PATH@, label_column: label, silo_column: silo}\n",
)


def _rows(cell=lambda i: str(i), label=lambda i: str(i % 2), n: int = 40) -> str:
    return "a,b,label,silo\n" + "".join(f"{cell(i)},1,{label(i)},{i % 2}\n" for i in range(n))


#: File name -> content of the data and config files the cases use (made in the test folder).
FILES: dict[str, str] = {
    "afile": "x",
    "binary.yaml": "\x00\x01\x02\xff",
    "list.yaml": "- a\n- b\n",
    "empty.yaml": "",
    "dup.yaml": EXAMPLE.read_text() + "seed: 3\n",
    "tag.yaml": EXAMPLE.read_text() + "x: !!python/object/apply:os.system ['echo hi']\n",
    "nan.csv": _rows(cell=lambda i: "nan" if i == 3 else str(i)),
    "text.csv": _rows(cell=lambda i: "x" if i == 3 else str(i)),
    "huge.csv": _rows(cell=lambda i: "1e400" if i == 3 else str(i)),
    "nolabel.csv": _rows(label=lambda i: "" if i == 3 else str(i % 2)),
    "header.csv": "a,b,label,silo\n",
    "ragged.csv": "a,b,label,silo\n1,2,0,0\n1,2,3,4,5,6\n",
    "budgets-nan.csv": "eps\n1\nnan\n2\n",
    "budgets-neg.csv": "eps\n1\n-2\n",
    "budgets-empty.csv": "",
}
DATA_CONFIGS = (
    "nan.csv",
    "text.csv",
    "huge.csv",
    "nolabel.csv",
    "header.csv",
    "ragged.csv",
    "missing.csv",
    "adir",
)

EX = str(EXAMPLE)
ACCOUNT = ["account", "--sigma", "1", "--delta", "1e-5"]
CALIBRATE = ["calibrate", "--delta", "1e-5", "--epsilon-max", "10", "--steps", "1", "--rounds", "1"]
SCENARIO = [*CALIBRATE, "--scenario", "three-levels", "--n", "10"]


def _set(*overrides: str) -> list[str]:
    return ["run", EX, "--out", "out", *[a for o in overrides for a in ("--set", o)]]


#: case -> (arguments, the field the error must name)
CASES: dict[str, tuple[list[str], str]] = {
    # ------------------------------------------------------------------ config files
    "config missing": (["run", "nope.yaml"], "config"),
    "config is a folder": (["run", "adir"], "config"),
    "config binary": (["run", "binary.yaml"], "config"),
    "config a list": (["run", "list.yaml"], "config"),
    "config empty": (["run", "empty.yaml"], "data"),
    "config duplicate key": (["run", "dup.yaml"], "duplicate key 'seed'"),
    "config python tag": (["run", "tag.yaml"], "is not allowed"),
    # ------------------------------------------------------- config values, every section
    "rounds negative": (_set("rounds=-1"), "training.rounds"),
    "rounds nan": (_set("training.rounds=nan"), "training.rounds"),
    "rounds huge": (_set("training.rounds=99999999999999999999"), "training.rounds"),
    "rounds a boolean": (_set("rounds=true"), "training.rounds"),
    "lr inf": (_set("training.lr=inf"), "training.lr"),
    "lr a list": (_set("training.lr=[1,2]"), "training.lr"),
    # was: a traceback (torch: "value cannot be converted to type float without overflow")
    "weight decay beyond float32": (_set("training.weight_decay=1e308"), "training.weight_decay"),
    # was: accepted; every noisy sum divided by 1e30, a run that trained nothing, exit 0
    "batch size absurd": (_set("training.batch_size=1e30"), "training.batch_size"),
    "momentum 1": (_set("training.momentum=1"), "training.momentum"),
    "clip bound -inf": (_set("training.max_grad_norm=-inf"), "training.max_grad_norm"),
    "client rate 0": (_set("training.client_rate=0"), "training.client_rate"),
    "optimizer unknown": (_set("training.optimizer=nosuch"), "training.optimizer"),
    "delta 2": (_set("privacy.delta=2"), "privacy.delta"),
    "delta underflows to 0": (_set("privacy.delta=1e-400"), "privacy.delta"),
    "epsilon max nan": (_set("privacy.epsilon_max=nan"), "privacy.epsilon_max"),
    "calibration unknown": (_set("privacy.calibration=bogus"), "privacy.calibration"),
    "budget values negative": (_set("budgets.params.values=[-1,1,5]"), "budgets: params"),
    # was: "error: could not convert string to float: 'a'" (no field named)
    "budget values text": (_set("budgets.params.values=[a,b,c]"), "budgets: params"),
    "budget scenario unknown": (_set("budgets.scenario=bogus"), "budgets: scenario"),
    "budgets file missing": (
        _set("budgets.scenario=file", "budgets.file=/nonexistent.csv"),
        "budgets.file",
    ),
    "data num_clients 0": (_set("data.num_clients=0"), "data.num_clients"),
    "data option unknown": (_set("data.options.bogus=1"), "data"),
    "partition unknown": (_set("data.partition=nosuch"), "data"),
    "model unknown": (_set("model.name=nosuch"), "model.name"),
    # was: a traceback (TypeError: _logreg() got an unexpected keyword argument 'bogus')
    "model option unknown": (_set("model.options.bogus=1"), "model: options"),
    "algorithm unknown": (_set("algorithm.name=nosuch"), "algorithm"),
    "seed text": (_set("seed=abc"), "seed"),
    "randomness unknown": (_set("randomness=bogus"), "randomness"),
    "set without =": (["run", EX, "--set", "training.lr"], "--set"),
    "set key too deep": (_set("a.b.c.d.e.f.g.h.i.j=1"), "--set"),
    # ------------------------------------------------------------------- run options
    "out is a file": (["run", EX, "--out", "afile"], "--out"),
    "resume and force": (["run", EX, "--resume", "--force", "--out", "out"], "--resume"),
    "runtime unknown": (["run", EX, "--runtime", "gpu", "--out", "out"], "runtime"),
    # was: ignored (the digits set needs no files): a run, exit 0
    "data dir missing": (["run", EX, "--data-dir", "nodir", "--out", "out"], "--data-dir"),
    "data dir a file": (["run", EX, "--data-dir", "afile", "--out", "out"], "--data-dir"),
    "import missing": (["run", EX, "--import", "nosuch_module_xyz", "--out", "out"], "--import"),
    # ------------------------------------------------------------------- other commands
    "privacy missing folder": (["privacy", "nodir"], "RUN_DIR"),
    "privacy on a file": (["privacy", "afile"], "RUN_DIR"),
    "export bad format": (["export", "adir", "--format", "onnx"], "--format"),
    "export empty folder": (["export", "adir"], "RUN_DIR"),
    # was: click's boxed "Invalid value for '--round'" panel, not pdpfl's one-line error
    "export round 0": (["export", "adir", "--round", "0"], "--round"),
    "account sigma 0": ([*ACCOUNT[:2], "0", *ACCOUNT[3:], "--q", "0.1"], "--sigma"),
    "account sigma nan": ([*ACCOUNT[:2], "nan", *ACCOUNT[3:], "--q", "0.1"], "--sigma"),
    "account delta 1": (["account", "--sigma", "1", "--delta", "1", "--q", "0.1"], "--delta"),
    "account q 1.5": ([*ACCOUNT, "--q", "1.5"], "--q"),
    "account q text": ([*ACCOUNT, "--q", "abc"], "--q"),
    "account steps negative": ([*ACCOUNT, "--q", "0.1", "--steps", "-1"], "--steps"),
    "account q-file pickle": ([*ACCOUNT, "--q-file", "pickle.npy"], "--q-file"),
    "account q-file missing": ([*ACCOUNT, "--q-file", "nofile.npy"], "--q-file"),
    # was: click's boxed "Missing option '--sigma'" panel
    "account sigma missing": (["account", "--delta", "1e-5", "--q", "0.1"], "--sigma"),
    # was: click's boxed "No such option" panel
    "account unknown option": ([*ACCOUNT, "--q", "0.1", "--frobnicate", "1"], "--frobnicate"),
    "calibrate budgets nan": ([*CALIBRATE, "--budgets", "budgets-nan.csv"], "--budgets"),
    "calibrate budgets negative": ([*CALIBRATE, "--budgets", "budgets-neg.csv"], "--budgets"),
    "calibrate budgets empty": ([*CALIBRATE, "--budgets", "budgets-empty.csv"], "--budgets"),
    "calibrate budgets 2-D": ([*CALIBRATE, "--budgets", "2d.npy"], "--budgets"),
    "calibrate budgets a folder": ([*CALIBRATE, "--budgets", "adir"], "--budgets"),
    "calibrate n 0": ([*CALIBRATE, "--scenario", "three-levels", "--n", "0"], "--n"),
    # was: a traceback (numpy: unable to allocate 728 TiB)
    "calibrate n huge": (
        [*CALIBRATE, "--scenario", "three-levels", "--n", "100000000000000"],
        "--n",
    ),
    "calibrate out a folder": ([*SCENARIO, "--out", "adir"], "--out"),
    "calibrate client rate 0": ([*SCENARIO, "--client-rate", "0"], "--client-rate"),
    "audit canaries 1": (["audit", EX, "--canaries", "1"], "--canaries"),
    "audit observer unknown": (["audit", EX, "--observer", "god"], "--observer"),
    "audit out a file": (["audit", EX, "--out", "afile"], "--out"),
    "compare method unknown": (["compare", EX, "--methods", "nosuch", "--seeds", "1"], "--methods"),
    "compare seed text": (["compare", EX, "--methods", "rpdp", "--seeds", "x"], "--seeds"),
    # was: an empty --methods ran the four default methods, exit 0
    "compare methods empty": (["compare", EX, "--methods", "", "--seeds", "1"], "--methods"),
    "compare out a file": (
        ["compare", EX, "--methods", "rpdp", "--seeds", "1", "--out", "afile"],
        "--out",
    ),
    "log level unknown": (["--log-level", "loud", *ACCOUNT, "--q", "0.1"], "--log-level"),
    # was: accepted (the run would fail later on the coordinator)
    "flower app out a file": (["flower", "app", EX, "--out", "afile"], "--out"),
    # was: accepted (the silo would fail at its first message)
    "flower state dir a file": (
        [
            "flower",
            "supernode",
            "--silo",
            "0",
            "--num-silos",
            "2",
            "--superlink",
            "127.0.0.1:9092",
            "--insecure",
            "--state-dir",
            "afile",
            "--dry-run",
        ],
        "--state-dir",
    ),
    **{
        f"data file {name}": (["run", f"data-{name}.yaml", "--out", "out"], "data")
        for name in DATA_CONFIGS
    },
}


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "adir").mkdir()
    np.save(tmp_path / "2d.npy", np.ones((2, 2)))
    np.save(tmp_path / "pickle.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    for name in DATA_CONFIGS:
        (tmp_path / f"data-{name}.yaml").write_text(
            CSV_CONFIG.replace("@PATH@", str(tmp_path / name))
        )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _listing(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b""
        for p in folder.rglob("*")
    }


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_input_gets_a_clear_error_and_exit_2(folder: Path, case: str) -> None:
    args, field = CASES[case]
    before = _listing(folder)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert errors, result.output
    assert field in errors[0], errors[0]
    assert _listing(folder) == before  # nothing written, nothing changed


def test_usage_errors_name_the_option_in_one_line() -> None:
    result = runner.invoke(app, ["export", "x", "--round", "0"])
    assert result.output.strip() == "error: --round: 0 is not in the range x>=1."
