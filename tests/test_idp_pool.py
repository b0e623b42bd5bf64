"""IDP-FedAvg's central clients as one pool (issue #37 item 4): one ledger row per client, a
silo only for a sampled client -- and the same privacy as one ledger per client.

The reference is the per-client path the simulator took before (one ``CentralIdpSilo`` with its
own one-row ledger per client, built for the whole run): the simulator is made to take it again
by withdrawing the pool (``build_pool`` → None), and both runs are compared client by client.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pdpfl
from pdpfl.config import config_from_dict
from pdpfl.fl.idp_fedavg import CentralIdpSilo, IdpFedAvgConfig
from pdpfl.ledger import PrivacyLedger
from pdpfl.privacy.unit import PrivacyUnit, SampledGaussianPlan
from pdpfl.runtime.simulation import run_simulation

CONFIG = {
    "name": "idp-pool",
    "seed": 5,
    "randomness": "reproducible",
    "threads": 1,
    "data": {"dataset": "digits", "num_clients": 24, "partition": "iid"},
    "model": {"name": "logreg"},
    "algorithm": {
        "name": "idp-fedavg",
        "clients_per_round": 6,
        # heterogeneous rates (SAMPLE gives each group its own q) and non-private clients
        "group_budgets": [1.0, 2.0, 4.0, float("inf")],
        "group_ratios": [0.4, 0.3, 0.2, 0.1],
        "assignment": "exact",
        "local_epochs": 1,
        "local_batch_size": 16,
        "count_noise_ratio": 1.0,
    },
    "privacy": {"delta": 1e-3},
    "lifetime": {"allow_respend": True},
    "training": {"rounds": 3, "local_steps": 1, "optimizer": "sgd", "lr": 0.5},
}


def _run(out: Path, pooled: bool, monkeypatch: pytest.MonkeyPatch, **over: object) -> dict:
    """The run, then (``rounds`` in ``over``) its extension past the plan, which makes every
    accounted client sit out (pre-check) -- the catch-up, the pre-check and the resume."""
    with monkeypatch.context() as m:
        if not pooled:
            m.setattr(IdpFedAvgConfig, "build_pool", lambda *a, **k: None)
        m.setenv("PDPFL_BUDGET_DIR", str(out.parent / f"budgets-{pooled}"))
        built: list[int] = []
        init = CentralIdpSilo.__init__

        def counted(self: CentralIdpSilo, client_id: int, *a: object, **k: object) -> None:
            built.append(int(client_id))
            init(self, client_id, *a, **k)  # type: ignore[arg-type]

        m.setattr(CentralIdpSilo, "__init__", counted)
        raw = json.loads(json.dumps(CONFIG))
        raw["lifetime"]["store"] = str(out.parent / f"store-{pooled}")
        summary = run_simulation(config_from_dict(raw), out, progress=False)
        if over:
            raw["training"].update(over)
            summary = run_simulation(config_from_dict(raw), out, progress=False, resume=True)
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    return {"summary": summary, "metrics": metrics, "built": built}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    mp = pytest.MonkeyPatch()
    try:
        root = tmp_path_factory.mktemp("pool")
        return {
            name: (root / name, _run(root / name, name == "pooled", mp, rounds=4))
            for name in ("pooled", "per-client")
        }
    finally:
        mp.undo()


@pytest.mark.slow
def test_each_client_has_the_same_epsilon_as_with_its_own_ledger(runs) -> None:
    (a, ra), (b, rb) = runs["pooled"], runs["per-client"]
    assert [m["selected"] for m in ra["metrics"]] == [m["selected"] for m in rb["metrics"]]
    ta = pdpfl.privacy_table(a, as_frame=False)
    tb = pdpfl.privacy_table(b, as_frame=False)
    assert sorted(p.name for p in (a / "ledgers").glob("*.npz")) == ["clients.npz"]
    assert len(list((b / "ledgers").glob("client_*.npz"))) == len(tb["id"]) > 10
    order_a, order_b = np.argsort(ta["id"]), np.argsort(tb["id"])
    assert ta["id"][order_a].tolist() == tb["id"][order_b].tolist()
    assert len(set(np.round(ta["rate"], 12))) == 3  # three privacy groups, three rates
    for col in ("budget", "rate", "noise_multiplier", "rounds_third_party", "stopped"):
        assert ta[col][order_a].tolist() == tb[col][order_b].tolist(), col
    np.testing.assert_allclose(
        ta["epsilon_third_party"][order_a], tb["epsilon_third_party"][order_b], rtol=1e-12
    )
    # the extension past T = 3: every accounted client sat out its 4th round in both
    assert ta["stopped"].all() and (ta["rounds_third_party"] == 3).all()
    assert (ta["epsilon_third_party"] <= ta["budget"] * (1 + 1e-9)).all()


#: summary.json fields equal in both runs.
SAME = ("per_group", "units", "units_stopped", "over_budget", "epsilon", "eps_spent_max",
        "noise_multiplier", "final_accuracy", "rounds_completed")  # fmt: skip


def _same(x: object, y: object, where: str = "") -> None:
    """Equal, up to the order of floating-point sums (a vectorized sum against a running one)."""
    if isinstance(x, dict) and isinstance(y, dict):
        assert sorted(x) == sorted(y), where
        for k in x:
            _same(x[k], y[k], f"{where}/{k}")
    elif isinstance(x, list) and isinstance(y, list):
        assert len(x) == len(y), where
        for k, (u, v) in enumerate(zip(x, y, strict=True)):
            _same(u, v, f"{where}[{k}]")
    elif isinstance(x, float) and isinstance(y, float):
        assert x == pytest.approx(y, rel=1e-12), where
    else:
        assert x == y, where


@pytest.mark.slow
def test_the_run_and_its_report_are_the_same(runs) -> None:
    (a, ra), (b, rb) = runs["pooled"], runs["per-client"]
    sa, sb = ra["summary"], rb["summary"]
    for key in (*SAME, "privacy", "risk"):
        _same(sa[key], sb[key], key)
    _same(sa["lifetime"]["eps_max"], sb["lifetime"]["eps_max"])
    _same([m["privacy"] for m in ra["metrics"]], [m["privacy"] for m in rb["metrics"]])
    for la, lb in zip(ra["metrics"], rb["metrics"], strict=True):  # pooled: no per-client map
        assert "clients" not in la and la["clients_evaluated"] == len(lb["clients"]) == 24
        assert la["test_records"] == sum(c["n"] for c in lb["clients"].values()) > 0
        for key in ("accuracy", "loss", "mean_client_accuracy"):
            assert la[key] == pytest.approx(lb[key], rel=1e-12), key
    with np.load(a / "model.npz") as ma, np.load(b / "model.npz") as mb:
        assert sorted(ma.files) == sorted(mb.files)
        for k in ma.files:
            np.testing.assert_array_equal(ma[k], mb[k])
    assert pdpfl.verify_run(a)["round"] == 4


@pytest.mark.slow
def test_a_silo_is_built_only_for_a_sampled_client(runs) -> None:
    (_, ra), (_, rb) = runs["pooled"], runs["per-client"]
    sampled = [c for m in ra["metrics"] for c in m["selected"]]
    assert sorted(ra["built"]) == sorted(sampled)  # none for the clients not sampled
    assert len(rb["built"]) >= 2 * 24  # before: every client, for each of the two calls


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(
    rates=st.lists(st.floats(0.01, 1.0), min_size=1, max_size=6),
    sigmas=st.lists(st.floats(0.5, 5.0), min_size=6, max_size=6),
    rounds=st.lists(st.lists(st.booleans(), min_size=6, max_size=6), max_size=8),
)
def test_one_ledger_row_per_client_charges_what_one_ledger_per_client_does(
    rates: list[float], sigmas: list[float], rounds: list[list[bool]]
) -> None:
    """The vectorized ledger (rows with their own q and σ) against one ledger per client
    (its mechanism at its own σ), round by round, both observers."""
    n = len(rates)
    plan = SampledGaussianPlan(PrivacyUnit.CLIENT, 1.0, 1e-3, 10, ("third-party", "server"))
    budgets = np.full(n, 8.0)
    pooled = PrivacyLedger(budgets, np.array(rates), plan, noise_multipliers=np.array(sigmas[:n]))
    own = [
        PrivacyLedger(budgets[:1], np.array([rates[i]]), plan.with_noise(sigmas[i]))
        for i in range(n)
    ]
    for sampled in rounds:
        part = np.array(sampled[:n])
        active = ~pooled.would_exceed()
        assert active.tolist() == [not o.would_exceed()[0] for o in own]
        pooled.record_round(participated=part & active, active=active)
        for i, o in enumerate(own):
            o.record_round(participated=part[i : i + 1] & active[i], active=active[i : i + 1])
    for obs in ("third-party", "server"):
        np.testing.assert_allclose(
            pooled.spent_epsilon(obs), [o.spent_epsilon(obs)[0] for o in own], rtol=1e-12
        )


def test_the_pooled_evaluation_gate_refuses_out_of_range_replies() -> None:
    from pdpfl.fl.api import PrivacyBoundaryError
    from pdpfl.fl.pool import PooledEvaluation

    ok = PooledEvaluation(np.array([2, 0]), np.array([0.5, np.nan]), np.array([1.0, np.nan]))
    ok.check(0)
    assert ok.pooled()["accuracy"] == 1.0 and ok.diverged() is None
    for bad in (
        PooledEvaluation(np.array([2, 1]), np.array([0.5, 0.1]), np.array([1.0, 1.5])),
        PooledEvaluation(np.array([2, -1]), np.array([0.5, 0.1]), np.array([1.0, 0.5])),
        PooledEvaluation(np.array([2.5, 1]), np.array([0.5, 0.1]), np.array([1.0, 0.5])),
        PooledEvaluation(np.array([2, 1]), np.array([-0.5, 0.1]), np.array([1.0, 0.5])),
    ):
        with pytest.raises(PrivacyBoundaryError, match="out of range"):
            bad.check(3)
    nan_loss = PooledEvaluation(np.array([0, 4]), np.array([np.nan, np.inf]), np.array([0.0, 0.5]))
    assert nan_loss.diverged() == 1
