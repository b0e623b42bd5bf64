"""`pdpfl account`: table, --json object, and bad input → exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.privacy import TrainingPlan, plan_epsilon

runner = CliRunner()
BASE = ["account", "--sigma", "1.0", "--delta", "1e-4"]


def test_json_matches_library_in_input_order(tmp_path) -> None:
    args = BASE + ["--q", "0.2", "--q", "0.01,0.05", "--steps", "50", "--rounds", "15"]
    res = runner.invoke(app, args + ["--client-rate", "0.5", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    plan = TrainingPlan(1.0, 1e-4, 50, 15, 0.5)
    ref, order = plan_epsilon([0.2, 0.01, 0.05], plan)
    np.testing.assert_allclose(out["epsilon"], ref, rtol=1e-12)
    assert out["order"] == list(order) and out["adversary"] == "third-party"
    assert out["mechanism"]["rounds"] == 15
    path = tmp_path / "q.npy"
    np.save(path, np.array([0.2, 0.01, 0.05]))
    res2 = runner.invoke(
        app,
        BASE
        + [
            "--q-file",
            str(path),
            "--steps",
            "50",
            "--rounds",
            "15",
            "--client-rate",
            "0.5",
            "--json",
        ],
    )
    assert json.loads(res2.stdout)["epsilon"] == out["epsilon"]


def test_centralized_and_server_and_table() -> None:
    res = runner.invoke(app, BASE + ["--q", "0.01", "--steps", "100", "--json"])
    eps = json.loads(res.stdout)["epsilon"][0]
    assert eps == pytest.approx(plan_epsilon([0.01], TrainingPlan(1.0, 1e-4, 100))[0][0])
    res = runner.invoke(
        app,
        BASE
        + [
            "--q",
            "0.01",
            "--steps",
            "5",
            "--rounds",
            "10",
            "--adversary",
            "server",
            "--participations",
            "4",
            "--json",
        ],
    )
    assert res.exit_code == 0 and json.loads(res.stdout)["adversary"] == "server"
    table = runner.invoke(app, BASE + ["--q", "0.01"])
    assert table.exit_code == 0 and "0.01" in table.stdout


@pytest.mark.parametrize(
    "extra,name",
    [
        (["--sigma", "0", "--delta", "1e-4", "--q", "0.1"], "--sigma"),
        (["--sigma", "1", "--delta", "1", "--q", "0.1"], "--delta"),
        (["--sigma", "1", "--delta", "1e-4", "--q", "1.5"], "--q"),
        (["--sigma", "1", "--delta", "1e-4", "--q", "nan"], "--q"),
        (
            [
                "--sigma",
                "1",
                "--delta",
                "1e-4",
                "--q",
                "0.1",
                "--rounds",
                "3",
                "--participations",
                "4",
            ],
            "--participations",
        ),
        (["--sigma", "1", "--delta", "1e-4", "--q", "0.1", "--adversary", "x"], "--adversary"),
    ],
)
def test_bad_input_exits_2(extra, name) -> None:
    res = runner.invoke(app, ["account", *extra, "--json"])
    assert res.exit_code == 2
    assert name in res.output
    assert "{" not in res.stdout


def test_space_separated_rates_and_orders_keep_input_order() -> None:
    """The documented form ``--q Q [Q ...]`` works and agrees with repeated ``--q``."""
    args = ["account", "--sigma", "1.0", "--delta", "1e-5", "--steps", "100", "--json"]
    spaced = runner.invoke(app, [*args, "--q", "0.2", "0.01", "--orders", "2", "3", "4"])
    repeated = runner.invoke(
        app, [*args, "--q", "0.2", "--q", "0.01", "--orders", "2", "--orders", "3", "--orders", "4"]
    )
    assert spaced.exit_code == 0, spaced.output
    a, b = json.loads(spaced.stdout), json.loads(repeated.stdout)
    assert a["epsilon"] == b["epsilon"] and a["epsilon"][0] > a["epsilon"][1]
    assert a["mechanism"]["n_orders"] == 3


def test_expand_multi_value_only_touches_named_options() -> None:
    from pdpfl.cli._common import expand_multi_value

    got = expand_multi_value(["--q", "1", "2", "--sigma", "3", "x", "--q=4"], ("--q",))
    assert got == ["--q", "1", "--q", "2", "--sigma", "3", "x", "--q=4"]


def test_client_and_user_units_are_t_rounds_of_a_subsampled_gaussian() -> None:
    from pdpfl.privacy import mechanism_epsilon
    from pdpfl.privacy.unit import PrivacyUnit, SampledGaussianPlan

    for unit in ("client", "user"):
        res = runner.invoke(
            app, BASE + ["--q", "0.1", "0.5", "--rounds", "30", "--unit", unit, "--json"]
        )
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        mech = SampledGaussianPlan(PrivacyUnit(unit), 1.0, 1e-4, 30)
        ref, _ = mechanism_epsilon(mech, [0.1, 0.5], "third-party")
        assert out["epsilon"] == list(ref) and out["unit"] == unit
        assert out["mechanism"]["type"] == "poisson-subsampled-gaussian"
    # the record-level plan with τ = 1, λ = 1 is the same mechanism
    rec = runner.invoke(app, BASE + ["--q", "0.1", "0.5", "--rounds", "30", "--json"])
    np.testing.assert_allclose(json.loads(rec.stdout)["epsilon"], out["epsilon"], rtol=1e-12)


@pytest.mark.parametrize(
    "extra,name",
    [
        (["--unit", "client", "--q", "0.1"], "--rounds"),
        (["--unit", "user", "--q", "0.1", "--rounds", "5", "--steps", "3"], "--steps"),
        (
            ["--unit", "client", "--q", "0.1", "--rounds", "5", "--client-rate", "0.5"],
            "--client-rate",
        ),
        (
            ["--unit", "client", "--q", "0.1", "--rounds", "5", "--adversary", "server"],
            "--adversary",
        ),
        (
            ["--unit", "user", "--q", "0.1", "--rounds", "5", "--participations", "2"],
            "--participations",
        ),
        (["--unit", "silo", "--q", "0.1"], "--unit"),
        (["--accountant", "moments", "--q", "0.1"], "--accountant"),
    ],
)
def test_unit_and_accountant_combinations_that_make_no_sense_exit_2(extra, name) -> None:
    res = runner.invoke(app, BASE + extra + ["--json"])
    assert res.exit_code == 2, res.output
    assert name in res.output and "{" not in res.stdout


def test_pld_prints_both_and_reports_the_smaller() -> None:
    args = BASE + [
        "--q",
        "0",
        "0.01",
        "0.3",
        "--steps",
        "10",
        "--rounds",
        "5",
        "--client-rate",
        "0.5",
    ]
    res = runner.invoke(app, args + ["--accountant", "pld", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    rdp = json.loads(runner.invoke(app, args + ["--json"]).stdout)
    assert out["epsilon_rdp"] == rdp["epsilon"] and out["accountant"] == "pld"
    assert out["epsilon"] == [
        min(a, b) for a, b in zip(out["epsilon_rdp"], out["epsilon_pld"], strict=True)
    ]
    assert out["epsilon"][0] == 0.0 and out["epsilon_pld"][2] < out["epsilon_rdp"][2]
    table = runner.invoke(app, args + ["--accountant", "pld"])
    assert table.exit_code == 0 and "ε PLD" in table.stdout and "ε RDP" in table.stdout
