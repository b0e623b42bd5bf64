"""Reports name silos and people as the data does, and show exactly the observers they account
for (issue #36 item 6).

Before: ``privacy.csv``, :func:`pdpfl.privacy_table` and ``pdpfl privacy --id`` named the silo
``client_2`` (the ledger file's name) where the data says ``north``; IDP-FedAvg's ids were
``client-3`` while its holder column said ``client_3``; IDP-FedAvg's headline said "adversary:
both" and ``--id`` printed a server line for a ledger that accounts third parties only;
PriFedSync's table printed internal keys (``gdp-clt_epsilon_max_server``, ``clt_mu``).
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

import pdpfl
from pdpfl.cli import app

runner = CliRunner()


def _text(tables: list[object]) -> str:
    import io

    console = Console(width=100, record=True, file=io.StringIO())
    for table in tables:
        console.print(table)
    return console.export_text()


@pytest.fixture(scope="module")
def hospitals(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An rPDP-FL run on silos the data calls north and south."""
    rng = np.random.default_rng(0)
    silos = {}
    for name in ("north", "south"):
        x = rng.normal(size=(40, 3))
        silos[name] = (x, (x[:, 0] > 0).astype(int))
    fed = pdpfl.federation_from_silos(silos)
    out = tmp_path_factory.mktemp("hospitals") / "run"
    pdpfl.train(
        fed, rounds=1, local_steps=1, batch_size=8, epsilon_max=5, delta=1e-3, out=out, seed=3
    )
    return out


def test_privacy_reports_use_the_data_s_silo_names(hospitals: Path) -> None:
    table = pdpfl.privacy_table(hospitals, as_frame=False)
    assert set(table["holder"]) == {"north", "south"}
    res = runner.invoke(app, ["privacy", str(hospitals)])
    assert res.exit_code == 0, res.output
    with open(hospitals / "privacy.csv", newline="") as fh:
        holders = {row["holder"] for row in csv.DictReader(fh)}
    assert holders == {"north", "south"}
    some_id = str(table["id"][0])
    res = runner.invoke(app, ["privacy", str(hospitals), "--id", some_id])
    assert res.exit_code == 0, res.output
    assert f"record {some_id} (held by {table['holder'][0]}):" in res.output
    assert "client_" not in res.output


@pytest.fixture(scope="module")
def idp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pdpfl.config import ALGORITHMS, config_from_dict
    from pdpfl.runtime.simulation import run_simulation
    from pdpfl.testing import TOY_CONFIG

    config = config_from_dict(
        copy.deepcopy(TOY_CONFIG),
        ["algorithm.name=idp-fedavg", *ALGORITHMS.get("idp-fedavg").toy_overrides],
    )
    out = tmp_path_factory.mktemp("idp") / "run"
    run_simulation(config, out, progress=False)
    return out


@pytest.mark.slow
def test_idp_fedavg_has_one_spelling_of_its_client_ids(idp_run: Path) -> None:
    table = pdpfl.privacy_table(idp_run, as_frame=False)
    assert list(table["id"]) == list(table["holder"]) == ["client-0", "client-1", "client-2"]
    for asked in ("client-1", "client_1"):  # the old holder spelling still answers
        res = runner.invoke(app, ["privacy", str(idp_run), "--id", asked])
        assert res.exit_code == 0, res.output
        answer = "\n".join(  # the answer, below the run folder's verification line
            line for line in res.output.splitlines() if not line.startswith("verified: ")
        )
        assert res.output.splitlines()[0].startswith("verified: ")
        assert answer.startswith("client client-1: budget ε = ")
        assert "third party: ε spent" in answer
        assert "server" not in answer  # a client-level ledger accounts third parties only


@pytest.mark.slow
def test_idp_fedavg_headline_shows_the_observers_it_accounts_for(idp_run: Path) -> None:
    import json

    from pdpfl.reports.tables import run_tables

    summary = json.loads((idp_run / "summary.json").read_text())
    assert summary["adversary"] == "both"
    text = _text(run_tables(summary))
    assert "(against third parties)" in text
    assert "adversary: both" not in text and "max ε (server)" not in text


def test_approximate_figures_are_named_in_words() -> None:
    from pdpfl.ledger.summary import GroupSummary, PrivacySummary
    from pdpfl.reports.tables import approximate_label, group_table

    group = GroupSummary(
        label="8",
        units=10,
        budget_min=8.0,
        budget_max=8.0,
        spent_max={"third-party": 7.9, "server": 7.9},
        utilization_sum={"third-party": 9.8, "server": 9.8},
        over_budget={"third-party": 0, "server": 0},
    )
    privacy = PrivacySummary(
        unit="record",
        units=10,
        observers=("third-party", "server"),
        groups=(group,),
        approximate={
            "gdp-clt_epsilon_max_third_party": 6.85,
            "gdp-clt_epsilon_max_server": 6.9,
            "clt_mu": 1.85,
            "clt_mu_strong": 2.62,
        },
    )
    text = " ".join(_text([group_table(privacy, "t")]).split())  # the caption wraps
    for key in privacy.approximate:
        assert key not in text
    assert "largest ε against third parties (gdp-clt accountant) = 6.85" in text
    assert "μ-GDP by the CLT (largest over clients) = 1.85" in text
    assert approximate_label("someone_elses_key") == "someone_elses_key"
