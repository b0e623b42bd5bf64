"""Personal budgets on discrete noise shares (issue #33): ULDP-AVG's per-user rates are
calibrated against the distributed discrete plan its ledger charges, and no user overspends."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pdpfl.config import config_from_dict
from pdpfl.fl.algorithm import as_algorithm
from pdpfl.fl.common import federation_info, party_randomness
from pdpfl.fl.uldp import user_budgets
from pdpfl.privacy.mechanisms import DistributedDiscreteGaussian
from pdpfl.privacy.uldp_discrete import DiscreteUserLevelPlan
from pdpfl.runtime.simulation import load_federation_for

RAW = {
    "name": "puldp-discrete-toy",
    "seed": 5,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 3, "options": {"num_users": 60}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "uldp-avg", "personal_budgets": True},
    "budgets": {
        "scenario": "three-levels",
        "params": {"values": [0.5, 2.0, 6.0], "ratios": [0.5, 0.3, 0.2]},
    },
    "privacy": {"noise_multiplier": 1.5, "delta": 1e-5, "adversary": "third-party"},
    "training": {"rounds": 40, "local_steps": 1, "batch_size": 8},
}


def _server(*overrides: str):  # type: ignore[no-untyped-def]
    config = config_from_dict(RAW, list(overrides))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        info = federation_info(load_federation_for(config), config)
        algo = as_algorithm(config.algorithm)
        setup = algo.setup(config, info)
        return config, algo.server(config, info, setup, party_randomness(config, "server"))


@pytest.fixture(scope="module")
def servers():  # type: ignore[no-untyped-def]
    return _server(), _server("privacy.noise_shares=continuous")


@pytest.mark.slow
def test_ledger_and_calibration_charge_the_discrete_plan(servers) -> None:  # type: ignore[no-untyped-def]
    (config, server), _ = servers
    plan = server.ledger.mechanism
    assert isinstance(plan, DiscreteUserLevelPlan)
    assert server.share_encoding is not None  # the silos add discrete shares
    # the calibrator's plan steps through the released sum's own event
    training = plan.as_training_plan()
    step = training.round_event(np.array([0.3]), "third-party").local.inner.inner
    assert isinstance(step, DistributedDiscreteGaussian)
    assert step == plan.released.base_event()
    # the calibrated rate of each budget spends at most that budget on the ledger's plan
    budgets = user_budgets(config)
    for b in (0.5, 2.0, 6.0):
        q = float(server.rates[budgets == b][0])
        planned = plan.planned_epsilon(np.array([q]), "third-party")
        assert 0.97 * b <= float(planned[0]) <= b * (1 + 1e-9)


@pytest.mark.slow
def test_no_user_exceeds_its_budget_and_rates_are_at_most_the_continuous(servers) -> None:  # type: ignore[no-untyped-def]
    (config, server), (_, cont) = servers
    budgets = user_budgets(config)
    np.testing.assert_array_equal(server.budgets, budgets)
    # the discrete plan is never cheaper than the continuous one: rates never larger
    assert (server.rates <= cont.rates * (1 + 1e-9)).all()
    assert (server.rates > 0).all()
    for t in range(config.training.rounds):
        server.round_config(t)
        server.round_users(t)
        server.record_round(t, [0, 1, 2])
    spent = server.ledger.spent_epsilon("third-party")
    assert (spent <= budgets * (1 + 1e-9)).all()
    assert server.privacy_summary().over_budget("third-party") == 0
