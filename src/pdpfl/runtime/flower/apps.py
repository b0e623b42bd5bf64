"""The pdpfl Flower app: one ServerApp (the federation's server) and one ClientApp (a silo).

``flwr run`` finds them through the app's ``pyproject.toml``::

    [tool.flwr.app.components]
    serverapp = "pdpfl.runtime.flower.apps:server_app"
    clientapp = "pdpfl.runtime.flower.apps:client_app"

Run config keys (``[tool.flwr.app.config]``, written by :func:`write_app`):
``pdpfl-config`` (the experiment config as base64 JSON), ``pdpfl-hooks`` (an
:class:`~pdpfl.runtime.flower.hooks.AppHooks` import spec), ``pdpfl-out-dir`` (server-side output
folder), ``pdpfl-resume``, ``pdpfl-round-timeout``, ``pdpfl-startup-timeout``, ``pdpfl-min-silos``,
``pdpfl-prefetch`` (send each round's training request together with the evaluation of the model
it starts from, in one message per silo; default true).

Node config keys (``flower-supernode --node-config``): ``partition-id`` (the silo index),
``num-partitions``, and optionally ``data-dir`` (the silo's data), ``state-dir`` (where the
silo keeps its records' ledger and counters) and ``hooks`` (a non-default hooks spec the silo
agrees to load).

Messages (``message_type``) and what a silo replies -- nothing else; each reply passes the
silo's gate (:func:`pdpfl.fl.messages.check_outgoing`, one declared schema per message) before it
is encoded:

=================  ============================================================================
``query.hello``    ``hello`` (partition id, number of partitions, whether it holds state for the
                   run) and ``info`` (public facts: shapes, class count, name; its size only when
                   the config declares sizes public)
``train``          exactly its :class:`~pdpfl.fl.api.Contribution`: ``update`` (arrays) and
                   ``contribution`` (public weight, declared-public metrics); a training request
                   that also asks for the evaluation of the model it starts from (records
                   ``evaluate`` and ``evaluate.config``) gets ``metrics`` as well (see below)
``evaluate``       ``metrics``: ``loss``, ``accuracy``, ``n`` of its test split
``query.stage``    one stage of a multi-stage summation protocol: the protocol's own payload
                   (``payload.arrays``, ``payload.values``; see :mod:`pdpfl.fl.aggregation`)
=================  ============================================================================

The silo side (:mod:`pdpfl.runtime.flower.silo`) keeps the silo's algorithm in memory in a warm
worker, or rebuilds it from its state file in a per-message process; either way its state and
ledger are on its disk before a reply leaves, and its privacy summary stays there
(``<state-dir>/run-<key>/privacy-summary-silo-<i>.json``).
"""

from __future__ import annotations

import math
import os
import secrets
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from pdpfl.checkpoint import finite
from pdpfl.errors import TrainingDiverged
from pdpfl.fl.api import (
    ClientAlgorithm,
    Contribution,
    Params,
    PrivacyBoundaryError,
    Scalars,
    check_contribution,
    check_evaluation,
)
from pdpfl.fl.messages import DIVERGED_REPLY, HELLO_REPLY, Outgoing, check_outgoing, public_cause
from pdpfl.io import write_json, write_text
from pdpfl.runtime.flower.codec import (
    config_to_scalars,
    contribution_to_records,
    decode_config,
    payload_to_records,
    record_to_params,
    records_to_payload,
    scalars_to_config,
)
from pdpfl.runtime.flower.discovery import Status, discover_silos
from pdpfl.runtime.flower.hooks import DEFAULT_HOOKS, NUM_PARTITIONS, AppHooks, load_hooks
from pdpfl.runtime.flower.transport import (
    ACTION_HELLO,
    CONTROL,
    DIVERGED,
    EVALUATE_FIRST,
    STAGE,
    FlowerTransport,
)
from pdpfl.runtime.outputs import silo_report

if TYPE_CHECKING:
    from pdpfl.runtime.flower.silo import Silo

#: Files the ServerApp writes under ``<out-dir>/flower/``.
RESULT_FILE = "server_result.json"
RUN_KEY_FILE = "run_key"
EVENTS_FILE = "transport.jsonl"
#: The ServerApp's progress (phase, silos connected, last round), rewritten atomically.
STATUS_FILE = "status.json"
#: Run-config key (set by ``--runtime flower-simulation`` only): evaluate only the sampled silos
#: before the final round (:meth:`~pdpfl.runtime.flower.transport.FlowerTransport.
#: evaluation_clients`). A deployment's silos are each asked every round: each hospital's own
#: ledger stays current round by round, and a cross-silo federation is small.
EVALUATE_SAMPLED = "pdpfl-evaluate-sampled"
#: With :data:`EVALUATE_SAMPLED`: the server's public setup (exactly what every message carries),
#: written once the server is built, for the operator's end-of-run catch-up of the silos that
#: were not asked lately (:mod:`pdpfl.runtime.flower.catch_up`).
PUBLIC_FILE = "public.json"

server_app = ServerApp()
client_app = ClientApp()


def _experiment(run_config: Mapping[str, Any]) -> tuple[AppHooks, Any]:
    hooks = load_hooks(str(run_config.get("pdpfl-hooks", DEFAULT_HOOKS)))
    return hooks, hooks.config_from_dict(decode_config(str(run_config["pdpfl-config"])))


# =============================================================================== ClientApp


def _process_age() -> float | None:
    """Seconds since this process started (Linux; None elsewhere): start-up + imports."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return round(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 4)
    except (OSError, ValueError, IndexError):
        return None


def _reply(msg: Message, records: dict[str, Any]) -> Message:
    return Message(RecordDict(records), reply_to=msg)


def release_key(round_index: int, params: Params, config: Mapping[str, Any]) -> str:
    from pdpfl.runtime.flower.silo import release_key as key

    return key(round_index, params, config)


def _diverged(
    msg: Message,
    silo: Silo,
    err: TrainingDiverged,
    action: str,
    round_index: int,
    compute_s: float,
    age: float | None,
    evaluation: MetricRecord | None = None,
) -> Message:
    """The reply of a silo whose training diverged: nothing released, only where and why
    (public: the run stops for everyone), and the evaluation it was asked for with it. Its
    charges are on its disk first."""
    silo.save(action, round_index, compute_s, age)
    # What leaves: the round and a declared cause (the silo's own text stays in its log).
    reply: dict[str, Any] = {
        "round": int(err.round_index),
        "cause": public_cause(str(err.cause)),
    }
    check_outgoing(DIVERGED_REPLY, reply, Outgoing(round_index=round_index, silo_id=silo.silo))
    records: dict[str, Any] = {DIVERGED: ConfigRecord(reply)}
    if evaluation is not None:
        records["metrics"] = evaluation
    return _reply(msg, records)


def _silo(msg: Message, context: Context) -> tuple[Silo, int, str]:
    from pdpfl.runtime.flower.silo import HOST

    control = msg.content.config_records[CONTROL]
    silo = HOST.silo(context.run_config, context.node_config, str(control["run_key"]))
    return silo, int(cast(int, control["round"])), str(control.get("public", "{}"))


@client_app.query(ACTION_HELLO)
def _hello(msg: Message, context: Context) -> Message:
    silo, _, _ = _silo(msg, context)
    info = silo.hooks.silo_info(silo.config, silo.silo, silo.node_config)
    hello: dict[str, Any] = {
        "partition-id": silo.silo,
        "num-partitions": int(silo.node_config.get(NUM_PARTITIONS, -1)),
        "has-state": silo.has_state(),
    }
    facts = Outgoing(silo_id=silo.silo, config=silo.config)
    check_outgoing(HELLO_REPLY, hello, facts)
    check_outgoing(silo.hooks.silo_info_message, info, facts)
    return _reply(msg, {"hello": ConfigRecord(hello), "info": scalars_to_config(info)})


def _evaluation(
    client: ClientAlgorithm,
    silo: Silo,
    params: Params,
    round_index: int,
    config: Scalars,
    age: float | None,
    *,
    persist: bool = True,
) -> MetricRecord:
    """Evaluate ``params`` on the silo's test split: ``loss``, ``accuracy``, ``n`` only."""
    t0 = time.perf_counter()
    with silo.threads():
        result = client.evaluate(params, round_index, config)
    check_evaluation(result, silo=silo.silo, round_index=round_index)  # the silo's gate
    compute_s = time.perf_counter() - t0
    # Evaluation also catches up the silo's Type II accounting for the round: persisted here,
    # or (inside a training request) by the training's save before the reply leaves.
    silo.save("evaluate", round_index, compute_s, age, persist=persist)
    return MetricRecord(
        {
            "loss": float(result["loss"]),
            "accuracy": float(result["accuracy"]),
            "n": int(result["n"]),
        }
    )


def _gate_training(
    silo: Silo,
    contribution: Contribution,
    params: Params,
    round_index: int,
    age: float | None,
    spent: float,
) -> None:
    """The silo's gate for its training reply; a refusal keeps the round's charge on disk."""
    public = frozenset(getattr(silo.client, "public_metrics", frozenset()))
    try:
        check_contribution(
            contribution,
            public,
            params=params,
            silo=silo.silo,
            round_index=round_index,
            encoding=getattr(silo.client, "share_encoding", None),
        )
    except PrivacyBoundaryError:
        silo.save("fit-refused", round_index, spent, age)
        raise


@client_app.train()
def _train(msg: Message, context: Context) -> Message:
    age = _process_age()
    silo, round_index, public = _silo(msg, context)
    client = silo.ensure_client(public)
    params = record_to_params(msg.content.array_records["params"])
    config = config_to_scalars(msg.content.config_records["config"])
    evaluation = None
    if EVALUATE_FIRST in msg.content.config_records:
        # A training request that also carries the evaluation of the model it starts from
        # (the previous round's global model): evaluate first, as the simulator does.
        first = msg.content.config_records[EVALUATE_FIRST]
        evaluation = _evaluation(
            client,
            silo,
            params,
            int(cast(int, first["round"])),
            config_to_scalars(msg.content.config_records[EVALUATE_FIRST + ".config"]),
            age,
            persist=False,
        )
        age = None
    key = release_key(round_index, params, config)
    t0 = time.perf_counter()
    contribution = silo.cached_release(key)
    action = "fit-replay"
    if contribution is None:  # a new request (not a resumed run asking again)
        action = "fit"
        try:
            with silo.threads():
                contribution = client.fit(params, round_index, config)
        except TrainingDiverged as err:  # NonFiniteError: nothing was released
            return _diverged(
                msg,
                silo,
                err,
                "fit-diverged",
                round_index,
                time.perf_counter() - t0,
                age,
                evaluation,
            )
        _gate_training(silo, contribution, params, round_index, age, time.perf_counter() - t0)
        silo.remember_release(key, contribution)
    else:
        _gate_training(silo, contribution, params, round_index, age, 0.0)
    compute_s = time.perf_counter() - t0
    records = contribution_to_records(contribution)
    if evaluation is not None:
        records["metrics"] = evaluation
    # Write-ahead: the round's charge is on the silo's disk before the update leaves it.
    silo.save(action, round_index, compute_s, age)
    return _reply(msg, records)


@client_app.evaluate()
def _evaluate(msg: Message, context: Context) -> Message:
    age = _process_age()
    silo, round_index, public = _silo(msg, context)
    client = silo.ensure_client(public)
    params = record_to_params(msg.content.array_records["params"])
    config = config_to_scalars(msg.content.config_records["config"])
    return _reply(msg, {"metrics": _evaluation(client, silo, params, round_index, config, age)})


@client_app.query(STAGE)
def _stage(msg: Message, context: Context) -> Message:
    from pdpfl.fl.aggregation import SiloContext, handle_silo_stage, holds_secrets
    from pdpfl.runtime.flower.silo import is_warm

    age = _process_age()
    silo, round_index, public = _silo(msg, context)
    stage = msg.content.config_records[STAGE]
    protocol, name = str(stage["protocol"]), str(stage["stage"])
    if holds_secrets(protocol) and not is_warm():
        raise PermissionError(
            f"silo {silo.silo}: aggregation protocol {protocol!r} keeps the round's keys and "
            "mask seeds in the silo's memory between stages, and this SuperNode starts a fresh "
            "process per message (mode per-message), which would have to write them to disk; "
            "start the silo with the pdpfl worker (pdpfl flower supernode --mode warm)"
        )
    client = silo.ensure_client(public)
    names = set(msg.content.keys()) - {CONTROL, STAGE}
    payload = records_to_payload(names, msg.content)
    t0 = time.perf_counter()
    try:
        with silo.threads():
            out = handle_silo_stage(
                protocol,
                name,
                payload,
                round_index,
                SiloContext(client, silo.silo, silo.memory, silo.security()),
            )
    except TrainingDiverged as err:  # a stage that trains: nothing was released
        return _diverged(
            msg,
            silo,
            err,
            f"stage:{protocol}/{name}-diverged",
            round_index,
            time.perf_counter() - t0,
            age,
        )
    except PrivacyBoundaryError:  # the gate refused the reply: keep any charge, send nothing
        silo.save(f"stage:{protocol}/{name}-refused", round_index, time.perf_counter() - t0, age)
        raise
    compute_s = time.perf_counter() - t0
    records = payload_to_records(out)  # exactly the payload that passed the gate
    # A stage may release the silo's contribution: its charge is on disk first.
    silo.save(f"stage:{protocol}/{name}", round_index, compute_s, age)
    return _reply(msg, records)


# =============================================================================== ServerApp


def _log(text: str) -> None:
    """A line in the ServerApp's log (``flwr run --stream`` shows it to the submitter)."""
    from logging import INFO

    from flwr.common.logger import log

    log(INFO, "[pdpfl] %s", text)


def _run_key(flower_dir: Path, resume: bool) -> tuple[str, bool]:
    """(key, resumed): the run's key is reused when resuming from a checkpoint."""
    from pdpfl.runtime.loop import CHECKPOINT_NAME

    path = flower_dir / RUN_KEY_FILE
    if resume and path.exists() and (flower_dir.parent / CHECKPOINT_NAME).exists():
        return path.read_text().strip(), True
    if resume and not (flower_dir.parent / CHECKPOINT_NAME).exists():
        # --resume never starts a run (its silos would charge everyone again)
        raise ValueError(
            f"--resume: nothing to resume in {flower_dir.parent} (no {CHECKPOINT_NAME} of a "
            "Flower run there); start a new run without --resume, or name the run's folder"
        )
    key = secrets.token_hex(8)
    write_text(path, key + "\n")
    return key, False


class RoundReporter:
    """After each round: one log line and the status file (round, sampled silos, accuracy)."""

    def __init__(self, status: Status, rounds: int, transport: FlowerTransport) -> None:
        self.status, self.rounds, self.transport = status, rounds, transport

    def __call__(self, t: int, line: dict[str, Any]) -> None:
        acc = line.get("accuracy")
        if not (isinstance(acc, float) and math.isfinite(acc)):
            acc = None  # no test records among the silos evaluated (the status file is JSON)
        acc_text = "-" if acc is None else f"{acc:.4f}"
        lost = sorted(self.transport.lost)
        _log(
            f"round {t + 1}/{self.rounds}: sampled silos {line.get('selected')} "
            f"({line.get('contributions')} contributions), accuracy {acc_text}"
            + (f", lost silos {lost}" if lost else "")
        )
        self.status.update(
            phase="rounds",
            round=t + 1,
            rounds=self.rounds,
            selected=line.get("selected"),
            accuracy=acc,
            lost=lost,
        )


def _lost_rounds(transport: FlowerTransport | None) -> dict[str, int]:
    """The (0-based) round in which each lost silo was lost (none before the rounds began)."""
    if transport is None:
        return {}
    return {str(s): int(r) for s, r in sorted(transport.lost_round.items())}


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
    run_config = context.run_config
    out_dir = Path(str(run_config["pdpfl-out-dir"]))
    flower_dir = out_dir / "flower"
    flower_dir.mkdir(parents=True, exist_ok=True)
    status = Status(flower_dir / STATUS_FILE)
    t0 = time.perf_counter()
    diverged: TrainingDiverged | None = None
    transport: FlowerTransport | None = None
    try:
        status.update(phase="starting", pid=os.getpid())
        hooks, config = _experiment(run_config)
        resume = bool(run_config.get("pdpfl-resume", False))
        run_key, resumed = _run_key(flower_dir, resume)
        num_silos = hooks.num_silos(config)
        timeout = float(run_config.get("pdpfl-startup-timeout", 60.0 + 10.0 * num_silos))
        _log(f"waiting for {num_silos} silos (up to {timeout:g} s)")
        silo_nodes, infos = discover_silos(
            grid, num_silos, run_key, timeout, status=status, require_state=resumed
        )
        startup_s = time.perf_counter() - t0
        _log(f"all {num_silos} silos ready after {startup_s:.1f} s")
        server, public = hooks.build_server(config, infos)
        rounds = int(getattr(getattr(config, "training", None), "rounds", 0))
        transport = FlowerTransport(
            grid,
            silo_nodes,
            run_key=run_key,
            public=public,
            round_timeout_s=float(run_config.get("pdpfl-round-timeout", 120.0)),
            min_silos=int(run_config.get("pdpfl-min-silos", 1)),
            log_path=flower_dir / EVENTS_FILE,
            prefetch=bool(run_config.get("pdpfl-prefetch", True)),
            final_round=rounds - 1,
            evaluate_sampled=bool(run_config.get(EVALUATE_SAMPLED, False)),
        )
        if transport.evaluate_sampled:  # the operator catches the silos up after the run
            write_text(flower_dir / PUBLIC_FILE, transport.public_json)
        reporter = RoundReporter(status, rounds, transport)
        try:
            result = hooks.run(config, server, transport, out_dir, resume, on_round=reporter)
        except TrainingDiverged as err:  # the round loop kept every finished round
            if err.result is None:
                raise
            diverged, result = err, err.result
        if hooks.run_facts is not None:
            result.update(hooks.run_facts(config, infos))
        names = {s: str(infos[s].get("name", s)) for s in infos}
        result["silos"] = silo_report(names, transport.lost_report(names), result)
        summary = hooks.finish(config, result, out_dir)
        write_json(
            flower_dir / RESULT_FILE,
            {
                "status": "ok" if diverged is None else "diverged",
                **(
                    {}
                    if diverged is None
                    else {"error": str(diverged), "diverged": diverged.to_dict()}
                ),
                "run_key": run_key,
                "silo_nodes": {str(s): str(n) for s, n in sorted(silo_nodes.items())},
                "lost": {str(s): why for s, why in sorted(transport.lost.items())},
                "lost_round": _lost_rounds(transport),
                "startup_seconds": startup_s,
                "seconds": time.perf_counter() - t0,
                "completed": bool(result.get("completed", True)),
                "summary": finite(summary),
            },
        )
        if diverged is not None:  # the outputs (completed: false) are written; now say it loudly
            status.update(phase="diverged", error=str(diverged))
            _log(f"error: {diverged}")
            raise diverged
        status.update(phase="done")
    except BaseException as err:  # report every failure to the launcher, then let Flower see it
        if err is diverged:
            raise
        write_json(
            flower_dir / RESULT_FILE,
            {
                "status": "error",
                "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(),
                "lost_round": _lost_rounds(transport),
            },
        )
        status.update(phase="error", error=f"{type(err).__name__}: {err}")
        raise


__all__ = ["Status", "client_app", "discover_silos", "server_app"]
