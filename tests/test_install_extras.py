"""The base install is complete, and a feature whose optional extra is missing says which one.

* Every third-party module pdpfl imports (at module level or inside a function) is a base
  dependency in ``pyproject.toml``, or one of the extras' modules (:data:`pdpfl.errors.EXTRAS`,
  each declared in its extra), or a module that only the Flower runtime imports and flwr brings.
* With the extras' modules made unimportable (``sys.modules[name] = None``, in a fresh
  interpreter), each feature that needs one exits 2 with ``error: <field>: ... pip install
  'pdpfl[EXTRA]'``, no traceback and no output folder; the base features still run.

``make check-wheel`` checks the same on a real install of the built wheel (tests/wheel_smoke.py).
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pdpfl.errors import EXTRAS, MissingExtra, extra_of, require_extra

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "pdpfl"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: Modules flwr installs that only the Flower runtime (which needs the flower extra) imports.
FLOWER_ONLY = {"tomli_w", "httpx", "grpc"}


def _dist(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement)[0].lower().replace("_", "-")


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level module -> the pdpfl files importing it (anywhere in the file)."""
    found: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("pdpfl", "__future__"):
                    found.setdefault(top, set()).add(str(path.relative_to(SRC)))
    return found


def test_every_import_is_a_base_dependency_or_an_extra() -> None:
    base = {_dist(d) for d in PROJECT["dependencies"]}
    extras = {k: {_dist(d) for d in v} for k, v in PROJECT["optional-dependencies"].items()}
    dists = md.packages_distributions()
    problems = []
    for module, files in sorted(_third_party_imports().items()):
        provided = {_dist(d) for d in dists.get(module, [])}
        if provided & base:
            continue
        if module in EXTRAS:
            extra = EXTRAS[module][0]
            if not provided & extras.get(extra, set()):
                problems.append(f"{module}: extra {extra!r} does not declare {provided}")
            continue
        if module in FLOWER_ONLY and all(f.startswith("runtime/flower/") for f in files):
            continue
        problems.append(f"{module} ({provided or 'not installed'}) imported by {sorted(files)}")
    assert not problems, "not a declared dependency:\n" + "\n".join(problems)
    # pycryptodome (Shamir, the OT's curve) and click are base: their modules are imported.
    assert {"pycryptodome", "click"} <= base


def test_missing_extra_names_the_field_and_the_extra() -> None:
    with pytest.raises(KeyError):
        require_extra("json", "field")
    err = MissingExtra("--runtime", "runtime flower", "flower", "flwr")
    assert str(err).startswith("--runtime: runtime flower needs the flower extra: ")
    assert "pip install 'pdpfl[flower]'" in str(err) and err.name == "flwr"
    assert extra_of(err) == ("flwr", "flower")
    try:
        try:
            raise ModuleNotFoundError("No module named 'ray._private'", name="ray._private")
        except ImportError as inner:
            raise ImportError("wrapped") from inner
    except ImportError as outer:
        assert extra_of(outer) == ("ray", "simulation")
    assert extra_of(ModuleNotFoundError("x", name="not_an_extra")) is None
    assert extra_of(ValueError("no import")) is None


#: Run in a fresh interpreter where the extras' modules cannot be imported: each command through
#: the CLI as the console script runs it; prints {label: [exit code, output]} as JSON.
_WITHOUT_EXTRAS = r"""
import contextlib, io, json, sys, traceback
for name in ("flwr", "ray", "dp_accounting", "pandas"):
    sys.modules[name] = None  # import raises ImportError, as if not installed
from pdpfl.cli import app
out = {}
for label, args in json.loads(sys.argv[1]).items():
    buf = io.StringIO()
    code = None
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            app(args=args, prog_name="pdpfl", standalone_mode=True)
        except SystemExit as stop:
            code = stop.code or 0
        except BaseException:
            traceback.print_exc(file=buf)
            code = "raised"
    out[label] = [code, buf.getvalue()]
print(json.dumps(out))
"""


@pytest.mark.slow  # a fresh interpreter importing torch: a few seconds
def test_features_whose_extra_is_missing_exit_2_naming_it(tmp_path: Path) -> None:
    demo = str(ROOT / "examples" / "digits_demo.yaml")
    out = tmp_path / "out"
    tiny = ["--set", "rounds=1", "--set", "training.local_steps=1", "--quiet"]
    commands = {
        "run --runtime flower": ["run", demo, "--runtime", "flower", "--out", str(out), *tiny],
        "runtime: flower": ["run", demo, "--set", "runtime=flower", "--out", str(out), *tiny],
        "flower-simulation": ["run", demo, "--runtime", "flower-simulation", "--out", str(out)],
        "accountant: pld": ["run", demo, "--set", "privacy.accountant=pld", "--out", str(out)],
        "account --accountant pld": [
            "account",
            "--sigma",
            "1",
            "--delta",
            "1e-5",
            "--q",
            "0.1",
            "--accountant",
            "pld",
        ],  # fmt: skip
        "calibrate --accountant pld": [
            "calibrate",
            "--scenario",
            "three-levels",
            "--n",
            "10",
            "--sigma",
            "1",
            "--delta",
            "1e-3",
            "--steps",
            "2",
            "--rounds",
            "2",
            "--accountant",
            "pld",
        ],  # fmt: skip
        "flower superlink": ["flower", "superlink", "--insecure", "--dry-run"],
        "flower app": ["flower", "app", demo, "--out", str(out), "--app-dir", str(tmp_path / "a")],
        # base features: no extra needed
        "flower keygen": ["flower", "keygen", "--out", str(tmp_path / "keys")],
        "account": ["account", "--sigma", "1", "--delta", "1e-5", "--q", "0.1", "--json"],
    }
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRAS, json.dumps(commands)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    expected = {
        "run --runtime flower": ("--runtime", "flower"),
        "runtime: flower": ("runtime", "flower"),
        "flower-simulation": ("--runtime", "simulation"),
        "accountant: pld": ("privacy.accountant", "pld"),
        "account --accountant pld": ("--accountant", "pld"),
        "calibrate --accountant pld": ("--accountant", "pld"),
        "flower superlink": ("pdpfl flower", "flower"),
        "flower app": ("pdpfl flower", "flower"),
    }
    for label, (field, extra) in expected.items():
        code, text = results[label]
        assert code == 2, (label, text)
        assert text.startswith(f"error: {field}: "), (label, text)
        assert f"pip install 'pdpfl[{extra}]'" in text, (label, text)
        assert "Traceback" not in text, (label, text)
    assert not out.exists()  # refused before any output
    for label in ("flower keygen", "account"):
        code, text = results[label]
        assert code == 0 and "Traceback" not in text, (label, text)
    assert (tmp_path / "keys" / "supernode.pub").is_file()
