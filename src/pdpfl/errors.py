"""Exceptions a pdpfl run raises for something other than bad input (bad input is a
``ValueError`` naming the field; :class:`pdpfl.config.ConfigError` for a configuration).

This module imports nothing of pdpfl: every layer may raise these.
"""

from __future__ import annotations

import importlib.util
from typing import Any

__all__ = ["EXTRAS", "MissingExtra", "TrainingDiverged", "extra_of", "require_extra"]


class TrainingDiverged(RuntimeError):
    """Training produced a non-finite model, update or loss: the run stopped.

    Nothing non-finite was released or published. Every round that finished before is kept
    (metrics, checkpoint), and every ledger charge -- including the round that diverged, whose
    other contributions may have been released -- is kept too: charges are never rolled back.

    Attributes
    ----------
    round_index
        The (0-based) round in which the non-finite value arose.
    silo
        The silo where it arose, or None when it arose at the server (the aggregate).
    cause
        What was found and the likely cause, in words.
    result
        The partial run record (set by the round loop; the outputs are written from it).
    """

    def __init__(self, cause: str, *, round_index: int, silo: int | None = None) -> None:
        self.cause = cause
        self.round_index = int(round_index)
        self.silo = silo
        self.result: dict[str, Any] | None = None
        where = "at the server" if silo is None else f"at silo {silo}"
        super().__init__(f"training diverged in round {self.round_index + 1} {where}: {cause}")

    def to_dict(self) -> dict[str, Any]:
        """The ``summary.json`` record of the divergence."""
        return {"round": self.round_index, "silo": self.silo, "cause": self.cause}


#: The likely causes, named in every divergence message.
LIKELY_CAUSES = (
    "a learning rate or weight decay too large for the model (lower training.lr / "
    "training.weight_decay), non-finite feature values in the data, or a model whose forward "
    "pass produces NaN"
)


#: The optional extras (``pip install 'pdpfl[EXTRA]'``): the top-level module each one brings,
#: and what it is for. Everything else a feature imports is a base dependency.
EXTRAS: dict[str, tuple[str, str]] = {
    "flwr": ("flower", "Flower deployments and --runtime flower"),
    "ray": ("simulation", "Flower's Simulation Engine (--runtime flower-simulation)"),
    "dp_accounting": ("pld", "the privacy-loss-distribution accountant (accountant: pld)"),
    "pandas": ("pandas", "DataFrames in and out"),
}


class MissingExtra(ImportError):
    """A feature needs a package of an optional extra that is not installed here.

    ``str(err)`` is ``<field>: <feature> needs the <extra> extra: pip install 'pdpfl[<extra>]'``
    (the CLI prints it as ``error: ...`` and exits 2).
    """

    def __init__(self, field: str, feature: str, extra: str, module: str) -> None:
        self.field, self.feature, self.extra = field, feature, extra
        super().__init__(
            f"{field}: {feature} needs the {extra} extra: pip install 'pdpfl[{extra}]' "
            f"({module} is not installed)",
            name=module,
        )


def require_extra(module: str, field: str, feature: str | None = None) -> None:
    """Raise :class:`MissingExtra` naming ``field`` when ``module`` (one of :data:`EXTRAS`'
    modules) cannot be imported here."""
    extra, purpose = EXTRAS[module]
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(field, feature or purpose, extra, module)


def extra_of(err: BaseException) -> tuple[str, str] | None:
    """``(module, extra)`` when ``err`` -- or an exception it was raised from -- is a failed
    import of an optional extra's module (:data:`EXTRAS`); else None."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ImportError) and current.name:
            module = current.name.split(".")[0]
            if module in EXTRAS:
                return module, EXTRAS[module][0]
        current = current.__cause__ or current.__context__
    return None
