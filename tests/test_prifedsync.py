"""PriFedSync: WOR batches, join coins, elastic sync, aggregation, per-client budgets, state.

The accounting against the first release's numbers (ledger ε and calibration on a grid) is in
``tests/test_prifedsync_ledger.py``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from pdpfl.config import ConfigError, config_from_dict
from pdpfl.dp.steps import wor_sample
from pdpfl.fl.aggregation import sum_contributions
from pdpfl.fl.algorithm import build_federation_algorithms
from pdpfl.fl.api import check_contribution, check_evaluation
from pdpfl.fl.prifedsync import (
    PriFedSyncClient,
    PriFedSyncSetup,
    client_plan,
    evaluate_models,
    federation_report,
    target_as_epsilon,
)
from pdpfl.fl.prifedsync.mechanism import clt_mu, epsilon, strong_epsilon
from pdpfl.io import decode_state, encode_state
from pdpfl.ledger import PrivacyLedger
from pdpfl.privacy import LocalStepsPlan
from pdpfl.randomness import SeededRandomness
from pdpfl.runtime.simulation import load_federation_for

pytestmark = pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning")


def _config(**over):
    raw = dict(
        name="pfs",
        seed=5,
        randomness="reproducible",
        data=dict(
            dataset="digits",
            num_clients=6,
            partition="label-shards",
            partition_params={"shards_per_client": 2},
        ),
        model=dict(name="logreg"),
        algorithm=dict(name="prifedsync"),
        privacy=dict(noise_multiplier=2.0, delta=1e-5),
        training=dict(
            rounds=3, local_steps=4, client_rate=0.5, optimizer="adam", lr=0.05, batch_size=8
        ),
    )
    for key, value in over.items():
        section, _, leaf = key.partition("__")
        raw[section] = {**raw[section], leaf: value} if leaf else value
    return config_from_dict(raw)


def _build(config):
    fed = load_federation_for(config)
    server, clients = build_federation_algorithms(config, fed)
    return fed, server, clients


def _copy(params):
    return [np.asarray(p).copy() for p in params]


# ------------------------------------------------------------------------------- models


def test_paper_models_have_the_paper_parameter_counts() -> None:
    from pdpfl.models import create_model, num_parameters

    assert num_parameters(create_model("prifedsync-mnist-cnn", (1, 28, 28), 10)) == 1_199_882
    assert (
        num_parameters(create_model("prifedsync-mnist-cnn", (1, 28, 28), 10, dropout=True))
        == 1_199_882
    )
    assert num_parameters(create_model("prifedsync-cifar-cnn", (3, 32, 32), 10)) == 122_570
    import torch

    out = create_model("prifedsync-cifar-cnn", (3, 32, 32), 10)(torch.zeros(2, 3, 32, 32))
    assert out.shape == (2, 10)
    with pytest.raises(ValueError, match="input_shape"):
        create_model("prifedsync-mnist-cnn", (784,), 10)


# ---------------------------------------------------------------------------- WOR sampler


def test_wor_sample_draws_exactly_b_distinct_records_uniformly() -> None:
    from scipy import stats

    stream = SeededRandomness(3).stream("wor-test")
    n, b, draws = 20, 5, 3000
    counts = np.zeros(n)
    for _ in range(draws):
        idx = wor_sample(n, b, stream).numpy()
        assert idx.dtype == np.int64 and len(idx) == b
        assert len(np.unique(idx)) == b and idx.min() >= 0 and idx.max() < n
        counts[idx] += 1
    # Each record is in a batch with probability B/n: a chi-square test of the counts.
    assert stats.chisquare(counts).pvalue > 1e-4
    assert sorted(wor_sample(n, n, stream).tolist()) == list(range(n))
    assert wor_sample(n, 0, stream).numel() == 0
    with pytest.raises(ValueError, match="batch_size"):
        wor_sample(4, 5, stream)


def test_wor_sample_is_not_a_fixed_subset() -> None:
    stream = SeededRandomness(4).stream("wor-test")
    seen = {tuple(sorted(wor_sample(6, 2, stream).tolist())) for _ in range(600)}
    assert len(seen) == math.comb(6, 2)  # every 2-subset of 6 appears


def test_local_training_uses_wor_batches_of_exactly_b() -> None:
    _, _, clients = _build(_config(training__client_rate=1.0))
    c = clients[0]
    params = _copy(c.local)
    c.fit(params, 0, {})
    n = len(c.y_train)
    assert len(c.last_batches) == c.mechanism.local_steps == 4
    for batch in c.last_batches:
        assert len(batch) == 8 and len(np.unique(batch)) == 8 and batch.max() < n


# ------------------------------------------------------------- join coins, sync, aggregate


def _round(server, clients, params, t):
    contributions = {cid: c.fit(params, t, {}) for cid, c in clients.items()}
    for contribution in contributions.values():
        check_contribution(contribution, server.public_metrics, len(params))
    agg = sum_contributions(list(contributions.values()), params)
    new = server.aggregate(t, params, agg)
    server.record_round(t, sorted(clients))
    return contributions, new


def test_elastic_sync_moves_joined_models_exactly_alpha_and_others_keep_theirs() -> None:
    config = _config()
    _, server, clients = _build(config)
    alpha = config.algorithm.alpha
    params = server.initial_params()
    before = {cid: _copy(c.local) for cid, c in clients.items()}
    contributions, new = _round(server, clients, params, 0)
    joined = [cid for cid, con in contributions.items() if con.weight > 0]
    idle = [cid for cid, con in contributions.items() if con.weight == 0]
    assert joined and idle  # the seed gives both kinds
    trained = {cid: _copy(clients[cid].local) for cid in joined}
    # The global model is the mean of the joined clients' local models.
    mean = [
        np.mean([np.asarray(trained[c][k], np.float64) for c in joined], axis=0)
        for k in range(len(params))
    ]
    for g, m in zip(new, mean, strict=True):
        np.testing.assert_allclose(g, m, rtol=1e-6, atol=1e-7)
    # A client that did not join released zeros of weight 0.
    for cid in idle:
        assert all(not np.any(u) for u in contributions[cid].update)
    for c in clients.values():
        check_evaluation(c.evaluate(new, 0, {}))
    for cid in joined:
        for h, w, g in zip(clients[cid].local, trained[cid], new, strict=True):
            w64 = np.asarray(w, np.float64)
            np.testing.assert_allclose(
                h, w64 + alpha * (np.asarray(g, np.float64) - w64), rtol=1e-6, atol=1e-7
            )
            assert not np.array_equal(h, w)  # it really moved
    for cid in idle:
        for h, b in zip(clients[cid].local, before[cid], strict=True):
            np.testing.assert_array_equal(h, b)


@pytest.mark.slow
def test_join_coins_are_each_clients_own_and_empty_rounds_are_not_redrawn() -> None:
    config = _config(training__client_rate=0.1, training__rounds=12)
    _, server, clients = _build(config)
    params = server.initial_params()
    empty = 0
    for t in range(12):
        expected = {
            cid: bool(
                SeededRandomness(config.seed).stream("client-join", t, cid).uniform(1)[0] < 0.1
            )
            for cid in clients
        }
        contributions, new = _round(server, clients, params, t)
        got = {cid: con.weight > 0 for cid, con in contributions.items()}
        assert got == expected
        if not any(got.values()):
            empty += 1
            for a, b in zip(new, params, strict=True):
                np.testing.assert_array_equal(a, b)
        for c in clients.values():
            c.evaluate(new, t, {})
        params = new
    assert empty > 0 and server.empty_rounds == empty and len(server.joined) == 12


@pytest.mark.slow
def test_server_lr_interpolates_the_global_model() -> None:
    _, server, clients = _build(
        _config(algorithm=dict(name="prifedsync", server_lr=0.5), training__client_rate=1.0)
    )
    params = server.initial_params()
    contributions, new = _round(server, clients, params, 0)
    mean = [
        sum(np.asarray(c.update[k], np.float64) for c in contributions.values()) / 6
        for k in range(len(params))
    ]
    for g, p, m in zip(new, params, mean, strict=True):
        np.testing.assert_allclose(g, 0.5 * np.asarray(p, np.float64) + 0.5 * m, atol=1e-6)


@pytest.mark.slow
def test_evaluation_reports_the_local_or_the_global_model() -> None:
    from pdpfl.dp.engine import evaluate
    from pdpfl.models import set_params

    for mode in ("local", "global"):
        _, server, clients = _build(
            _config(algorithm=dict(name="prifedsync", evaluate=mode), training__client_rate=1.0)
        )
        params = server.initial_params()
        _, new = _round(server, clients, params, 0)
        c = clients[1]
        reply = c.evaluate(new, 0, {})
        assert set(reply) == {"loss", "accuracy", "n"}
        set_params(c.model, c.local if mode == "local" else new)
        assert reply["accuracy"] == evaluate(c.model, c.x_test, c.y_test)["accuracy"]
        both = evaluate_models(clients, new)
        assert set(both) == {
            "local_mean_client_accuracy",
            "local_pooled_accuracy",
            "global_mean_client_accuracy",
            "global_pooled_accuracy",
        }


# --------------------------------------------------------------- accounting and budgets


def _plan(sampler="wor", noise_multiplier=2.0, local_steps=38) -> LocalStepsPlan:
    return LocalStepsPlan(sampler, noise_multiplier, local_steps, 1e-5, 50)


def _setup(**kw) -> PriFedSyncSetup:
    base = dict(
        sampler="wor",
        alpha=0.1,
        server_lr=1.0,
        client_rate=1.0,
        local_steps=38,
        local_epoch=False,
        rounds=50,
        planned_rounds=50,
        max_grad_norm=1.0,
        noise_multiplier=1.0,
        delta=1e-5,
        num_clients=10,
    )
    return PriFedSyncSetup(**{**base, **kw})


def test_mechanism_matches_theorem2_and_the_wor_bound() -> None:
    from pdpfl.privacy.gdp import prifedsync_mu
    from pdpfl.privacy.wor import wor_gaussian_epsilon

    m, rate = _plan(), 16 / 600  # noise std 2C: the paper's σ_j = 1 (Table 1, first row)
    assert clt_mu(m, rate, 93) == pytest.approx(float(prifedsync_mu(1.0, 16, 600, 38, 93)))
    assert round(clt_mu(m, rate, 93), 2) == 2.71
    assert epsilon(m, rate, 93) == pytest.approx(
        wor_gaussian_epsilon(16 / 600, 1.0, 38 * 93, 1e-5)[0]
    )
    assert epsilon(m, rate, 93) >= epsilon(m, rate, 93, "clt")
    assert strong_epsilon(m, rate, 93, 100) > epsilon(m, rate, 93)
    p = _plan(sampler="poisson")
    assert p.event_noise_multiplier == 2.0 and m.event_noise_multiplier == 1.0
    assert epsilon(p, rate, 0) == 0.0 and epsilon(p, rate, 10) > 0
    with pytest.raises(ValueError, match="batch_size"):
        client_plan(_setup(), 600, 700, None)


def test_calibrate_noise_meets_the_target_tightly() -> None:
    for target in (2.0, 8.0):
        m, rate = client_plan(_setup(), 600, 16, target)
        assert epsilon(m, rate, 50) <= target
        assert epsilon(m.with_noise(m.noise_multiplier * 0.995), rate, 50) > target
    m, rate = client_plan(_setup(budget_accounting="clt"), 600, 16, 8.0)
    assert epsilon(m, rate, 50, "clt") <= 8.0
    with pytest.raises(ValueError, match="target"):
        client_plan(_setup(planned_rounds=10_000, rounds=10_000), 600, 600, 1e-6)


def test_calibrate_steps_meets_the_target_tightly() -> None:
    setup = _setup(
        calibrate="steps", noise_multiplier=2.0, local_steps=200, rounds=20, planned_rounds=20
    )
    m, rate = client_plan(setup, 600, 16, 5.0)
    k = m.local_steps
    assert 1 <= k < 200 and m.noise_multiplier == 2.0
    assert epsilon(m, rate, 20) <= 5.0 < epsilon(m.with_steps(k + 1), rate, 20)
    with pytest.raises(ValueError, match="one local step"):
        client_plan(
            _setup(calibrate="steps", noise_multiplier=0.3, rounds=100, planned_rounds=100),
            600,
            16,
            0.01,
        )


def test_mu_target_is_enforced_as_its_epsilon_delta() -> None:
    from pdpfl.privacy.gdp import gdp_epsilon

    assert target_as_epsilon(None, 1.5, 1e-5) == pytest.approx(float(gdp_epsilon(1.5, 1e-5)))
    assert target_as_epsilon(3.0, None, 1e-5) == 3.0
    assert target_as_epsilon(None, None, 1e-5) is None


def test_ledger_stops_a_client_before_it_would_exceed() -> None:
    m, rate = _plan(), 16 / 600
    target = epsilon(m, rate, 3) * 1.0001
    led = PrivacyLedger(np.full(4, target), np.full(4, rate), m, orders=None)
    every = np.ones(4, dtype=bool)
    for _ in range(3):
        assert not led.would_exceed().any()
        led.record_round(participated=every, active=every)
    assert led.would_exceed().all()
    assert np.all(led.spent_epsilon("both") <= target)


@pytest.mark.slow
def test_per_client_targets_pick_each_clients_noise_and_the_ledger_stops_them() -> None:
    config = _config(
        algorithm=dict(
            name="prifedsync", target_epsilon=[1.0, 4.0, 4.0, 4.0, 8.0, None], planned_rounds=2
        ),
        training__client_rate=1.0,
        training__rounds=4,
    )
    _, server, clients = _build(config)
    sigmas = [c.mechanism.noise_multiplier for c in clients.values()]
    assert [c.target_epsilon for c in clients.values()] == [1.0, 4.0, 4.0, 4.0, 8.0, None]
    assert sigmas[0] > sigmas[1] > sigmas[4] and sigmas[5] == 2.0
    params = server.initial_params()
    for t in range(4):
        contributions, params = _round(server, clients, params, t)
        for c in clients.values():
            c.evaluate(params, t, {})
        for c in clients.values():
            if c.target_epsilon is not None:
                assert c.spent() <= c.target_epsilon
                assert np.all(c.ledger.spent_epsilon("both") <= c.target_epsilon)
    for cid in range(5):
        c = clients[cid]
        assert c.participations_charged == c.participations == 2 and c.stopped
        s = c.privacy_summary()
        assert s.stopped == len(c.y_train) and s.over_budget_any("both") == 0
        assert [g.label for g in s.groups] == [f"{c.target_epsilon:g}"]
    assert clients[5].participations_charged == 4 and not clients[5].stopped
    # no target: never stopped, its records' group is "no target" (budget: the planned ε)
    assert [g.label for g in clients[5].privacy_summary().groups] == ["no target"]
    assert clients[5].ledger.budgets[0] == pytest.approx(clients[5].spent())
    report = federation_report(clients)
    assert report["clt_mu_strong"] >= report["clt_mu_weak"]
    assert report["eps_strong_paper_rigorous"] >= report["eps_rigorous_max"]


@pytest.mark.slow
def test_clt_enforced_targets_are_still_judged_by_the_rigorous_bound() -> None:
    # Few steps per client: the CLT under-reports, so a CLT-calibrated σ overshoots the target
    # under the rigorous bound -- and the summary says so instead of hiding it.
    config = _config(
        algorithm=dict(name="prifedsync", target_epsilon=2.0, budget_accounting="clt"),
        training__client_rate=1.0,
        training__rounds=2,
    )
    _, server, clients = _build(config)
    params = server.initial_params()
    for t in range(2):
        _, params = _round(server, clients, params, t)
    c = clients[0]
    assert c.spent("clt") <= 2.0
    assert c.spent("rigorous") > 2.0
    summary = c.privacy_summary()
    assert summary.over_budget("third-party") == len(c.y_train)
    assert summary.spent_max("third-party") == pytest.approx(c.spent("rigorous"))
    assert summary.approximate["gdp-clt_epsilon_max_server"] == pytest.approx(c.spent("clt"))


@pytest.mark.slow
def test_summary_headline_is_the_rigorous_epsilon(tmp_path) -> None:
    import json

    from pdpfl.runtime.simulation import run_simulation

    config = _config(training__rounds=2)
    summary = run_simulation(config, tmp_path, progress=False)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    overview = lines[-1]["privacy"]
    # the metrics line holds the typed summary (approximations labelled as such)
    assert summary["eps_spent_max"]["third_party"] == pytest.approx(
        overview["spent_max"]["third-party"]
    )
    approx = overview["approximate"]
    assert approx["clt_mu_strong"] == pytest.approx(math.sqrt(5) * approx["clt_mu"])
    assert approx["gdp-clt_epsilon_max_third_party"] > 0
    assert summary["privacy_unit"] == "record"
    assert summary["neighbouring"].startswith("replace one record of one client")
    assert (tmp_path / "ledgers").is_dir()
    assert len(list((tmp_path / "ledgers").glob("*.npz"))) == 6


# -------------------------------------------------------------------------- state, config


def test_state_is_pickle_free_and_resumes_exactly() -> None:
    config = _config(training__client_rate=1.0)
    _, server, clients = _build(config)
    params = server.initial_params()
    _, params = _round(server, clients, params, 0)
    clients[2].evaluate(params, 0, {})  # syncs
    state = decode_state(encode_state(clients[2].state_dict()))
    assert state["extra"]["optimizer"]  # Adam moments travel with the state
    _, _, fresh = _build(config)
    fresh[2].load_state_dict(state)
    a = clients[2].fit(params, 1, {})
    b = fresh[2].fit(params, 1, {})
    for x, y in zip(a.update, b.update, strict=True):
        np.testing.assert_array_equal(x, y)
    assert fresh[2].participations_charged == clients[2].participations_charged == 2
    np.testing.assert_array_equal(fresh[2].ledger.ids, clients[2].ledger.ids)


@pytest.mark.slow
def test_poisson_sampler_option_runs_and_accounts_add_remove() -> None:
    config = _config(
        algorithm=dict(name="prifedsync", sampler="poisson"), training__client_rate=1.0
    )
    _, server, clients = _build(config)
    _round(server, clients, server.initial_params(), 0)
    c = clients[0]
    assert c.mechanism.sampler == "poisson" and "add/remove" in c.mechanism.neighbouring
    assert "add/remove" in config.algorithm.neighbouring
    assert c.privacy_summary().spent_max("third-party") == pytest.approx(c.spent())


@pytest.mark.parametrize(
    ("over", "field"),
    [
        (dict(training__batch_size=None), "training.batch_size"),
        (dict(training__batch_size=7.5), "training.batch_size"),
        (dict(privacy=dict(delta=1e-5)), "privacy.noise_multiplier"),
        (dict(privacy=dict(epsilon_max=3.0, noise_multiplier=1.0)), "privacy.epsilon_max"),
        (
            dict(
                privacy=dict(epsilon_max=3.0), algorithm=dict(name="prifedsync", calibrate="steps")
            ),
            "privacy.noise_multiplier",
        ),
        (dict(algorithm=dict(name="prifedsync", target_mu=1.0, target_epsilon=2.0)), "target_mu"),
        (dict(algorithm=dict(name="prifedsync", target_epsilon=[1.0, 2.0])), "target_epsilon"),
        (dict(algorithm=dict(name="prifedsync", target_epsilon=-1.0)), "target_epsilon"),
        (dict(algorithm=dict(name="prifedsync", planned_rounds=9)), "planned_rounds"),
        (dict(algorithm=dict(name="prifedsync", alpha=1.5)), "alpha"),
        (dict(algorithm=dict(name="prifedsync", sampler="shuffle")), "sampler"),
    ],
)
def test_bad_config_names_the_field(over, field) -> None:
    with pytest.raises(ConfigError, match=field):
        _config(**over)


def test_target_without_sigma_is_fine_with_noise_calibration() -> None:
    config = _config(
        privacy=dict(delta=1e-5), algorithm=dict(name="prifedsync", target_epsilon=5.0)
    )
    assert config.privacy.noise_multiplier is None
    _, _, clients = _build(config)
    assert all(c.target_epsilon == 5.0 for c in clients.values())


def test_epsilon_max_is_the_target_of_clients_without_their_own() -> None:
    config = _config(
        privacy=dict(epsilon_max=6.0, delta=1e-5),
        algorithm=dict(name="prifedsync", target_epsilon=[2.0, None, None, None, None, None]),
    )
    _, _, clients = _build(config)
    assert clients[0].target_epsilon == 2.0
    assert all(clients[c].target_epsilon == 6.0 for c in range(1, 6))
    assert clients[0].mechanism.noise_multiplier > clients[1].mechanism.noise_multiplier


def test_local_epoch_sets_each_clients_steps_from_its_own_size() -> None:
    _, _, clients = _build(
        _config(algorithm=dict(name="prifedsync", local_epoch=True), training__local_steps=1000)
    )
    for c in clients.values():
        assert c.mechanism.local_steps == math.ceil(len(c.y_train) / 8)
    _, _, capped = _build(_config(algorithm=dict(name="prifedsync", local_epoch=True)))
    assert all(c.mechanism.local_steps == 4 for c in capped.values())


def test_batch_larger_than_a_client_is_refused_at_the_silo() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="training.batch_size"):
            _build(_config(training__batch_size=1000))
    assert isinstance(PriFedSyncClient, type)
