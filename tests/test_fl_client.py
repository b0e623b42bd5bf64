"""rPDP-FL silo: budget pre-check (records sit out), catch-up accounting, resume state, and
what the silo releases (a Contribution and nothing else)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pdpfl.fl.api import ClientAlgorithm, Contribution, check_contribution
from pdpfl.fl.rpdp import DpFedAvgClient
from pdpfl.fl.rpdp import DpFedAvgSetup as Publication
from pdpfl.models import create_model, get_params
from pdpfl.randomness import SecureRandomness, SeededRandomness


def _data(n: int, seed: int = 0) -> SimpleNamespace:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return SimpleNamespace(x_train=x, y_train=y, x_test=x[:10], y_test=y[:10], name="silo")


def _client(
    budgets: np.ndarray,
    rate: float,
    *,
    rounds: int = 6,
    client_rate: float = 1.0,
    adversary: str = "both",
    seed: int = 0,
    randomness=None,
    model: str = "logreg",
    **kw,
) -> DpFedAvgClient:
    pub = Publication(
        mode="uniform",
        noise_multiplier=5.0,
        delta=1e-5,
        local_steps=3,
        rounds=rounds,
        client_rate=client_rate,
        max_grad_norm=1.0,
        adversary=adversary,
        uniform_epsilon=float(budgets.min()),
        uniform_rate=rate,
    )
    return DpFedAvgClient(
        3,
        create_model(model, (5,), 2),
        _data(budgets.size, seed),
        budgets,
        pub,
        randomness=randomness or SeededRandomness(seed),
        normalizer=4.0,
        lr=0.1,
        **kw,
    )


def test_client_satisfies_the_protocol() -> None:
    assert isinstance(_client(np.full(20, 1.0), 0.1), ClientAlgorithm)


def test_fit_releases_exactly_a_contribution() -> None:
    c = _client(np.full(20, 1.0), 0.3)
    params = get_params(c.model)
    out = c.fit(params, 0, {})
    assert type(out) is Contribution
    assert set(vars(out)) == {"update", "weight", "metrics"}
    assert out.metrics == {} and out.weight == 1.0
    check_contribution(out, frozenset(), len(params))


def test_records_that_would_exceed_sit_out_and_never_overspend() -> None:
    budgets = np.repeat([2.0, 4.0, 1000.0], 10)
    c = _client(budgets, rate=1.0)  # far too high a rate for the small budgets
    params = get_params(c.model)
    stopped = []
    for t in range(6):
        c.fit(params, t, {})
        stopped.append(int(c.sat_out.sum()))
        for adv in ("third-party", "server"):
            assert np.all(c.spent(adv) <= budgets)
    summary = c.privacy_summary()
    assert summary.stopped > 0 and summary.over_budget("third-party") == 0
    # the small budgets stop first; the largest never has to
    assert c.sat_out[budgets == 2.0].all() and not c.sat_out[budgets == 1000.0].any()
    assert stopped[0] == 0 and 0 < stopped[-1] <= 20
    assert stopped == sorted(stopped)


def test_a_silo_whose_records_all_sat_out_still_adds_noise() -> None:
    """Nothing distinguishes a silo without active records on the wire: its update is noise."""
    c = _client(np.full(8, 0.3), rate=1.0, randomness=SecureRandomness(), model="mlp")
    params = get_params(c.model)
    for t in range(6):
        out = c.fit(params, t, {})
    assert c.sat_out.all()
    flat = np.concatenate([d.ravel() for d in out.update])
    # τ = 3 noise-only SGD steps of std σC/B = 5/4 each, times lr 0.1: std 0.1·1.25·√3.
    assert np.all(flat != 0)
    assert flat.std() == pytest.approx(0.1 * 1.25 * np.sqrt(3), rel=0.1)
    assert [d.shape for d in out.update] == [p.shape for p in params]


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
    for x, y in zip(ua.update, ub.update, strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.spent("both"), b.spent("both"))
    assert a.privacy_summary() == b.privacy_summary()


def test_state_holds_no_secret_randomness() -> None:
    from pdpfl.io import decode_state, encode_state

    c = _client(np.full(10, 1.0), 0.3, randomness=SecureRandomness())
    c.fit(get_params(c.model), 0, {})
    state = decode_state(encode_state(c.state_dict()))  # must encode without pickle
    # the silo template's state: counters, the ledger's integer counters, the algorithm's own
    assert set(state) == {"next_round", "participations", "ledger", "extra"}
    assert set(state["extra"]) == {"selection_counts"}
    assert set(state["ledger"]) == {
        "third_party_rounds",
        "server_rounds",
        "sat_out_rounds",
        "rounds_recorded",
    }


def test_public_weight_scales_the_released_update() -> None:
    budgets = np.full(12, 1.0)
    a = _client(budgets, rate=0.5, randomness=SeededRandomness(5))
    b = _client(budgets, rate=0.5, randomness=SeededRandomness(5), weight=7.0)
    params = get_params(a.model)
    ua, ub = a.fit(params, 0, {}), b.fit(params, 0, {})
    assert ub.weight == 7.0
    for x, y in zip(ua.update, ub.update, strict=True):
        np.testing.assert_allclose(7.0 * x, y, rtol=1e-5, atol=1e-7)


def test_personalized_silo_refuses_infeasible_budgets_unless_excluded() -> None:
    from pdpfl.calibration import fit_estimator
    from pdpfl.privacy.plan import TrainingPlan

    plan = TrainingPlan(noise_multiplier=0.5, delta=1e-5, steps=3, rounds=6, client_rate=1.0)
    est = fit_estimator(plan, adversary="both")  # smallest achievable ε ≈ 1.32
    pub = Publication(
        mode="personalized",
        noise_multiplier=0.5,
        delta=1e-5,
        local_steps=3,
        rounds=6,
        client_rate=1.0,
        max_grad_norm=1.0,
        adversary="both",
        estimator=est.to_dict(),
    )
    budgets = np.array([0.5, 1.0, 2.0, 5.0])
    model = create_model("logreg", (5,), 2)
    kw = dict(randomness=SeededRandomness(0), normalizer=2.0)
    with pytest.raises(ValueError, match=r"2 record\(s\).*allow_exclusion"):
        DpFedAvgClient(0, model, _data(4), budgets, pub, **kw)
    c = DpFedAvgClient(0, model, _data(4), budgets, pub, allow_exclusion=True, **kw)
    assert est.min_epsilon > 1.0
    assert c.privacy_summary().excluded == 2
    assert c.rates[:2].tolist() == [0.0, 0.0] and np.all(c.rates[2:] > 0)


def test_dp_silo_needs_a_public_normaliser() -> None:
    pub = Publication(
        mode="uniform",
        noise_multiplier=1.0,
        delta=1e-5,
        local_steps=1,
        rounds=1,
        client_rate=1.0,
        max_grad_norm=1.0,
        uniform_epsilon=1.0,
        uniform_rate=0.5,
    )
    with pytest.raises(ValueError, match="training.batch_size"):
        DpFedAvgClient(
            0,
            create_model("logreg", (5,), 2),
            _data(4),
            np.ones(4),
            pub,
            randomness=SeededRandomness(0),
            normalizer=None,
        )
