"""Experiment configs: validation messages name the field, overrides, hashing, the examples."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from pdpfl.config import (
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    config_from_dict,
    config_hash,
    load_config,
    with_updates,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

BASE = {
    "data": {"dataset": "digits", "num_clients": 3},
    "privacy": {"epsilon_max": 10.0, "delta": 1e-3},
    "training": {"rounds": 3, "local_steps": 2, "batch_size": 8},
}


def _problems(raw: dict, overrides: list[str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw, overrides)
    return info.value.problems


def test_valid_minimal_config_gets_defaults() -> None:
    cfg = config_from_dict(BASE)
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.algorithm.name == "rpdp" and cfg.algorithm.server_lr == 1.0
    assert cfg.training.client_rate == 1.0 and cfg.privacy.calibration == "certified"
    # Honest defaults: both observers, no silent exclusion, secure randomness, plain sum.
    assert cfg.privacy.adversary == "both"
    assert cfg.privacy.allow_exclusion is False
    assert cfg.randomness == "secure" and not cfg.reproducible
    assert cfg.aggregation == "plain" and cfg.data.public_silo_sizes is False


def test_dp_needs_a_public_batch_size_but_privacy_free_does_not() -> None:
    raw = {**BASE, "training": {"rounds": 3, "local_steps": 2}}
    assert any(p.startswith("training.batch_size: required under DP") for p in _problems(raw))
    config_from_dict({**raw, "algorithm": {"name": "privacy-free"}})
    assert any("training.batch_size" in p for p in _problems(BASE, ["training.batch_size=0"]))
    cfg = config_from_dict(BASE, ["training.batch_size=[4, 8, 16]"])
    assert cfg.training.batch_size_for(2) == 16.0
    with pytest.raises(ValueError, match="silo 3"):
        cfg.training.batch_size_for(3)


def test_weighting_by_silo_size_needs_sizes_declared_public() -> None:
    problems = _problems({**BASE, "algorithm": {"name": "rpdp", "weighting": "num_examples"}})
    assert any(p.startswith("algorithm.weighting") and "public_silo_sizes" in p for p in problems)
    cfg = config_from_dict(
        {
            **BASE,
            "algorithm": {"name": "rpdp", "weighting": "num_examples"},
            "data": {**BASE["data"], "public_silo_sizes": True},
        }
    )
    assert cfg.algorithm.weighting == "num_examples"


def test_algorithm_sections_are_per_algorithm() -> None:
    # ε belongs to the uniform baselines, not to rPDP-FL.
    problems = _problems({**BASE, "algorithm": {"name": "rpdp", "epsilon": 1.0}})
    assert "algorithm.epsilon: unknown key" in problems
    problems = _problems({**BASE, "algorithm": {"name": "no-such-thing"}})
    assert any(p.startswith("algorithm.name") and "rpdp" in p for p in problems)
    cfg = config_from_dict(BASE, ["algorithm.name=uniform", "algorithm.epsilon=0.5"])
    assert type(cfg.algorithm).__name__ == "UniformConfig" and cfg.algorithm.epsilon == 0.5


def test_minimum_and_dropout_need_a_public_epsilon_with_budget_files() -> None:
    raw = {**BASE, "budgets": {"file": "budgets_{client_id}.npy"}}
    for name in ("minimum", "dropout"):
        problems = _problems({**raw, "algorithm": {"name": name}})
        assert any(p.startswith("algorithm.epsilon: required") for p in problems), problems
        config_from_dict({**raw, "algorithm": {"name": name, "epsilon": 1.0}})


def test_registered_models_are_accepted_by_the_config() -> None:
    import torch

    from pdpfl.models import MODELS, register_model

    assert any(p.startswith("model.name") for p in _problems({**BASE, "model": {"name": "my-mlp"}}))

    @register_model("my-mlp")
    def _mine(input_shape, num_classes, width=4):
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, num_classes))

    try:
        cfg = config_from_dict({**BASE, "model": {"name": "my-mlp", "options": {"width": 8}}})
        assert cfg.model.name == "my-mlp" and cfg.model.options == {"width": 8}
    finally:
        MODELS.pop("my-mlp")


def test_unknown_keys_are_named_one_message_each() -> None:
    raw = {**BASE, "colour": "red", "training": {**BASE["training"], "epochs": 3}}
    problems = _problems(raw)
    assert "colour: unknown key" in problems
    assert "training.epochs: unknown key" in problems
    assert len(problems) == 2


def test_bad_values_are_named() -> None:
    raw = {
        **BASE,
        "training": {"rounds": 0, "local_steps": 2, "client_rate": 1.5},
        "privacy": {"epsilon_max": 10.0, "delta": 2.0},
    }
    problems = _problems(raw)
    fields = sorted(p.split(":")[0] for p in problems)
    assert fields == ["privacy.delta", "training.client_rate", "training.rounds"]


def test_missing_required_sections_and_privacy_source() -> None:
    problems = _problems({"data": {"dataset": "digits"}})
    assert any(p.startswith("training:") for p in problems)
    raw = {k: v for k, v in BASE.items() if k != "privacy"}
    assert any("privacy.noise_multiplier" in p for p in _problems(raw))
    # privacy-free needs neither σ nor ε_max
    config_from_dict({**raw, "algorithm": {"name": "privacy-free"}})


def test_both_sigma_and_epsilon_max_is_an_error() -> None:
    raw = {**BASE, "privacy": {"epsilon_max": 1.0, "noise_multiplier": 1.0}}
    assert any("only one" in p for p in _problems(raw))


def test_uniform_needs_epsilon() -> None:
    problems = _problems({**BASE, "algorithm": {"name": "uniform"}})
    assert any(p.startswith("algorithm.epsilon") for p in problems)


def test_set_overrides_rounds_is_T_and_dotted_keys() -> None:
    cfg = config_from_dict(BASE, ["rounds=7", "training.lr=0.25", "algorithm.name=dropout"])
    assert cfg.training.rounds == 7
    assert cfg.training.lr == 0.25
    assert cfg.algorithm.name == "dropout"


def test_set_errors_are_named() -> None:
    problems = _problems(BASE, ["nonsense=1", "rounds", "training.rounds=-2"])
    assert any(p.startswith("--set nonsense") for p in problems)
    assert any(p.startswith("--set 'rounds'") for p in problems)
    assert any(p.startswith("training.rounds") for p in _problems(BASE, ["rounds=-2"]))


def test_overrides_do_not_mutate_input() -> None:
    raw = {"training": {"rounds": 1}}
    out = apply_overrides(raw, ["training.rounds=5"])
    assert raw["training"]["rounds"] == 1 and out["training"]["rounds"] == 5


@given(st.integers(1, 1000), st.integers(1, 1000))
def test_config_hash_is_a_function_of_content(t1: int, t2: int) -> None:
    a = config_from_dict(BASE, [f"rounds={t1}"])
    b = config_from_dict(BASE, [f"rounds={t2}"])
    assert (config_hash(a) == config_hash(b)) == (t1 == t2)
    # the output folder does not change the experiment
    assert config_hash(with_updates(a, ["output_dir=elsewhere"])) == config_hash(a)


def test_load_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(BASE))
    assert load_config(good, data_dir="/somewhere").data.data_dir == "/somewhere"


@pytest.mark.parametrize(
    "name", ["heart_disease.yaml", "mnist10k_iid.yaml", "mnist10k_niid.yaml", "digits_demo.yaml"]
)
def test_examples_validate(name: str) -> None:
    cfg = load_config(EXAMPLES / name)
    assert cfg.training.rounds >= 1
    assert cfg.randomness == "secure"  # examples never default to the reproducible mode


def test_heart_disease_example_has_the_paper_settings() -> None:
    cfg = load_config(EXAMPLES / "heart_disease.yaml")
    assert (cfg.data.dataset, cfg.model.name) == ("heart-disease", "logreg")
    training = cfg.training
    assert (training.rounds, training.local_steps, training.client_rate) == (15, 50, 1.0)
    assert (cfg.privacy.delta, cfg.privacy.epsilon_max) == (1e-3, 10.0)
    assert cfg.budgets.scenario == "three-levels"
    assert cfg.budgets.params == {"values": [0.1, 1.0, 5.0], "ratios": [0.7, 0.2, 0.1]}
    # The example runs with the honest defaults (no reproducible randomness, both observers).
    assert cfg.randomness == "secure" and cfg.privacy.adversary == "both"
    assert cfg.training.batch_size is not None
