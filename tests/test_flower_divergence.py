"""A diverging run on the Flower runtime stops loudly, as in the simulator (issue #23, item 1).

A silo whose training turns non-finite (:class:`pdpfl.fl.template.NonFiniteError`) releases
nothing and tells the server so; the server stops the run with
:class:`pdpfl.errors.TrainingDiverged` naming the round and the silo, writes its outputs with
``completed: false`` (every finished round kept), and ``pdpfl run --runtime flower`` exits 3.
A non-finite aggregate at the server stops it the same way. Before, the silo's error reply made
it "lost" and the run went on and reported success.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr")

from pdpfl.errors import TrainingDiverged  # noqa: E402
from pdpfl.fl.template import NonFiniteError  # noqa: E402
from pdpfl.runtime.flower.hooks import AppHooks  # noqa: E402
from test_flower_toy import (  # noqa: E402,F401
    TOY_HOOKS,
    FakeGrid,
    ToyClient,
    ToyServer,
    _silo_state,
    serve,
    task_identity,
    toy_config,
    toy_run_config,
)

SPEC = "test_flower_divergence:DIVERGING_HOOKS"
#: Where the in-process run diverges (set by each test): silo and round, or the server's round.
WHERE: dict[str, Any] = {}


class DivergingClient(ToyClient):
    def fit(self, global_params: Any, round_index: int, config: Any) -> Any:
        if (self.client_id, round_index) == (WHERE.get("silo"), WHERE.get("round")):
            self.fits += 1  # charged before the step (write-ahead), then nothing released
            self.fit_rounds.append(round_index)
            raise NonFiniteError(
                "its update of parameter 0 is not finite",
                round_index=round_index,
                silo=self.client_id,
            )
        return super().fit(global_params, round_index, config)


class DivergingServer(ToyServer):
    def aggregate(self, round_index: int, global_params: Any, aggregate: Any) -> Any:
        params = super().aggregate(round_index, global_params, aggregate)
        if round_index == WHERE.get("server"):
            return [np.full_like(params[0], np.nan)]
        return params


DIVERGING_HOOKS = AppHooks(
    config_from_dict=TOY_HOOKS.config_from_dict,
    config_to_dict=TOY_HOOKS.config_to_dict,
    num_silos=TOY_HOOKS.num_silos,
    silo_info=TOY_HOOKS.silo_info,
    build_server=lambda c, infos: (DivergingServer(c.seed, c.client_rate), {}),
    build_client=lambda c, silo, node_config, public: DivergingClient(silo, c.seed),
    run=TOY_HOOKS.run,
    finish=TOY_HOOKS.finish,
)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _serve(tmp_path: Path, monkeypatch: Any, where: dict[str, Any], **extra: Any):
    WHERE.clear()
    WHERE.update(where)
    out = tmp_path / "flower"
    run_config = toy_run_config(toy_config(num_silos=3, rounds=4), out, **extra)
    run_config["pdpfl-hooks"] = SPEC
    grid = FakeGrid(run_config, out / "silo-state", 3, hooks=SPEC, monkeypatch=monkeypatch)
    with pytest.raises(TrainingDiverged) as info:
        serve(grid, out)
    result = json.loads((out / "flower" / "server_result.json").read_text())
    return out, result, info.value


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("prefetch", [True, False])
def test_a_silo_that_diverges_stops_the_run_naming_round_and_silo(
    tmp_path: Path, monkeypatch: Any, prefetch: bool
) -> None:
    """With prefetch, round 2's training travels with round 1's evaluation: the divergence is
    raised when round 2 collects it, after round 1 is complete (metrics, checkpoint)."""
    out, result, err = _serve(
        tmp_path, monkeypatch, {"silo": 1, "round": 2}, **{"pdpfl-prefetch": prefetch}
    )
    assert (err.round_index, err.silo) == (2, 1)
    assert result["status"] == "diverged"
    assert result["diverged"]["round"] == 2 and result["diverged"]["silo"] == 1
    assert "training diverged in round 3 at silo 1" in result["error"]
    lines = _lines(out / "metrics.jsonl")
    assert [m["round"] for m in lines] == [0, 1, 2] and lines[-1]["diverged"]["silo"] == 1
    assert all(np.isfinite(np.load(out / "model.npz")["p000"]))
    # The silo's charge for the round that diverged is on its disk.
    assert _silo_state(out, 1, result["run_key"])["fit_rounds"].tolist() == [0, 1, 2]


@pytest.mark.usefixtures("task_identity")
def test_a_non_finite_aggregate_stops_the_run_at_the_server(
    tmp_path: Path, monkeypatch: Any
) -> None:
    out, result, err = _serve(tmp_path, monkeypatch, {"server": 1})
    assert (err.round_index, err.silo) == (1, None)
    assert result["status"] == "diverged" and result["diverged"]["silo"] is None
    assert "aggregated global model" in result["error"]
    assert [m["round"] for m in _lines(out / "metrics.jsonl")] == [0, 1]
    assert all(np.isfinite(np.load(out / "model.npz")["p000"]))


def test_the_launcher_raises_for_a_diverged_result() -> None:
    from pdpfl.runtime.flower.launcher import raise_if_diverged

    raise_if_diverged({"status": "ok"}, {})
    with pytest.raises(TrainingDiverged, match="round 3 at silo 1: boom") as info:
        raise_if_diverged(
            {"status": "diverged", "diverged": {"round": 2, "silo": 1, "cause": "boom"}},
            {"completed": False},
        )
    assert info.value.result == {"completed": False}


def test_pdpfl_run_on_flower_exits_3_when_training_diverges(
    tmp_path: Path, monkeypatch: Any
) -> None:
    from typer.testing import CliRunner

    from pdpfl.cli import app
    from pdpfl.runtime.flower import launcher

    def diverging(config: Any, out_dir: Any, resume: bool, **kw: Any) -> dict[str, Any]:
        launcher.raise_if_diverged(
            {"status": "diverged", "diverged": {"round": 4, "silo": 0, "cause": "nan loss"}},
            {"completed": False},
        )
        return {}

    monkeypatch.setattr(launcher, "run_flower", diverging)
    config = Path(__file__).resolve().parents[1] / "examples" / "digits_demo.yaml"
    if not config.exists():
        pytest.skip("examples/digits_demo.yaml missing")
    result = CliRunner().invoke(
        app, ["run", str(config), "--runtime", "flower", "--out", str(tmp_path / "out"), "--quiet"]
    )
    assert result.exit_code == 3, result.output
    assert "training diverged in round 5 at silo 0" in result.output
    assert "Traceback" not in result.output


# ------------------------------------------- pdpfl's own algorithms (rPDP-FL), a huge lr

DIVERGING = {
    "name": "diverge",
    "seed": 3,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "breast-cancer", "num_clients": 3},
    "model": {"name": "logreg"},
    "privacy": {"epsilon_max": 5.0, "delta": 1e-3},
    "training": {"rounds": 3, "local_steps": 2, "lr": 1e38, "max_grad_norm": 1e30, "batch_size": 8},
}


@pytest.mark.usefixtures("task_identity")
@pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning")
def test_rpdp_on_flower_stops_where_the_simulator_stops(tmp_path: Path, monkeypatch: Any) -> None:
    """The real hooks: the template's NonFiniteError at a silo crosses Flower as 'diverged'."""
    from pdpfl.config import config_from_dict, config_to_dict
    from pdpfl.runtime.flower.codec import encode_config
    from pdpfl.runtime.simulation import run_simulation

    config = config_from_dict(DIVERGING)
    with pytest.raises(TrainingDiverged) as sim:
        run_simulation(config, tmp_path / "sim", progress=False)
    out = tmp_path / "flower"
    run_config = {
        "pdpfl-config": encode_config(config_to_dict(config)),
        "pdpfl-hooks": "pdpfl.runtime.flower.hooks:PDPFL_HOOKS",
        "pdpfl-out-dir": str(out),
        "pdpfl-resume": False,
        "pdpfl-round-timeout": 30.0,
        "pdpfl-startup-timeout": 30.0,
        "pdpfl-min-silos": 3,
    }
    grid = FakeGrid(run_config, out / "silos", 3, hooks=None, monkeypatch=monkeypatch)
    with pytest.raises(TrainingDiverged) as flw:
        serve(grid, out)
    assert (flw.value.round_index, flw.value.silo) == (sim.value.round_index, sim.value.silo)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] is False
    assert summary["diverged"]["round"] == sim.value.round_index


@pytest.mark.flower
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning")
def test_pdpfl_run_on_a_real_flower_federation_exits_3(tmp_path: Path) -> None:
    """SuperLink, SuperNodes and the silo worker as processes: exit 3, the round named."""
    import yaml
    from typer.testing import CliRunner

    from pdpfl.cli import app
    from pdpfl.runtime.flower.processes import flower_binary
    from pdpfl.runtime.flower.transport import FlowerRunError

    try:
        for name in ("flower-superlink", "flower-supernode", "flwr"):
            flower_binary(name)
    except FlowerRunError as err:  # pragma: no cover - depends on the installation
        pytest.skip(f"Flower binaries missing: {err}")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(DIVERGING))
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app, ["run", str(cfg), "--runtime", "flower", "--out", str(out), "--quiet"]
    )
    assert res.exit_code == 3, res.output
    assert "training diverged in round 1 at silo" in res.output
    assert "Traceback" not in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] is False and summary["diverged"]["round"] == 0
