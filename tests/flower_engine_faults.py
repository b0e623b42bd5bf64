"""Failing virtual clients for the Simulation Engine tests (``--runtime flower-simulation``).

:data:`FAULTY_HOOKS` are pdpfl's own Flower hooks (:data:`pdpfl.runtime.flower.hooks.PDPFL_HOOKS`:
the same configuration, data, algorithms and round loop) except that a silo's ``fit`` misbehaves
in the rounds named by the fault plan, a JSON file named by the environment variable
:data:`PLAN_ENV`, read in the Ray actor that handles the message (Ray's workers inherit the
driver's environment):

* ``{"<silo>": [round indices]}``: ``fit`` raises :class:`InjectedFailure` before the silo's
  algorithm runs: nothing is charged, nothing is released, and the silo's state on disk stays
  that of its last reply (the silo is lost);
* ``"diverge": {"<silo>": [rounds]}``: the round is charged (the template's ``begin_round``),
  then the update is non-finite (:class:`~pdpfl.fl.template.NonFiniteError`, nothing released),
  as a real divergence at that silo;
* ``"interrupt": {"<silo>": [rounds]}``: SIGINT is sent to the process ``"driver_pid"`` (the one
  running the engine, as Ctrl-C would), then the silo trains as usual.

An empty (or absent) plan is the plain pdpfl run.

The engine's actors import this module by the spec :data:`SPEC` (Flower hands them the driver's
``sys.path``, which holds ``tests/`` under pytest).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pdpfl.runtime.flower.hooks import PDPFL_HOOKS

PLAN_ENV = "PDPFL_TEST_FAULT_PLAN"
SPEC = "flower_engine_faults:FAULTY_HOOKS"


class InjectedFailure(RuntimeError):
    """The failure the fault plan asked for."""


def write_plan(
    path: Path,
    plan: Mapping[int, list[int]],
    *,
    diverge: Mapping[int, list[int]] | None = None,
    interrupt: Mapping[int, list[int]] | None = None,
) -> None:
    """Write the fault plan ``{silo: [round indices]}`` (empty: no failure), with the silos
    whose update diverges and those that interrupt this process in the given rounds."""
    data: dict[str, Any] = {str(s): list(r) for s, r in plan.items()}
    for key, faults in (("diverge", diverge), ("interrupt", interrupt)):
        if faults:
            data[key] = {str(s): list(r) for s, r in faults.items()}
    data["driver_pid"] = os.getpid()
    path.write_text(json.dumps(data))


def _plan() -> dict[str, Any]:
    path = os.environ.get(PLAN_ENV)
    if not path or not Path(path).is_file():
        return {}
    return dict(json.loads(Path(path).read_text()))


class _FailsIn:
    """A silo whose ``fit`` misbehaves in the given rounds; everything else is the silo's own."""

    def __init__(self, inner: Any, silo: int, plan: Mapping[str, Any]) -> None:
        self._inner, self._silo, self._plan = inner, silo, plan

    def _in(self, key: str | None, round_index: int) -> bool:
        faults = self._plan if key is None else self._plan.get(key, {})
        return round_index in set(faults.get(str(self._silo), []))

    def fit(self, global_params: Any, round_index: int, config: Any) -> Any:
        if self._in(None, round_index):
            raise InjectedFailure(f"silo {self._silo}: injected failure in round {round_index}")
        if self._in("interrupt", round_index):
            os.kill(int(self._plan["driver_pid"]), signal.SIGINT)
        if self._in("diverge", round_index):
            from pdpfl.fl.messages import nonfinite_update_cause
            from pdpfl.fl.template import NonFiniteError

            self._inner.begin_round(round_index, config)  # charged, as before a real step
            raise NonFiniteError(
                nonfinite_update_cause(0), round_index=round_index, silo=self._silo
            )
        return self._inner.fit(global_params, round_index, config)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _build_client(
    config: Any, silo: int, node_config: Mapping[str, Any], public: dict[str, Any]
) -> Any:
    client = PDPFL_HOOKS.build_client(config, silo, node_config, public)
    plan = _plan()
    faulty = any(str(silo) in plan.get(key, {}) for key in ("diverge", "interrupt")) or (
        str(silo) in plan
    )
    return _FailsIn(client, silo, plan) if faulty else client


FAULTY_HOOKS = dataclasses.replace(PDPFL_HOOKS, build_client=_build_client)
