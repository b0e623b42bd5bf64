"""A hostile tester's sweep of the CLI (issue #23, "tried again as a hostile tester would").

Every case is a bad input to a pdpfl command -- bad flags, bad config values of every section,
bad or malicious data and budget files, wrong types, negative/inf/nan/huge numbers, missing
files, folders instead of files and files instead of folders -- and must end the same way:
``error: <field>: ...`` on the terminal, exit code 2, no traceback, and nothing left behind in
the folder the command was run from. Cases marked "was" failed before this sweep (how is in the
comment): a traceback, a silently ignored value, or a run that trained nothing and reported
success.

The cases after "issue #36" come from a hostile new user at the places where pdpfl meets the
operating system and Flower: ports, addresses, the key folder, model files, budget tables,
names, and models handed to the Python API.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
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
    # issue #36: the README's record_id,epsilon table and its ways to be wrong
    "table-dup.csv": "record_id,epsilon\n1,0.5\n1,1.0\n",
    "table-text-id.csv": "record_id,epsilon\nabc,0.5\n",
    "table-nan.csv": "record_id,epsilon\n1,nan\n",
    "table-empty-eps.csv": "record_id,epsilon\n1,\n",
    "table-negative.csv": "record_id,epsilon\n1,-1\n",
    "table-header-only.csv": "record_id,epsilon\n",
    "two-columns.csv": "age,eps\n30,1.0\n",
    "budgets.npy.csv": "eps\n1\n",
    **{
        f"name-{key}.yaml": EXAMPLE.read_text().replace("name: digits-demo", f'name: "{escaped}"')
        for key, escaped in {
            "escape": "a\\x1b[2Jb",
            "newline": "run\\nforged log line",
            "tab": "a\\tb",
            "nul": "a\\0b",
            "delete": "a\\x7fb",
            "bidi": "a\\u202eb",
            "line-separator": "a\\u2028b",
            "blank": "   ",
        }.items()
    },
    # --import plugins whose models cannot be trained (refused before training, not a traceback)
    "plugin_tuple.py": "import torch\nfrom pdpfl.models import register_model\n"
    "class M(torch.nn.Module):\n"
    "    def __init__(self):\n        super().__init__(); self.l = torch.nn.Linear(64, 10)\n"
    "    def forward(self, x):\n        return self.l(x.flatten(1)), x\n"
    "@register_model('hostile-tuple')\ndef build(shape, k):\n    return M()\n",
    "plugin_noparams.py": "import torch\nfrom pdpfl.models import register_model\n"
    "@register_model('hostile-noparams')\ndef build(shape, k):\n"
    "    return torch.nn.Flatten()\n",
    "plugin_signature.py": "import torch\nfrom pdpfl.models import register_model\n"
    "@register_model('hostile-signature')\ndef build(shape):\n"
    "    return torch.nn.Linear(64, 10)\n",
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


SUPERNODE = ["flower", "supernode", "--silo", "0", "--num-silos", "2", "--insecure"]
#: With TLS (a file stands in for the certificates): reaches the checks beyond the TLS options.
SUPERNODE_TLS = [*SUPERNODE[:-1], "--root-certificates", "afile"]
SUPERLINK_TLS = ["flower", "superlink", "--ssl-certfile", "afile", "--ssl-keyfile", "afile"]


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
    # ------------------------------------------------------------ issue #36: audit bounds
    # was: a traceback after trying to allocate 1.6 TB for the canary block
    "audit canaries 1e11": (["audit", EX, "--canaries", "100000000000"], "--canaries"),
    "audit canaries above the bound": (["audit", EX, "--canaries", "1000001"], "--canaries"),
    "audit delta 1": (["audit", EX, "--delta", "1"], "--delta"),
    "audit space unknown": (["audit", EX, "--space", "disk"], "--space"),
    # ------------------------------------------- issue #36: calibrate reads run's budget table
    "calibrate table duplicate id": ([*CALIBRATE, "--budgets", "table-dup.csv"], "--budgets"),
    "calibrate table text id": ([*CALIBRATE, "--budgets", "table-text-id.csv"], "--budgets"),
    "calibrate table nan": ([*CALIBRATE, "--budgets", "table-nan.csv"], "--budgets"),
    "calibrate table empty ε": ([*CALIBRATE, "--budgets", "table-empty-eps.csv"], "--budgets"),
    "calibrate table negative": ([*CALIBRATE, "--budgets", "table-negative.csv"], "--budgets"),
    "calibrate table no rows": ([*CALIBRATE, "--budgets", "table-header-only.csv"], "--budgets"),
    # was: the hint named a Python keyword, "(column=...)"
    "calibrate two columns": ([*CALIBRATE, "--budgets", "two-columns.csv"], "--column NAME"),
    "calibrate column unknown": (
        [*CALIBRATE, "--budgets", "two-columns.csv", "--column", "epsilon"],
        "--column",
    ),
    "calibrate column on npy": ([*CALIBRATE, "--budgets", "2d.npy", "--column", "x"], "--column"),
    # was: "budgets file not found" for a folder that exists
    "calibrate budgets folder says folder": ([*CALIBRATE, "--budgets", "adir"], "is a folder"),
    "calibrate budgets missing": ([*CALIBRATE, "--budgets", "none.csv"], "--budgets"),
    # --------------------------------------------------------------- issue #36: export
    # was: "RUN_DIR: no models/round-0009..." without saying how many rounds exist
    "export round beyond the run": (["export", "arun", "--round", "9"], "--round: the run has 3"),
    "export round without round models": (["export", "brun", "--round", "1"], "--round"),
    # was: an existing file overwritten silently
    "export out exists": (["export", "arun", "--out", "afile"], "--out"),
    "export default target exists": (["export", "crun"], "--force"),
    # was: the run's own model file overwritten with its export
    "export out is the run's model": (
        ["export", "arun", "--out", "arun/model.safetensors", "--force"],
        "--out",
    ),
    "export out a folder": (["export", "arun", "--out", "adir"], "--out"),
    "export out under a file": (["export", "arun", "--out", "afile/m.safetensors"], "--out"),
    "export run missing": (["export", "norun"], "RUN_DIR"),
    "export run a file": (["export", "afile"], "RUN_DIR"),
    # ------------------------------------------------ issue #36: control characters in names
    **{
        f"name with {key}": (["run", f"name-{key}.yaml", "--out", "out"], "name")
        for key in (
            "escape",
            "newline",
            "tab",
            "nul",
            "delete",
            "bidi",
            "line-separator",
            "blank",
        )
    },
    # ------------------------------- issue #36: user models refused before training (--import)
    "model returns a tuple": (
        [*_set("model.name=hostile-tuple"), "--import", "plugin_tuple.py"],
        "model",
    ),
    "model without parameters": (
        [*_set("model.name=hostile-noparams"), "--import", "plugin_noparams.py"],
        "model",
    ),
    "model builder signature": (
        [*_set("model.name=hostile-signature"), "--import", "plugin_signature.py"],
        "model",
    ),
    # ------------------------------------ issue #36: Flower ports and addresses, before start
    # was: a SuperLink on a taken port exited after 30-50 s with only Flower's log lines
    "superlink port taken": (
        ["flower", "superlink", "--insecure", "--port", "@BUSY@"],
        "--port: port @BUSY@ on 127.0.0.1 is already in use",
    ),
    "superlink host not here": (
        [*SUPERLINK_TLS, "--host", "192.0.2.1", "--port", "@FREE@"],
        "--host: 192.0.2.1 is not an address of this machine",
    ),
    "superlink host unresolvable": (
        [*SUPERLINK_TLS, "--host", "nosuch.invalid", "--port", "@FREE@"],
        "--host: cannot resolve",
    ),
    "supernode port taken": (
        [*SUPERNODE, "--superlink", "127.0.0.1:@FREE@", "--port", "@BUSY@"],
        "--port: port @BUSY@ on 127.0.0.1 is already in use",
    ),
    # was: a SuperNode retrying forever with no bound
    "supernode nothing listens": (
        [*SUPERNODE, "--superlink", "127.0.0.1:@FREE@", "--connect-timeout", "1"],
        "--superlink: no SuperLink at 127.0.0.1:",
    ),
    "supernode superlink unresolvable": (
        [*SUPERNODE_TLS, "--superlink", "nosuch.invalid:9092", "--connect-timeout", "1"],
        "--superlink: no SuperLink at nosuch.invalid:9092: cannot resolve",
    ),
    "supernode superlink port 0": ([*SUPERNODE, "--superlink", "127.0.0.1:0"], "--superlink"),
    "supernode superlink port 70000": (
        [*SUPERNODE, "--superlink", "127.0.0.1:70000"],
        "--superlink",
    ),
    "supernode superlink without port": ([*SUPERNODE, "--superlink", "localhost"], "--superlink"),
    "supernode connect timeout 0": (
        [*SUPERNODE, "--superlink", "127.0.0.1:9092", "--connect-timeout", "0"],
        "--connect-timeout",
    ),
    "supernode silo beyond": (
        [*SUPERNODE[:2], "5", *SUPERNODE[3:], "--superlink", "127.0.0.1:9092"],
        "--silo",
    ),
    "submit superlink malformed": (
        ["flower", "submit", EX, "--superlink", "host:port", "--insecure", "--out", "out"],
        "--superlink",
    ),
    "register superlink malformed": (
        ["flower", "register", "afile", "--superlink", ":9093", "--insecure"],
        "--superlink",
    ),
}


def _model_run(path: Path, rounds: list[int] | None = None, done: int = 3) -> None:
    """A finished run's model files (``rounds``: the per-round models it kept)."""
    import json

    from pdpfl.runtime.model_file import FORMAT, write_model

    path.mkdir()
    meta = {"format": FORMAT}
    params = [np.zeros((2, 3), dtype=np.float32)]
    write_model(path / "model.safetensors", params, ["lin.weight"], meta)
    for r in rounds or []:
        write_model(path / "models" / f"round-{r:04d}.safetensors", params, ["lin.weight"], meta)
    (path / "summary.json").write_text(json.dumps({"rounds_completed": done}))


def _no_process(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"a bad input must be refused before any process starts: {args[:2]}")


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # --import leaves no __pycache__
    # `pdpfl flower superlink` replaces its process with Flower's, `supernode` starts children:
    # a case that got that far would replace or outlive the test process
    monkeypatch.setattr(os, "execve", _no_process)
    monkeypatch.setattr(subprocess, "Popen", _no_process)
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "adir").mkdir()
    _model_run(tmp_path / "arun", rounds=[1, 2, 3])
    _model_run(tmp_path / "brun")
    _model_run(tmp_path / "crun")
    (tmp_path / "crun" / "model-export.safetensors").write_bytes(b"an earlier export")
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


@pytest.fixture(scope="module")
def ports() -> Iterator[dict[str, str]]:
    """``@BUSY@``: a port something listens on; ``@FREE@``: a port nothing listens on."""
    import socket

    from pdpfl.runtime.flower.processes import free_port

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield {"@BUSY@": str(busy.getsockname()[1]), "@FREE@": str(free_port())}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_input_gets_a_clear_error_and_exit_2(
    folder: Path, case: str, ports: dict[str, str]
) -> None:
    args, field = CASES[case]
    for key, port in ports.items():
        args = [a.replace(key, port) for a in args]
        field = field.replace(key, port)
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


# ----------------------------------------------- issue #36: a key folder that is not a folder

#: command -> arguments; each seals state with this machine's key (checkpoints, ledgers).
KEY_DIR_CASES: dict[str, list[str]] = {
    "run": ["run", EX, "--out", "out"],
    "run on flower": ["run", EX, "--runtime", "flower", "--out", "out"],
    "compare": ["compare", EX, "--methods", "rpdp", "--out", "out"],
    "audit": ["audit", EX, "--out", "out"],
    "reproduce": ["reproduce", "rpdp-fl", "--smoke", "--out", "out"],
    "flower supernode": [*SUPERNODE, "--superlink", "127.0.0.1:9092", "--port", "@FREE@"],
}


@pytest.mark.parametrize("where", ["afile", "afile/keys"])
@pytest.mark.parametrize("case", list(KEY_DIR_CASES))
def test_a_key_folder_that_is_a_file_is_refused_before_any_work(
    folder: Path, case: str, where: str, ports: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: a traceback (FileExistsError) after the first round had trained."""
    monkeypatch.setenv("PDPFL_KEY_DIR", str(folder / where))
    args = [a.replace("@FREE@", ports["@FREE@"]) for a in KEY_DIR_CASES[case]]
    before = _listing(folder)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert errors and errors[0].startswith("error: PDPFL_KEY_DIR: "), result.output
    assert "is a file, not a folder" in errors[0]
    assert _listing(folder) == before


# ------------------------------------ issue #36: the Python API refuses what cannot be trained


def _api_cases() -> dict[str, tuple[dict[str, object], str]]:
    import torch

    class Pair(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.lin(x), x

    class NoParameters(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, :1]

    class Frozen(torch.nn.Linear):
        def __init__(self) -> None:
            super().__init__(4, 1)
            self.requires_grad_(False)

    class Broken(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("forward exploded")

    def builder_of_a_list(input_shape: tuple[int, ...], num_classes: int) -> list[int]:
        return [1, 2]

    def raising_builder(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
        raise KeyError("no such layer")

    return {
        # was: AttributeError: 'tuple' object has no attribute 'ndim'
        "model returns a tuple": ({"model": Pair()}, "model: the Pair module returns a tuple"),
        # was: ValueError from torch.optim, "optimizer got an empty parameter list"
        "module without parameters": ({"model": NoParameters()}, "model: the NoParameters"),
        "module with frozen parameters": ({"model": Frozen()}, "no trainable parameters"),
        # was: TypeError: <lambda>() takes 1 positional argument but 2 were given
        "a lambda as the model": ({"model": lambda x: x}, "model: <lambda>(x) cannot be called"),
        "builder returns a list": ({"model": builder_of_a_list}, "model: the builder"),
        "builder raises": ({"model": raising_builder}, "model: building"),
        "forward raises": ({"model": Broken(4, 1)}, "model: the module fails"),
        "three logits for two classes": ({"model": torch.nn.Linear(4, 3)}, "returns shape (2, 3)"),
        "a number as the model": ({"model": 42}, "model: expected a registered name"),
        # was: NotADirectoryError from pathlib
        "out is a file": ({"out": "afile"}, "out: afile is a file"),
        "out under a file": ({"out": "afile/run"}, "out: "),
    }


API_CASES = list(_api_cases())


@pytest.mark.parametrize("case", API_CASES)
def test_the_python_api_names_the_argument_before_training(folder: Path, case: str) -> None:
    import pdpfl

    kwargs, message = _api_cases()[case]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 4))
    fed = pdpfl.federation_from_arrays(x, (x[:, 0] > 0).astype(int), rng.integers(0, 2, 60))
    before = _listing(folder)
    settings = {"rounds": 1, "local_steps": 1, "batch_size": 8, "epsilon_max": 5, "delta": 1e-3}
    with pytest.raises((ValueError, TypeError)) as caught:
        pdpfl.train(fed, **{"out": "out", "overwrite": True, **settings, **kwargs})
    assert message in str(caught.value), str(caught.value)
    assert str(caught.value).split(":")[0] in ("model", "out")
    assert _listing(folder) == before


AUDIT_SETTINGS = {
    # was: accepted; run_audit then tried to allocate 1.6 TB for the canary block
    "canaries 1e11": ({"canaries": 10**11}, "canaries: must be an integer in [2, 1,000,000]"),
    "canaries 1": ({"canaries": 1}, "canaries: "),
    "canaries a float": ({"canaries": 100.5}, "canaries: "),
    "an unknown observer": ({"observers": ("god",)}, "observers: each must be one of"),
    "no observer": ({"observers": ()}, "observers: "),
    "space unknown": ({"space": "disk"}, "space: must be auto, model or block"),
    "delta 1": ({"delta": 1.0}, "delta: must be in (0, 1)"),
    "confidence 0": ({"confidence": 0.0}, "confidence: must be in (0, 1)"),
}


@pytest.mark.parametrize("case", list(AUDIT_SETTINGS))
def test_the_python_audit_settings_are_checked_when_made(case: str) -> None:
    """The Python API refuses what ``pdpfl audit`` refuses, naming the field, before any
    training or allocation (issue #36 item 4: "in the CLI and the Python API alike")."""
    from pdpfl.audit import AuditSettings
    from pdpfl.audit.session import MAX_CANARIES
    from pdpfl.cli.audit import MAX_CANARIES as CLI_MAX

    assert CLI_MAX == MAX_CANARIES
    kwargs, message = AUDIT_SETTINGS[case]
    with pytest.raises(ValueError) as caught:
        AuditSettings(**kwargs)
    assert message in str(caught.value), str(caught.value)
