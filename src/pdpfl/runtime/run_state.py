"""What a run is and what it carries from round to round: :class:`LoopSettings` (the public
facts of an experiment the round loop needs), :class:`RunState` (the model, the metrics, the
run id, the privacy summary; written by :meth:`RunState.checkpoint` every round) and
:func:`start_run` (a fresh run, or one restored from its checkpoint on ``resume``, checked to
belong to the same configuration and planned T: :func:`check_planned_rounds`).

Checkpoints contain no pickle: arrays in an ``.npz`` read with ``allow_pickle=False`` and a JSON
skeleton (:func:`pdpfl.io.encode_state`); a truncated or tampered checkpoint is a clear error.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.checkpoint import config_changes, load_checkpoint, read_metrics, save_round
from pdpfl.errors import TrainingDiverged
from pdpfl.fl.api import Params, ServerAlgorithm
from pdpfl.fl.rounds import Transport
from pdpfl.fl.server_optimizer import ServerOptimizer, ServerOptimizerSpec
from pdpfl.ledger import PrivacySummary

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig

__all__ = ["LoopSettings", "RunState", "check_planned_rounds", "start_run"]


def check_planned_rounds(ckpt: dict[str, Any], planned: int, out: Path | str) -> None:
    """Refuse to resume a checkpoint under a mechanism calibrated for another T.

    σ and the sampling rates are calibrated for the planned number of rounds, and a resumed
    ledger restores only its counts: a silo rebuilt for a larger T (smaller rates) would
    re-price the rounds already charged at the new, smaller rates and under-count ε. The
    simulator extends a run by rebuilding at the checkpoint's T (``planned_rounds``); a runtime
    that rebuilds at the new T must stop here."""
    was = int(ckpt.get("planned_rounds", planned))
    if was != int(planned):
        raise ValueError(
            f"training.rounds: the run in {out} was calibrated for {was} rounds; this runtime "
            f"would rebuild its mechanism for {planned} and re-price the rounds already charged; "
            "extend a finished run with the simulator (--runtime simulation --resume --set "
            "rounds=N), which keeps the published mechanism"
        )


@dataclass(frozen=True)
class LoopSettings:
    """What the round loop needs to know of an experiment (public facts only).

    ``fingerprint`` identifies the configuration a checkpoint belongs to (a resume with another
    configuration is refused); ``unit`` names the privacy unit of the summaries.
    """

    rounds: int
    fingerprint: str | None
    unit: str = "record"
    reproducible: bool = False
    #: T the algorithm's mechanism was published for (less than ``rounds`` when a finished
    #: run is extended; the ledgers charge every extra round).
    planned_rounds: int | None = None
    #: The fingerprinted part of the configuration (public), kept in the checkpoint so that a
    #: resume refused for another configuration names the fields that changed.
    config_fields: dict[str, Any] | None = None
    #: The server optimizer post-processing each round's model (None: the algorithm's step).
    server_optimizer: ServerOptimizerSpec | None = None
    #: The user's explicit opt-in to extend a run past its plan although units that cannot sit
    #: out exceed their budget (:func:`pdpfl.fl.extension.check_extension`).
    allow_over_budget: bool = False
    #: The algorithm's name (the extension's sentences name it).
    algorithm: str = "this algorithm"

    @classmethod
    def of(cls, config: ExperimentConfig) -> LoopSettings:
        """The settings of an :class:`~pdpfl.config.ExperimentConfig` (or a test stub)."""
        return cls(
            rounds=int(config.training.rounds),
            fingerprint=_fingerprint(config),
            unit=str(getattr(getattr(config, "algorithm", None), "unit", "record")),
            reproducible=getattr(config, "randomness", None) == "reproducible",
            config_fields=_fingerprint_fields(config),
            server_optimizer=ServerOptimizerSpec.from_config(
                getattr(config, "server_optimizer", None)
            ),
            algorithm=str(getattr(getattr(config, "algorithm", None), "name", "this algorithm")),
        )


@dataclass
class RunState:
    """What the loop carries from round to round (and a checkpoint restores)."""

    settings: LoopSettings
    server: ServerAlgorithm
    transport: Transport
    params: Params
    run_id: str
    optimizer: ServerOptimizer | None = None
    start: int = 0
    seconds_before: float = 0.0
    metrics: list[dict[str, Any]] = field(default_factory=list)
    #: The privacy summary of this view after the last round (None: nothing accounted yet).
    privacy: PrivacySummary | None = None
    #: The round the checkpoint records (what the run's outputs are sealed at).
    next_round: int = 0
    diverged: TrainingDiverged | None = None
    t0: float = 0.0

    def seconds(self) -> float:
        """Training wall time over all sessions, up to now."""
        return self.seconds_before + time.perf_counter() - self.t0

    def checkpoint(
        self,
        out: Path,
        line: dict[str, Any],
        save_model: Callable[[int, Params, str], None] | None,
    ) -> None:
        """Append the round's metrics line, save its model (not a diverged one) and write the
        checkpoint atomically (:func:`~pdpfl.checkpoint.save_round`)."""
        s = self.settings
        line["seconds"] = self.seconds()
        self.metrics.append(line)
        t = int(line["round"])
        if save_model is not None and self.diverged is None:
            save_model(t, self.params, self.run_id)
        state: dict[str, Any] = {
            "next_round": t + 1,
            "params": self.params,
            "server_state": self.server.state_dict(),
            "client_states": self.transport.client_states(),
            "seconds": line["seconds"],
            "config_hash": s.fingerprint,
            "run_id": self.run_id,
            "planned_rounds": s.planned_rounds or s.rounds,
            "config_fields": s.config_fields,
        }
        if self.optimizer is not None:
            state["server_optimizer"] = self.optimizer.state_dict()
        save_round(out, self.metrics, state)
        self.next_round = t + 1


def start_run(
    server: ServerAlgorithm,
    transport: Transport,
    out: Path,
    settings: LoopSettings,
    *,
    resume: bool,
) -> RunState:
    """A fresh run (a new run id, the server's x⁰), or -- on ``resume`` with a checkpoint in
    ``out`` -- the checkpoint's state restored into the server, the optimizer and the silos,
    after checking it belongs to this configuration and its planned T."""
    optimizer = settings.server_optimizer.build() if settings.server_optimizer else None
    state = RunState(
        settings,
        server,
        transport,
        params=[np.asarray(p).copy() for p in server.initial_params()],
        run_id=secrets.token_hex(16),  # this run's identity (its checkpoints and ledgers)
        optimizer=optimizer,
    )
    ckpt = load_checkpoint(out) if resume else None
    if ckpt is None:
        return state
    rounds = settings.rounds
    if ckpt.get("config_hash") != settings.fingerprint:
        changed = config_changes(ckpt.get("config_fields"), settings.config_fields)
        raise ValueError(
            f"cannot resume: the checkpoint in {out} was written by a different config"
            + (f"; changed: {', '.join(changed)}" if changed else "")
            + " (resume with the run's own config and --set values; only "
            "training.rounds may grow)"
        )
    check_planned_rounds(ckpt, settings.planned_rounds or rounds, out)
    start = int(ckpt["next_round"])
    if start > rounds:
        raise ValueError(
            f"cannot resume: the run in {out} already finished {start} rounds; "
            f"training.rounds = {rounds} would shorten it (give a larger T to extend it)"
        )
    state.start = state.next_round = start
    state.run_id = str(ckpt["run_id"])
    state.params = ckpt["params"]
    server.load_state_dict(ckpt["server_state"])
    if optimizer is not None:
        if "server_optimizer" not in ckpt:
            raise ValueError(
                f"cannot resume: the checkpoint in {out} holds no server_optimizer state"
            )
        optimizer.load_state_dict(ckpt["server_optimizer"])
    transport.load_client_states(ckpt["client_states"])
    state.seconds_before = float(ckpt["seconds"])
    state.metrics = [m for m in read_metrics(out) if int(m["round"]) < start]
    return state


def _fingerprint_fields(config: ExperimentConfig) -> dict[str, Any] | None:
    try:
        from pdpfl.config.loading import fingerprint_fields

        return fingerprint_fields(config)
    except Exception:  # pragma: no cover - non-pdpfl configs (tests with stubs)
        return None


def _fingerprint(config: ExperimentConfig) -> str | None:
    try:
        from pdpfl.config import run_fingerprint

        return run_fingerprint(config)
    except Exception:  # pragma: no cover - non-pdpfl configs (tests with stubs)
        return None
