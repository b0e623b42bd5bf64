"""The one federated round loop shared by every runtime (in-process simulation and Flower).

A runtime only provides a :class:`Transport` that moves parameters and small scalar dictionaries
to and from the silos; :func:`run_federation` owns the order of events of Algorithm 3 of the
rPDP-FL paper (§6.2) for every algorithm, as named steps:

1. :func:`~pdpfl.runtime.run_state.start_run` -- a fresh run or its checkpoint restored;
   :func:`check_run_extension` -- past the planned T, units sit out or the run is refused;
   the budget stores are locked before any release (:func:`~pdpfl.fl.lifetime.open_lifetime`);
2. per round, :func:`play_round`: :func:`~pdpfl.fl.rounds.select_round` (the server samples
   clients, Poisson with rate λ; an empty round counts and is not redrawn) →
   :func:`~pdpfl.fl.rounds.aggregate_round` (the summation protocol collects the selected
   silos' :class:`~pdpfl.fl.api.Contribution` s -- the only thing a silo releases -- and the
   server computes the next global model and records the round in its Type I view) →
   :func:`~pdpfl.fl.rounds.evaluate_round` (every silo evaluates it on its test split,
   aggregate metrics only, and catches up its own ledger);
3. :meth:`~pdpfl.runtime.run_state.RunState.checkpoint` -- one line appended to
   ``metrics.jsonl`` and a checkpoint written atomically; :func:`report_round` -- the log line
   and the one progress display (:class:`~pdpfl.runtime.progress.ProgressDisplay`);
4. :func:`run_record` -- what the run returns.

Randomness: with ``randomness: secure`` (default) every party draws its noise and coins from its
own secret key (:mod:`pdpfl.randomness`), which no checkpoint holds: a resumed run continues with
fresh keys. With ``randomness: reproducible`` all streams derive from ``(seed, purpose, round,
client)``, so a resumed run reproduces an uninterrupted one exactly.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsFloat

from pdpfl.checkpoint import (
    CHECKPOINT_NAME,
    LEGACY_CHECKPOINT_NAME,
    METRICS_NAME,
    has_checkpoint,
    load_checkpoint,
    read_metrics,
    save_checkpoint,
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
from pdpfl.ledger import PrivacySummary
from pdpfl.runtime.progress import ProgressDisplay
from pdpfl.runtime.run_state import LoopSettings, RunState, check_planned_rounds, start_run

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig

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


def run_federation(
    config: ExperimentConfig,
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
    lifetime: dict[str, Any] | None,
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


def _short(x: SupportsFloat | str | None) -> str:
    return "-" if x is None else f"{float(x):.4g}"
