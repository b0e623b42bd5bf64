"""The accountant registry (Opacus ``accountants/registry.py``; dp-accounting ``supports``).

An *accountant* interprets mechanisms described as data (:mod:`pdpfl.privacy.mechanisms`) and
turns them into ε at a given δ. Every accountant declares which events it can interpret
(:meth:`Accountant.supports`) and whether its ε are certified upper bounds or approximations
(:attr:`Accountant.approximate`, e.g. a central-limit μ-GDP figure), so that every report can say
which it shows.

This module is the bottom of the accounting layer: it knows no accountant. Each implementation
registers itself when its module is imported (``rdp`` in :mod:`pdpfl.privacy.accountant`,
``pld`` in :mod:`pdpfl.privacy.pld`, ``gdp-clt`` in :mod:`pdpfl.privacy.gdp_clt`); the package
``pdpfl.privacy`` imports all three, so they are registered as soon as any part of it is
imported. Imports point one way only: implementations → registry, never back.

The registry is open: an accountant registered with :func:`register_accountant` can be chosen
from an experiment config (``privacy.accountant``, validated against
:func:`accountant_names` ``(rigorous=True)``: a budget is enforced only with upper bounds), and
every algorithm refuses one that cannot interpret the events it charges. The built-in
accountants derive ``supports`` from the same traversal of the event as their ε (each compiles
the event once; "supported" is "compiles"), as dp-accounting does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.mechanisms import Mechanism

__all__ = [
    "Accountant",
    "UnsupportedEventError",
    "accountant_names",
    "as_accountant_name",
    "check_counts",
    "make_accountant",
    "register_accountant",
    "unregister_accountant",
]


class UnsupportedEventError(ValueError):
    """An accountant was asked for an event it cannot interpret (``supports`` is False)."""


@runtime_checkable
class Accountant(Protocol):
    """What every registered accountant provides.

    ``approximate`` is False for accountants whose every ε is an upper bound (``rdp``, ``pld``)
    and True for those that report an approximation (``gdp-clt``); reports must label the
    latter.
    """

    name: str

    @property
    def approximate(self) -> bool:
        """True if ε is an approximation (label it), False if every ε is an upper bound."""
        ...

    def supports(self, event: Mechanism) -> bool:
        """True if :meth:`composed_epsilon` can interpret ``event``."""
        ...

    def epsilon(self, event: Mechanism, delta: float) -> tuple[np.ndarray, np.ndarray]:
        """ε per row (rate) of ``event`` at ``delta``, and a per-row detail."""
        ...

    def composed_epsilon(
        self, event: Mechanism, counts: ArrayLike, delta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """ε of ``counts[i]`` adaptive repetitions of row i of ``event`` (0 repetitions: 0)."""
        ...


_REGISTRY: dict[str, Callable[..., Accountant]] = {}
_LOCK = threading.Lock()
_INSTANCES: dict[tuple[str, tuple[Any, ...]], Accountant] = {}
_MAX_INSTANCES = 16


def register_accountant(name: str, factory: Callable[..., Accountant]) -> None:
    """Register ``factory(**options) -> Accountant`` under ``name`` (lower case, unique)."""
    key = str(name).strip().lower()
    if not key or key in _REGISTRY:
        raise ValueError(f"accountant: {name!r} is empty or already registered")
    _REGISTRY[key] = factory


def unregister_accountant(name: str) -> None:
    """Remove the accountant ``name`` (and its shared instances); KeyError if unknown."""
    key = str(name).strip().lower()
    with _LOCK:
        del _REGISTRY[key]
        for k in [k for k in _INSTANCES if k[0] == key]:
            del _INSTANCES[k]


def accountant_names(rigorous: bool = False) -> tuple[str, ...]:
    """Names of the registered accountants (``rdp``, ``pld``, ``gdp-clt``, ...); with
    ``rigorous`` only those whose every ε is an upper bound (``approximate`` False)."""
    if not rigorous:
        return tuple(_REGISTRY)
    return tuple(n for n in _REGISTRY if not make_accountant(n).approximate)


def as_accountant_name(name: object) -> str:
    """Validate an accountant name; ValueError names ``accountant`` and the allowed values."""
    key = str(name).strip().lower()
    if key not in _REGISTRY:
        raise ValueError(f"accountant: expected one of {', '.join(_REGISTRY)}, got {name!r}")
    return key


def make_accountant(name: str | Accountant = "rdp", **options: object) -> Accountant:
    """The accountant ``name`` built with ``options`` (shared instances: they cache results).

    An :class:`Accountant` instance is returned unchanged.
    """
    if not isinstance(name, str):
        if isinstance(name, Accountant):
            return name
        raise ValueError(f"accountant: expected a name or an Accountant, got {name!r}")
    key = as_accountant_name(name)
    norm = tuple(sorted((k, _freeze(v)) for k, v in options.items()))
    with _LOCK:
        inst = _INSTANCES.pop((key, norm), None)
        if inst is not None:  # least recently used first: a hit moves to the end
            _INSTANCES[(key, norm)] = inst
        else:
            inst = _REGISTRY[key](**options)
            if len(_INSTANCES) >= _MAX_INSTANCES:
                _INSTANCES.pop(next(iter(_INSTANCES)))
            _INSTANCES[(key, norm)] = inst
    return inst


def _freeze(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def check_counts(counts: ArrayLike, n: int) -> np.ndarray:
    """Repetition counts as an int64 array of shape ``(n,)`` (a scalar broadcasts).

    Raises
    ------
    ValueError
        Naming ``counts``, unless every count is an integer >= 0 and the shape broadcasts.
    """
    k = np.asarray(counts, dtype=np.float64)
    if np.any(np.isnan(k)) or np.any(k != np.floor(k)) or np.any(k < 0):
        raise ValueError("counts: every repetition count must be an integer >= 0")
    try:
        return np.broadcast_to(k.astype(np.int64), (n,)).copy()
    except ValueError:
        raise ValueError(f"counts: expected a scalar or {n} values, got shape {k.shape}") from None
