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

import json
import logging
import secrets
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pdpfl.errors import LIKELY_CAUSES, TrainingDiverged
from pdpfl.fl.aggregation import SumProtocol, check_compatible, protocol_from_config
from pdpfl.fl.api import Contribution, Params, Scalars, ServerAlgorithm, check_evaluation
from pdpfl.integrity import IntegrityError, check_progress, record_progress, seal, unseal
from pdpfl.io import decode_state, encode_state, write_bytes, write_text
from pdpfl.ledger import PrivacySummary

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.npz"
#: The first release's pickle checkpoint: never loaded (it could run code).
LEGACY_CHECKPOINT_NAME = "checkpoint.pkl"
METRICS_NAME = "metrics.jsonl"


@runtime_checkable
class Transport(Protocol):
    """How the round loop reaches the silos (direct calls in-process, messages with Flower)."""

    client_ids: list[int]

    def fit(
        self, selected: list[int], params: Params, round_index: int, config: Scalars
    ) -> list[Contribution]:
        """Local training on each selected silo; their contributions in ``selected`` order.

        A silo that is lost (deployment runtimes) is simply missing from the result.
        """
        ...

    def evaluate(
        self, client_ids: list[int], params: Params, round_index: int, config: Scalars
    ) -> dict[int, Scalars]:
        """Test metrics (``loss``, ``accuracy``, ``n``) of ``params`` on each silo's test split.

        Every silo is told ``round_index`` so that one not selected this round catches up its
        third-party (Type II) accounting for the rounds it did not train in.
        """
        ...

    def privacy_summaries(self) -> dict[int, PrivacySummary | None]:
        """The operator's view of each silo's privacy state (aggregates only).

        Only meaningful where one operator owns every silo (the in-process simulator). A
        deployment transport returns ``{}``: privacy summaries stay at the silos.
        """
        ...

    def exchange(
        self, protocol: str, stage: str, requests: dict[int, dict[str, Any]], round_index: int
    ) -> dict[int, dict[str, Any]]:
        """One stage of a multi-message protocol: send each silo its request payload and return
        the replies of the silos that answered (see :mod:`pdpfl.fl.aggregation`)."""
        ...

    def client_states(self) -> dict[int, dict]:
        """Everything needed to resume each silo exactly."""
        ...

    def load_client_states(self, states: dict[int, dict]) -> None: ...


#: Called after each round with (round_index, metrics line); used for progress bars.
RoundCallback = Callable[[int, dict[str, Any]], None]


def pooled_evaluation(evals: dict[int, Scalars]) -> dict[str, float]:
    """Pooled (example-weighted) and client-mean test loss/accuracy over the test records
    that exist (silos with an empty test split are left out)."""
    evals = {c: e for c, e in evals.items() if float(e.get("n", 0)) > 0}
    if not evals:
        nan = float("nan")
        return {"accuracy": nan, "loss": nan, "mean_client_accuracy": nan}
    n = np.array([float(e.get("n", 0)) for e in evals.values()])
    acc = np.array([float(e["accuracy"]) for e in evals.values()])
    loss = np.array([float(e["loss"]) for e in evals.values()])
    total = n.sum()
    weights = n / total if total > 0 else np.full(len(n), 1.0 / len(n))
    return {
        "accuracy": float(np.dot(weights, acc)),
        "loss": float(np.dot(weights, loss)),
        "mean_client_accuracy": float(acc.mean()),
    }


def collect_privacy(
    summaries: dict[int, Any], server: ServerAlgorithm, unit: str
) -> PrivacySummary | None:
    """One typed summary of every unit this view can see: the silos' own summaries (the
    operator's view; empty in a deployment) merged with the server's (e.g. ULDP-FL's users,
    whose ledger lives at the server). None when nothing is accounted in this view."""
    parts: list[PrivacySummary | None] = list(summaries.values())
    own = getattr(server, "privacy_summary", None)
    if callable(own):
        parts.append(own())
    present = [p for p in parts if p is not None]
    return PrivacySummary.merge(present) if present else None


def _finite(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become None, numpy scalars become Python scalars."""
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def read_metrics(out_dir: str | Path) -> list[dict[str, Any]]:
    """The per-round metrics lines written so far (empty list if none)."""
    path = Path(out_dir) / METRICS_NAME
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def save_checkpoint(out_dir: Path, state: dict[str, Any]) -> None:
    """Write the round loop's state atomically as a pickle-free, sealed ``checkpoint.npz``
    (:mod:`pdpfl.integrity`: an HMAC under the operator's key over the run id and the bytes),
    then raise the run's high-water mark to its ``next_round``."""
    run_id = str(state["run_id"])
    write_bytes(out_dir / CHECKPOINT_NAME,
                seal(encode_state(state), purpose="checkpoint", identity=run_id))
    record_progress(run_id, int(state["next_round"]))


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


def load_checkpoint(out_dir: str | Path) -> dict[str, Any] | None:
    """The last checkpoint written by :func:`run_federation`, or None.

    Raises ``ValueError`` for a truncated or tampered file, and for a first-release
    ``checkpoint.pkl`` (pickle is never loaded: it could execute code).
    """
    out = Path(out_dir)
    path = out / CHECKPOINT_NAME
    if not path.exists():
        if (out / LEGACY_CHECKPOINT_NAME).exists():
            raise ValueError(
                f"cannot resume: {out / LEGACY_CHECKPOINT_NAME} is a pickle checkpoint, which "
                "pdpfl no longer loads (it could execute code); start the run again"
            )
        return None
    try:
        payload, run_id = unseal(path.read_bytes(), purpose="checkpoint", what=str(path))
        state = decode_state(payload)
        if not isinstance(state, dict) or "next_round" not in state or "params" not in state:
            raise ValueError("missing fields")
        if state.get("run_id") != run_id:
            raise IntegrityError("its run id does not match its seal")
        check_progress(run_id, int(state["next_round"]))
        state["params"] = [np.asarray(p, dtype=np.float32) for p in state["params"]]
        if not all(np.all(np.isfinite(p)) for p in state["params"]):
            raise ValueError("its model parameters are not finite")
        return state
    except IntegrityError as exc:
        raise IntegrityError(f"cannot resume: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"cannot resume: {path} is not a valid pdpfl checkpoint ({exc})") from None


def has_checkpoint(out_dir: str | Path) -> bool:
    """True if ``out_dir`` holds a run checkpoint (current or first-release format)."""
    out = Path(out_dir)
    return (out / CHECKPOINT_NAME).exists() or (out / LEGACY_CHECKPOINT_NAME).exists()


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

    @classmethod
    def of(cls, config: Any) -> LoopSettings:
        """The settings of an :class:`~pdpfl.config.ExperimentConfig` (or a test stub)."""
        return cls(
            rounds=int(config.training.rounds),
            fingerprint=_fingerprint(config),
            unit=str(getattr(getattr(config, "algorithm", None), "unit", "record")),
            reproducible=getattr(config, "randomness", None) == "reproducible",
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
    return run_rounds(
        server, transport, out_dir, LoopSettings.of(config), protocol, resume=resume,
        progress=progress, on_round=on_round, stop_after=stop_after,
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
    save_model: Callable[[int, Params], None] | None = None,
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
        Optional ``(round_index, params)`` called with each round's global model (before its
        checkpoint is written).

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
            transport.load_client_states(ckpt["client_states"])
            seconds_before = float(ckpt["seconds"])
            metrics = [m for m in read_metrics(out) if int(m["round"]) < start]
    last_round = rounds if stop_after is None else min(rounds, int(stop_after))

    bar = _ProgressBar(rounds, start, enabled=progress)
    t0 = time.perf_counter()
    try:
        # A transport that can announce the next round's training request early (Flower:
        # one polling wait per round instead of two) gets it right after aggregation, under
        # plain summation only. The selection is computed once either way, so the order of
        # events at every silo and the results are the same as without the announcement.
        prefetch = getattr(transport, "prefetch_fit", None) if protocol.name == "plain" else None
        planned: tuple[list[int], dict[str, Any]] | None = None
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
            aggregate = protocol.collect(transport, selected, params, t, round_config, server)
            new_params = server.aggregate(t, params, aggregate)
            server.record_round(t, selected)  # the round happened: the server's view counts it
            _check_model(new_params, t)
            params = new_params
            if prefetch is not None and t + 1 < last_round:
                planned = (
                    list(server.select_clients(t + 1, list(transport.client_ids))),
                    dict(server.round_config(t + 1)),
                )
                if planned[0]:
                    prefetch(planned[0], params, t + 1, planned[1])
            evals = transport.evaluate(list(transport.client_ids), params, t, round_config)
            for c, e in evals.items():
                check_evaluation(e)
                if not np.isfinite(float(e.get("loss", 0.0))) and float(e.get("n", 0)) > 0:
                    raise TrainingDiverged(
                        f"the test loss of the new global model is not finite; likely "
                        f"{LIKELY_CAUSES}", round_index=t, silo=int(c),
                    )
            privacy = collect_privacy(transport.privacy_summaries(), server, unit)
            line = _metrics_line(t, selected, aggregate.count, evals, privacy)
            line["seconds"] = seconds_before + time.perf_counter() - t0
            metrics.append(line)
            if save_model is not None:
                save_model(t, params)
            write_text(
                out / METRICS_NAME,
                "".join(json.dumps(_finite(m), allow_nan=False) + "\n" for m in metrics),
            )
            save_checkpoint(
                out,
                {
                    "next_round": t + 1,
                    "params": params,
                    "server_state": server.state_dict(),
                    "client_states": transport.client_states(),
                    "seconds": line["seconds"],
                    "config_hash": settings.fingerprint,
                    "run_id": run_id,
                    "planned_rounds": settings.planned_rounds or rounds,
                },
            )
            log.info("round %d/%d: %d silo(s) selected, %d contribution(s), accuracy %s, "
                     "max ε %s", t + 1, rounds, len(selected), aggregate.count,
                     _short(line.get("accuracy")),
                     "-" if privacy is None else _short(privacy.headline_epsilon("both")))
            bar.advance(line)
            if on_round is not None:
                on_round(t, line)
    except TrainingDiverged as err:
        log.error("%s", err)
        # Nothing non-finite was published. Keep what happened: the round is recorded (its
        # charges stay -- other silos may have released), the model stays the last finite one.
        seconds = seconds_before + time.perf_counter() - t0
        line = {"round": err.round_index, "diverged": err.to_dict(), "seconds": seconds,
                "selected": [], "contributions": 0, "accuracy": None, "loss": None}
        metrics.append(line)
        write_text(out / METRICS_NAME,
                   "".join(json.dumps(_finite(m), allow_nan=False) + "\n" for m in metrics))
        save_checkpoint(out, {
            "next_round": err.round_index + 1,
            "params": params,
            "server_state": server.state_dict(),
            "client_states": transport.client_states(),
            "seconds": seconds,
            "config_hash": settings.fingerprint,
            "run_id": run_id,
            "planned_rounds": settings.planned_rounds or rounds,
        })
        err.result = {
            "params": params,
            "metrics": metrics,
            "seconds": seconds,
            "privacy": collect_privacy(transport.privacy_summaries(), server, unit),
            "server_state": server.state_dict(),
            "completed": False,
            "fingerprint": settings.fingerprint,
            "run_id": run_id,
            "diverged": err.to_dict(),
        }
        raise
    finally:
        bar.close()
    seconds = seconds_before + time.perf_counter() - t0
    return {
        "params": params,
        "metrics": metrics,
        "seconds": seconds,
        "privacy": collect_privacy(transport.privacy_summaries(), server, unit),
        "server_state": server.state_dict(),
        "completed": last_round == rounds,
        "fingerprint": settings.fingerprint,
        "run_id": run_id,
    }


def _short(x: Any) -> str:
    return "-" if x is None else f"{float(x):.4g}"


def _check_model(params: Params, t: int) -> None:
    """The aggregated global model must be finite (else nothing is published)."""
    for k, p in enumerate(params):
        if not np.all(np.isfinite(np.asarray(p))):
            raise TrainingDiverged(
                f"the aggregated global model (parameter {k}) is not finite; likely "
                f"{LIKELY_CAUSES}", round_index=t,
            )


def _fingerprint(config: Any) -> str | None:
    try:
        from pdpfl.config import run_fingerprint

        return run_fingerprint(config)
    except Exception:  # pragma: no cover - non-pdpfl configs (tests with stubs)
        return None


def _metrics_line(
    t: int,
    selected: list[int],
    contributions: int,
    evals: dict[int, Scalars],
    privacy: PrivacySummary | None,
) -> dict[str, Any]:
    pooled = pooled_evaluation(evals)
    return {
        "round": t,
        "selected": sorted(int(c) for c in selected),
        "contributions": int(contributions),
        "accuracy": pooled["accuracy"],
        "loss": pooled["loss"],
        "mean_client_accuracy": pooled["mean_client_accuracy"],
        "clients": {
            str(cid): {"accuracy": float(e["accuracy"]), "loss": float(e["loss"]), "n": int(e["n"])}
            for cid, e in sorted(evals.items())
        },
        "privacy": None if privacy is None else privacy.to_dict(),
    }


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
