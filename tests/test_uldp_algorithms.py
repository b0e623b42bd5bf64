"""ULDP-FL algorithms: server steps (D1, D2, D24), SGD's mean gradient (D7), user masks, GROUP
flags (fixed, ≤ k), weights, configuration checks and warnings."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.config import ConfigError, config_from_dict
from pdpfl.fl.algorithm import build_federation_algorithms
from pdpfl.fl.api import Aggregate
from pdpfl.fl.uldp import (
    check_weights,
    decode_mask,
    encode_mask,
    enhanced_weights,
    fair_group_quotas,
    resolve_group_k,
    split_group_quotas,
    uniform_weights,
)
from pdpfl.models import loss_fn
from pdpfl.runtime.simulation import load_federation_for

BASE = {
    "name": "uldp-toy",
    "seed": 3,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 3, "options": {"num_users": 15}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "uldp-avg"},
    # the continuous option's arithmetic (discrete shares: tests/test_discrete_shares.py)
    "privacy": {"noise_multiplier": 2.0, "delta": 1e-5, "noise_shares": "continuous"},
    "training": {"rounds": 2, "local_steps": 2, "lr": 0.3, "batch_size": 8, "max_grad_norm": 1.0},
}


def _config(*overrides: str):
    return config_from_dict(BASE, list(overrides))


def _build(*overrides: str):
    config = _config(*overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        federation = load_federation_for(config)
        server, clients = build_federation_algorithms(config, federation)
    return config, federation, server, clients


def _round(server, clients, params, t):
    cfg = server.round_config(t)
    outs = [clients[c].fit(params, t, cfg) for c in server.select_clients(t, sorted(clients))]
    total = [sum(np.asarray(o.update[i], np.float64) for o in outs) for i in range(len(params))]
    agg = Aggregate(total=total, weight=float(len(outs)), metrics={}, count=len(outs))
    new = server.aggregate(t, params, agg)
    server.record_round(t, sorted(clients))
    return new, agg


@pytest.mark.parametrize(("name", "sign"), [("uldp-avg", 1.0), ("uldp-sgd", -1.0)])
@pytest.mark.parametrize("rate", [None, 0.5])
@pytest.mark.parametrize("weights", ["uniform", "enhanced"])
def test_server_step_sign_and_divisor(name, sign, rate, weights) -> None:
    # Every combination runs (the reference crashes on AVG-s and ascends on SGD-ws: D1, D2).
    over = [f"algorithm.name={name}", f"algorithm.weights={weights}", "algorithm.server_lr=3.0"]
    if weights == "enhanced":
        over.append("data.public_user_histograms=true")
    if rate is not None:
        over.append(f"algorithm.user_rate={rate}")
    _, _, server, clients = _build(*over)
    params = server.initial_params()
    new, agg = _round(server, clients, params, 0)
    q = 1.0 if rate is None else rate
    assert server.divisor == pytest.approx(q * 3 * 15)  # q·|S|·|U|, a float
    for x, y, s in zip(new, params, agg.total, strict=True):
        np.testing.assert_allclose(x, y + sign * 3.0 / (q * 3 * 15) * s, rtol=1e-5, atol=1e-6)


def test_sgd_descends_and_releases_the_users_mean_gradient() -> None:
    config, fed, server, clients = _build(
        "algorithm.name=uldp-sgd",
        "privacy.noise_multiplier=1e-6",
        "algorithm.server_lr=3",
        "training.max_grad_norm=100",
    )
    silo = clients[0]
    params = server.initial_params()
    # D7: the user's vector is the mean gradient over all of its records (no double division).
    pos = np.arange(min(3, len(silo.users)))
    vectors = silo.user_vectors(params, pos, 0)
    model = silo.model
    from pdpfl.models import set_params

    for j, p in enumerate(pos):
        set_params(model, params)
        idx = silo.user_index[p]
        model.zero_grad()
        loss_fn(model(silo.x_train[idx]), silo.y_train[idx]).backward()
        for v, param in zip(vectors, model.parameters(), strict=True):
            torch.testing.assert_close(v[j], param.grad, rtol=1e-4, atol=1e-6)

    def train_loss(ps):
        tot = 0.0
        for c in clients.values():
            set_params(c.model, ps)
            with torch.no_grad():
                tot += float(loss_fn(c.model(c.x_train), c.y_train))
        return tot

    before = train_loss(params)
    for t in range(3):
        params, _ = _round(server, clients, params, t)
    assert train_loss(params) < before  # gradient *descent* (D1)


def test_user_mask_trains_only_sampled_users_and_empty_rounds_still_add_noise() -> None:
    _, _, server, clients = _build("algorithm.user_rate=0.5")
    silo = clients[1]
    nobody = encode_mask(np.zeros(15, dtype=bool))
    params = server.initial_params()
    assert silo.selected_users({"users": nobody}).size == 0
    out = silo.fit(params, 0, {"round": 0, "users": nobody})
    flat = np.concatenate([u.ravel() for u in out.update])
    assert np.std(flat) == pytest.approx(silo.setup.noise_std, rel=0.35)  # noise only
    with pytest.raises(ValueError, match="mask"):
        silo.fit(params, 1, {"round": 1})  # a sub-sampled round without a mask is refused
    mask = np.zeros(15, dtype=bool)
    mask[silo.users[:2]] = True
    assert list(silo.selected_users({"users": encode_mask(mask)})) == [0, 1]
    np.testing.assert_array_equal(decode_mask(encode_mask(mask), 15), mask)


def test_user_sampling_coins_follow_the_rate() -> None:
    _, _, server, _ = _build("algorithm.user_rate=0.3")
    taken = np.array([server.round_users(t)[1] for t in range(200)])
    assert taken.mean() == pytest.approx(0.3, abs=0.03)


@given(st.lists(st.lists(st.integers(0, 9), min_size=6, max_size=6), min_size=1, max_size=5))
@settings(max_examples=60, deadline=None)
def test_weights_sum_to_at_most_one_and_absent_users_get_none(rows) -> None:
    h = np.array(rows)
    for w in (enhanced_weights(h), uniform_weights(h > 0)):
        check_weights(w)
        assert (w[h == 0] == 0).all()
    sums = enhanced_weights(h).sum(axis=0)
    np.testing.assert_allclose(sums[h.sum(0) > 0], 1.0, atol=1e-12)
    assert (sums <= 1.0).all()


def test_weights_that_sum_above_one_are_refused() -> None:
    with pytest.raises(ValueError, match="Σ_s w"):
        check_weights(np.array([[0.6], [0.5]]))


@given(
    st.lists(st.lists(st.integers(0, 12), min_size=5, max_size=5), min_size=1, max_size=6),
    st.integers(1, 20),
)
@settings(max_examples=60, deadline=None)
def test_group_quotas_keep_each_user_at_most_k(rows, k) -> None:
    h = np.array(rows)
    fair = fair_group_quotas(h, k)
    assert (fair <= h).all() and (fair.sum(0) == np.minimum(k, h.sum(0))).all()
    split = split_group_quotas(h.shape[0], h.shape[1], k)
    assert (split.sum(0) == k).all() and (split >= 0).all()


def test_group_flags_are_fixed_and_bound_users_across_silos() -> None:
    over = (
        "algorithm.name=uldp-group",
        "algorithm.record_rate=0.3",
        "algorithm.group_k=3",
        "algorithm.group_flags=fair",
        "data.public_user_histograms=true",
    )
    config, fed, server, clients = _build(*over)
    kept_total = np.zeros(15, dtype=np.int64)
    for c, silo in clients.items():
        np.add.at(kept_total, fed.clients[c].user_ids[silo.kept], 1)
    assert kept_total.max() <= 3 and kept_total.sum() > 0
    # Same flags every round and in a silo rebuilt from scratch (e.g. a restarted process).
    before = {c: s.kept.copy() for c, s in clients.items()}
    params = server.initial_params()
    for t in range(2):
        params, _ = _round(server, clients, params, t)
    _, _, _, again = _build(*over)
    for c in clients:
        np.testing.assert_array_equal(clients[c].kept, before[c])
        np.testing.assert_array_equal(again[c].kept, before[c])
    report = server.privacy_summary()
    assert report.unit == "user" and report.units == 15
    assert report.spent_max("third-party") > report.info["record_epsilon"] > 0
    assert resolve_group_k("max", np.array([3, 9, 4])) == 9
    assert resolve_group_k("median", np.array([3, 9, 4, 0])) == 4


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["algorithm.weights=enhanced"], "public_user_histograms"),
        (
            ["algorithm.name=uldp-group", "algorithm.group_k=max", "algorithm.record_rate=0.1"],
            "public_user_histograms",
        ),
        (["algorithm.name=uldp-group"], "algorithm.record_rate"),
        (["training.client_rate=0.5"], "training.client_rate"),
        (["algorithm.personal_budgets=true", "algorithm.user_rate=0.5"], "algorithm.user_rate"),
        (
            ["algorithm.name=uldp-naive", "algorithm.personal_budgets=true"],
            "algorithm.personal_budgets",
        ),
    ],
)
def test_bad_configs_name_the_field(overrides, field) -> None:
    with pytest.raises(ConfigError, match=field):
        _config(*overrides)


def test_num_users_is_required() -> None:
    raw = {**BASE, "data": {"dataset": "digits", "num_clients": 3}}
    with pytest.raises(ConfigError, match="num_users"):
        config_from_dict(raw, [])


def test_histogram_disclosure_and_paper_sensitivity_are_warned() -> None:
    _, _, server, _ = _build("algorithm.weights=enhanced", "data.public_user_histograms=true")
    assert any("disclosed" in w for w in server.warnings)
    _, _, server, _ = _build("algorithm.name=uldp-naive", "algorithm.sensitivity=paper")
    assert any("2C" in w for w in server.warnings)
    # The honest ε is that of σ/2: larger than the paper's claim.
    _, _, rigorous, _ = _build("algorithm.name=uldp-naive")
    assert server.observer_noise["third-party"] == pytest.approx(1.0)
    assert rigorous.observer_noise["third-party"] == pytest.approx(2.0)


def test_plain_aggregation_with_enhanced_weights_is_charged_to_the_server() -> None:
    _, _, uniform, clients = _build()
    _, _, enhanced, clients_w = _build(
        "algorithm.weights=enhanced", "data.public_user_histograms=true"
    )
    assert uniform.observer_noise == {"third-party": 2.0, "server": 2.0}
    # σ/√t: each of the 3 silos' noise shares is sized for t(3) = 2 survivors (issue #22)
    assert enhanced.observer_noise["server"] == pytest.approx(2.0 / np.sqrt(2))
    for server, cl in ((uniform, clients), (enhanced, clients_w)):
        params = server.initial_params()
        _round(server, cl, params, 0)
    assert enhanced.privacy_summary().spent_max("server") > uniform.privacy_summary().spent_max(
        "server"
    )
    assert enhanced.privacy_summary().spent_max("third-party") == pytest.approx(
        uniform.privacy_summary().spent_max("third-party")
    )


def test_user_ids_outside_the_declared_users_are_refused() -> None:
    _, fed, _, clients = _build()
    silo = clients[0]
    with pytest.raises(ValueError, match="num_users"):
        type(silo)(
            0,
            silo.model,
            fed.clients[0],
            replace(silo.setup, num_users=2),
            randomness=silo.randomness,
            batch_size=8,
            lr=0.1,
        )


def test_a_silo_refuses_a_published_total_below_its_own_count() -> None:
    _, fed, _, clients = _build("algorithm.weights=enhanced", "data.public_user_histograms=true")
    silo = clients[0]
    totals = list(silo.setup.user_totals)
    totals[int(silo.users[0])] = 0  # a lying histogram would make Σ_s w exceed 1
    with pytest.raises(ValueError, match="N_u"):
        type(silo)(
            0,
            silo.model,
            fed.clients[0],
            replace(silo.setup, user_totals=totals),
            randomness=silo.randomness,
            batch_size=8,
            lr=0.1,
        )


@pytest.mark.parametrize("name", ["uldp-naive", "uldp-avg", "uldp-sgd"])
def test_secure_summation_gives_the_plain_model(name, tmp_path) -> None:
    """``aggregation: secure`` (pairwise masks) changes what the server sees, not the model."""
    from pdpfl.runtime.simulation import run_simulation

    models = {}
    for agg in ("plain", "secure"):
        # the same users twice, on purpose: not a second spending of their budgets
        config = _config(f"algorithm.name={name}", f"aggregation={agg}", "lifetime.allow_respend=1")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            summary = run_simulation(config, tmp_path / agg, progress=False)
        assert summary["aggregation"]["protocol"] == agg
        models[agg] = np.load(tmp_path / agg / "model.npz")
    for key in models["plain"].files:
        np.testing.assert_allclose(models["plain"][key], models["secure"][key], atol=1e-6)


def test_secure_summation_charges_the_server_the_sum_with_enhanced_weights() -> None:
    _, _, plain, _ = _build("algorithm.weights=enhanced", "data.public_user_histograms=true")
    _, _, secure, _ = _build(
        "algorithm.weights=enhanced", "data.public_user_histograms=true", "aggregation=secure"
    )
    assert plain.observer_noise["server"] == pytest.approx(2.0 / np.sqrt(2))  # σ/√t(3)
    assert secure.observer_noise == {"third-party": 2.0, "server": 2.0}


def test_private_weights_refuse_a_second_aggregation_protocol() -> None:
    with pytest.raises(ConfigError, match="aggregation"):
        _config("algorithm.weights=private", "aggregation=secure")


def test_compare_methods_that_change_the_data_options(tmp_path) -> None:
    """``uldp-avg`` then ``uldp-avg-w`` (which declares the histograms public) in one compare:
    each method gets a federation built from its own data section."""
    import csv

    import yaml
    from typer.testing import CliRunner

    from pdpfl.cli import app

    cfg = tmp_path / "u.yaml"
    cfg.write_text(yaml.safe_dump({**BASE, "training": {**BASE["training"], "rounds": 1}}))
    res = CliRunner().invoke(
        app,
        [
            "compare",
            str(cfg),
            "--methods",
            "uldp-avg",
            "uldp-avg-w",
            "--csv",
            str(tmp_path / "rows.csv"),
        ],
    )
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "rows.csv").open()))
    assert [r["method"] for r in rows] == ["uldp-avg", "uldp-avg-w"]
    # enhanced public weights cost more against the server: a larger headline ε
    assert float(rows[1]["epsilon"]) > float(rows[0]["epsilon"])
