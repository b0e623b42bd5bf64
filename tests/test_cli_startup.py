"""The commands that do not train start without the heavy libraries (issue #26 item 4).

``pdpfl --help``, ``pdpfl run --help`` and ``pdpfl account`` must not import torch, flwr,
matplotlib or pandas (seconds of start-up each on a 2-core machine); ``--help`` not even scipy.
Each case runs in a fresh interpreter, because the test process has imported them already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "flwr", "matplotlib", "pandas", "scipy")


def _imported_after(args: list[str]) -> set[str]:
    code = (
        "import json, sys\n"
        "from pdpfl.cli import main\n"
        f"sys.argv = ['pdpfl', *{args!r}]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return set(json.loads(res.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["compare", "--help"]])
def test_help_imports_no_heavy_library(args: list[str]) -> None:
    assert _imported_after(args) == set()


def test_account_imports_scipy_only() -> None:
    args = [
        "account",
        "--sigma",
        "1.0",
        "--delta",
        "1e-5",
        "--q",
        "0.01",
        "--steps",
        "10",
        "--json",
    ]
    assert _imported_after(args) <= {"scipy"}
