"""ULDP-FL's user-level mechanism (pdpfl.privacy.uldp.UserLevelPlan) and the one user ledger at
the server: the same ε as the two per-observer ledgers it replaces, the spec's Theorem 3/5
vectors, charge-before-release at the server, user ids that survive a resume, silos without a
ledger, and the typed summary in the unit ``user``."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.config import config_from_dict
from pdpfl.fl.algorithm import build_federation_algorithms
from pdpfl.io import decode_state, encode_state
from pdpfl.ledger import PrivacyLedger, PrivacySummary, load_ledger, save_ledger
from pdpfl.ledger.store import mechanism_from_dict, mechanism_to_dict
from pdpfl.privacy.accountant import mechanism_epsilon
from pdpfl.privacy.mechanisms import PoissonSampled
from pdpfl.privacy.uldp import (
    OPACUS_ORDERS,
    ORDERS,
    UserLevelPlan,
    group_epsilon,
    record_rdp,
    user_epsilon,
)
from pdpfl.privacy.unit import SampledGaussianPlan
from pdpfl.runtime.simulation import load_federation_for
from test_uldp_accounting import VECTORS, _digits

BASE = {
    "name": "uldp-mech",
    "seed": 3,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 3, "options": {"num_users": 15}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "uldp-avg"},
    # the continuous option's arithmetic (discrete shares: tests/test_discrete_shares.py)
    "privacy": {"noise_multiplier": 2.0, "delta": 1e-5, "noise_shares": "continuous"},
    "training": {"rounds": 3, "local_steps": 2, "lr": 0.3, "batch_size": 8, "max_grad_norm": 1.0},
}


def _build(*overrides: str):
    config = config_from_dict(BASE, list(overrides))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_federation_algorithms(config, load_federation_for(config))


# ----------------------------------------------------------------- the mechanism description


def _old_ledgers(budgets, rates, sigma_tp, sigma_sv, delta, rounds):
    """The two ledgers the server kept before (one per observer, different σ and rate)."""
    tp = PrivacyLedger(
        budgets,
        rates,
        SampledGaussianPlan("user", sigma_tp, delta, rounds, ("third-party",)),
        orders=ORDERS,
    )
    sv = PrivacyLedger(
        budgets,
        np.ones_like(rates),
        SampledGaussianPlan("user", sigma_sv, delta, rounds, ("server",)),
        orders=ORDERS,
    )
    return tp, sv


@given(
    sigma=st.floats(0.5, 8.0),
    silos=st.sampled_from([1, 3, 10]),
    rates=st.lists(st.sampled_from([1.0, 0.5, 0.2, 0.05]), min_size=2, max_size=6),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=25, deadline=None)
def test_one_ledger_matches_the_two_old_ones_exactly(sigma, silos, rates, seed) -> None:
    rng = np.random.default_rng(seed)
    q = np.array(rates)
    n, rounds, delta = q.size, 6, 1e-5
    sigma_sv = sigma / math.sqrt(silos)
    plan = UserLevelPlan(sigma, sigma_sv, delta, rounds)
    budgets = np.full(n, 1e6)
    new = PrivacyLedger(budgets, q, plan, ids=np.arange(n), orders=ORDERS)
    old_tp, old_sv = _old_ledgers(budgets, q, sigma, sigma_sv, delta, rounds)
    # the old server ledger charged every active round; the server is charged only the rounds it
    # sampled the user in (it drew the coins): the same ledger fed the sampled rounds only
    old_sv_sampled = _old_ledgers(budgets, q, sigma, sigma_sv, delta, rounds)[1]
    for _ in range(rounds):
        active = rng.uniform(size=n) < 0.9
        taking = active & (rng.uniform(size=n) < q)
        new.record_round(participated=taking, active=active)
        old_tp.record_round(participated=taking, active=active)
        old_sv.record_round(participated=taking, active=active)
        old_sv_sampled.record_round(participated=taking, active=taking)
    np.testing.assert_array_equal(
        new.spent_epsilon("third-party"), old_tp.spent_epsilon("third-party")
    )
    np.testing.assert_array_equal(
        new.spent_epsilon("server"), old_sv_sampled.spent_epsilon("server")
    )
    assert (new.spent_epsilon("server") <= old_sv.spent_epsilon("server")).all()
    full = q == 1.0  # without sub-sampling the two rules charge the same rounds
    np.testing.assert_array_equal(
        new.spent_epsilon("server")[full], old_sv.spent_epsilon("server")[full]
    )


@pytest.mark.parametrize(("sigma", "q", "rounds", "delta", "expected"), VECTORS)
def test_theorem_5_vectors(sigma, q, rounds, delta, expected) -> None:
    plan = UserLevelPlan(sigma, sigma, delta, rounds)
    grid, _ = mechanism_epsilon(
        plan, [q], "third-party", rounds, orders=OPACUS_ORDERS, refine=False
    )
    assert float(grid[0]) == pytest.approx(expected, abs=_digits(expected))
    # the ledger's conversion (pdpfl's orders, refined) is user_epsilon exactly, never above
    ours = float(plan.planned_epsilon([q], "third-party")[0])
    assert ours == user_epsilon(sigma, delta, rounds, q)
    assert ours <= expected + _digits(expected)
    # the server knows the coins: T sampled rounds are T plain Gaussian rounds (Theorem 3/5
    # at q = 1), whatever the rate
    assert float(plan.planned_epsilon([q], "server")[0]) == user_epsilon(sigma, delta, rounds)


@pytest.mark.parametrize(("sigma", "rounds"), [(5.0, 50), (1.0, 2), (0.1, 2), (5.0, 200)])
def test_theorem_3_closed_form_at_q_one(sigma, rounds) -> None:
    """ε = min_α Tα/(2σ²) + log((α−1)/α) − (log δ + log α)/(α−1), written out here."""
    a, delta = OPACUS_ORDERS, 1e-5
    closed = np.min(
        rounds * a / (2 * sigma**2) + np.log((a - 1) / a) - (np.log(delta) + np.log(a)) / (a - 1)
    )
    plan = UserLevelPlan(sigma, sigma, delta, rounds)
    for obs in ("third-party", "server"):
        eps, _ = mechanism_epsilon(plan, [1.0], obs, rounds, orders=OPACUS_ORDERS, refine=False)
        assert float(eps[0]) == pytest.approx(float(closed), rel=1e-12)


def test_observers_noise_and_charge_rules() -> None:
    plan = UserLevelPlan(2.0, 2.0 / math.sqrt(4), 1e-5, 10)
    assert plan.unit == "user" and plan.planned_rounds == 10
    assert plan.observers == ("third-party", "server")
    assert plan.charged_on("third-party") == "active"
    assert plan.charged_on("server") == "participated"
    tp = plan.round_event(np.array([0.1, 0.5]), "third-party")
    sv = plan.round_event(np.array([0.1, 0.5]), "server")
    assert isinstance(tp, PoissonSampled) and isinstance(sv, PoissonSampled)
    np.testing.assert_array_equal(tp.rate, [0.1, 0.5])
    np.testing.assert_array_equal(sv.rate, [1.0, 1.0])
    assert tp.inner.noise_multiplier == 2.0 and sv.inner.noise_multiplier == 1.0
    assert plan.total_event(0.5, "server").count == 10
    # with_noise keeps the server's ratio (a property of the aggregation)
    louder = plan.with_noise(4.0)
    assert (louder.noise_multiplier, louder.server_noise_multiplier) == (4.0, 2.0)
    with pytest.raises(ValueError, match="adversary"):
        UserLevelPlan(1.0, 1.0, 1e-5, 3, ("third-party",)).round_event(0.5, "server")
    for bad in (dict(delta=0.0), dict(rounds=0), dict(noise_multiplier=float("nan"))):
        with pytest.raises(ValueError, match=next(iter(bad))):
            UserLevelPlan(
                **{
                    **dict(noise_multiplier=1.0, server_noise_multiplier=1.0, delta=1e-5, rounds=3),
                    **bad,
                }
            )


def test_the_plan_is_stored_with_the_ledger(tmp_path) -> None:
    plan = UserLevelPlan(3.0, 1.5, 1e-5, 8)
    assert mechanism_from_dict(mechanism_to_dict(plan)) == plan
    ledger = PrivacyLedger(
        np.full(4, 9.0), np.array([1.0, 0.5, 0.5, 0.0]), plan, ids=np.arange(4), orders=ORDERS
    )
    ledger.record_round(participated=np.array([1, 0, 1, 0], bool), active=np.ones(4, bool))
    save_ledger(ledger, tmp_path / "server.npz")
    again = load_ledger(tmp_path / "server.npz")
    assert again.unit == "user" and again.mechanism == plan
    np.testing.assert_array_equal(again.ids, np.arange(4))
    for obs in ("third-party", "server"):
        np.testing.assert_array_equal(again.spent_epsilon(obs), ledger.spent_epsilon(obs))


# -------------------------------------------------------------------------- the algorithms


@pytest.mark.parametrize(
    "name", ["uldp-naive", "uldp-group", "uldp-avg", "uldp-sgd", "uldp-default"]
)
def test_silos_hold_no_ledger_and_the_server_reports_users(name) -> None:
    extra = ["algorithm.record_rate=0.2"] if name == "uldp-group" else []
    server, clients = _build(f"algorithm.name={name}", *extra)
    for silo in clients.values():
        assert silo.ledger is None and silo.privacy_summary() is None
        assert silo.state_dict()["ledger"] is None
    summary = server.privacy_summary()
    assert isinstance(summary, PrivacySummary)
    assert summary.unit == "user" and summary.units == 15
    if name in ("uldp-naive", "uldp-avg", "uldp-sgd", "uldp-group"):  # GROUP: GroupPlan
        assert isinstance(server.ledger, PrivacyLedger) and server.ledger.unit == "user"
        np.testing.assert_array_equal(server.ledger.ids, np.arange(15))
    else:
        assert server.ledger is None
    if name == "uldp-default":
        assert not summary.private and summary.spent_max("third-party") == math.inf
        assert summary.over_budget("server") == 15


def _fit_round(server, clients, params, t):
    cfg = server.round_config(t)
    for c in server.select_clients(t, sorted(clients)):
        clients[c].fit(params, t, cfg)
    server.record_round(t, sorted(clients))


def test_the_server_charges_a_round_when_it_decides_it_and_only_once() -> None:
    server, clients = _build("algorithm.user_rate=0.5")
    ledger = server.ledger
    assert ledger.rounds_recorded == 0
    cfg = server.round_config(0)
    # charged before any silo trained: the step of every silo runs after this
    assert ledger.rounds_recorded == 1
    before = ledger.state_dict()
    assert server.round_config(0) == cfg  # decided once: same users, not charged again
    np.testing.assert_array_equal(server.sampled_users(0), server.round_users(0)[1])
    for key, value in ledger.state_dict().items():
        np.testing.assert_array_equal(value, before[key])
    params = server.initial_params()
    for c in sorted(clients):
        clients[c].fit(params, 0, cfg)
    server.record_round(0, sorted(clients))
    assert ledger.rounds_recorded == 1  # recording the round charges nothing more
    taking = server.round_users(0)[1]
    np.testing.assert_array_equal(ledger.server_rounds, taking.astype(int))
    np.testing.assert_array_equal(ledger.third_party_rounds, np.ones(15, dtype=int))
    with pytest.raises(ValueError, match="in order"):
        server.round_config(2)


def test_user_ids_and_a_decided_round_survive_a_resume() -> None:
    server, clients = _build("algorithm.user_rate=0.5")
    params = server.initial_params()
    _fit_round(server, clients, params, 0)
    cfg1 = server.round_config(1)  # decided (and charged) before an interruption
    state = decode_state(encode_state(server.state_dict()))
    fresh, _ = _build("algorithm.user_rate=0.5")
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.ledger.ids, np.arange(15))
    for key, value in server.ledger.state_dict().items():
        np.testing.assert_array_equal(fresh.ledger.state_dict()[key], value)
    assert fresh.round_config(1) == cfg1  # the same users, and no second charge
    assert fresh.ledger.rounds_recorded == 2
    np.testing.assert_array_equal(
        fresh.ledger.spent_epsilon("server"), server.ledger.spent_epsilon("server")
    )


@pytest.mark.slow
def test_a_resumed_run_writes_the_same_user_ledger(tmp_path) -> None:
    """Interrupted after one round and resumed: ``ledgers/server.npz`` lists the users by id
    with the charges of an uninterrupted run, and ``pdpfl privacy`` reads it."""
    from pdpfl.ledger.table import privacy_table, select_id
    from pdpfl.runtime.simulation import run_simulation

    config = config_from_dict(BASE, ["algorithm.user_rate=0.5"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the same users twice, each run with its own budget store (two copies of the data)
        other = config_from_dict(BASE, ["algorithm.user_rate=0.5", f"lifetime.store={tmp_path}"])
        whole = run_simulation(other, tmp_path / "whole", progress=False)
        run_simulation(config, tmp_path / "cut", progress=False, stop_after=1)
        resumed = run_simulation(config, tmp_path / "cut", resume=True, progress=False)
    a = load_ledger(tmp_path / "whole" / "ledgers" / "server.npz")
    b = load_ledger(tmp_path / "cut" / "ledgers" / "server.npz")
    np.testing.assert_array_equal(b.ids, np.arange(15))
    for key, value in a.state_dict().items():
        np.testing.assert_array_equal(b.state_dict()[key], value)
    assert resumed["privacy"] == whole["privacy"]
    assert resumed["privacy"]["unit"] == "user" and resumed["privacy"]["units"] == 15
    assert sorted((tmp_path / "cut" / "ledgers").glob("*.npz")) == [
        tmp_path / "cut" / "ledgers" / "server.npz"
    ]  # the silos keep none
    row = select_id(privacy_table(tmp_path / "cut"), "7")
    assert list(row["unit"]) == ["user"] and list(row["holder"]) == ["server"]
    assert row["epsilon_third_party"][0] == pytest.approx(float(a.spent_epsilon("third-party")[7]))


def test_group_summary_is_the_group_conversion() -> None:
    server, clients = _build(
        "algorithm.name=uldp-group",
        "algorithm.record_rate=0.2",
        "algorithm.group_k=3",
        "algorithm.group_conversion=rdp",
    )
    params = server.initial_params()
    _fit_round(server, clients, params, 0)
    summary = server.privacy_summary()
    steps = 1 * 2  # one round of τ = 2 DP-SGD steps
    expected = group_epsilon(record_rdp(2.0, 0.2, steps), 1e-5, 3, "rdp")["epsilon"]
    assert summary.spent_max("third-party") == summary.spent_max("server") == expected
    planned = group_epsilon(record_rdp(2.0, 0.2, 3 * steps), 1e-5, 3, "rdp")["epsilon"]
    (group,) = summary.groups
    assert group.units == 15 and group.budget_max == planned
    assert summary.over_budget("third-party") == 0
    assert summary.info["record_epsilon"] == user_epsilon(2.0, 1e-5, steps, 0.2)
    state = decode_state(encode_state(server.state_dict()))
    fresh = type(server)(
        params, server.group_setup, conversion="rdp", server_lr=1.0, randomness=server.randomness
    )
    fresh.load_state_dict(state)
    assert fresh.privacy_summary() == summary


def test_planned_budget_is_the_planned_epsilon_against_both_observers() -> None:
    uniform, _ = _build()
    enhanced, _ = _build("algorithm.weights=enhanced", "data.public_user_histograms=true")
    planned = user_epsilon(2.0, 1e-5, 3)
    np.testing.assert_allclose(uniform.ledger.budgets, planned, rtol=0, atol=0)
    # the server sees σ/√t with public enhanced weights (each of the 3 silos' shares sized
    # for t(3) = 2 survivors, issue #22): the larger planned ε is the budget
    np.testing.assert_allclose(
        enhanced.ledger.budgets, user_epsilon(2.0 / math.sqrt(2), 1e-5, 3), rtol=0, atol=0
    )
    summary = uniform.privacy_summary()
    assert [g.label for g in summary.groups] == [f"{planned:g}"]
    assert summary.info["noise_multiplier"] == 2.0
    assert summary.info["noise_multiplier_server"] == 2.0
