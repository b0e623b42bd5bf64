"""Personal budgets per user (ULDP-AVG-w with per-user rates q_u and a per-user ledger)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pdpfl.config import config_from_dict
from pdpfl.fl.algorithm import as_algorithm
from pdpfl.fl.common import federation_info, party_randomness
from pdpfl.fl.uldp import ORDERS, user_budgets
from pdpfl.runtime.simulation import load_federation_for

RAW = {
    "name": "puldp-toy",
    "seed": 5,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 3, "options": {"num_users": 60}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "uldp-avg", "weights": "enhanced", "personal_budgets": True},
    "budgets": {
        "scenario": "three-levels",
        "params": {"values": [0.5, 2.0, 6.0], "ratios": [0.5, 0.3, 0.2]},
    },
    "privacy": {"noise_multiplier": 1.5, "delta": 1e-5, "adversary": "third-party"},
    "training": {"rounds": 40, "local_steps": 1, "batch_size": 8},
}


def _server(*overrides: str):
    config = config_from_dict(RAW, ["data.public_user_histograms=true", *overrides])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        info = federation_info(load_federation_for(config), config)
        algo = as_algorithm(config.algorithm)
        setup = algo.setup(config, info)
        return config, algo.server(config, info, setup, party_randomness(config, "server"))


def _run_rounds(server, rounds):
    taken = np.zeros(server.num_users, dtype=np.int64)
    for t in range(rounds):
        server.round_config(t)
        taken += server.round_users(t)[1]
        server.record_round(t, [0, 1, 2])
    return taken


@pytest.mark.slow
def test_no_user_exceeds_its_budget_and_larger_budgets_sample_more() -> None:
    dp_accounting = pytest.importorskip("dp_accounting")
    config, server = _server()
    budgets = user_budgets(config)
    np.testing.assert_array_equal(server.budgets, budgets)
    rates = server.rates
    # Certified calibration at the user level: q_u increases with ε_u ...
    for lo, hi in ((0.5, 2.0), (2.0, 6.0)):
        assert rates[budgets == lo].max() < rates[budgets == hi].min()
    taken = _run_rounds(server, config.training.rounds)
    # ... so users with larger budgets take part in more rounds.
    means = [taken[budgets == b].mean() for b in (0.5, 2.0, 6.0)]
    assert means[0] < means[1] < means[2]
    spent = server.ledger.spent_epsilon("third-party")
    assert (spent <= budgets * (1 + 1e-9)).all()
    # Independent accountant: T rounds of the Poisson-subsampled Gaussian at each user's rate,
    # in dp-accounting at the (fractional) order pdpfl's accountant chose -- and its PLD
    # accountant, which is tighter still.
    from pdpfl.privacy.accountant import mechanism_epsilon
    from pdpfl.privacy.unit import SampledGaussianPlan

    plan = SampledGaussianPlan("user", 1.5, 1e-5, config.training.rounds)
    for q, eps_u in {(float(q), float(e)) for q, e in zip(rates, budgets, strict=True)}:
        ours, order = mechanism_epsilon(plan, np.array([q]), "third-party", orders=ORDERS)
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.5))
        acc = dp_accounting.rdp.RdpAccountant([float(order[0])])
        acc.compose(event, config.training.rounds)
        # dp-accounting's fractional-order series is a slightly looser bound than pdpfl's
        # (which matches mpmath's integral, tests/test_privacy_orders.py)
        assert float(ours[0]) <= acc.get_epsilon(1e-5) * (1 + 1e-9)
        assert acc.get_epsilon(1e-5) == pytest.approx(float(ours[0]), rel=1e-2)
        assert float(ours[0]) <= eps_u * (1 + 1e-9)
        pld = dp_accounting.pld.PLDAccountant()
        pld.compose(event, config.training.rounds)
        assert pld.get_epsilon(1e-5) <= eps_u
    report = server.privacy_summary()
    assert report.unit == "user" and report.over_budget("third-party") == 0
    assert {g.label: g.units for g in report.groups}["0.5"] == int((budgets == 0.5).sum())


def test_budgets_are_enforced_against_the_server_when_asked() -> None:
    config, server = _server("privacy.adversary=both")
    _run_rounds(server, config.training.rounds)
    for name in ("third-party", "server"):
        spent = server.ledger.spent_epsilon(name)
        assert (spent <= server.budgets * (1 + 1e-9)).all()
    # The server drew the coins: against it there is no amplification, so users stop early.
    assert server.privacy_summary().stopped > 0


def test_tiny_budgets_get_tiny_rates_and_stay_within_budget() -> None:
    config, server = _server("budgets.params.values=[0.001, 2.0, 6.0]")
    tiny = server.budgets == 0.001
    assert 0 < server.rates[tiny].max() < 1e-3 < server.rates[~tiny].min()
    _run_rounds(server, config.training.rounds)
    spent = server.ledger.spent_epsilon("third-party")
    assert (spent[tiny] <= 0.001).all()
