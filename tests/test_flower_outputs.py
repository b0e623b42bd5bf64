"""What a Flower run writes and says, through pdpfl's real ServerApp and ClientApp over the
in-memory grid of ``test_flower_toy`` (issue #36 items 2, 3 and 6).

* One model file: the Flower run's ``model.safetensors`` holds the same named ``state_dict`` as
  the simulator's -- byte-identical tensors under ``randomness: reproducible`` -- with the same
  header (config hash, algorithm, unit, rounds, ε and the privacy summary once the loopback
  launcher collected the silos' summaries), and :func:`pdpfl.load_model` reads both. Before:
  positional keys (``param.0``), ``epsilon: null``, no summary, and ``load_model`` failed.
* Lost silos: ``summary.json`` and the terminal headline name them (the data's silo name, the
  round, why) and say which rounds aggregated how many silos. Before: only ``status.json`` did.
* Set-up failures are named as what they were. Before: a SuperNode lost during discovery was
  reported as "bad SuperNode configuration".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr")

from test_flower_toy import FakeGrid, serve, task_identity  # noqa: E402,F401

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits_demo.yaml"
HOOKS = "pdpfl.runtime.flower.hooks:PDPFL_HOOKS"


def _config(*extra: str) -> Any:
    from pdpfl.config import ExperimentConfig, load_config

    # several runs on the same records in one test: where a person's budget is kept for life
    # across runs (the ``lifetime`` section), allowed to re-spend (public data)
    respend = ["lifetime.allow_respend=true"] if "lifetime" in ExperimentConfig.model_fields else []
    return load_config(
        EXAMPLE,
        [
            "rounds=2",
            "data.num_clients=3",
            "training.local_steps=2",
            "randomness=reproducible",
            *respend,
            *extra,
        ],
    )


def _grid(config: Any, out: Path, monkeypatch: Any) -> FakeGrid:
    """Three silos over the in-memory grid; their operator allows what the config asks of their
    budget stores (``lifetime.allow_respend``), as the loopback launcher does."""
    from pdpfl.runtime.flower.hooks import ALLOW_RESPEND

    grid = FakeGrid(
        _run_config(config, out), out / "flower", 3, hooks=None, monkeypatch=monkeypatch
    )
    for node_config in grid.node_configs.values():
        node_config[ALLOW_RESPEND] = True
    return grid


def _run_config(config: Any, out: Path, **extra: Any) -> dict[str, Any]:
    from pdpfl.config import config_to_dict
    from pdpfl.runtime.flower.codec import encode_config

    return {
        "pdpfl-config": encode_config(config_to_dict(config)),
        "pdpfl-hooks": HOOKS,
        "pdpfl-out-dir": str(out),
        "pdpfl-resume": False,
        "pdpfl-round-timeout": 30.0,
        "pdpfl-startup-timeout": 30.0,
        "pdpfl-min-silos": 1,
        **extra,
    }


@pytest.mark.slow
@pytest.mark.usefixtures("task_identity")
def test_both_runtimes_write_the_same_model_file(tmp_path: Path, monkeypatch: Any) -> None:
    import torch

    import pdpfl
    from pdpfl.models import initial_model
    from pdpfl.runtime.flower.launcher import collect_result
    from pdpfl.runtime.model_file import read_model
    from pdpfl.runtime.simulation import run_simulation

    config = _config()
    run_simulation(config, tmp_path / "sim", progress=False)
    out = tmp_path / "flower"
    grid = _grid(config, out, monkeypatch)
    assert serve(grid, out)["status"] == "ok"
    # the loopback launcher's last step: the silos' own summaries, collected by their operator
    collect_result(config, out, 3, missing="-")

    sim, sim_meta = read_model(tmp_path / "sim" / "model.safetensors")
    flw, flw_meta = read_model(out / "model.safetensors")
    assert list(sim) == list(flw) == ["1.bias", "1.weight"]  # torch names, not param.0
    for name in sim:
        assert sim[name].dtype == flw[name].dtype == np.float32
        assert sim[name].tobytes() == flw[name].tobytes()
    same = ("format", "pdpfl_version", "config_hash", "algorithm", "privacy_unit", "rounds")
    assert {k: flw_meta[k] for k in same} == {k: sim_meta[k] for k in same}
    assert flw_meta["config_hash"] != "None" and flw_meta["rounds"] == "2"
    assert json.loads(flw_meta["epsilon"]) == pytest.approx(json.loads(sim_meta["epsilon"]))
    assert json.loads(flw_meta["epsilon"]) is not None
    assert json.loads(flw_meta["privacy"]) == json.loads(sim_meta["privacy"])
    for run in (tmp_path / "sim", out):
        module = initial_model("logreg", (64,), 10, {}, seed=0)
        pdpfl.load_model(run, module)
        for name, p in module.named_parameters():
            assert torch.equal(p.detach(), torch.from_numpy(sim[name]))


@pytest.mark.usefixtures("task_identity")
def test_a_lost_silo_is_named_in_the_summary_and_the_headline(
    tmp_path: Path, monkeypatch: Any
) -> None:
    from rich.console import Console

    from pdpfl.reports.tables import run_tables

    config = _config("rounds=3")
    out = tmp_path / "flower"
    grid = _grid(config, out, monkeypatch)
    failing = grid.node_of(2)
    original_push = grid.push_messages

    def push(messages: Any) -> list[str]:
        ids = original_push(messages)
        if sum(t == "train" for _, t in grid.sent) >= 3:  # after the first round's training
            grid.failing.add(failing)
        return ids

    grid.push_messages = push  # type: ignore[method-assign]
    result = serve(grid, out)
    assert result["status"] == "ok" and list(result["lost"]) == ["2"]
    summary = json.loads((out / "summary.json").read_text())
    silos = summary["silos"]
    assert silos["total"] == 3 and silos["names"] == summary["data"]["silo_names"]
    [lost] = silos["lost"]
    assert lost["silo"] == summary["data"]["silo_names"][2] and lost["index"] == 2
    assert lost["round"] == 2 and "error" in lost["reason"]
    assert silos["aggregated"] == [{"rounds": [1, 1], "silos": 3}, {"rounds": [2, 3], "silos": 2}]
    console = Console(width=100, record=True)
    for table in run_tables(summary):
        console.print(table)
    rows = {" ".join(line.split()[:4]): line for line in console.export_text().splitlines()}
    assert f"{lost['silo']} (round 2 fit+evaluate: error boom)" in rows["lost silos (1 of"]
    assert "round 1: 3 of 3; rounds 2–3: 2 of 3" in rows["silos aggregated round 1:"]


def test_the_simulator_records_its_silos_too(tmp_path: Path) -> None:
    from pdpfl.runtime.simulation import run_simulation

    summary = run_simulation(_config("rounds=1"), tmp_path / "sim", progress=False)
    assert summary["silos"] == {
        "total": 3,
        "names": summary["data"]["silo_names"],
        "lost": [],
        "aggregated": [{"rounds": [1, 1], "silos": 3}],
    }


class _HelloGrid:
    """Discovery against SuperNodes that answer the hello with Flower errors."""

    def __init__(self, codes: dict[int, int]) -> None:
        self.codes = codes
        self.replies: dict[str, Any] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.codes)

    def push_messages(self, messages: Any) -> list[str]:
        from flwr.app import Error, Message

        ids = []
        for i, msg in enumerate(messages):
            mid = f"m{len(self.replies)}-{i}"
            msg.metadata.__dict__["_message_id"] = mid
            node = msg.metadata.dst_node_id
            self.replies[mid] = Message(Error(code=self.codes[node], reason="gone"), reply_to=msg)
            ids.append(mid)
        return ids

    def pull_messages(self, ids: Any) -> list[Any]:
        return [self.replies.pop(i) for i in list(ids) if i in self.replies]


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize(
    ("code", "said"),
    [
        (5, "SuperNode node 11 was lost during set-up (gone); start it again"),
        (2, "the silo on node 11 failed while starting: gone"),
        (8, "the silo on node 11 failed while starting: gone"),
        (1, "node 11 could not load the pdpfl ClientApp: gone"),
    ],
)
def test_set_up_failures_are_named_as_what_they_were(code: int, said: str) -> None:
    from pdpfl.runtime.flower.apps import discover_silos
    from pdpfl.runtime.flower.transport import FlowerRunError

    with pytest.raises(FlowerRunError) as caught:
        discover_silos(_HelloGrid({11: code}), 1, "key", 5.0)  # type: ignore[arg-type]
    assert str(caught.value).startswith(f"set-up failed: {said}")
    assert "bad SuperNode configuration" not in str(caught.value)
