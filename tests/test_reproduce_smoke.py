"""`pdpfl reproduce PAPER --smoke`: one tiny experiment per paper, end to end through the CLI.

Each report must open with its figures (PNG files that exist), list every difference from the
paper with a reason or as unexplained, and write strict JSON results whose ε come from the runs'
typed privacy summaries. Uses ``../shared/data`` when present (Heart, MNIST); without it the
experiments that need those files are skipped in the report, with the fetch command.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.reproduce import PAPERS

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _data_args() -> list[str]:
    return ["--data-dir", str(DATA)] if DATA.is_dir() else []


@pytest.mark.slow
@pytest.mark.parametrize("paper", list(PAPERS))
def test_smoke_tier_writes_a_report_that_opens_with_its_figures(paper: str, tmp_path: Path) -> None:
    out = tmp_path / paper
    res = CliRunner().invoke(
        app, ["reproduce", paper, "--smoke", "--out", str(out), "--json", *_data_args()]
    )
    assert res.exit_code == 0, res.output
    results = json.loads(res.stdout.strip().splitlines()[-1])
    assert results["paper"] == paper and results["tier"] == "smoke"
    text = (out / "REPORT.md").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[0].startswith("# Reproducing ") and lines[1] == "## Figures"
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert figures, "the report shows no figure"
    for fig in figures:
        assert (out / fig).read_bytes()[:4] == b"\x89PNG"
    assert "## Differences from the paper beyond the seeds' spread" in text
    assert "expected about" in res.stderr or "expected about" in res.output
    # every run's ε comes from its typed privacy summary
    for record in results["results"]:
        summary = json.loads((Path(record["run_dir"]) / "summary.json").read_text())
        if record["epsilon"] is not None:
            headline = summary["privacy"]["spent_max"]
            assert record["epsilon"] == pytest.approx(
                max(v for v in headline.values() if v is not None)
            )
        assert record["over_budget"] in (None, 0) or not record["private"]
    if DATA.is_dir() and paper in ("rpdp-fl", "uldp-fl", "prifedsync"):
        assert results["runs"] > 0
