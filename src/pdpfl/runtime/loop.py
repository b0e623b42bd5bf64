"""The one federated round loop shared by every runtime (in-process simulation and Flower).

A runtime only provides a :class:`Transport` that moves parameters and small scalar dictionaries
to and from the silos; :func:`run_federation` owns the order of events of Algorithm 3 of the
rPDP-FL paper (§6.2) for every algorithm:

1. the server samples clients (Poisson with rate λ; an empty round counts and is not redrawn),
2. the summation protocol (:mod:`pdpfl.fl.aggregation`) collects the selected silos'
   :class:`~pdpfl.fl.api.Contribution` s -- the only thing a silo releases -- and hands the server
   their sum (:class:`~pdpfl.fl.api.Aggregate`),
3. the server computes the next global model and records the round in its Type I view,
4. every silo evaluates the new global model on its test split (aggregate metrics only) and
   catches up its own ledger for the round,
5. one line is appended to ``metrics.jsonl`` and a checkpoint is written atomically.

Randomness: with ``randomness: secure`` (default) every party draws its noise and coins from its
own secret key (:mod:`pdpfl.randomness`), which no checkpoint holds: a resumed run continues with
fresh keys. With ``randomness: reproducible`` all streams derive from ``(seed, purpose, round,
client)``, so a resumed run reproduces an uninterrupted one exactly.

Checkpoints contain no pickle: arrays in an ``.npz`` read with ``allow_pickle=False`` and a JSON
skeleton (:func:`pdpfl.io.encode_state`); a truncated or tampered checkpoint is a clear error.
"""

from __future__ import annotations

import logging
import secrets
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl.checkpoint import (
    CHECKPOINT_NAME,
    LEGACY_CHECKPOINT_NAME,
    METRICS_NAME,
    config_changes,
    has_checkpoint,
    load_checkpoint,
    read_metrics,
    save_checkpoint,
    save_round,
)
from pdpfl.errors import TrainingDiverged
from pdpfl.fl.aggregation import SumProtocol, check_compatible, protocol_from_config
from pdpfl.fl.api import Params, ServerAlgorithm
from pdpfl.fl.extension import check_extension
from pdpfl.fl.lifetime import open_lifetime, run_holders
from pdpfl.fl.rounds import (
    Selection,
    Transport,
    aggregate_round,
    collect_privacy,
    diverged_round,
    evaluate_round,
    pooled_evaluation,
    select_round,
)
from pdpfl.fl.server_optimizer import ServerOptimizer, ServerOptimizerSpec
from pdpfl.ledger import PrivacySummary
from pdpfl.runtime.progress import ProgressDisplay

__all__ = [
    "CHECKPOINT_NAME",
    "LEGACY_CHECKPOINT_NAME",
    "METRICS_NAME",
    "LoopSettings",
    "RoundCallback",
    "Transport",
    "check_planned_rounds",
    "collect_privacy",
    "has_checkpoint",
    "load_checkpoint",
    "pooled_evaluation",
    "read_metrics",
    "run_federation",
    "run_rounds",
    "save_checkpoint",
]

log = logging.getLogger(__name__)

#: Called after each round with (round_index, metrics line); used for progress bars.
RoundCallback = Callable[[int, dict[str, Any]], None]


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
    def of(cls, config: Any) -> LoopSettings:
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


def run_federation(
    config: Any,
    server: ServerAlgorithm,
    transport: Transport,
    out_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    on_round: RoundCallback | None = None,
    stop_after: int | None = None,
    protocol: SumProtocol | None = None,
) -> dict[str, Any]:
    """:func:`run_rounds` for an experiment config (its settings and, by default, its
    summation protocol, :func:`~pdpfl.fl.aggregation.protocol_from_config`)."""
    protocol = protocol if protocol is not None else protocol_from_config(config)
    check_compatible(server, protocol)
    configure = getattr(transport, "configure_security", None)
    if callable(configure):  # in-process silos take their protocol settings from the config
        configure(config)
    return run_rounds(
        server,
        transport,
        out_dir,
        LoopSettings.of(config),
        protocol,
        resume=resume,
        progress=progress,
        on_round=on_round,
        stop_after=stop_after,
    )


def run_rounds(
    server: ServerAlgorithm,
    transport: Transport,
    out_dir: str | Path,
    settings: LoopSettings,
    protocol: SumProtocol,
    *,
    resume: bool = False,
    progress: bool = True,
    on_round: RoundCallback | None = None,
    stop_after: int | None = None,
    save_model: Callable[[int, Params, str], None] | None = None,
) -> dict[str, Any]:
    """Run ``settings.rounds`` rounds and return the run's record.

    The steps, each a function below: :func:`start_run` (a fresh run, or the checkpoint's
    state on ``resume``) → :func:`check_run_extension` (past the planned T) → the budget
    stores opened (:func:`~pdpfl.fl.lifetime.open_lifetime`) → per round :func:`play_round`
    (:func:`~pdpfl.fl.rounds.select_round` → :func:`~pdpfl.fl.rounds.aggregate_round` →
    :func:`~pdpfl.fl.rounds.evaluate_round`, or :func:`~pdpfl.fl.rounds.diverged_round`) →
    :meth:`RunState.checkpoint` → :func:`report_round` → :func:`run_record`.

    Parameters
    ----------
    server, transport
        The server algorithm and the way to reach the silos.
    out_dir
        Where ``metrics.jsonl`` and ``checkpoint.npz`` are written (atomically, every round).
    settings
        Rounds T, the configuration's fingerprint, the privacy unit, the randomness mode.
    protocol
        The summation protocol (:mod:`pdpfl.fl.aggregation`). A protocol with
        ``silo_side_sampling`` (hidden participation) asks every silo every round instead of
        the server's sample.
    resume
        Continue from ``out_dir/checkpoint.npz`` if present (with reproducible randomness, the
        same result as an uninterrupted run).
    progress
        Show the progress display (:class:`~pdpfl.runtime.progress.ProgressDisplay`) on stderr.
    on_round
        Optional callback ``(round_index, metrics_line)`` after each round.
    stop_after
        Stop (as if interrupted) after this many rounds in total; for tests of ``resume``.
    save_model
        Optional ``(round_index, params, run_id)`` called with each round's global model (before
        its checkpoint is written).

    Returns
    -------
    dict
        ``params`` (final global model), ``metrics`` (all lines), ``seconds`` (training wall time
        over all sessions), ``privacy`` (the final typed :class:`~pdpfl.ledger.PrivacySummary`
        of this view, or None), ``server_state``, ``completed`` (whether all T rounds ran).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if settings.reproducible:
        from pdpfl.randomness import ReproducibleRandomnessWarning

        warnings.warn(
            "randomness: reproducible -- noise and sampling coins are derived from the configured "
            "seed; anyone who knows it can remove the noise (no privacy guarantee against them)",
            ReproducibleRandomnessWarning,
            stacklevel=2,
        )
    state = start_run(server, transport, out, settings, resume=resume)
    extension = check_run_extension(server, transport, settings, state.start)
    last_round = settings.rounds if stop_after is None else min(settings.rounds, int(stop_after))
    # Every budget store of the parties held here is locked and charged from now on, before
    # any release; a run that would overspend and cannot stop its units is refused here.
    lifetime = open_lifetime(
        run_holders(server, transport), state.run_id, settings.rounds - state.start
    )
    try:
        # the privacy summary of this view; each round replaces it (no round: computed now)
        if state.start >= last_round:
            state.privacy = collect_privacy(transport.privacy_summaries(), server, settings.unit)
        display = ProgressDisplay(settings.rounds, state.start, enabled=progress)
        display.start("round")
    except BaseException:
        lifetime.close()
        raise
    state.t0 = time.perf_counter()
    try:
        # A transport that can announce the next round's training request early (Flower:
        # one polling wait per round instead of two) gets it right after aggregation, under
        # plain summation only. The selection is computed once either way, so the order of
        # events at every silo and the results are the same as without the announcement.
        prefetch = getattr(transport, "prefetch_fit", None) if protocol.name == "plain" else None
        planned: Selection | None = None
        for t in range(state.start, last_round):
            selection = (
                planned if planned is not None else select_round(server, transport, protocol, t)
            )
            line, planned, aggregated = play_round(
                server, transport, protocol, state, t, selection, prefetch, last_round
            )
            state.checkpoint(out, line, save_model)
            if state.diverged is not None:
                break
            report_round(line, selection, aggregated, state.privacy, settings.rounds, display)
            if on_round is not None:
                on_round(t, line)
    finally:
        display.close()
        lifetime.close()
    record = run_record(state, server, settings, last_round, lifetime.report(), extension)
    if state.diverged is not None:
        record["diverged"] = state.diverged.to_dict()
        state.diverged.result = record
        raise state.diverged
    return record


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


def check_run_extension(
    server: ServerAlgorithm, transport: Transport, settings: LoopSettings, start: int
) -> dict[str, Any] | None:
    """Past the planned T: units sit out at their budget, or the extension is refused unless
    the user opted in (issue #34; :func:`~pdpfl.fl.extension.check_extension`); before any
    store is opened and anything is charged. None when the run is not past its plan."""
    if settings.planned_rounds is None:
        return None
    extension = check_extension(
        run_holders(server, transport),
        planned=int(settings.planned_rounds),
        rounds=settings.rounds,
        start=start,
        allow_over_budget=settings.allow_over_budget,
        algorithm=settings.algorithm,
    )
    for sentence in (extension or {}).get("warnings", []):
        log.warning("%s", sentence)
    return extension


def play_round(
    server: ServerAlgorithm,
    transport: Transport,
    protocol: SumProtocol,
    state: RunState,
    t: int,
    selection: Selection,
    prefetch: Callable[..., Any] | None,
    last_round: int,
) -> tuple[dict[str, Any], Selection | None, int]:
    """Round ``t``: aggregate (the protocol collects the selected silos' sum, the server's new
    model), announce the next round's request early when the transport can (``prefetch``),
    evaluate (every silo's metrics, its ledger caught up). A round that diverged is recorded
    (:func:`~pdpfl.fl.rounds.diverged_round`; its charges stay, the model stays the last
    finite one) and ``state.diverged`` set. Returns the round's metrics line, the next round's
    selection if announced, and the number of contributions aggregated."""
    selected, round_config = selection
    planned: Selection | None = None
    try:
        aggregate, state.params = aggregate_round(
            server, transport, protocol, state.params, t, selected, round_config, state.optimizer
        )
        if prefetch is not None and t + 1 < last_round:
            planned = select_round(server, transport, None, t + 1)
            if planned[0]:
                prefetch(planned[0], state.params, t + 1, planned[1])
        line, state.privacy = evaluate_round(
            server,
            transport,
            state.params,
            t,
            round_config,
            selected,
            aggregate.count,
            state.settings.unit,
        )
        return line, planned, aggregate.count
    except TrainingDiverged as err:
        # Nothing non-finite was published. Keep what happened: the round is recorded (its
        # charges stay -- other silos may have released), the model stays the last finite one.
        log.error("%s", err)
        state.diverged = err
        line, state.privacy = diverged_round(err, server, transport, state.settings.unit)
        return line, None, 0


def report_round(
    line: dict[str, Any],
    selection: Selection,
    contributions: int,
    privacy: PrivacySummary | None,
    rounds: int,
    display: ProgressDisplay,
) -> None:
    """The round's log line and the progress display."""
    log.info(
        "round %d/%d: %d silo(s) selected, %d contribution(s), accuracy %s, max ε %s",
        int(line["round"]) + 1,
        rounds,
        len(selection[0]),
        contributions,
        _short(line.get("accuracy")),
        "-" if privacy is None else _short(privacy.headline_epsilon("both")),
    )
    display.round_done(int(line["round"]) + 1, accuracy=line.get("accuracy"), privacy=privacy)


def run_record(
    state: RunState,
    server: ServerAlgorithm,
    settings: LoopSettings,
    last_round: int,
    lifetime: Any,
    extension: dict[str, Any] | None,
) -> dict[str, Any]:
    """The run's record (see :func:`run_rounds`)."""
    metrics = state.metrics
    return {
        "params": state.params,
        "metrics": metrics,
        "seconds": metrics[-1]["seconds"] if state.diverged is not None else state.seconds(),
        "privacy": state.privacy,
        "server_state": server.state_dict(),
        "completed": state.diverged is None and last_round == settings.rounds,
        "fingerprint": settings.fingerprint,
        "run_id": state.run_id,
        "next_round": state.next_round,
        "lifetime": lifetime,
        "extension": extension,
    }


def _short(x: Any) -> str:
    return "-" if x is None else f"{float(x):.4g}"


def _fingerprint_fields(config: Any) -> dict[str, Any] | None:
    try:
        from pdpfl.config.loading import fingerprint_fields

        return fingerprint_fields(config)
    except Exception:  # pragma: no cover - non-pdpfl configs (tests with stubs)
        return None


def _fingerprint(config: Any) -> str | None:
    try:
        from pdpfl.config import run_fingerprint

        return run_fingerprint(config)
    except Exception:  # pragma: no cover - non-pdpfl configs (tests with stubs)
        return None
