"""The risk card in every output of a run: summary.json, the headline, `pdpfl privacy` (the
table, --json, --id) and the model file's metadata -- and equal to the ledgers' own cards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.ledger.risk import risk_cards
from pdpfl.ledger.table import load_ledgers
from pdpfl.runtime.model_file import read_model

TINY = {
    "name": "risk-tiny",
    "seed": 3,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "breast-cancer", "num_clients": 2},
    "model": {"name": "logreg"},
    "privacy": {"epsilon_max": 5.0, "delta": 1e-3},
    "training": {"rounds": 2, "local_steps": 3, "lr": 0.3, "batch_size": 8},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("risk")
    cfg = tmp / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    res = CliRunner().invoke(app, ["run", str(cfg), "--out", str(tmp / "run")])
    assert res.exit_code == 0, res.output
    return tmp / "run", res.output


@pytest.mark.slow
def test_every_output_carries_the_card(run: tuple[Path, str]) -> None:
    out, printed = run
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    risk = summary["risk"]
    assert risk["schema"] == "pdpfl.risk/1" and risk["fpr"] == [0.001, 0.01, 0.1]
    assert set(risk["groups"]) == {g["label"] for g in summary["privacy"]["groups"]}
    # the cards are the ledgers' own (recomputed from the files pdpfl privacy reads)
    cards = risk_cards(load_ledgers(out).values())
    for label, per in cards.items():
        for obs, card in per.items():
            assert risk["groups"][label][obs]["tpr_max"] == pytest.approx(list(card.tprs))
            assert all(t >= a for a, t in zip(card.fprs, card.tprs, strict=True))
    # a larger budget never lowers the attacker's best rate
    top = max(risk["groups"], key=float)
    low = min(risk["groups"], key=float)
    assert risk["groups"][top]["server"]["tpr_max"] >= risk["groups"][low]["server"]["tpr_max"]
    assert "attack TPR at FPR 1 %" in printed and f"group {top}" in printed
    _, meta = read_model(out / "model.safetensors")
    assert json.loads(meta["risk"]) == json.loads(json.dumps(risk))


@pytest.mark.slow
def test_pdpfl_privacy_prints_the_card(run: tuple[Path, str]) -> None:
    out, _ = run
    table = CliRunner().invoke(app, ["privacy", str(out)])
    assert table.exit_code == 0, table.output
    assert "attack risk, per budget group" in table.output and "false-alarm rate" in table.output
    as_json = CliRunner().invoke(app, ["privacy", str(out), "--json"])
    record = json.loads(as_json.output.strip().splitlines()[-1])
    summary = json.loads((out / "summary.json").read_text())
    assert record["risk"]["groups"] == summary["risk"]["groups"]
    first = (out / "privacy.csv").read_text().splitlines()[1].split(",")[0]
    one = CliRunner().invoke(app, ["privacy", str(out), "--id", first, "--json"])
    rows = json.loads(one.output.strip().splitlines()[-1])
    assert set(rows["risk"][0]) == {"third-party", "server"}
    assert "false-alarm rate" in rows["risk"][0]["server"]["sentence"]
