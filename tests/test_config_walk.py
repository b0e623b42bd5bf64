"""The configuration is read once at the algorithm's edge (issue #40: no file entered more than
twice on the config's route).

The whole route of a run is measured by ``benchmarks/config_walk.py`` (a 2-round run, too slow
for a unit test); these tests hold its cause in place: the rPDP-FL family's build
(``Algorithm.assemble``) enters no file more than twice with the config, and the shared helpers
and the mechanism take plain values (:class:`~pdpfl.fl.common.ModelSource`,
:class:`~pdpfl.fl.common.BudgetSource`, :class:`~pdpfl.fl.rpdp.mechanism.MechanismSpec`),
never the :class:`~pdpfl.config.ExperimentConfig`.
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The helpers of ``fl.common`` that resolve the run's environment (called once, by
#: ``fl.environment`` and the Flower hooks), not by an algorithm's builders.
ENVIRONMENT_READERS = {"federation_info", "user_histogram", "party_randomness"}


def _config_walk() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_config_walk", ROOT / "benchmarks" / "config_walk.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _takes_the_config(function: object) -> bool:
    annotations = getattr(function, "__annotations__", {})
    return any("ExperimentConfig" in str(a) for a in annotations.values())


@pytest.mark.parametrize(
    "module",
    ["pdpfl.fl.common", "pdpfl.fl.rpdp.mechanism", "pdpfl.fl.rpdp.checks"],
)
def test_shared_helpers_and_the_mechanism_take_values_not_the_config(module: str) -> None:
    mod = importlib.import_module(module)
    takers = []
    for name, obj in vars(mod).items():
        if getattr(obj, "__module__", None) != module:
            continue
        members = [(name, obj)]
        if inspect.isclass(obj):
            members = [(f"{name}.{m}", f) for m, f in vars(obj).items()]
        for qual, function in members:
            function = getattr(function, "__func__", function)  # classmethods
            if callable(function) and _takes_the_config(function):
                takers.append(qual)
    allowed = ENVIRONMENT_READERS if module == "pdpfl.fl.common" else set()
    assert set(takers) <= allowed, f"{module}: these take the whole config: {sorted(takers)}"


@pytest.mark.parametrize("name", ["rpdp", "minimum"])
def test_the_build_enters_no_file_more_than_twice(name: str) -> None:
    walk = _config_walk()
    route = walk.walk_build([f"algorithm.name={name}"])
    result = walk.measure(route)
    assert result["entered_more_than_twice"] == {}, result["route"]
    # the one climb: from the shared budget-table check up to the algorithm's own checks
    assert len(result["climbs"]) <= 1, result["climbs"]
    assert f"pdpfl.fl.rpdp.{'config' if name == 'rpdp' else 'baselines'} (5)" in result["route"]
