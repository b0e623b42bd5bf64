"""Failing virtual clients for the Simulation Engine tests (``--runtime flower-simulation``).

:data:`FAULTY_HOOKS` are pdpfl's own Flower hooks (:data:`pdpfl.runtime.flower.hooks.PDPFL_HOOKS`:
the same configuration, data, algorithms and round loop) except that a silo's ``fit`` raises
:class:`InjectedFailure` in the rounds named by the fault plan: a JSON file ``{"<silo>":
[round indices]}`` named by the environment variable :data:`PLAN_ENV`, read in the Ray actor
that handles the message (Ray's workers inherit the driver's environment). The failure happens
before the silo's algorithm runs: nothing is charged, nothing is released, and the silo's state
on disk stays that of its last reply. An empty (or absent) plan is the plain pdpfl run.

The engine's actors import this module by the spec :data:`SPEC` (Flower hands them the driver's
``sys.path``, which holds ``tests/`` under pytest).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pdpfl.runtime.flower.hooks import PDPFL_HOOKS

PLAN_ENV = "PDPFL_TEST_FAULT_PLAN"
SPEC = "flower_engine_faults:FAULTY_HOOKS"


class InjectedFailure(RuntimeError):
    """The failure the fault plan asked for."""


def write_plan(path: Path, plan: Mapping[int, list[int]]) -> None:
    """Write the fault plan ``{silo: [round indices]}`` (empty: no failure)."""
    path.write_text(json.dumps({str(s): list(r) for s, r in plan.items()}))


def _failing_rounds(silo: int) -> set[int]:
    path = os.environ.get(PLAN_ENV)
    if not path or not Path(path).is_file():
        return set()
    return set(json.loads(Path(path).read_text()).get(str(silo), []))


class _FailsIn:
    """A silo whose ``fit`` raises in the given rounds; everything else is the silo's own."""

    def __init__(self, inner: Any, silo: int, rounds: set[int]) -> None:
        self._inner, self._silo, self._rounds = inner, silo, rounds

    def fit(self, global_params: Any, round_index: int, config: Any) -> Any:
        if round_index in self._rounds:
            raise InjectedFailure(f"silo {self._silo}: injected failure in round {round_index}")
        return self._inner.fit(global_params, round_index, config)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _build_client(
    config: Any, silo: int, node_config: Mapping[str, Any], public: dict[str, Any]
) -> Any:
    client = PDPFL_HOOKS.build_client(config, silo, node_config, public)
    rounds = _failing_rounds(silo)
    return _FailsIn(client, silo, rounds) if rounds else client


FAULTY_HOOKS = dataclasses.replace(PDPFL_HOOKS, build_client=_build_client)
