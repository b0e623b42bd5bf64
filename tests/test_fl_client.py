"""rPDP-FL silo: budget pre-check (records sit out), catch-up accounting, resume state."""

from __future__ import annotations

import numpy as np
import pytest

from pdpfl.fl.api import ClientAlgorithm
from pdpfl.fl.publication import Publication
from pdpfl.fl.rpdp import RpdpClient
from pdpfl.models import create_model, get_params


def _client(budgets: np.ndarray, rate: float, *, rounds: int = 6, client_rate: float = 1.0,
            adversary: str = "both", seed: int = 0) -> RpdpClient:
    rng = np.random.default_rng(seed)
    n = budgets.size
    x = rng.normal(size=(n, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    pub = Publication(mode="uniform", noise_multiplier=5.0, delta=1e-5, local_steps=3,
                      rounds=rounds, client_rate=client_rate, max_grad_norm=1.0,
                      adversary=adversary, uniform_epsilon=float(budgets.min()),
                      uniform_rate=rate)
    model = create_model("logreg", (5,), 2)
    return RpdpClient(3, model, x, y, x[:10], y[:10], budgets, pub, seed=seed, lr=0.1)


def test_client_satisfies_the_protocol() -> None:
    assert isinstance(_client(np.full(20, 1.0), 0.1), ClientAlgorithm)


def test_records_that_would_exceed_sit_out_and_never_overspend() -> None:
    budgets = np.repeat([2.0, 4.0, 1000.0], 10)
    c = _client(budgets, rate=1.0)  # far too high a rate for the small budgets
    params = get_params(c.model)
    deltas = []
    for t in range(6):
        u = c.fit(params, t, {})
        deltas.append(u)
        for adv in ("third-party", "server"):
            assert np.all(c.spent(adv) <= budgets)
    summary = c.privacy_summary()
    assert summary["stopped"] > 0 and summary["over_budget_third_party"] == 0
    # the small budgets stop first; the largest never has to
    assert c.sat_out[budgets == 2.0].all() and not c.sat_out[budgets == 1000.0].any()
    active = [u.metrics["active_records"] for u in deltas]
    assert active[0] == 30 and 10 <= active[-1] < 30
    assert active == sorted(active, reverse=True)


def test_all_records_stopped_gives_a_zero_update() -> None:
    c = _client(np.full(8, 0.3), rate=1.0)
    params = get_params(c.model)
    for t in range(6):
        u = c.fit(params, t, {})
    assert u.metrics["active_records"] == 0
    assert all(np.all(d == 0) for d in u.delta)


def test_unselected_rounds_are_caught_up_deterministically() -> None:
    budgets = np.repeat([1.0, 4.0], 10)
    a = _client(budgets, rate=0.2, client_rate=0.5)
    b = _client(budgets, rate=0.2, client_rate=0.5)
    params = get_params(a.model)
    for t in range(3):  # a: evaluated every round, never selected
        a.evaluate(params, t, {})
    b.fit(params, 3, {})  # b: first contact in round 3 (rounds 0-2 caught up, 3 trained)
    a.fit(params, 3, {})
    np.testing.assert_array_equal(a.spent("third-party"), b.spent("third-party"))
    np.testing.assert_array_equal(a.spent("server"), b.spent("server"))
    assert a.participations == b.participations == 1
    with pytest.raises(ValueError, match="already accounted"):
        a.fit(params, 2, {})


def test_state_round_trip_resumes_exactly() -> None:
    budgets = np.repeat([1.0, 4.0], 10)
    a = _client(budgets, rate=0.3)
    params = get_params(a.model)
    a.fit(params, 0, {})
    b = _client(budgets, rate=0.3)
    b.load_state_dict(a.state_dict())
    ua, ub = a.fit(params, 1, {}), b.fit(params, 1, {})
    for x, y in zip(ua.delta, ub.delta, strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.spent("both"), b.spent("both"))
    assert a.privacy_summary() == b.privacy_summary()
