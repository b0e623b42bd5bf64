"""The trained model people can use elsewhere: a named state_dict in safetensors with the run's
facts in its header, `pdpfl.load_model`, `pdpfl export`, per-round models, and run.log."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import pdpfl
from pdpfl.cli import app, hoist_global_options
from pdpfl.config import config_from_dict
from pdpfl.models import create_model, get_params
from pdpfl.runtime.model_file import read_model
from pdpfl.runtime.simulation import run_simulation

TINY = {
    "name": "export",
    "seed": 4,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "breast-cancer", "num_clients": 2},
    "model": {"name": "mlp", "options": {"hidden": [8]}},
    "privacy": {"epsilon_max": 5.0, "delta": 1e-3},
    "training": {"rounds": 2, "local_steps": 2, "lr": 0.3, "batch_size": 8},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("export")
    cfg = config_from_dict(TINY, ["save_models=every-round"])
    summary = run_simulation(cfg, out, progress=False)
    return out, summary, cfg


def _module(cfg) -> torch.nn.Module:
    return create_model(cfg.model.name, (30,), 2, **dict(cfg.model.options))


def test_the_model_file_has_torch_names_and_the_runs_facts(run) -> None:
    out, summary, cfg = run
    tensors, meta = read_model(out / "model.safetensors")
    names = [n for n, p in _module(cfg).named_parameters()]
    assert sorted(tensors) == sorted(names)
    assert meta["config_hash"] == summary["config_hash"]
    assert meta["privacy_unit"] == "record" and meta["rounds"] == "2"
    assert json.loads(meta["epsilon"]) == pytest.approx(summary["epsilon"])
    assert json.loads(meta["privacy"])["units"] == summary["units"]


def test_load_model_fills_a_module_by_name_and_refuses_a_mismatch(run) -> None:
    out, summary, cfg = run
    module = pdpfl.load_model(out, _module(cfg))
    tensors, _ = read_model(out / "model.safetensors")
    for name, p in module.named_parameters():
        np.testing.assert_array_equal(p.detach().numpy(), tensors[name])
    with np.load(out / "model.npz") as z:  # the same model as the resume format
        for a, b in zip(get_params(module), [z[k] for k in sorted(z.files)], strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="do not match"):
        pdpfl.load_model(out, create_model("logreg", (30,), 2))


def test_every_round_models_and_export_formats(run, tmp_path) -> None:
    out, _, cfg = run
    first = pdpfl.load_model(out, round=1)
    last = pdpfl.load_model(out, round=2)
    final = pdpfl.load_model(out)
    for k in final:
        np.testing.assert_array_equal(last[k], final[k])
    assert any(not np.array_equal(first[k], final[k]) for k in final)
    runner = CliRunner()
    res = runner.invoke(
        app, ["export", str(out), "--format", "torch", "--out", str(tmp_path / "m.pt")]
    )
    assert res.exit_code == 0, res.output
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    module = _module(cfg)
    module.load_state_dict(state, strict=False)
    for name, p in module.named_parameters():
        np.testing.assert_array_equal(p.detach().numpy(), final[name])
    res = runner.invoke(app, ["export", str(out), "--out", str(tmp_path / "m.safetensors")])
    assert res.exit_code == 0 and (tmp_path / "m.safetensors").is_file()
    res = runner.invoke(app, ["export", str(out), "--round", "9"])
    assert res.exit_code == 2 and "error: --round: the run has 2 round(s)" in res.output
    assert "rounds 1 to 2; got 9" in res.output


def test_run_log_and_verbosity_on_every_command(run) -> None:
    out, _, _ = run
    log = (out / "run.log").read_text()
    assert "round 2/2" in log and "federation" in log
    assert hoist_global_options(["run", "cfg.yaml", "-v", "--log-level", "debug"]) == [
        "-v",
        "--log-level",
        "debug",
        "run",
        "cfg.yaml",
    ]
    res = CliRunner().invoke(app, ["--log-level", "loud", "data", "list"])
    assert res.exit_code == 2 and "--log-level" in res.output
