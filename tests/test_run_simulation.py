"""End-to-end rPDP-FL runs on tiny offline federations (digits, breast-cancer).

Runs that compare two executions use ``randomness: reproducible`` explicitly (the research mode);
everything else runs with the default secure randomness.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pdpfl.config import config_from_dict, with_updates
from pdpfl.fl.algorithm import build_federation_algorithms
from pdpfl.runtime.loop import read_metrics, run_federation
from pdpfl.runtime.simulation import InProcessTransport, load_federation_for, run_simulation

TINY = {
    "name": "tiny",
    "seed": 5,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 4},
    "model": {"name": "logreg"},
    "budgets": {
        "scenario": "three-levels",
        "params": {"values": [0.5, 2.0, 8.0], "ratios": [0.5, 0.3, 0.2]},
    },
    "privacy": {"epsilon_max": 8.0, "delta": 1e-3, "adversary": "both"},
    "training": {"rounds": 6, "local_steps": 3, "client_rate": 0.5, "lr": 0.5, "batch_size": 8},
}

pytestmark = pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning")


def _run(overrides: list[str] | None = None):
    """(config, server, clients, result) of an in-memory run (no files kept by the caller)."""
    cfg = config_from_dict(TINY, overrides)
    fed = load_federation_for(cfg)
    server, clients = build_federation_algorithms(cfg, fed)
    return cfg, server, clients, fed


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory: pytest.TempPathFactory):
    cfg, server, clients, fed = _run()
    out = tmp_path_factory.mktemp("partial")
    result = run_federation(cfg, server, InProcessTransport(clients), out, progress=False)
    return cfg, server, clients, result, out


@pytest.mark.slow
def test_no_record_over_budget_for_either_adversary(partial_run) -> None:
    cfg, server, clients, result, _ = partial_run
    for c in clients.values():
        for adv in ("third-party", "server"):
            spent = c.spent(adv)
            assert np.all(spent <= c.budgets * (1 + 1e-9)), (c.client_id, adv)
    # one typed summary merged over the silos (it was a dict of per-silo flat summaries)
    assert result["privacy"].over_budget("third-party") == 0
    assert result["privacy"].over_budget("server") == 0
    assert result["privacy"].units == sum(len(c.budgets) for c in clients.values())


@pytest.mark.slow
def test_lambda_below_one_leaves_clients_out_and_type_I_follows_participation(partial_run) -> None:
    cfg, server, clients, result, _ = partial_run
    T = cfg.training.rounds
    parts = {cid: c.participations for cid, c in clients.items()}
    assert parts == {cid: server.participation.get(cid, 0) for cid in clients}
    assert min(parts.values()) < T  # someone sat out some round
    selected = [set(m["selected"]) for m in result["metrics"]]
    assert any(len(s) < len(clients) for s in selected)
    assert {cid: sum(cid in s for s in selected) for cid in clients} == parts
    # Third-party ε of a q = 1 record does not depend on participation; Type I ε does.
    top = {cid: c.spent("server")[c.rates == c.rates.max()].max() for cid, c in clients.items()}
    for a in clients:
        for b in clients:
            if parts[a] < parts[b]:
                assert top[a] <= top[b] + 1e-12
            if parts[a] == 0:
                assert top[a] == 0.0
    tp = [c.spent("third-party")[c.rates == c.rates.max()].max() for c in clients.values()]
    assert np.ptp(tp) <= 1e-9 * max(tp)


@pytest.mark.slow
def test_larger_budgets_are_sampled_more_often() -> None:
    cfg, server, clients, fed = _run(
        ["client_rate=1.0", "rounds=4", "local_steps=25", "privacy.adversary=third-party"]
    )
    run_federation(cfg, server, InProcessTransport(clients), _tmp(), progress=False)
    freq_by_q: dict[float, list[float]] = {}
    for c in clients.values():
        steps = c.participations * cfg.training.local_steps
        assert steps > 0
        for q in np.unique(c.rates):
            mask = c.rates == q
            freq_by_q.setdefault(float(q), []).extend((c.selection_counts[mask] / steps).tolist())
    qs = sorted(freq_by_q)
    assert len(qs) == 3
    means = [float(np.mean(freq_by_q[q])) for q in qs]
    assert means == sorted(means)
    for q, m in zip(qs, means, strict=True):
        n = len(freq_by_q[q]) * 4 * 25
        assert abs(m - q) <= 6 * np.sqrt(q * (1 - q) / n) + 1e-12


def _tmp() -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="pdpfl-test-"))


@pytest.mark.slow
def test_resume_equals_uninterrupted(tmp_path: Path) -> None:
    cfg = config_from_dict(TINY, ["rounds=4"])
    fed = load_federation_for(cfg)
    # the same data twice, each run with its own budget store (as if on two copies of it)
    full = run_simulation(
        with_updates(cfg, [f"lifetime.store={tmp_path / 'store-full'}"]),
        tmp_path / "full",
        progress=False,
        federation=fed,
    )
    cfg = with_updates(cfg, [f"lifetime.store={tmp_path / 'store-part'}"])
    part = run_simulation(cfg, tmp_path / "part", progress=False, federation=fed, stop_after=2)
    assert part["rounds_completed"] == 2 and not part["completed"]
    resumed = run_simulation(cfg, tmp_path / "part", True, progress=False, federation=fed)
    assert resumed["rounds_completed"] == 4 and resumed["completed"]
    a = np.load(tmp_path / "full" / "model.npz")
    b = np.load(tmp_path / "part" / "model.npz")
    for k in a.files:
        np.testing.assert_array_equal(a[k], b[k])
    strip, strip2 = (
        [{k: v for k, v in m.items() if k != "seconds"} for m in read_metrics(tmp_path / d)]
        for d in ("full", "part")
    )
    assert strip == strip2
    for key in ("final_accuracy", "per_group", "over_budget", "participation"):
        assert full[key] == resumed[key]


def test_resume_rejects_a_different_config(tmp_path: Path) -> None:
    cfg = config_from_dict(TINY, ["rounds=3"])
    fed = load_federation_for(cfg)
    run_simulation(cfg, tmp_path, progress=False, federation=fed, stop_after=1)
    with pytest.raises(ValueError, match="different config"):
        run_simulation(
            with_updates(cfg, ["training.lr=0.1"]), tmp_path, True, progress=False, federation=fed
        )


def test_outputs(tmp_path: Path) -> None:
    cfg = config_from_dict(TINY, ["rounds=3", "data.dataset=breast-cancer", "data.num_clients=3"])
    summary = run_simulation(cfg, tmp_path, progress=False)
    for name in (
        "metrics.jsonl",
        "summary.json",
        "model.npz",
        "accuracy.png",
        "epsilon.png",
        "checkpoint.npz",
    ):
        assert (tmp_path / name).is_file(), name
    assert len(list((tmp_path / "ledgers").glob("*.npz"))) == 3
    assert (tmp_path / "ledgers" / "manifest.sealed").is_file()  # the run's sealed list of them
    lines = read_metrics(tmp_path)
    assert [m["round"] for m in lines] == [0, 1, 2]
    assert set(lines[0]["clients"]) == {"0", "1", "2"}
    assert set(lines[0]["privacy"]["spent_max"]) == {"third-party", "server"}
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    for key in (
        "final_accuracy",
        "last3_mean_accuracy",
        "per_group",
        "over_budget",
        "seconds",
        "config",
        "config_hash",
        "randomness",
        "neighbouring",
        "privacy_view",
        "over_budget_third_party",
        "over_budget_server",
        "units_excluded",
        "warnings",
        "schema",
        "privacy",
        "units",
    ):
        assert key in on_disk
    assert on_disk["randomness"].startswith("reproducible (no guarantee")
    assert on_disk["neighbouring"].startswith("add/remove one record")
    assert "train_loss" not in lines[0]  # a noise-free loss is never released
    assert on_disk["last3_mean_accuracy"] == pytest.approx(np.mean([m["accuracy"] for m in lines]))
    groups = summary["per_group"]
    assert [g["budget"] for g in groups.values()] == [0.5, 2.0, 8.0]
    for g in groups.values():
        assert g["max_spent_third_party"] <= g["budget"] * (1 + 1e-9)
        assert 0 <= g["mean_utilization_third_party"] <= 1 + 1e-9


def test_baselines_rates_and_privacy_free(tmp_path: Path) -> None:
    _, _, clients, _ = _run(["algorithm.name=dropout"])
    # ε_mod is the scenario's public expected budget, not a statistic of the silos' budgets.
    mean_budget = 0.5 * 0.5 + 0.3 * 2.0 + 0.2 * 8.0
    realized = np.mean(np.concatenate([c.budgets for c in clients.values()]))
    assert realized != pytest.approx(mean_budget, abs=1e-12)
    for c in clients.values():
        assert np.all(c.rates[c.budgets < mean_budget] == 0)
        kept = c.rates[c.budgets >= mean_budget]
        assert kept.size and np.all(kept == kept[0]) and kept[0] > 0
    _, _, clients, _ = _run(["algorithm.name=minimum"])
    q = np.unique(np.concatenate([c.rates for c in clients.values()]))
    assert q.size == 1 and 0 < q[0] < 1
    assert next(iter(clients.values())).setup.uniform_epsilon == 0.5  # public minimum
    cfg = config_from_dict(
        TINY, ["rounds=2", "algorithm.name=privacy-free", "lifetime.allow_respend=true"]
    )
    summary = run_simulation(cfg, tmp_path, progress=False)
    assert summary["over_budget"] == summary["units"] > 0  # ε = ∞ for every record
    assert summary["per_group"]  # groups still listed, with infinite spend


def test_centralized_runs_on_pooled_data(tmp_path: Path) -> None:
    cfg = config_from_dict(TINY, ["rounds=2", "algorithm.name=centralized"])
    summary = run_simulation(cfg, tmp_path, progress=False)
    assert summary["algorithm"] == "centralized"
    assert summary["over_budget"] == 0
    assert list(summary["participation"]) == ["0"]


@pytest.mark.slow
def test_rpdp_beats_minimum_on_the_digits_demo(tmp_path: Path) -> None:
    from pdpfl.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "examples" / "digits_demo.yaml")
    fed = load_federation_for(cfg)
    acc = {}
    for method in ("rpdp", "minimum"):
        s = run_simulation(
            with_updates(cfg, [f"algorithm.name={method}"]),
            tmp_path / method,
            progress=False,
            federation=fed,
        )
        assert s["over_budget"] == 0
        acc[method] = s["last3_mean_accuracy"]
    assert acc["rpdp"] > acc["minimum"] + 0.05, acc


@pytest.mark.slow
def test_secure_runs_draw_fresh_noise_and_say_so(tmp_path: Path) -> None:
    """Same config, secure randomness: the two runs' models differ (nothing derives from seed)."""
    cfg = config_from_dict(TINY, ["rounds=1", "randomness=secure", "client_rate=1.0"])
    fed = load_federation_for(cfg)
    a = run_simulation(cfg, tmp_path / "a", progress=False, federation=fed)
    run_simulation(cfg, tmp_path / "b", progress=False, federation=fed)
    ma, mb = np.load(tmp_path / "a" / "model.npz"), np.load(tmp_path / "b" / "model.npz")
    assert any(not np.array_equal(ma[k], mb[k]) for k in ma.files)
    assert a["randomness"].startswith("secure")


def test_reproducible_mode_warns() -> None:
    from pdpfl.randomness import ReproducibleRandomnessWarning

    cfg, server, clients, _ = _run(["rounds=1"])
    with pytest.warns(ReproducibleRandomnessWarning, match="seed"):
        run_federation(cfg, server, InProcessTransport(clients), _tmp(), progress=False)


@pytest.mark.slow
def test_third_party_only_runs_warn_when_the_server_view_exceeds_budgets(tmp_path: Path) -> None:
    """The paper's setting (third-party adversary, λ < 1): the server's view can exceed budgets;
    the headline reports it per observer and warns instead of hiding it."""
    cfg = config_from_dict(
        TINY,
        ["rounds=6", "privacy.adversary=third-party", "client_rate=0.3", "local_steps=20"]
        + ["lifetime.allow_respend=true"],  # two runs on the same data, on purpose
    )
    summary = run_simulation(cfg, tmp_path, progress=False)
    assert summary["over_budget_third_party"] == 0
    assert summary["over_budget_server"] > 0
    assert any("server's view exceeds" in w for w in summary["warnings"])
    both = run_simulation(
        with_updates(cfg, ["privacy.adversary=both"]), tmp_path / "both", progress=False
    )
    assert both["over_budget_server"] == both["over_budget_third_party"] == 0
    assert both["warnings"] == []
