"""Reading a configuration: YAML, ``--set key=value`` overrides, validation with one message per
problem, and the configuration's canonical dictionary, hash and resume fingerprint
(:mod:`pdpfl.config`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from pdpfl.config.base import _PROBLEM_SEPARATOR, ConfigError
from pdpfl.config.experiment import ALGORITHMS, ExperimentConfig, experiment_model
from pdpfl.config_checks import raw_value_problems
from pdpfl.safe_yaml import YamlError, YamlValue, load_yaml_file, load_yaml_text


def _format_errors(err: ValidationError) -> list[str]:
    problems: list[str] = []
    names = set(ALGORITHMS.names())
    for e in err.errors():
        parts = [str(p) for p in e["loc"]]
        if len(parts) >= 2 and parts[0] == "algorithm" and parts[1] in names:
            parts = [parts[0], *parts[2:]]  # drop the union tag: algorithm.<name>.x -> algorithm.x
        loc = ".".join(parts)
        msg = e["msg"]
        if e["type"] == "union_tag_invalid":
            msg = (
                (
                    f"unknown algorithm {e['input'].get('name')!r}; registered: "
                    + ", ".join(sorted(names))
                )
                if isinstance(e.get("input"), dict)
                else msg
            )
            loc = "algorithm.name"
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        if e["type"] == "finite_number":
            msg = f"must be a finite number, got {e.get('input')!r}"
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
            if not loc and ":" in msg:
                problems.extend(m for m in msg.split(_PROBLEM_SEPARATOR) if m)
                continue
        problems.append(f"{loc or 'config'}: {msg}")
    return problems


def leaf_index() -> dict[str, list[str]]:
    """Leaf field name -> dotted paths (for short override keys such as ``rounds``)."""
    index: dict[str, list[str]] = {}
    for section, field in ExperimentConfig.model_fields.items():
        ann = field.annotation
        if section == "algorithm":
            leaves = dict.fromkeys(f for cls in ALGORITHMS.values() for f in cls.model_fields)
            for leaf in leaves:
                index.setdefault(leaf, []).append(f"algorithm.{leaf}")
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            for leaf in ann.model_fields:
                index.setdefault(leaf, []).append(f"{section}.{leaf}")
        else:
            index.setdefault(section, []).append(section)
    return index


def _parse_value(key: str, text: str) -> YamlValue:
    """The YAML value of ``--set key=text`` (hardened loader: plain data, limits)."""
    return load_yaml_text(text, source=f"--set {key}")


#: Most parts of a dotted ``--set`` key (``data.options.x`` has 3).
_MAX_KEY_PARTS = 8


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` overrides (YAML-parsed values) to a raw config dictionary."""
    try:
        data: dict[str, Any] = json.loads(json.dumps(raw))  # deep copy of plain data
    except (TypeError, ValueError, RecursionError) as err:
        raise ConfigError(
            [f"config: not plain data (mappings, lists, text, numbers): {err}"]
        ) from None
    index: dict[str, list[str]] | None = (
        None  # built on the first short key (loads every algorithm)
    )
    problems = []
    for item in overrides:
        if "=" not in item:
            problems.append(f"--set {item!r}: expected key=value")
            continue
        key, text = item.split("=", 1)
        key = key.strip()
        if key.count(".") >= _MAX_KEY_PARTS or not all(key.split(".")):
            problems.append(
                f"--set {key[:80]!r}: expected a dotted key such as training.lr "
                f"(at most {_MAX_KEY_PARTS} parts, none empty)"
            )
            continue
        if "." not in key:
            index = leaf_index() if index is None else index
            paths = index.get(key, [])
            if len(paths) != 1:
                hint = f" (one of {', '.join(paths)})" if paths else ""
                problems.append(f"--set {key}: unknown or ambiguous key{hint}")
                continue
            key = paths[0]
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"--set {key}: {part} is not a section")
                break
            node = child
        else:
            try:
                node[parts[-1]] = _parse_value(key, text)
            except YamlError as err:
                problems.append(str(err))
    if problems:
        raise ConfigError(problems)
    return data


def _section_fields(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each section's pydantic fields ("" = top-level keys; the algorithm named in ``raw``)."""
    fields: dict[str, dict[str, Any]] = {"": dict(ExperimentConfig.model_fields)}
    for section, field in ExperimentConfig.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            fields[section] = dict(ann.model_fields)
    algorithm = raw.get("algorithm")
    fields["algorithm"] = _algorithm_fields(
        algorithm.get("name") if isinstance(algorithm, dict) else None
    )
    return fields


def _algorithm_fields(name: object) -> dict[str, Any]:
    """The pydantic fields of the registered algorithm ``name`` (default rpdp; {} if unknown)."""
    key = name if isinstance(name, str) else "rpdp"
    return dict(ALGORITHMS.get(key).model_fields) if key in ALGORITHMS else {}


def config_from_dict(raw: object, overrides: list[str] | None = None) -> ExperimentConfig:
    """Validate a raw dictionary (after ``overrides``); raises :class:`ConfigError`."""
    if not isinstance(raw, dict):
        raise ConfigError(["config: expected a mapping of sections (data, training, ...)"])
    raw = apply_overrides(raw, list(overrides or []))
    try:
        problems = raw_value_problems(raw, _section_fields(raw))
    except RecursionError:
        problems = ["config: nested too deeply"]
    if problems:
        raise ConfigError(problems)
    try:
        return experiment_model(raw).model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None


def read_config_file(path: str | Path) -> dict[str, YamlValue]:
    """The raw mapping of a YAML config file, read with :mod:`pdpfl.safe_yaml`'s limits
    (plain data only, no duplicate keys); an empty file is ``{}``."""
    try:
        raw = load_yaml_file(path)
    except YamlError as err:
        raise ConfigError([f"config: {err}"]) from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(
            [
                f"config: {path} holds a {_kind(raw)}; expected a mapping of "
                "sections (data, training, ...)"
            ]
        )
    # section names as text, as the JSON copy in apply_overrides makes them anyway
    return {str(k): v for k, v in raw.items()}


def _kind(value: object) -> str:
    return {list: "list", str: "text value", int: "number", float: "number", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def load_config(
    path: str | Path, overrides: list[str] | None = None, *, data_dir: str | None = None
) -> ExperimentConfig:
    """Read a YAML config file, apply overrides (and ``data_dir``), and validate it."""
    raw = read_config_file(path)
    extra = list(overrides or [])
    if data_dir is not None:
        extra.append(f"data.data_dir={data_dir}")
    return config_from_dict(raw, extra)


def config_to_dict(config: ExperimentConfig) -> dict[str, Any]:
    return config.model_dump(mode="json")


def _drop_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """Sections added after a release that hash like their absence at their default (a config
    written before ``server_optimizer`` existed keeps its hash and its resumable checkpoints)."""
    if data.get("server_optimizer", {}).get("name") == "none":
        data.pop("server_optimizer", None)
    return data


def config_hash(config: ExperimentConfig) -> str:
    """SHA-256 (first 16 hex digits) of the canonical JSON of the config, output folder excluded."""
    data = _drop_defaults(config_to_dict(config))
    data.pop("output_dir", None)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_fingerprint(config: ExperimentConfig) -> str:
    """What a checkpoint must match to be resumed: :func:`config_hash` of the config with its
    file paths resolved (``--data-dir data`` and ``--data-dir /abs/data`` are the same run),
    the output folder, the number of rounds T (a finished run may be extended), the
    per-round model option and the budget store's settings left out (:func:`fingerprint_fields`)."""
    text = json.dumps(fingerprint_fields(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint_fields(config: ExperimentConfig) -> dict[str, Any]:
    """The part of the config :func:`run_fingerprint` hashes (a checkpoint keeps it, so that a
    resume refused for a changed config can name the fields that changed)."""
    data = _drop_defaults(config_to_dict(config))
    data.pop("output_dir", None)
    data.pop("save_models", None)
    data["training"].pop("rounds", None)
    data["training"].pop("device", None)  # a run may continue on another device
    data.pop("flower", None)  # nor do the Simulation Engine's resources
    data.pop("lifetime", None)  # nor where the budget store is (a resume charges the same run)
    for section, key in (("data", "data_dir"), ("budgets", "file")):
        value = data.get(section, {}).get(key)
        if value:
            data[section][key] = str(Path(value).expanduser().resolve())
    return data


def with_updates(config: ExperimentConfig, overrides: list[str]) -> ExperimentConfig:
    """A validated copy of ``config`` with ``key=value`` overrides applied."""
    return config_from_dict(config_to_dict(config), overrides)
