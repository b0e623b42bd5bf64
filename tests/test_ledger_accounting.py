"""Per-record ledger: totals equal the accountant, pre-check, exact resume."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.ledger import PrivacyLedger, load_ledger, save_ledger
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.two_stage import plan_epsilon

PLAN = TrainingPlan(noise_multiplier=2.0, delta=1e-4, steps=4, rounds=12, client_rate=0.5)


def accountant(rates, plan, adversary, participations=None) -> np.ndarray:
    return np.asarray(plan_epsilon(np.asarray(rates, float), plan, adversary, participations)[0])


def simulate(ledger: PrivacyLedger, rounds: int, clients: np.ndarray, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        sampled = rng.random(clients.max() + 1) < ledger.plan.client_rate
        active = ~ledger.would_exceed(adversary="both")
        ledger.record_round(participated=active & sampled[clients], active=active)


@given(
    rates=st.lists(st.sampled_from([0.0, 0.01, 0.05, 0.3, 1.0]), min_size=1, max_size=12),
    seed=st.integers(0, 1000),
)
@settings(max_examples=20)
def test_totals_equal_the_accountant_for_the_same_history(rates: list[float], seed: int) -> None:
    q = np.array(rates)
    n = q.size
    ledger = PrivacyLedger(np.full(n, 1e9), q, PLAN)
    rng = np.random.default_rng(seed)
    k = np.zeros(n, dtype=int)
    for _ in range(PLAN.rounds):
        part = rng.random(n) < 0.5
        k += part
        ledger.record_round(participated=part, active=np.ones(n, bool))
    live = q > 0
    tp, srv = ledger.spent_epsilon("third-party"), ledger.spent_epsilon("server")
    if live.any():
        expect_tp = accountant(q[live], PLAN, "third-party")
        expect_srv = accountant(q[live], PLAN, "server", k[live])
        # one conversion path: exactly the accountant's value, bit for bit
        np.testing.assert_array_equal(tp[live], expect_tp)
        np.testing.assert_array_equal(srv[live], expect_srv)
    np.testing.assert_array_equal(tp[~live], 0.0)
    np.testing.assert_array_equal(ledger.spent_epsilon("both"), np.maximum(tp, srv))
    assert ledger.rounds_recorded == PLAN.rounds


def test_sat_out_rounds_add_nothing_and_third_party_counts_unsampled_rounds() -> None:
    q = np.array([0.2, 0.2, 0.2])
    ledger = PrivacyLedger(np.full(3, 100.0), q, PLAN)
    # unit 0 active + participating, unit 1 active but client not sampled, unit 2 sat out.
    ledger.record_round(participated=np.array([1, 0, 0], bool), active=np.array([1, 1, 0], bool))
    one_round = dataclasses.replace(PLAN, rounds=1)
    tp = ledger.spent_epsilon("third-party")
    srv = ledger.spent_epsilon("server")
    assert (
        tp[0] == tp[1] == pytest.approx(accountant([0.2], one_round, "third-party")[0], rel=1e-12)
    )
    assert srv[0] == pytest.approx(accountant([0.2], one_round, "server")[0], rel=1e-12)
    assert srv[1] == 0.0 and tp[2] == 0.0 and srv[2] == 0.0
    with pytest.raises(ValueError, match="participate"):
        ledger.record_round(
            participated=np.array([0, 0, 1], bool), active=np.array([1, 1, 0], bool)
        )


def test_pre_check_stops_units_before_they_overspend() -> None:
    q = np.array([0.5, 0.5, 0.05])

    def after(k: int, rate: float) -> float:
        return accountant([rate], dataclasses.replace(PLAN, rounds=k), "both")[0]

    # unit 0 affords exactly 2 rounds; unit 2 (small rate) all 6.
    budgets = np.array([0.5 * (after(2, 0.5) + after(3, 0.5)), 1e6, after(6, 0.05) * 1.01])
    ledger = PrivacyLedger(budgets, q, PLAN)
    stopped_at = None
    for t in range(6):
        active = ~ledger.would_exceed(adversary="both")
        if not active[0] and stopped_at is None:
            stopped_at = t
        ledger.record_round(participated=active, active=active)
    assert stopped_at == 2
    assert np.all(ledger.spent_epsilon("both") <= budgets)
    s = ledger.summary()
    assert s.stopped == 1 and s.over_budget_any("both") == 0 and ledger.rounds_recorded == 6
    masked = ledger.would_exceed(np.array([False, True, True]))
    assert not masked[0]


def test_resume_equals_an_uninterrupted_run(tmp_path) -> None:
    rng = np.random.default_rng(3)
    n = 2000
    q = rng.choice([0.0, 0.02, 0.1, 0.4, 1.0], size=n)
    budgets = rng.uniform(0.5, 6.0, size=n)
    clients = rng.integers(0, 5, size=n)
    full = PrivacyLedger(budgets, q, PLAN, ids=np.arange(n) * 7 + 3)
    simulate(full, 12, clients, seed=7)

    part = PrivacyLedger(budgets, q, PLAN, ids=np.arange(n) * 7 + 3)
    rng_state = np.random.default_rng(7)
    for t in range(12):
        if t == 5:
            save_ledger(part, tmp_path / "ledger.npz")
            part = load_ledger(tmp_path / "ledger.npz")
            np.testing.assert_array_equal(part.ids, np.arange(n) * 7 + 3)
        sampled = rng_state.random(clients.max() + 1) < PLAN.client_rate
        active = ~part.would_exceed(adversary="both")
        part.record_round(participated=active & sampled[clients], active=active)
    assert part.rounds_recorded == full.rounds_recorded == 12
    for attr in ("third_party_rounds", "server_rounds", "sat_out_rounds"):
        np.testing.assert_array_equal(getattr(part, attr), getattr(full, attr))
    for adv in ("third-party", "server", "both"):
        np.testing.assert_array_equal(part.spent_epsilon(adv), full.spent_epsilon(adv))
    assert part.summary() == full.summary()
    assert np.all(full.spent_epsilon("both") <= budgets)


def test_state_is_per_distinct_rate_not_per_unit() -> None:
    n = 200_000
    q = np.random.default_rng(0).choice([0.01, 0.1, 0.5], size=n)
    ledger = PrivacyLedger(np.full(n, 5.0), q, PLAN)
    assert ledger.distinct_rows == 3
    ledger.record_round(participated=np.ones(n, bool), active=np.ones(n, bool))
    assert ledger.spent_epsilon("both").shape == (n,)
    # one conversion per distinct (rate, count) pair and observer, cached
    assert all(len(c) == 3 for c in ledger._cache.values())
    assert set(ledger.state_dict()) == {
        "third_party_rounds",
        "server_rounds",
        "sat_out_rounds",
        "rounds_recorded",
    }


def test_summary_groups_and_validation() -> None:
    budgets = np.array([0.5, 0.5, 2.0, 2.0])
    ledger = PrivacyLedger(budgets, np.array([0.01, 0.02, 0.1, 0.2]), PLAN)
    ledger.record_round(participated=np.ones(4, bool), active=np.ones(4, bool))
    s = ledger.summary()
    assert [g.label for g in s.groups] == ["0.5", "2"]
    assert s.groups[1].spent_max["server"] == pytest.approx(ledger.spent_epsilon("server")[3])
    assert s.unit == "record" and s.units == 4
    with pytest.raises(ValueError, match="rates"):
        PrivacyLedger(budgets, np.array([0.1, 0.2, 1.5, 0.0]), PLAN)
    with pytest.raises(ValueError, match="active"):
        ledger.record_round(participated=np.ones(3, bool), active=np.ones(3, bool))
    with pytest.raises(ValueError, match="adversary"):
        ledger.spent_epsilon("eve")
