"""Exceptions a pdpfl run raises for something other than bad input (bad input is a
``ValueError`` naming the field; :class:`pdpfl.config.ConfigError` for a configuration).

This module imports nothing of pdpfl: every layer may raise these.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TrainingDiverged"]


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
