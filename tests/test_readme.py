"""The README's Python quick-start must keep working (it is executed, not just parsed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_quick_start_blocks() -> None:
    assert len(_python_blocks()) >= 2


def test_readme_accounting_quick_start_runs() -> None:
    block = _python_blocks()[0]
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - the README is ours
    # The snippet asserts the certified guarantee itself; check it really calibrated.
    assert namespace["result"].report.over_budget == 0
    assert namespace["plan"].noise_multiplier == pytest.approx(namespace["sigma"])


@pytest.mark.slow
def test_readme_training_quick_start_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(README.parent)
    block = _python_blocks()[1].replace('"runs/demo"', repr(str(tmp_path / "demo")))
    block = block.replace('["rounds=10"]', '["rounds=2"]')
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["summary"]["over_budget"] == 0
    assert 0.0 <= namespace["summary"]["final_accuracy"] <= 1.0
