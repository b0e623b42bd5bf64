"""Hostile configs: malformed YAML, resource exhaustion, silent type guesses, non-finite values.

Every case must end in ``ConfigError`` (CLI: ``error: ...``, exit 2) quickly, naming the field,
file and line -- never a traceback, a hang or a silently chosen value.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.config import ConfigError, config_from_dict, load_config
from pdpfl.safe_yaml import MAX_BYTES, MAX_DEPTH, YamlError, load_yaml_file, load_yaml_text

BASE = {
    "data": {"dataset": "digits", "num_clients": 3},
    "privacy": {"epsilon_max": 10.0, "delta": 1e-3},
    "training": {"rounds": 1, "local_steps": 1, "batch_size": 8},
}
BASE_TEXT = yaml.safe_dump(BASE)


def _file(tmp_path: Path, content: str | bytes, name: str = "cfg.yaml") -> Path:
    p = tmp_path / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content, encoding="utf-8")
    return p


def _problem(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert len(info.value.problems) == 1
    return info.value.problems[0]


# ----------------------------------------------------------------------- the YAML reader


def _billion_laughs(levels: int = 9) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"\x00\x01\xff\xfe binary", "not UTF-8 text (byte 0xff on line 1)"),
        (BASE_TEXT.encode() + b"name: \xc3\x28\n", "not UTF-8 text (byte 0xc3 on line"),
        ("name: a\x00b\n", "unacceptable character #x0000"),
        (_billion_laughs(), "expands to more than"),
        ("a: &a [*a]\n", "recursive alias"),
        (BASE_TEXT + "seed: 1\nseed: 2\n", "duplicate key 'seed' (first given on line"),
        ("data:\n  dataset: digits\n  dataset: mnist\n", "line 3, column 3: duplicate key"),
        ("a: " + "[" * 2000 + "]" * 2000 + "\n", f"nested more than {MAX_DEPTH} levels"),
        ("seed: " + "9" * 5000 + "\n", "is too large"),
        ("seed: 99999999999999999999\n", "out of range"),
        ("training: {lr: 1e999}\n", "too large for a float"),
        ("x: !!python/object/apply:os.system ['echo hi']\n", "tag '!!python/object/apply"),
        ("x: !!binary aGVsbG8=\n", "tag '!!binary' is not allowed"),
        ("x: !!set {a, b}\n", "tag '!!set' is not allowed"),
        ("x: !custom 1\n", "tag '!custom' is not allowed"),
        ("{? [a, b]: 1}\n", "mapping keys must be text or integers"),
        ("name: x\n---\nname: y\n", "expected a single document"),
        ("training: {lr: 0.1\n", "not valid YAML: line"),
        ("- data\n- training\n", "holds a list; expected a mapping of sections"),
        ("just text\n", "holds a text value; expected a mapping"),
    ],
    ids=[
        "binary",
        "bad-utf8",
        "nul",
        "billion-laughs",
        "recursive-alias",
        "duplicate-key",
        "nested-duplicate",
        "deep",
        "huge-int-digits",
        "int64-overflow",
        "float-overflow",
        "python-tag",
        "binary-tag",
        "set-tag",
        "local-tag",
        "complex-key",
        "two-documents",
        "unclosed",
        "list-top",
        "scalar-top",
    ],
)
def test_hostile_yaml_is_refused_quickly_with_the_place(
    tmp_path: Path, content: str | bytes, expected: str
) -> None:
    path = _file(tmp_path, content)
    start = time.perf_counter()
    message = _problem(path)
    assert time.perf_counter() - start < 10.0  # a hang guard (speed: benchmarks/validation.py)
    assert message.startswith("config: ") and expected in message, message
    assert "Traceback" not in message


def test_oversized_file_and_special_files_are_refused(tmp_path: Path) -> None:
    big = _file(tmp_path, "# " + "x" * MAX_BYTES + "\n")
    assert "larger than 256 KiB" in _problem(big)
    assert "is not a regular file" in _problem(tmp_path)
    assert "file not found" in _problem(tmp_path / "missing.yaml")


def test_yaml_11_guesses_are_not_applied() -> None:
    """Values stay what they look like: no Norway problem, no dates, no octal, no base 60."""
    got = load_yaml_text(
        "a: yes\nb: off\nc: 2024-01-01\nd: 012\ne: 1:30\nf: 1e-5\ng: true\nh: ~\ni: .inf\nj: 0x10\n"
    )
    assert got == {
        "a": "yes",
        "b": "off",
        "c": "2024-01-01",
        "d": 12,
        "e": "1:30",
        "f": 1e-5,
        "g": True,
        "h": None,
        "i": float("inf"),
        "j": 16,
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: !!bool 'yes'", "'yes' is not a valid bool for tag '!!bool'"),
        ("a: !!int '0x'", "'0x' is not a valid int"),
        ("a: !!null 'x'", "'x' is not a valid null"),
        ("a: !!float 'abc'", "'abc' is not a valid float"),
        ("a: {<<: 5}", "expected a mapping or list of mappings for merging"),
        ("a: *nope", "found undefined alias 'nope'"),
        (
            "%TAG !p! tag:yaml.org,2002:python/\n---\na: !p!object:os.system {}",
            "tag '!!python/object:os.system' is not allowed",
        ),
    ],
)
def test_explicit_tags_must_match_their_value(text: str, expected: str) -> None:
    """``!!bool 'yes'`` was False and ``!!null 'x'`` None: silently chosen values."""
    with pytest.raises(YamlError, match=expected):
        load_yaml_text(text)
    assert load_yaml_text("a: !!int '12'\nb: !!float '3'\nc: !!str yes") == {
        "a": 12,
        "b": 3.0,
        "c": "yes",
    }


def test_merge_keys_and_moderate_aliases_still_work(tmp_path: Path) -> None:
    text = (
        "defaults: &d {rounds: 1, local_steps: 1, batch_size: 8}\n"
        "data: {dataset: digits, num_clients: 3}\n"
        "privacy: {epsilon_max: 10.0, delta: 0.001}\n"
        "training:\n  <<: *d\n  local_steps: 2\n"
    )
    raw = load_yaml_file(_file(tmp_path, text))
    assert raw["training"] == {"rounds": 1, "local_steps": 2, "batch_size": 8}
    lists = "a: &a [" + ", ".join(["1"] * 400) + "]\nb: [" + ", ".join(["*a"] * 100) + "]\n"
    assert len(load_yaml_text(lists)["b"]) == 100


def test_empty_file_is_an_empty_config_and_bom_is_accepted(tmp_path: Path) -> None:
    assert load_yaml_file(_file(tmp_path, "")) is None
    with pytest.raises(ConfigError, match="data: Field required"):
        load_config(_file(tmp_path, "# only a comment\n"))
    bom = _file(tmp_path, "\ufeff" + BASE_TEXT, "bom.yaml")
    assert load_config(bom).data.dataset == "digits"


def test_yaml_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="duplicate key"):
        load_yaml_text("{a: 1, a: 2}")
    assert issubclass(YamlError, ValueError)


# ----------------------------------------------------------------- --set values


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("data.data_dir=[oops", "--set data.data_dir: not valid YAML"),
        ("data.options={a: 1, a: 2}", "--set data.options: line 1, column 8: duplicate key"),
        (
            "data.options=!!python/object:os.system {}",
            "--set data.options: line 1, column 1: tag '!!python/object:os.system'",
        ),
        ("seed=1" + "0" * 30, "--set seed: line 1, column 1: integer"),
        ("data.options=&a [*a]", "recursive alias"),
        ("training.lr=1e999", "--set training.lr: line 1, column 1: number 1e999 is too large"),
    ],
)
def test_set_values_use_the_same_hardened_reader(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(BASE, [override])
    assert any(expected in p for p in info.value.problems), info.value.problems


def test_set_value_with_a_colon_must_be_quoted() -> None:
    """``a: b`` is a mapping in YAML: refused for a text field, never silently kept as text."""
    with pytest.raises(ConfigError, match="data.data_dir: Input should be a valid string"):
        config_from_dict(BASE, ["data.data_dir=a: b"])
    assert config_from_dict(BASE, ['data.data_dir="a: b"']).data.data_dir == "a: b"


# ------------------------------------------------------------ non-finite hyper-parameters


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("training.lr=.inf", "training.lr"),
        ("training.lr=.nan", "training.lr"),
        ("training.lr=inf", "training.lr"),  # text that pydantic would turn into a float
        ("training.weight_decay=.inf", "training.weight_decay"),
        ("training.momentum=.nan", "training.momentum"),
        ("training.max_grad_norm=.inf", "training.max_grad_norm"),
        ("training.batch_size=.inf", "training.batch_size"),
        ("training.batch_size=[8, .nan, 8]", "training.batch_size.1"),
        ("training.client_rate=.nan", "training.client_rate"),
        ("training.rounds=.inf", "training.rounds"),
        ("privacy.delta=.nan", "privacy.delta"),
        ("privacy.epsilon_max=.inf", "privacy.epsilon_max"),
        ("privacy.epsilon_max=null", None),  # not a problem of finiteness
        ("secure.precision=-.inf", "secure.precision"),
        ("algorithm.server_lr=.inf", "algorithm.server_lr"),
        ("algorithm.server_lr=NaN", "algorithm.server_lr"),
        ("data.options={undersample: .inf}", "data.options.undersample"),
        ("budgets.params={values: [0.1, .nan, 5]}", "budgets.params.values.1"),
        ("model.options={hidden: .inf}", "model.options.hidden"),
    ],
)
def test_non_finite_hyper_parameters_are_refused_naming_the_field(
    override: str, field: str | None
) -> None:
    raw = {**BASE, "privacy": {"epsilon_max": 10.0, "delta": 1e-3}}
    if field is None:
        with pytest.raises(ConfigError) as info:
            config_from_dict(raw, [override])
        assert not any("finite" in p for p in info.value.problems)
        return
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw, [override])
    assert f"{field}: must be a finite number" in "\n".join(info.value.problems)


def test_non_finite_values_from_python_are_refused_too() -> None:
    raw = {**BASE, "training": {**BASE["training"], "lr": float("nan")}}
    with pytest.raises(ConfigError, match="training.lr: must be a finite number, got nan"):
        config_from_dict(raw)


def test_infinity_only_where_a_field_declares_it() -> None:
    """IDP-FedAvg's group budgets use .inf for non-private clients; NaN is still refused."""
    raw = {
        **BASE,
        "data": {"dataset": "digits", "num_clients": 20},
        "privacy": {"delta": 1e-3},
        "algorithm": {
            "name": "idp-fedavg",
            "group_budgets": [1.0, float("inf")],
            "group_ratios": [0.5, 0.5],
            "clients_per_round": 5,
        },
    }
    cfg = config_from_dict(raw)
    assert cfg.algorithm.group_budgets[1] == float("inf")
    with pytest.raises(ConfigError, match=r"algorithm.group_budgets.1: must be a finite"):
        config_from_dict(raw, ["algorithm.group_budgets=[1.0, .nan]"])
    with pytest.raises(ConfigError, match=r"algorithm.group_budgets.0: must be a finite"):
        config_from_dict(raw, ["algorithm.group_budgets=[-.inf, 1.0]"])


def test_config_that_is_not_plain_data_is_a_config_error() -> None:
    loop: dict = {}
    loop["self"] = loop
    with pytest.raises(ConfigError, match="config: not plain data"):
        config_from_dict({**BASE, "data": {**BASE["data"], "options": loop}})
    with pytest.raises(ConfigError, match="config: not plain data"):
        config_from_dict({**BASE, "data": {**BASE["data"], "options": {"x": {1, 2}}}})


# ---------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(
    ("content", "args", "expected"),
    [
        (_billion_laughs() + BASE_TEXT, [], "expands to more than"),
        (BASE_TEXT + "seed: 1\nseed: 2\n", [], "duplicate key 'seed'"),
        (b"\xff\xfe\x00d\x00a\x00t\x00a", [], "not UTF-8 text"),
        (BASE_TEXT, ["--set", "training.lr=.nan"], "error: training.lr: must be a finite"),
        (BASE_TEXT, ["--set", "weight_decay=.inf"], "error: training.weight_decay: must be"),
        (BASE_TEXT, ["--set", "data.options=!!python/name:os.system"], "is not allowed"),
    ],
    ids=["billion-laughs", "duplicate", "utf16", "nan-lr", "inf-weight-decay", "tag-in-set"],
)
def test_cli_run_refuses_hostile_configs_with_exit_2_and_no_output(
    tmp_path: Path, content: str | bytes, args: list[str], expected: str
) -> None:
    cfg = _file(tmp_path, content)
    out = tmp_path / "out"
    start = time.perf_counter()
    res = CliRunner().invoke(app, ["run", str(cfg), "--out", str(out), *args])
    assert time.perf_counter() - start < 30.0  # a hang guard, not a speed measurement
    assert res.exit_code == 2, res.output
    assert expected in res.output and "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert not out.exists()


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("rounds=true", "training.rounds"),
        ("training.lr=true", "training.lr"),
        ("seed=false", "seed"),
        ("threads=true", "threads"),
        ("training.batch_size=[8, true]", "training.batch_size.1"),
        ("algorithm.server_lr=true", "algorithm.server_lr"),
    ],
)
def test_a_boolean_is_not_silently_a_number(override: str, field: str) -> None:
    """pydantic's lax mode would read ``rounds: true`` as T = 1."""
    with pytest.raises(ConfigError) as info:
        config_from_dict(BASE, [override])
    assert f"{field}: expected a number, got " in "\n".join(info.value.problems)


def test_booleans_where_booleans_belong_and_in_free_form_options() -> None:
    cfg = config_from_dict(BASE, ["privacy.allow_exclusion=true", "data.options={flat: false}"])
    assert cfg.privacy.allow_exclusion is True and cfg.data.options == {"flat": False}


@pytest.mark.parametrize("key", ["", "training..lr", "." * 3, "data.options." + "a." * 50 + "b"])
def test_malformed_or_absurdly_deep_set_keys_are_refused(key: str) -> None:
    with pytest.raises(ConfigError, match="expected a dotted key"):
        config_from_dict(BASE, [f"{key}=1"])


def test_absurdly_nested_python_config_is_a_config_error() -> None:
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(ConfigError, match="config: "):
        config_from_dict({**BASE, "data": {**BASE["data"], "options": deep}})
