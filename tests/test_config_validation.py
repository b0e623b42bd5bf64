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
    "training": {"rounds": 3, "local_steps": 2},
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
    assert any(p.startswith("algorithm.epsilon") for p in _problems({**BASE, "algorithm": {"name": "uniform"}}))


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


def test_heart_disease_example_has_the_paper_settings() -> None:
    cfg = load_config(EXAMPLES / "heart_disease.yaml")
    assert (cfg.data.dataset, cfg.model.name) == ("heart-disease", "logreg")
    assert (cfg.training.rounds, cfg.training.local_steps, cfg.training.client_rate) == (15, 50, 1.0)
    assert (cfg.privacy.delta, cfg.privacy.epsilon_max) == (1e-3, 10.0)
    assert cfg.budgets.scenario == "three-levels"
    assert cfg.budgets.params == {"values": [0.1, 1.0, 5.0], "ratios": [0.7, 0.2, 0.1]}
