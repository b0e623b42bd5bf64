"""What the config decides for every algorithm is resolved once, before any mechanism is
calibrated (``pdpfl.fl.environment``), and the round loop's final privacy summary is the last
round's, also when a resumed run has no round left to run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pdpfl.config import with_updates
from pdpfl.fl.algorithm import Algorithm
from pdpfl.fl.environment import parties, resolve_environment
from pdpfl.models import initial_model, trainable_parameters
from pdpfl.runtime.simulation import load_federation_for, run_simulation
from pdpfl.testing import toy_config


def test_environment_resolves_device_randomness_and_names_once() -> None:
    config = toy_config("rpdp")
    federation = load_federation_for(config)
    env = resolve_environment(config, federation)
    assert env.device == torch.device("cpu")
    assert list(env.randomness) == parties(len(federation.clients))
    assert len({id(r) for r in env.randomness.values()}) == len(env.randomness)  # one each
    x0 = initial_model(
        config.model.name,
        env.info.input_shape,
        env.info.num_classes,
        dict(config.model.options),
        seed=config.seed,
    )
    assert env.parameter_names == tuple(n for n, _ in trainable_parameters(x0))


def test_secure_parties_draw_different_coins() -> None:
    config = with_updates(toy_config("rpdp"), ["randomness=secure"])
    env = resolve_environment(config, load_federation_for(config))
    draws = {
        party: r.stream("coins", 0, 0).uniform(8).tobytes() for party, r in env.randomness.items()
    }
    assert len(set(draws.values())) == len(draws)


def test_an_unavailable_device_fails_before_the_mechanism_is_calibrated(monkeypatch) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: 'cuda' is available here")
    config = with_updates(toy_config("rpdp"), ["training.device=cuda"])
    federation = load_federation_for(config)

    def calibrate(*args: object, **kwargs: object) -> None:
        raise AssertionError("setup ran before the device was checked")

    monkeypatch.setattr(type(config.algorithm), "setup", calibrate)
    assert isinstance(config.algorithm, Algorithm)
    with pytest.raises(ValueError, match=r"^training\.device: "):
        config.algorithm.assemble(config, federation)


def test_a_resume_with_no_round_left_reports_the_last_rounds_privacy(tmp_path: Path) -> None:
    config = with_updates(toy_config("rpdp"), ["rounds=1"])
    federation = load_federation_for(config)
    first = run_simulation(config, tmp_path, progress=False, federation=federation)
    again = run_simulation(config, tmp_path, True, progress=False, federation=federation)
    assert first["privacy"] is not None
    assert again["privacy"] == first["privacy"] and again["per_group"] == first["per_group"]
