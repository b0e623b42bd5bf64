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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl.checkpoint import (
    CHECKPOINT_NAME,
    LEGACY_CHECKPOINT_NAME,
    METRICS_NAME,
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
    Transport,
    aggregate_round,
    collect_privacy,
    diverged_round,
    evaluate_round,
    pooled_evaluation,
)
from pdpfl.fl.server_optimizer import ServerOptimizerSpec

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
        Show a progress bar over rounds (rich) on stderr.
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
    rounds, unit = settings.rounds, settings.unit
    optimizer = settings.server_optimizer.build() if settings.server_optimizer else None
    params: Params = [np.asarray(p).copy() for p in server.initial_params()]
    start, seconds_before = 0, 0.0
    run_id = secrets.token_hex(16)  # this run's identity (its checkpoints and ledgers)
    metrics: list[dict[str, Any]] = []
    if resume:
        ckpt = load_checkpoint(out)
        if ckpt is not None:
            if ckpt.get("config_hash") != settings.fingerprint:
                raise ValueError(
                    f"cannot resume: the checkpoint in {out} was written by a different config"
                )
            check_planned_rounds(ckpt, settings.planned_rounds or rounds, out)
            start = int(ckpt["next_round"])
            if start > rounds:
                raise ValueError(
                    f"cannot resume: the run in {out} already finished {start} rounds; "
                    f"training.rounds = {rounds} would shorten it (give a larger T to extend it)"
                )
            run_id = str(ckpt["run_id"])
            params = ckpt["params"]
            server.load_state_dict(ckpt["server_state"])
            if optimizer is not None:
                if "server_optimizer" not in ckpt:
                    raise ValueError(
                        f"cannot resume: the checkpoint in {out} holds no server_optimizer state"
                    )
                optimizer.load_state_dict(ckpt["server_optimizer"])
            transport.load_client_states(ckpt["client_states"])
            seconds_before = float(ckpt["seconds"])
            metrics = [m for m in read_metrics(out) if int(m["round"]) < start]
    planned_t = settings.planned_rounds
    # Past the planned T: units sit out at their budget, or the extension is refused unless the
    # user opted in (issue #34); before any store is opened and anything is charged.
    extension = (
        check_extension(
            run_holders(server, transport),
            planned=int(planned_t),
            rounds=rounds,
            start=start,
            allow_over_budget=settings.allow_over_budget,
            algorithm=settings.algorithm,
        )
        if planned_t is not None
        else None
    )
    for sentence in (extension or {}).get("warnings", []):
        log.warning("%s", sentence)
    last_round = rounds if stop_after is None else min(rounds, int(stop_after))
    next_round = start  # the round the checkpoint records (what the run's outputs are sealed at)
    # Every budget store of the parties held here is locked and charged from now on, before
    # any release; a run that would overspend and cannot stop its units is refused here.
    lifetime = open_lifetime(run_holders(server, transport), run_id, rounds - start)
    try:
        # the privacy summary of this view; each round replaces it (no round: computed now)
        privacy = (
            collect_privacy(transport.privacy_summaries(), server, unit)
            if start >= last_round
            else None
        )
        bar = _ProgressBar(rounds, start, enabled=progress)
    except BaseException:
        lifetime.close()
        raise
    t0 = time.perf_counter()
    try:
        # A transport that can announce the next round's training request early (Flower:
        # one polling wait per round instead of two) gets it right after aggregation, under
        # plain summation only. The selection is computed once either way, so the order of
        # events at every silo and the results are the same as without the announcement.
        prefetch = getattr(transport, "prefetch_fit", None) if protocol.name == "plain" else None
        planned: tuple[list[int], dict[str, Any]] | None = None
        diverged: TrainingDiverged | None = None
        for t in range(start, last_round):
            if planned is not None:
                selected, round_config = planned
            elif getattr(protocol, "silo_side_sampling", False):
                selected = list(transport.client_ids)  # each silo flips its own λ-coin
                round_config = dict(server.round_config(t))
            else:
                selected = list(server.select_clients(t, list(transport.client_ids)))
                round_config = dict(server.round_config(t))
            planned = None
            try:
                aggregate, params = aggregate_round(
                    server, transport, protocol, params, t, selected, round_config, optimizer
                )
                if prefetch is not None and t + 1 < last_round:
                    planned = (
                        list(server.select_clients(t + 1, list(transport.client_ids))),
                        dict(server.round_config(t + 1)),
                    )
                    if planned[0]:
                        prefetch(planned[0], params, t + 1, planned[1])
                line, privacy = evaluate_round(
                    server, transport, params, t, round_config, selected, aggregate.count, unit
                )
            except TrainingDiverged as err:
                # Nothing non-finite was published. Keep what happened: the round is recorded
                # (its charges stay -- other silos may have released), the model stays the
                # last finite one.
                log.error("%s", err)
                diverged = err
                line, privacy = diverged_round(err, server, transport, unit)
            line["seconds"] = seconds_before + time.perf_counter() - t0
            metrics.append(line)
            if save_model is not None and diverged is None:
                save_model(t, params, run_id)
            state: dict[str, Any] = {
                "next_round": int(line["round"]) + 1,
                "params": params,
                "server_state": server.state_dict(),
                "client_states": transport.client_states(),
                "seconds": line["seconds"],
                "config_hash": settings.fingerprint,
                "run_id": run_id,
                "planned_rounds": settings.planned_rounds or rounds,
            }
            if optimizer is not None:
                state["server_optimizer"] = optimizer.state_dict()
            save_round(out, metrics, state)
            next_round = int(line["round"]) + 1
            if diverged is not None:
                break
            log.info(
                "round %d/%d: %d silo(s) selected, %d contribution(s), accuracy %s, max ε %s",
                t + 1,
                rounds,
                len(selected),
                aggregate.count,
                _short(line.get("accuracy")),
                "-" if privacy is None else _short(privacy.headline_epsilon("both")),
            )
            bar.advance(line)
            if on_round is not None:
                on_round(t, line)
    finally:
        bar.close()
        lifetime.close()
    record: dict[str, Any] = {
        "params": params,
        "metrics": metrics,
        "seconds": metrics[-1]["seconds"]
        if diverged is not None
        else seconds_before + time.perf_counter() - t0,
        "privacy": privacy,
        "server_state": server.state_dict(),
        "completed": diverged is None and last_round == rounds,
        "fingerprint": settings.fingerprint,
        "run_id": run_id,
        "next_round": next_round,
        "lifetime": lifetime.report(),
        "extension": extension,
    }
    if diverged is not None:
        record["diverged"] = diverged.to_dict()
        diverged.result = record
        raise diverged
    return record


def _short(x: Any) -> str:
    return "-" if x is None else f"{float(x):.4g}"


def _fingerprint(config: Any) -> str | None:
    try:
        from pdpfl.config import run_fingerprint

        return run_fingerprint(config)
    except Exception:  # pragma: no cover - non-pdpfl configs (tests with stubs)
        return None


class _ProgressBar:
    """A rich progress bar over rounds (no-op when disabled)."""

    def __init__(self, total: int, completed: int, *, enabled: bool) -> None:
        self._progress = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            TextColumn("round"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task("rounds", total=total, completed=completed, info="")

    def advance(self, line: dict[str, Any]) -> None:
        if self._progress is None:
            return
        acc = line.get("accuracy")
        info = f"acc {acc:.3f}" if isinstance(acc, float) and np.isfinite(acc) else ""
        self._progress.update(self._task, advance=1, info=info)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
