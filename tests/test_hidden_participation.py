"""Hidden participation (every silo sends a masked contribution, drawing its own λ-coin) does
not hide participation on a real network (reply timing): the server is charged exactly as in
visible mode -- its realized participations, no client-sampling amplification -- and third
parties keep the λ-amplified bound (issue #22, item 4)."""

from __future__ import annotations

import numpy as np
import pytest

from pdpfl.config import config_from_dict
from pdpfl.privacy.two_stage import plan_epsilon
from pdpfl.runtime.simulation import run_simulation

TINY = {
    "name": "hidden",
    "seed": 11,
    "threads": 1,
    "randomness": "reproducible",
    "aggregation": "secure",
    "participation": "hidden",
    "data": {"dataset": "breast-cancer", "num_clients": 3},
    "model": {"name": "logreg"},
    "privacy": {"noise_multiplier": 3.0, "delta": 1e-3},
    "budgets": {
        "scenario": "three-levels",
        "params": {"values": [0.5, 1.0, 2.0], "ratios": [0.4, 0.3, 0.3]},
    },
    "training": {"rounds": 4, "local_steps": 2, "lr": 0.3, "batch_size": 8, "client_rate": 0.5},
}


@pytest.mark.slow
def test_the_server_is_charged_its_realized_participations_like_in_visible_mode(tmp_path):
    import pdpfl

    summary = run_simulation(config_from_dict(TINY), tmp_path, progress=False)
    assert "participation revealed" in summary["aggregation"]["server_observer"]
    table = pdpfl.privacy_table(tmp_path, as_frame=False)
    cfg = config_from_dict(TINY)
    from pdpfl.fl.rpdp.config import mechanism_spec
    from pdpfl.fl.rpdp.mechanism import mechanism_plan

    plan = mechanism_plan(mechanism_spec(cfg), 3.0)
    live = table["rate"] > 0
    k = table["rounds_server"][live]
    assert np.any(k < table["rounds_third_party"][live])  # some rounds a silo sat out
    expected, _ = plan_epsilon(table["rate"][live], plan, "server", k)
    np.testing.assert_allclose(table["epsilon_server"][live], expected, rtol=1e-12)
    # third parties: every active round, λ-amplified -- less than the server's bound
    tp, _ = plan_epsilon(
        table["rate"][live], plan, "third-party", table["rounds_third_party"][live]
    )
    np.testing.assert_allclose(table["epsilon_third_party"][live], tp, rtol=1e-12)
