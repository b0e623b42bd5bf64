"""Issue #17 in Python: truthful records of your own data and model, the one output rule, no
silent NaN (empty test splits), honest budget mixes, and plots that say what they show."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import pdpfl
from pdpfl.config import ConfigError, config_from_dict
from pdpfl.data.user import federation_from_silos
from pdpfl.ledger import GroupSummary, PrivacySummary, load_ledger
from pdpfl.runtime.loop import read_metrics
from pdpfl.runtime.outputs import OutputDirError
from pdpfl.runtime.plots import accuracy_figure, epsilon_figure
from pdpfl.runtime.simulation import SetupWarning, check_federation, run_simulation

BASE = {
    "name": "nc-run",
    "seed": 1,
    "threads": 1,
    "data": {"dataset": "breast-cancer", "num_clients": 2},
    "privacy": {"epsilon_max": 5.0, "delta": 1e-3},
    "training": {"rounds": 2, "local_steps": 2, "lr": 0.3, "batch_size": 6},
}


def _silos(n_test: tuple[int, ...] = (6, 6, 6), n_train: int = 30, seed: int = 0):
    rng = np.random.default_rng(seed)
    silos = {}
    for k, m in enumerate(n_test):
        x = rng.normal(size=(n_train + m, 3))
        y = (x[:, 0] > 0).astype(int)
        y[:2] = [0, 1]
        silos[f"h{k}"] = (x[:n_train], y[:n_train], x[n_train:], y[n_train:])
    return federation_from_silos(silos, name="my-hospitals")


# --------------------------------------------------------------- your dataset, recorded truly


@pytest.mark.slow
def test_run_simulation_records_a_user_federation_truthfully(tmp_path: Path) -> None:
    cfg = config_from_dict(BASE)  # says breast-cancer ...
    fed = _silos()  # ... but the user passes their own federation
    summary = run_simulation(cfg, tmp_path / "o", progress=False, federation=fed)
    on_disk = json.loads((tmp_path / "o" / "summary.json").read_text())
    for s in (summary, on_disk):
        assert s["config"]["data"]["dataset"] == "my-hospitals"
        assert s["config"]["data"]["partition"] == "user"
        assert s["config"]["data"]["num_clients"] == 3
        assert s["data"]["source"].startswith("user-supplied")
        assert s["data"]["silo_names"] == ["h0", "h1", "h2"]
        assert s["config"]["output_dir"] == str(tmp_path / "o")
    assert "breast-cancer" not in json.dumps(on_disk)
    own = run_simulation(cfg, tmp_path / "p", progress=False)
    assert own["data"]["source"] == "config.data"
    assert own["config"]["data"]["dataset"] == "breast-cancer"


@pytest.mark.slow
def test_train_with_a_torch_module_and_budgets_by_id(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(150, 3))
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    ids = rng.permutation(1000)[:150] + 500
    eps = rng.choice([0.5, 4.0], size=150)
    fed = pdpfl.federation_from_arrays(x, y, silos=rng.choice(["a", "b"], 150), record_ids=ids)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    before = [p.detach().clone() for p in model.parameters()]
    by_id = dict(zip(ids.tolist(), eps.tolist(), strict=True))
    summary = pdpfl.train(
        fed,
        model,
        budgets=by_id,
        rounds=2,
        local_steps=3,
        batch_size=8,
        lr=0.5,
        epsilon_max=4.0,
        delta=1e-3,
        out=tmp_path / "run",
        name="mine",
        threads=1,
    )
    assert summary["name"] == "mine" and summary["over_budget"] == 0
    assert summary["config"]["model"]["name"].startswith("user-Sequential-")
    assert summary["config"]["budgets"]["file"] == str(tmp_path / "run" / "budgets.csv")
    assert sorted(summary["per_group"]) == ["0.5", "4"]
    for k, c in enumerate(fed.clients):  # each silo's ledger holds the ε of its own record ids
        ledger = load_ledger(tmp_path / "run" / "ledgers" / f"client_{k}.npz")  # sealed files
        np.testing.assert_array_equal(ledger.budgets, [by_id[int(i)] for i in c.record_ids])
        np.testing.assert_array_equal(ledger.ids, c.record_ids)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    with pytest.raises(OutputDirError, match="overwrite=True"):
        pdpfl.train(
            fed,
            model,
            budgets=by_id,
            rounds=1,
            local_steps=1,
            batch_size=8,
            epsilon_max=4.0,
            out=tmp_path / "run",
        )
    with pytest.raises(ValueError, match="model: the .*module returns shape"):
        pdpfl.train(
            fed,
            torch.nn.Linear(3, 3),
            rounds=1,
            local_steps=1,
            batch_size=8,
            epsilon_max=4.0,
            out=tmp_path / "bad",
        )
    with pytest.raises(ConfigError, match="speed: not a config field"):
        pdpfl.train(
            fed,
            model,
            rounds=1,
            local_steps=1,
            batch_size=8,
            epsilon_max=4.0,
            speed=3,
            out=tmp_path / "bad3",
        )
    with pytest.raises(ConfigError, match="training.rounds"):
        pdpfl.train(
            fed,
            model,
            rounds=0,
            local_steps=1,
            batch_size=8,
            epsilon_max=4.0,
            out=tmp_path / "bad2",
        )


# ---------------------------------------------------------------------- the one output rule


@pytest.mark.slow
def test_run_simulation_follows_the_output_rule(tmp_path: Path) -> None:
    cfg = config_from_dict(BASE)
    out = tmp_path / "o"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    with pytest.raises(OutputDirError, match="overwrite=True"):
        run_simulation(cfg, out, progress=False)
    with pytest.raises(OutputDirError, match="nothing to resume"):
        run_simulation(cfg, out, resume=True, progress=False)
    (out / "mine.txt").write_text("keep")
    first = run_simulation(cfg, out, progress=False, overwrite=True, stop_after=1)
    assert first["rounds_completed"] == 1 and (out / "mine.txt").read_text() == "keep"
    with pytest.raises(OutputDirError, match="resume=True"):
        run_simulation(cfg, out, progress=False)
    resumed = run_simulation(cfg, out, resume=True, progress=False)
    assert resumed["rounds_completed"] == 2
    again = run_simulation(cfg, out, progress=False, overwrite=True)
    assert again["rounds_completed"] == 2
    with pytest.raises(OutputDirError, match="not a folder"):
        run_simulation(cfg, out / "mine.txt", progress=False)


# ---------------------------------------------------------- empty splits, honest budget mixes


@pytest.mark.slow
def test_empty_test_split_pools_over_existing_records_and_warns_once(tmp_path: Path) -> None:
    cfg = config_from_dict(BASE)
    fed = _silos(n_test=(6, 0, 6))
    with pytest.warns(SetupWarning, match=r"1 silo\(s\) have no test records \(h1\)") as rec:
        summary = run_simulation(cfg, tmp_path / "o", progress=False, federation=fed)
    assert len([w for w in rec if issubclass(w.category, SetupWarning)]) == 1
    assert summary["final_accuracy"] is not None and 0 <= summary["final_accuracy"] <= 1
    assert [w for w in summary["warnings"] if "no test records" in w] == [str(rec[0].message)]


@pytest.mark.slow
def test_no_test_records_anywhere_is_said_not_silent(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    cfg = config_from_dict(BASE)
    fed = _silos(n_test=(0, 0))
    with pytest.warns(SetupWarning, match="no silo has test records"):
        summary = run_simulation(cfg, tmp_path / "o", progress=False, federation=fed)
    assert summary["final_accuracy"] is None
    metrics = read_metrics(tmp_path / "o")
    fig = accuracy_figure(metrics, summary)
    assert any("nothing to draw" in t.get_text() for t in fig.axes[0].texts)


def test_a_silo_without_training_records_is_named(tmp_path: Path) -> None:
    fed = _silos()
    c = fed.clients[1]
    c.x_train, c.y_train, c.record_ids = c.x_train[:0], c.y_train[:0], c.record_ids[:0]
    with pytest.raises(ValueError, match=r"silo\(s\) 1 \('h1'\) have no training records"):
        run_simulation(config_from_dict(BASE), tmp_path / "o", progress=False, federation=fed)


def test_many_tiny_silos_cannot_fake_the_budget_mix() -> None:
    from pdpfl.runtime.simulation import load_federation_for

    cfg = config_from_dict(BASE, ["data.dataset=digits", "data.num_clients=1500"])
    fed = load_federation_for(cfg)
    with pytest.raises(
        ValueError,
        match=r"budgets: the three-levels mix cannot be kept.*"
        r"ε=0.1: 70%.*ε=0.1: 100%",
    ):
        check_federation(cfg, fed)
    ok = config_from_dict(BASE, ["data.dataset=digits", "data.num_clients=10"])
    assert check_federation(ok, load_federation_for(ok)) == []


# ------------------------------------------------------------------------------------ plots


def _summary(groups: dict, name: str = "s") -> dict:
    # the plots read the run's typed privacy summary (summary["privacy"])
    privacy = PrivacySummary(unit="record", units=10 * len(groups), groups=tuple(groups.values()))
    return {
        "name": name,
        "algorithm": "rpdp",
        "privacy": privacy.to_dict() if groups else None,
        "privacy_view": "operator: merged",
    }


def _group(budget: float, tp: float, sv: float, over=(0, 0), excluded: int = 0) -> GroupSummary:
    return GroupSummary(
        label=f"{budget:g}",
        units=10,
        budget_min=budget,
        budget_max=budget,
        excluded=excluded,
        spent_max={"third-party": tp, "server": sv},
        utilization_sum={"third-party": 10 * tp / budget, "server": 10 * sv / budget},
        over_budget={"third-party": over[0], "server": over[1]},
    )


def test_epsilon_plot_is_log_scale_and_marks_groups() -> None:
    import matplotlib

    matplotlib.use("Agg")
    fig = epsilon_figure(
        _summary(
            {
                "0.1": _group(0.1, 0.099, 0.099, excluded=3),
                "1": _group(1.0, 0.99, 1.4, over=(0, 4)),
                "5": _group(5.0, 5.0, 5.0),
            }
        )
    )
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    lo, hi = ax.get_ylim()
    assert lo < 0.099 and hi > 5.0  # the 0.1 group is on the plot, not a sliver at zero
    notes = " ".join(t.get_text() for t in ax.texts)
    assert "excluded 3" in notes and "over budget 0/4" in notes
    heights = sorted(p.get_height() for p in ax.patches)
    assert heights[0] == pytest.approx(0.099)


def test_plots_say_when_there_is_nothing_to_draw() -> None:
    import matplotlib

    matplotlib.use("Agg")
    for summary in (_summary({}), {**_summary({}), "privacy_view": "coordinator: ..."}):
        ax = epsilon_figure(summary).axes[0]
        assert any("nothing to draw" in t.get_text() for t in ax.texts)
    nan_round = {"round": 0, "accuracy": None, "mean_client_accuracy": None}
    ax = accuracy_figure([nan_round], _summary({})).axes[0]
    assert any("nothing to draw" in t.get_text() for t in ax.texts)
    assert not ax.lines
