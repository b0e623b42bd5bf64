"""IDP-FedAvg end to end: sampling, clipping, noise, budgets, both trust models, baselines."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch

from pdpfl.config import ConfigError, config_from_dict
from pdpfl.fl import idp_fedavg as idp
from pdpfl.fl.api import Aggregate, Contribution, FederationInfo, check_contribution
from pdpfl.randomness import SecureRandomness, SeededRandomness

CONFIG = {
    "name": "idp-toy",
    "seed": 3,
    "randomness": "reproducible",
    "threads": 1,
    "data": {"dataset": "digits", "num_clients": 100, "partition": "iid"},
    "model": {"name": "logreg"},
    "algorithm": {
        "name": "idp-fedavg",
        "clients_per_round": 20,
        "group_budgets": [1.0, 2.0, 3.0],
        "group_ratios": [0.54, 0.37, 0.09],
        "assignment": "exact",
        "local_epochs": 1,
        "local_batch_size": 16,
    },
    "privacy": {"delta": 1e-3},
    "training": {"rounds": 3, "local_steps": 1, "optimizer": "sgd", "lr": 0.5},
}


def _config(**algo):
    raw = {**CONFIG, "algorithm": {**CONFIG["algorithm"], **algo}}
    return config_from_dict(raw)


def _setup(**overrides) -> idp.IdpSetup:
    """A hand-made publication (no accounting) for unit tests of server and client."""
    base = dict(
        method="individual",
        variant="central",
        delta=1e-3,
        rounds=50,
        num_clients=6,
        clients_per_round=2.0,
        budgets=(1.0, 2.0, math.inf),
        sizes=(2.0, 2.0, 2.0),
        assigned=(1.0, 2.0, None),
        rates=(0.2, 0.5, 1.0),
        clip_factors=(1.0, 1.0, 1.0),
        noise_multiplier=1.2,
        value_noise_multiplier=1.3,
        count_noise_std=0.5,
        denominator=3.4,
        clipping="adaptive",
        initial_clip=0.1,
        target_quantile=0.5,
        clip_lr=0.2,
        server_lr=1.0,
        asked_per_round=0,
        survivors=0,
        local=idp.LocalTraining(epochs=1, batch_size=4, optimizer="sgd", lr=0.1, strategy="loop"),
        rate_fractions="realized",
        observers=("third-party",),
    )
    base.update(overrides)
    if base["variant"] == "distributed" and "survivors" not in overrides:
        base["survivors"] = base["asked_per_round"]  # every share in every sum
    for key in (
        "budgets",
        "sizes",
        "assigned",
        "rates",
        "clip_factors",
        "observers",
    ):
        base[key] = tuple(base[key])
    return idp.IdpSetup(**base)


def _silo(cid, data, budget, pub, randomness, factory=None):
    """The silo of ``pub``'s variant, as the config section builds it."""
    cls = idp.CentralIdpSilo if pub.variant == "central" else idp.DistributedIdpSilo
    return cls(
        cid,
        data,
        budget,
        pub,
        randomness=randomness,
        model_factory=factory or (lambda: torch.nn.Linear(4, 3)),
    )


class _ZeroStream:
    def uniform(self, n):
        return np.full(int(n), 0.5)

    def normal(self, shape):
        return torch.zeros(tuple(int(s) for s in shape), dtype=torch.float64)


class _ZeroNoise:
    """Randomness whose normals are 0 (to check the deterministic part of the server)."""

    mode = "reproducible"
    label = "zero"

    def stream(self, purpose, *indices):
        return _ZeroStream()


# ------------------------------------------------------------------------------ sampling


def test_client_sampling_frequencies_match_the_group_rates():
    pub = _setup(num_clients=60, sizes=[20.0, 20.0, 20.0], rates=[0.05, 0.3, 1.0])
    groups = np.repeat([0, 1, 2], 20)
    server = idp.CentralIdpServer(
        [np.zeros(3, np.float32)], pub, client_groups=groups, randomness=SecureRandomness()
    )
    rounds = 3000
    counts = np.zeros(60)
    empty = 0
    for t in range(rounds):
        chosen = server.select_clients(t, list(range(60)))
        counts[chosen] += 1
        empty += not chosen
    for g, q in enumerate(pub.rates):
        freq = counts[groups == g] / rounds
        sd = math.sqrt(q * (1 - q) / rounds) + 1e-12
        assert np.all(np.abs(freq - q) <= 5 * sd + 1e-12), (g, freq, q)
    # distributed variant: each client's own coin, same frequencies
    cpub = _setup(variant="distributed", asked_per_round=6, rates=[0.05, 0.3, 1.0])
    data = _tiny_data()
    client = _silo(0, data, 2.0, cpub, SecureRandomness())
    freq = np.mean([client.participates(t, {}) for t in range(rounds)])
    assert abs(freq - 0.3) <= 5 * math.sqrt(0.3 * 0.7 / rounds)


def _tiny_data(n=8, seed=0):
    from pdpfl.data.federation import ClientData

    rng = np.random.default_rng(seed)
    return ClientData(
        name="c",
        x_train=rng.random((n, 4)),
        y_train=rng.integers(0, 3, n),
        x_test=rng.random((3, 4)),
        y_test=rng.integers(0, 3, 3),
        record_ids=np.arange(n) + 1000 * seed,
    )


# ---------------------------------------------------------------------- server aggregation


def test_central_server_clips_adapts_and_noises_on_a_fixed_sequence():
    """With zero noise: mean of clipped updates / denominator, and C_t follows the geometric
    rule with the exact unclipped fraction; every update is clipped to C_t."""
    pub = _setup(count_noise_std=0.5, value_noise_multiplier=1.3, denominator=2.0)
    server = idp.CentralIdpServer(
        [np.zeros(2, np.float32)],
        pub,
        client_groups=np.zeros(6, dtype=np.int64),
        randomness=_ZeroNoise(),
    )
    norms_per_round = [[0.05, 0.3], [0.2, 0.01, 0.5], [0.02, 0.03], [1.0]]
    params = [np.zeros(2, np.float32)]
    clip = 0.1
    for t, norms in enumerate(norms_per_round):
        assert server.round_config(t)["clip_norm"] == pytest.approx(clip)
        server.select_clients(t, list(range(6)))
        contribs = [Contribution(update=[np.array([n, 0.0], np.float32)]) for n in norms]
        agg = Aggregate(
            total=[np.zeros(2, np.float32)],
            weight=len(norms),
            metrics={},
            count=len(norms),
            contributions=contribs,
        )
        new = server.aggregate(t, params, agg)
        expected = sum(min(n, clip) for n in norms) / pub.denominator
        assert new[0][0] == pytest.approx(params[0][0] + expected, rel=1e-5)
        below = sum(n <= clip for n in norms)
        b = (below - 0.5 * len(norms)) / pub.denominator + 0.5
        clip = idp.clip_update(clip, b, 0.5, 0.2)
        assert server.clip_norm == pytest.approx(clip)
        params = new
    assert server.clip_history[0] == pytest.approx(0.1)


def test_crafted_updates_cannot_exceed_the_clip_bound_or_poison_the_sum():
    pub = _setup(denominator=1.0)
    server = idp.CentralIdpServer(
        [np.zeros(3, np.float32)],
        pub,
        client_groups=np.zeros(6, dtype=np.int64),
        randomness=_ZeroNoise(),
    )
    server.select_clients(0, list(range(6)))
    bad = [
        np.array([1e30, -1e30, 3e38], np.float32),
        np.array([np.nan, 0, 0], np.float32),
        np.array([np.inf, 1, 1], np.float32),
    ]
    agg = Aggregate(
        total=[np.zeros(3, np.float32)],
        weight=3,
        metrics={},
        count=3,
        contributions=[Contribution(update=[b]) for b in bad],
    )
    new = server.aggregate(0, [np.zeros(3, np.float32)], agg)
    assert np.all(np.isfinite(new[0]))
    assert float(np.linalg.norm(new[0])) <= pub.initial_clip * (1 + 1e-6)  # one clipped update


def test_an_empty_round_still_gets_noise_and_moves_the_clip():
    pub = _setup()
    server = idp.CentralIdpServer(
        [np.zeros(50, np.float32)],
        pub,
        client_groups=np.zeros(6, dtype=np.int64),
        randomness=SeededRandomness(1),
    )
    agg = Aggregate(
        total=[np.zeros(50, np.float32)], weight=0, metrics={}, count=0, contributions=[]
    )
    new = server.aggregate(0, [np.zeros(50, np.float32)], agg)
    std = float(np.std(new[0]))
    expected = pub.value_noise_multiplier * pub.initial_clip / pub.denominator
    assert 0.6 * expected < std < 1.4 * expected
    assert server.clip_norm != pytest.approx(pub.initial_clip)


def test_central_variant_refuses_secure_summation():
    from pdpfl.fl.aggregation import check_compatible

    class Hiding:
        name = "secure"
        hides_individual_updates = True

    server = idp.CentralIdpServer(
        [np.zeros(1, np.float32)],
        _setup(),
        client_groups=np.zeros(6, dtype=np.int64),
        randomness=SecureRandomness(),
    )
    with pytest.raises(ValueError, match="needs each silo's update"):
        check_compatible(server, Hiding())
    dist = idp.DistributedIdpServer(
        [np.zeros(1, np.float32)],
        _setup(variant="distributed", asked_per_round=6),
        client_groups=None,
        randomness=SecureRandomness(),
    )
    check_compatible(dist, Hiding())  # the distributed variant works with secure summation


def test_distributed_noise_shares_add_up_to_the_central_noise():
    m = 40
    pub = _setup(
        variant="distributed",
        asked_per_round=m,
        num_clients=m,
        rates=[1e-12, 1e-12, 1e-12],
        budgets=[1.0, 2.0, 3.0],
        assigned=[1.0, 2.0, 3.0],
    )
    total = np.zeros(200)
    count = 0.0
    for cid in range(m):
        client = _silo(cid, _tiny_data(seed=cid), 1.0, pub, SecureRandomness())
        c = client.fit([np.zeros(200, np.float32)], 0, {"clip_norm": 0.5})
        check_contribution(c, idp.DistributedIdpServer.public_metrics, 1)
        assert set(c.metrics) == {"clip_count"}
        total += c.update[0]
        count += c.metrics["clip_count"]
    target = pub.value_noise_multiplier * 0.5
    assert 0.75 * target < float(np.std(total)) < 1.25 * target
    assert abs(count) < 6 * pub.count_noise_std


def test_distributed_client_clips_its_update_to_the_public_clip_norm():
    pub = _setup(
        variant="distributed",
        asked_per_round=1,
        num_clients=1,
        rates=[1.0, 1.0, 1.0],
        value_noise_multiplier=1e-9,
        count_noise_std=1e-9,
        local=idp.LocalTraining(epochs=3, batch_size=4, lr=5.0, strategy="loop"),
    )
    # a non-private client (ε = ∞) is still clipped: its update bounds everyone's sensitivity
    client = _silo(0, _tiny_data(), math.inf, pub, SeededRandomness(0))
    params = [p.detach().numpy().copy() for p in torch.nn.Linear(4, 3).parameters()]
    c = client.fit(params, 0, {"clip_norm": 0.01})
    norm = math.sqrt(sum(float(np.sum(np.asarray(u, np.float64) ** 2)) for u in c.update))
    assert norm <= 0.01 * (1 + 1e-6)
    assert c.metrics["clip_count"] == pytest.approx(-0.5, abs=1e-6)  # it was clipped


# ------------------------------------------------------------------------- budgets


def test_a_client_stops_before_it_would_exceed_its_budget():
    """Run past the planned rounds: the ledger stops the client, which then releases zeros."""
    # ε after k rounds at q = 0.5, σ = 2, δ = 1e-3: 0.98, 1.36, 1.66, 1.92, ... 2.37 (k = 6)
    pub = _setup(
        rounds=4,
        rates=[0.5, 0.5, 1.0],
        clipping="fixed",
        value_noise_multiplier=2.0,
        count_noise_std=None,
    )
    assert pub.noise_multipliers == (2.0, 2.0, None)  # what the ledger charges
    client = _silo(0, _tiny_data(), 2.0, pub, SeededRandomness(0))
    params = [p.detach().numpy().copy() for p in torch.nn.Linear(4, 3).parameters()]
    released = []
    for t in range(12):
        c = client.fit(params, t, {"clip_norm": 0.1})
        released.append(max(float(np.abs(u).max()) for u in c.update))
        client.evaluate(params, t, {})
    tp = client.spent()["third-party"]
    assert client.stopped and 1.9 < tp <= 2.0
    assert client.ledger.sat_out_rounds[0] == 8
    summary = client.privacy_summary()
    assert summary.unit == "client" and summary.units == 1
    assert summary.over_budget("third-party") == 0 and summary.stopped == 1
    assert released[0] > 0 and released[-1] == 0.0
    # the state is plain JSON (pickle-free, cheap checkpoints) and resumes exactly
    state = client.state_dict()
    json.dumps(state)
    other = _silo(0, _tiny_data(), 2.0, pub, SeededRandomness(0))
    other.load_state_dict(state)
    assert other.spent() == client.spent() and other.stopped


def test_budget_file_with_nonprivate_clients(tmp_path):
    path = tmp_path / "budgets.csv"
    path.write_text("epsilon\n1.0\ninf\n2\n2\n")
    algo = _config(budget_file=str(path)).algorithm
    np.testing.assert_array_equal(idp.assign_client_budgets(algo, 0, 4), [1.0, np.inf, 2, 2])
    assert idp.client_budget(algo, 0, 4, 1) == math.inf
    with pytest.raises(ValueError, match="4 budgets for 5 clients"):
        idp.assign_client_budgets(algo, 0, 5)
    path.write_text("1\n-2\n")
    with pytest.raises(ValueError, match="budget_file"):
        idp.read_budget_file(path)


def test_iid_and_exact_assignment():
    iid = idp.assign_client_budgets(_config(assignment="iid").algorithm, 5, 2000)
    exact = idp.assign_client_budgets(_config().algorithm, 5, 100)
    assert abs(np.mean(iid == 1.0) - 0.54) < 0.05
    assert [int(np.sum(exact == b)) for b in (1.0, 2.0, 3.0)] == [54, 37, 9]
    single = [idp.client_budget(_config(assignment="iid").algorithm, 5, 2000, i) for i in range(5)]
    assert single == iid[:5].tolist()


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"group_ratios": [0.5, 0.4, 0.2]}, "algorithm.group_ratios"),
        ({"group_budgets": [1.0, 2.0]}, "algorithm.group_ratios"),
        ({"clients_per_round": 500}, "algorithm.clients_per_round"),
        ({"method": "fancy"}, "algorithm.method"),
    ],
)
def test_bad_configs_name_the_field(change, needle):
    with pytest.raises(ConfigError, match=needle):
        _config(**change)
    with pytest.raises(ConfigError, match="privacy.adversary"):
        config_from_dict({**CONFIG, "privacy": {"delta": 1e-3, "adversary": "server"}})


def test_publication_round_trips_through_json_with_infinite_budgets():
    pub = _setup()
    back = idp.IdpSetup.from_dict(json.loads(json.dumps(pub.to_dict(), allow_nan=False)))
    assert back == pub and back.group_of(math.inf) == 2
    with pytest.raises(ValueError, match="unknown fields"):
        idp.IdpSetup.from_dict({**pub.to_dict(), "cohort": "x"})


# ------------------------------------------------------------ batching = the per-client loop


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["central", "distributed"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_transport_batch_equals_each_silo_alone_and_the_loop(optimizer, variant, monkeypatch):
    """The in-process transport trains silos of equal batch_key in one batched call (prepare →
    train_batch → finish, vmap over the clients); each contribution equals the one the silo
    computes alone with the per-client loop (the Flower case), with the same randomness, and
    the batched evaluation equals each silo's own."""
    from pdpfl.fl.idp_fedavg import silo as silo_module
    from pdpfl.models import create_model
    from pdpfl.runtime.simulation import InProcessTransport

    def factory():
        torch.manual_seed(0)
        return create_model("mlp", (4,), 3, hidden=[8])

    calls = []
    real = silo_module.train_clients

    def counting(model, params, datasets, local):
        calls.append((len(datasets), local.strategy))
        return real(model, params, datasets, local)

    monkeypatch.setattr(silo_module, "train_clients", counting)

    def pub(strategy):
        local = idp.LocalTraining(
            epochs=2, batch_size=3, optimizer=optimizer, lr=0.05, strategy=strategy
        )
        return _setup(
            local=local,
            num_clients=5,
            variant=variant,
            rates=[1.0, 1.0, 1.0],  # every client is sampled: the batch has all five
            budgets=(10.0, 20.0, math.inf),  # a round's ε (σ_v = 1.3, q = 1) fits every budget
            assigned=(10.0, 20.0, None),
            asked_per_round=5 if variant == "distributed" else 0,
        )

    budgets = [10.0, 20.0, math.inf, 20.0, math.inf]

    def silos(strategy):
        return {
            i: _silo(
                i,
                _tiny_data(n=5 + 3 * i, seed=i),
                budgets[i],
                pub(strategy),
                SeededRandomness(7),
                factory,
            )
            for i in range(5)
        }

    together, alone = silos("batched"), silos("loop")
    params = [p.detach().numpy().copy() for p in factory().parameters()]
    config = {"clip_norm": 0.5}
    transport = InProcessTransport(together)
    a = transport.fit(list(range(5)), params, 0, config)
    trained = [
        c for c in range(5) if not together[c].stopped and together[c].participates(0, config)
    ]
    assert calls == [(len(trained), "batched")] and len(trained) >= 3  # one batched call
    calls.clear()
    b = [alone[c].fit(params, 0, config) for c in range(5)]
    assert calls == [(1, "loop")] * len(trained)
    for x, y in zip(a, b, strict=True):
        assert x.weight == y.weight and set(x.metrics) == set(y.metrics)
        for k in x.metrics:
            assert x.metrics[k] == pytest.approx(y.metrics[k], abs=1e-9)
        for u, v in zip(x.update, y.update, strict=True):
            np.testing.assert_allclose(u, v, atol=1e-5)
    for c in range(5):
        if together[c].ledger is not None:
            assert together[c].ledger.state_dict().keys() == alone[c].ledger.state_dict().keys()
            for key, value in together[c].ledger.state_dict().items():
                np.testing.assert_array_equal(value, alone[c].ledger.state_dict()[key])
    # batched evaluation of every silo equals each silo's own evaluation
    evals = transport.evaluate(list(range(5)), params, 0, {})
    for c in range(5):
        ey = alone[c].evaluate(params, 0, {})
        assert evals[c]["n"] == ey["n"] and evals[c]["accuracy"] == pytest.approx(ey["accuracy"])
        assert evals[c]["loss"] == pytest.approx(ey["loss"], rel=1e-5)


def test_auto_strategy_uses_the_loop_for_conv_nets():
    from pdpfl.models import create_model

    assert idp.choose_strategy("auto", create_model("idp-cnn", (1, 28, 28), 10)) == "loop"
    assert idp.choose_strategy("auto", create_model("mlp", (64,), 10)) == "batched"
    assert idp.choose_strategy("batched", create_model("idp-cnn", (1, 28, 28), 10)) == "batched"


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    from pdpfl.runtime.simulation import run_simulation

    out = tmp_path_factory.mktemp("idp") / "run"
    summary = run_simulation(_config(), out, progress=False)
    return summary, out


@pytest.mark.slow
def test_end_to_end_no_client_over_budget(toy_run):
    summary, out = toy_run
    assert summary["completed"] and summary["privacy_unit"] == "client"
    assert summary["over_budget"] == 0 and summary["units"] == 100  # 100 clients
    groups = summary["per_group"]
    assert set(groups) == {"1", "2", "3"}
    assert [groups[k]["count"] for k in ("1", "2", "3")] == [54, 37, 9]
    for g in groups.values():
        assert g["max_spent_third_party"] <= g["budget"]
        assert g["mean_utilization_third_party"] > 0.99  # all planned rounds were used
    rates = [groups[k]["rate"] for k in ("1", "2", "3")]
    assert rates[0] < 0.2 < rates[1] < rates[2]
    assert summary["noise_multiplier"] > 0
    assert summary["neighbouring"].startswith("add/remove one client")
    assert 0.0 <= summary["final_accuracy"] <= 1.0
    # one ledger for the N clients (the simulator's client pool), one row per client, each
    # unit named by the client's name from the data
    from pdpfl.ledger import load_ledger
    from pdpfl.ledger.table import privacy_table
    from pdpfl.reports.compare import mechanism_columns
    from pdpfl.runtime.simulation import load_federation_for

    names = [c.name for c in load_federation_for(_config()).clients]
    ledger = load_ledger(out / "ledgers" / "clients.npz")
    assert ledger.unit == "client" and ledger.ids.tolist() == names
    assert sorted(p.name for p in (out / "ledgers").glob("*.npz")) == ["clients.npz"]
    table = privacy_table(out)
    assert sorted(table["id"].tolist()) == sorted(names)
    assert set(table["unit"].tolist()) == {"client"}
    # pdpfl compare's mechanism columns: σ_SAMPLE and each group's rate
    columns = mechanism_columns(summary)
    assert columns["sigma"] == summary["noise_multiplier"]
    assert [columns[f"rate_{k}"] for k in ("1", "2", "3")] == rates


@pytest.mark.slow
def test_resume_reproduces_an_uninterrupted_run(toy_run, tmp_path):
    from pdpfl.runtime.loop import load_checkpoint
    from pdpfl.runtime.simulation import run_simulation

    _, out = toy_run
    cfg = _config()
    run_simulation(cfg, tmp_path / "r", progress=False, stop_after=2)
    run_simulation(cfg, tmp_path / "r", resume=True, progress=False)
    a = np.load(out / "model.npz")
    b = np.load(tmp_path / "r" / "model.npz")
    for k in a.files:
        np.testing.assert_allclose(a[k], b[k], atol=1e-6)
    assert load_checkpoint(tmp_path / "r")["next_round"] == 3


def test_sample_sees_realized_counts_or_nominal_ratios(monkeypatch):
    seen = {}

    def fake(levels, sizes, q, **kw):
        seen["levels"], seen["sizes"] = list(levels), list(sizes)
        return idp.GroupRates(
            tuple(levels),
            tuple(sizes),
            (q,) * len(levels),
            1.0,
            (0.5,) * len(levels),
            q,
            q,
            1e-3,
            3,
        )

    from pdpfl.fl.idp_fedavg import mechanism

    monkeypatch.setattr(mechanism, "sample_group_rates", fake)
    info = FederationInfo(input_shape=(64,), num_classes=10, client_ids=tuple(range(100)))
    cfg = _config(assignment="iid")
    cfg.algorithm.setup(cfg, info)
    counts = np.unique(idp.assign_client_budgets(cfg.algorithm, cfg.seed, 100), return_counts=True)[
        1
    ]
    assert seen["sizes"] == counts.tolist() and seen["sizes"] != [54.0, 37.0, 9.0]
    nominal = _config(assignment="iid", rate_fractions="nominal")
    nominal.algorithm.setup(nominal, info)
    assert seen["levels"] == [1.0, 2.0, 3.0]
    assert seen["sizes"] == pytest.approx([54.0, 37.0, 9.0])


def test_comparison_setups_strict_relaxed_scale_nodp():
    info = FederationInfo(input_shape=(64,), num_classes=10, client_ids=tuple(range(100)))
    configs = {m: _config(method=m) for m in ("strict", "relaxed", "scale", "no-dp")}
    pubs = {
        m: idp.IdpSetup.from_dict(c.algorithm.setup(c, info).to_dict()) for m, c in configs.items()
    }
    q = 20 / 100
    for pub in pubs.values():
        assert list(pub.rates) == [pytest.approx(q)] * 3 and pub.denominator == pytest.approx(20)
    assert pubs["strict"].noise_multiplier == pytest.approx(idp.noise_for_rate(1.0, q, 1e-3, 3))
    assert pubs["relaxed"].noise_multiplier == pytest.approx(idp.noise_for_rate(3.0, q, 1e-3, 3))
    assert pubs["strict"].assigned == (1.0,) * 3 and pubs["relaxed"].assigned == (3.0,) * 3
    scale = pubs["scale"]
    assert scale.clip_factors[0] < 1 < scale.clip_factors[2]
    assert all(
        s >= idp.noise_for_rate(b, q, 1e-3, 3) * (1 - 1e-9)
        for s, b in zip(scale.noise_multipliers, scale.budgets, strict=True)
    )
    assert pubs["no-dp"].noise_multiplier is None and not pubs["no-dp"].private


@pytest.mark.slow
def test_compare_cli_methods_table_and_csv(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from pdpfl.cli import app

    cfg = tmp_path / "idp.yaml"
    # the toy run's σ and rates are memoized; five methods re-use the data on purpose
    cfg.write_text(yaml.safe_dump({**CONFIG, "lifetime": {"allow_respend": True}}))
    out_csv = tmp_path / "cmp.csv"
    res = CliRunner().invoke(
        app,
        [
            "compare",
            str(cfg),
            "--csv",
            str(out_csv),
            "--methods",
            "idp-fedavg",
            "strict",
            "relaxed",
            "scale",
            "no-dp",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = {r["method"]: r for r in csv.DictReader(out_csv.open())}
    assert list(rows) == ["idp-fedavg", "strict", "relaxed", "scale", "no-dp"]
    for m in ("idp-fedavg", "strict", "scale"):
        assert int(rows[m]["over_budget"]) == 0
    # relaxed spends ε_max = 3 for everyone, beyond the 91 clients who chose 1 or 2;
    # no-dp has no guarantee at all (ε = ∞ for all 100 clients)
    assert int(rows["relaxed"]["over_budget"]) == 91
    assert int(rows["no-dp"]["over_budget"]) == 100
    assert float(rows["idp-fedavg"]["rate_1"]) < float(rows["idp-fedavg"]["rate_3"])
    assert float(rows["strict"]["sigma"]) > float(rows["relaxed"]["sigma"])
    assert rows["no-dp"]["sigma"] == ""
    assert "σ" in res.output and "q[1]" in res.output


@pytest.mark.slow
def test_the_digits_example_reports_per_client(tmp_path):
    """``pdpfl run examples/idp_digits.yaml`` (offline) prints the run in its own unit --
    clients over budget, ε per observer and per budget group -- draws it in epsilon.png, and
    ``pdpfl privacy`` answers for each client by name."""
    from pathlib import Path

    from typer.testing import CliRunner

    from pdpfl.cli import app

    example = Path(__file__).resolve().parents[1] / "examples" / "idp_digits.yaml"
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(example), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "clients over budget" in res.output and "0 of 60" in res.output
    assert "max ε (third-party)" in res.output
    assert "per budget group (clients)" in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert [g["label"] for g in summary["privacy"]["groups"]] == ["1", "2", "3"]
    assert (out / "epsilon.png").stat().st_size > 10_000
    res = CliRunner().invoke(app, ["privacy", str(out), "--id", "client-7"])
    assert res.exit_code == 0, res.output
    assert "client client-7" in res.output and "third party: ε spent" in res.output
    res = CliRunner().invoke(app, ["privacy", str(out)])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((out / "privacy.csv").open()))
    assert len(rows) == 60 and {r["id"] for r in rows} == {f"client-{i}" for i in range(60)}
    assert all(float(r["epsilon_third_party"]) <= float(r["budget"]) for r in rows)
