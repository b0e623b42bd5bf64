"""Resume is not fooled by another spelling of the same data folder, and a finished run can be
extended (`--resume --set rounds=N`) with the accountant charging every extra round."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import pdpfl
from pdpfl.config import config_from_dict
from pdpfl.runtime.simulation import run_simulation

TINY = {
    "name": "extend",
    "seed": 3,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "breast-cancer", "num_clients": 2},
    "model": {"name": "logreg"},
    "privacy": {"epsilon_max": 5.0, "delta": 1e-3},
    "training": {"rounds": 2, "local_steps": 2, "lr": 0.3, "batch_size": 8},
}


def test_a_relative_and_an_absolute_data_dir_are_the_same_run(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    out = tmp_path / "run"
    run_simulation(
        config_from_dict(TINY, ["data.data_dir=data"]), out, progress=False, stop_after=1
    )
    absolute = config_from_dict(TINY, [f"data.data_dir={os.fspath(tmp_path / 'data')}"])
    summary = run_simulation(absolute, out, resume=True, progress=False)
    assert summary["rounds_completed"] == 2


@pytest.mark.slow
def test_a_finished_run_is_extended_and_every_extra_round_is_charged(tmp_path) -> None:
    out = tmp_path / "run"
    # σ given, and a group with a budget far above what T = 2 rounds at q = 1 spend: room to go on
    roomy = [
        "privacy.epsilon_max=null",
        "privacy.noise_multiplier=2.0",
        "budgets.params={values: [0.5, 2.0, 1000.0], ratios: [0.4, 0.3, 0.3]}",
        "budgets.cap_at_epsilon_max=true",
    ]  # (the 1000s train at q = 1: room to go on)
    base = run_simulation(config_from_dict(TINY, roomy), out, progress=False)
    before = pdpfl.privacy_table(out, as_frame=False)
    longer = config_from_dict(TINY, [*roomy, "rounds=4"])
    summary = run_simulation(longer, out, resume=True, progress=False)
    after = pdpfl.privacy_table(out, as_frame=False)
    assert summary["rounds_completed"] == 4 and base["rounds_completed"] == 2
    # the same records, charged for the extra rounds unless the pre-check stopped them
    np.testing.assert_array_equal(before["id"], after["id"])
    extra = after["rounds_third_party"] - before["rounds_third_party"]
    assert np.all((extra == 2) | after["stopped"]) and np.any(extra == 2)
    assert np.all(after["epsilon_third_party"] >= before["epsilon_third_party"])
    assert np.all(after["epsilon_third_party"] <= after["budget"] * (1 + 1e-9))
    assert any("extended from T = 2" in w for w in summary["warnings"])


def test_a_run_cannot_be_shortened_on_resume(tmp_path) -> None:
    out = tmp_path / "run"
    run_simulation(config_from_dict(TINY, ["rounds=3"]), out, progress=False)
    with pytest.raises(ValueError, match="shorten"):
        run_simulation(config_from_dict(TINY), out, resume=True, progress=False)
    assert Path(out / "summary.json").is_file()


def test_a_runtime_that_rebuilds_at_the_new_t_refuses_to_extend(tmp_path) -> None:
    """The Flower runtimes rebuild every silo at the configured T and restore only the ledgers'
    counts: extending there would re-price the rounds already charged at the smaller rates of a
    larger T (an under-count). Refused before any process starts; the simulator extends."""
    from pdpfl.runtime.flower.launcher import check_resume
    from pdpfl.runtime.loop import check_planned_rounds, load_checkpoint

    out = tmp_path / "run"
    run_simulation(config_from_dict(TINY), out, progress=False)
    ckpt = load_checkpoint(out)
    assert ckpt is not None and int(ckpt["planned_rounds"]) == 2
    check_resume(config_from_dict(TINY), out, True)  # the same T resumes
    check_resume(config_from_dict(TINY, ["rounds=4"]), out, False)  # not a resume
    with pytest.raises(ValueError, match=r"training.rounds: .*calibrated for 2 rounds"):
        check_resume(config_from_dict(TINY, ["rounds=4"]), out, True)
    with pytest.raises(ValueError, match="re-price"):  # what the Flower ServerApp's loop checks
        check_planned_rounds(ckpt, 4, out)
