"""The README's Python snippets keep working and do what they say (executed, then checked).

tests/test_docs.py runs every block of every page; the checks here go further for the
quick starts a newcomer copies first.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pdpfl.ledger import load_ledger

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def _section_block(heading: str) -> str:
    """The first ```python block under the ``## heading`` section."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"```python\n(.*?)```", text[start : end if end > 0 else None], flags=re.S)
    assert blocks, f"no python block under '## {heading}'"
    return blocks[0]


def test_readme_has_quick_start_blocks() -> None:
    assert len(_python_blocks()) >= 3


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
    block = _python_blocks()[1]
    assert '"runs/demo"' in block and "overwrite=True" in block
    block = block.replace('"runs/demo"', repr(str(tmp_path / "demo")))
    block = re.sub(r'\["rounds=\d+"\]', '["rounds=2"]', block)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["summary"]["over_budget"] == 0
    assert 0.0 <= namespace["summary"]["final_accuracy"] <= 1.0


@pytest.mark.slow
def test_readme_own_data_and_model_snippet(tmp_path, monkeypatch) -> None:
    """The exact README snippet: a DataFrame, a torch module, ε per patient id -> rPDP-FL."""
    pytest.importorskip("pandas")
    import torch

    monkeypatch.chdir(tmp_path)
    block = _section_block("Your own data and model")
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102
    df, fed, model, summary = (namespace[k] for k in ("df", "fed", "model", "summary"))
    out = tmp_path / "runs" / "my-hospitals"
    assert summary["over_budget"] == 0 and summary["rounds_completed"] >= 1
    assert summary["algorithm"] == "rpdp" and summary["privacy_unit"] == "record"
    assert summary["data"]["source"].startswith("user-supplied")
    assert sorted(summary["data"]["silo_names"]) == sorted(df.hospital.unique())
    # every silo's ledger holds exactly the ε its patients chose (matched by patient id)
    by_id = dict(zip(df.patient_id, df.epsilon, strict=True))
    for k, c in enumerate(fed.clients):
        ledger = load_ledger(out / "ledgers" / f"client_{k}.npz")  # sealed ledger files
        np.testing.assert_array_equal(ledger.budgets, [by_id[int(i)] for i in c.record_ids])
    # the module now holds the final global model written to model.npz
    with np.load(out / "model.npz") as z:
        final = [z[k] for k in sorted(z.files)]
    for p, arr in zip(model.parameters(), final, strict=True):
        torch.testing.assert_close(p.detach(), torch.as_tensor(arr))
    assert (out / "epsilon.png").is_file() and (out / "budgets.csv").is_file()
