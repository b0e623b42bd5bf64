"""Real distributed runs on Flower: every pdpfl algorithm as a ServerApp + ClientApps.

Requires the optional Flower extra (``pip install pdpfl[flower]``, flwr 1.41). The ServerApp
runs the very same :func:`pdpfl.runtime.loop.run_federation` as the in-process simulator over a
:class:`FlowerTransport`; each ClientApp builds its algorithm from its own silo's data and keeps
its records' ledger at the silo. A warm silo worker (:mod:`pdpfl.runtime.flower.worker`) keeps
each silo in memory between messages. :func:`run_flower_simulation` runs the same apps under
Flower's Simulation Engine (Ray; ``pip install pdpfl[simulation]``). See ``docs/flower.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdpfl.runtime.flower.launcher import run_flower
    from pdpfl.runtime.flower.processes import FlowerInterrupted, LocalFederation
    from pdpfl.runtime.flower.simulation_engine import run_flower_simulation
    from pdpfl.runtime.flower.transport import FlowerRunError, FlowerTransport

__all__ = [
    "FlowerInterrupted",
    "FlowerRunError",
    "FlowerTransport",
    "LocalFederation",
    "run_flower",
    "run_flower_simulation",
]

_LAZY = {
    "run_flower": "pdpfl.runtime.flower.launcher",
    "LocalFederation": "pdpfl.runtime.flower.launcher",
    "FlowerInterrupted": "pdpfl.runtime.flower.launcher",
    "run_flower_simulation": "pdpfl.runtime.flower.simulation_engine",
    "FlowerTransport": "pdpfl.runtime.flower.transport",
    "FlowerRunError": "pdpfl.runtime.flower.transport",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
