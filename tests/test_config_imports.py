"""Parsing a config imports neither torch nor flwr; built-in algorithms and models are declared.

``pdpfl.config.BUILTIN_ALGORITHMS`` maps each built-in algorithm to the module that registers
it, so a config imports only the algorithm it names; ``BUILTIN_MODELS`` names the built-in
models and their options, so a model section is checked without building a torch model.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

_PROBE = """
import json, sys
import pdpfl.config
seen = {}
for path in sys.argv[1:]:
    config = pdpfl.config.load_config(path)
    seen[path] = {
        "algorithm": config.algorithm.name,
        "torch": "torch" in sys.modules,
        "flwr": "flwr" in sys.modules,
        "packages": sorted({m.split(".")[2] for m in sys.modules if m.startswith("pdpfl.fl.")}),
    }
print(json.dumps(seen))
"""


def _probe(paths: list[Path]) -> dict[str, dict]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout)


@pytest.mark.slow
def test_parsing_the_examples_imports_neither_torch_nor_flwr() -> None:
    """One fresh interpreter parses every example one after the other: after each, neither
    torch nor flwr is loaded (the first example that loads one is named), and the first one
    (rpdp) loaded no other algorithm's package."""
    paths = list(EXAMPLES)
    assert len(paths) >= 5
    assert {"uldp_heart.yaml", "uldp_mnist10k.yaml"} <= {p.name for p in paths}
    seen = _probe(paths)
    for path in paths:
        facts = seen[str(path)]
        assert not facts["torch"], f"{path.name} ({facts['algorithm']}) imported torch"
        assert not facts["flwr"], f"{path.name} ({facts['algorithm']}) imported flwr"
    first = seen[str(paths[0])]
    assert first["algorithm"] == "rpdp"
    assert "uldp" not in first["packages"] and "idp_fedavg" not in first["packages"]


def test_the_algorithm_table_is_what_each_module_registers() -> None:
    from pdpfl.config import ALGORITHMS, BUILTIN_ALGORITHMS

    builtin = {
        name: ALGORITHMS.get(name).__module__
        for name in ALGORITHMS.names()
        if ALGORITHMS.get(name).__module__.startswith("pdpfl.")
    }
    assert set(builtin) == set(BUILTIN_ALGORITHMS)
    for name, module in builtin.items():
        declared = BUILTIN_ALGORITHMS[name]
        assert module == declared or module.startswith(declared + "."), (name, module)


def test_the_model_table_is_what_the_builders_take() -> None:
    from pdpfl.config.sections import BUILTIN_MODELS
    from pdpfl.models import MODELS

    own = {n: b for n, b in MODELS.items() if b.__module__ == "pdpfl.models"}
    assert set(own) == set(BUILTIN_MODELS)
    for name, builder in own.items():
        params = list(inspect.signature(builder).parameters.values())[2:]
        assert tuple(p.name for p in params) == BUILTIN_MODELS[name], name


def test_a_model_option_is_still_refused_by_field() -> None:
    from pdpfl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="model: options: unknown option"):
        load_config(ROOT / "examples" / "digits_demo.yaml", ["model.options={depth: 3}"])
    with pytest.raises(ConfigError, match="unknown model"):
        load_config(ROOT / "examples" / "digits_demo.yaml", ["model.name=nope"])
