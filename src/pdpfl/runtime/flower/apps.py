"""The pdpfl Flower app: one ServerApp (the federation's server) and one ClientApp (a silo).

``flwr run`` finds them through the app's ``pyproject.toml``::

    [tool.flwr.app.components]
    serverapp = "pdpfl.runtime.flower.apps:server_app"
    clientapp = "pdpfl.runtime.flower.apps:client_app"

Run config keys (``[tool.flwr.app.config]``, written by :func:`write_app`):
``pdpfl-config`` (the experiment config as base64 JSON), ``pdpfl-hooks`` (an
:class:`~pdpfl.runtime.flower.hooks.AppHooks` import spec), ``pdpfl-out-dir`` (server-side output
folder), ``pdpfl-resume``, ``pdpfl-round-timeout``, ``pdpfl-startup-timeout``, ``pdpfl-min-silos``.

Node config keys (``flower-supernode --node-config``): ``partition-id`` (the silo index),
``num-partitions``, and optionally ``data-dir`` (the silo's data) and ``state-dir`` (where the
silo keeps its records' ledger and counters between messages).

A SuperNode starts a fresh ClientApp process for every message, so a silo's algorithm state
lives in a state file under its ``state-dir``: loaded before, and written (atomically) after
each message, *before* the reply -- an update never leaves a silo before its charge is on disk.
The silo's secret randomness is *not* state: each message's process draws a fresh key.

What a silo sends (and nothing else): a train reply carries exactly its
:class:`~pdpfl.fl.api.Contribution` (``update`` arrays; ``contribution`` = weight and declared
public metrics); an evaluate reply carries ``loss``, ``accuracy``, ``n`` of its test split.
Its privacy summary is written to ``<state-dir>/run-<key>/privacy-summary-silo-<i>.json`` on the
silo's own disk.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from pdpfl.fl.api import ClientAlgorithm, Contribution, PrivacyBoundaryError, check_evaluation
from pdpfl.io import decode_state, encode_state, write_bytes, write_json, write_text
from pdpfl.runtime.flower.codec import (
    config_to_scalars,
    contribution_to_records,
    record_to_params,
    scalars_to_config,
    scalars_to_records,
)
from pdpfl.runtime.flower.hooks import (
    DEFAULT_HOOKS,
    NUM_PARTITIONS,
    PARTITION_ID,
    STATE_DIR,
    AppHooks,
    load_hooks,
)
from pdpfl.runtime.flower.transport import (
    ACTION_HELLO,
    CONTROL,
    FlowerRunError,
    FlowerTransport,
    control_record,
    send_and_receive,
)
from pdpfl.runtime.loop import _finite

#: Files the ServerApp writes under ``<out-dir>/flower/``.
RESULT_FILE = "server_result.json"
RUN_KEY_FILE = "run_key"
EVENTS_FILE = "transport.jsonl"

server_app = ServerApp()
client_app = ClientApp()


def encode_config(config_dict: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(config_dict).encode("utf-8")).decode("ascii")


def decode_config(text: str) -> dict[str, Any]:
    return json.loads(base64.b64decode(text.encode("ascii")).decode("utf-8"))


def _experiment(run_config: Mapping[str, Any]) -> tuple[AppHooks, Any]:
    hooks = load_hooks(str(run_config.get("pdpfl-hooks", DEFAULT_HOOKS)))
    return hooks, hooks.config_from_dict(decode_config(str(run_config["pdpfl-config"])))


# =============================================================================== ClientApp


class _Silo:
    """One message's view of the silo: its algorithm, rebuilt from config + state file."""

    def __init__(self, msg: Message, context: Context) -> None:
        self.process_age_s = _process_age()
        self.hooks, self.config = _experiment(context.run_config)
        node_config = dict(context.node_config)
        if PARTITION_ID not in node_config:
            raise ValueError(f"SuperNode started without --node-config '{PARTITION_ID}=<silo>'")
        self.silo = int(node_config[PARTITION_ID])
        self.node_config = node_config
        control = msg.content.config_records[CONTROL]
        self.run_key = str(control["run_key"])
        self.round = int(control["round"])
        self.public = json.loads(str(control.get("public", "{}")))
        state_root = node_config.get(STATE_DIR) or Path.home() / ".pdpfl" / "silo-state"
        self.state_path = (
            Path(str(state_root)).expanduser() / f"run-{self.run_key}" / f"silo-{self.silo}.npz"
        )

    def client(self) -> ClientAlgorithm:
        t0 = time.perf_counter()
        client = self.hooks.build_client(self.config, self.silo, self.node_config, self.public)
        if self.state_path.exists():
            client.load_state_dict(decode_state(self.state_path.read_bytes()))
        self._t_built = time.perf_counter()
        self._build_s = self._t_built - t0
        return client

    def save(self, client: ClientAlgorithm, action: str) -> None:
        """Persist the silo's state (and, if the algorithm has one, its records' ledger).

        Also appends this message's timings (build, compute, save) to a silo-local file.
        """
        t0 = time.perf_counter()
        write_bytes(self.state_path, encode_state(client.state_dict()))
        ledger = getattr(client, "ledger", None)
        if ledger is not None and hasattr(ledger, "save"):
            ledger.save(self.state_path.with_name(f"ledger-silo-{self.silo}.npz"))
        # The silo's own privacy report: stays on this disk (never in a reply).
        write_json(
            self.state_path.with_name(f"privacy-summary-silo-{self.silo}.json"),
            _finite(client.privacy_summary()),
        )
        timing = {
            "action": action,
            "round": self.round,
            "process_age_s": self.process_age_s,
            "build_s": round(self._build_s, 4),
            "compute_s": round(t0 - self._t_built, 4),
            "save_s": round(time.perf_counter() - t0, 4),
        }
        with self.state_path.with_name(f"timings-silo-{self.silo}.jsonl").open("a") as fh:
            fh.write(json.dumps(timing) + "\n")


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


@client_app.train()
def _train(msg: Message, context: Context) -> Message:
    silo = _Silo(msg, context)
    client = silo.client()
    params = record_to_params(msg.content.array_records["params"])
    config = config_to_scalars(msg.content.config_records["config"])
    contribution = client.fit(params, silo.round, config)
    if type(contribution) is not Contribution:
        raise PrivacyBoundaryError(
            f"the silo's algorithm returned a {type(contribution).__name__}, not a Contribution"
        )
    # Write-ahead: the round's charge is on the silo's disk before the update leaves it.
    silo.save(client, "fit")
    return _reply(msg, contribution_to_records(contribution))


@client_app.evaluate()
def _evaluate(msg: Message, context: Context) -> Message:
    silo = _Silo(msg, context)
    client = silo.client()
    params = record_to_params(msg.content.array_records["params"])
    config = config_to_scalars(msg.content.config_records["config"])
    result = check_evaluation(client.evaluate(params, silo.round, config))
    # Evaluation also catches up the silo's Type II accounting for the round: persist it.
    silo.save(client, "evaluate")
    metrics, rest = scalars_to_records(result)
    return _reply(msg, {"metrics": metrics, "metrics.extra": rest})


@client_app.query()
def _query(msg: Message, context: Context) -> Message:
    silo = _Silo(msg, context)
    action = str(msg.content.config_records[CONTROL]["action"])
    if action == ACTION_HELLO:
        info = silo.hooks.silo_info(silo.config, silo.silo, silo.node_config)
        return _reply(
            msg,
            {
                "hello": ConfigRecord(
                    {
                        "partition-id": silo.silo,
                        "num-partitions": int(silo.node_config.get(NUM_PARTITIONS, -1)),
                        "has-state": silo.state_path.exists(),
                    }
                ),
                "info": scalars_to_config(info),
            },
        )
    raise ValueError(f"unknown pdpfl query action {action!r}")


# =============================================================================== ServerApp


def discover_silos(
    grid: Grid, num_silos: int, run_key: str, timeout_s: float
) -> tuple[dict[int, int], dict[int, dict[str, Any]]]:
    """Wait for ``num_silos`` SuperNodes and map silo index → node id via their partition-id.

    Raises :class:`FlowerRunError` (after at most ``timeout_s`` seconds) when the silos do not
    all answer, or when their ``partition-id`` values are not exactly ``0 .. num_silos-1``.
    """
    deadline = time.monotonic() + timeout_s
    silo_nodes: dict[int, int] = {}
    infos: dict[int, dict[str, Any]] = {}
    problems: list[str] = []
    asked: set[int] = set()
    while time.monotonic() < deadline:
        nodes = [n for n in grid.get_node_ids() if n not in asked]
        if nodes:
            messages = []
            for node in nodes:
                content = RecordDict({CONTROL: control_record(ACTION_HELLO, run_key)})
                messages.append(
                    Message(content, dst_node_id=node, message_type=MessageType.QUERY, ttl=60.0)
                )
            wait = max(1.0, min(30.0, deadline - time.monotonic()))
            for reply in send_and_receive(grid, messages, wait):
                node = reply.metadata.src_node_id
                asked.add(node)
                if reply.has_error():
                    problems.append(f"node {node}: {reply.error.reason}")
                    continue
                hello = reply.content.config_records["hello"]
                silo = int(hello["partition-id"])
                declared = int(hello["num-partitions"])
                if not 0 <= silo < num_silos:
                    problems.append(f"node {node}: partition-id={silo} not in [0, {num_silos})")
                elif declared not in (-1, num_silos):
                    problems.append(
                        f"node {node}: num-partitions={declared}, the config has {num_silos}"
                    )
                elif silo in silo_nodes:
                    problems.append(f"node {node}: partition-id={silo} already taken")
                else:
                    silo_nodes[silo] = node
                    infos[silo] = config_to_scalars(reply.content.config_records["info"])
        if problems:
            raise FlowerRunError("bad SuperNode configuration: " + "; ".join(problems))
        if len(silo_nodes) == num_silos:
            return silo_nodes, infos
        time.sleep(0.5)
    missing = sorted(set(range(num_silos)) - set(silo_nodes))
    raise FlowerRunError(
        f"silos {missing} did not connect within {timeout_s:g} s "
        f"(start one SuperNode per silo with --node-config 'partition-id=i num-partitions=N')"
    )


def _run_key(flower_dir: Path, resume: bool) -> str:
    """Reuse the run's key when resuming from a checkpoint; otherwise a fresh random one."""
    from pdpfl.runtime.loop import CHECKPOINT_NAME

    path = flower_dir / RUN_KEY_FILE
    if resume and path.exists() and (flower_dir.parent / CHECKPOINT_NAME).exists():
        return path.read_text().strip()
    key = secrets.token_hex(8)
    write_text(path, key + "\n")
    return key


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
    run_config = context.run_config
    out_dir = Path(str(run_config["pdpfl-out-dir"]))
    flower_dir = out_dir / "flower"
    flower_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        hooks, config = _experiment(run_config)
        resume = bool(run_config.get("pdpfl-resume", False))
        run_key = _run_key(flower_dir, resume)
        num_silos = hooks.num_silos(config)
        silo_nodes, infos = discover_silos(
            grid, num_silos, run_key, float(run_config.get("pdpfl-startup-timeout", 120.0))
        )
        startup_s = time.perf_counter() - t0
        server, public = hooks.build_server(config, infos)
        transport = FlowerTransport(
            grid,
            silo_nodes,
            run_key=run_key,
            public=public,
            round_timeout_s=float(run_config.get("pdpfl-round-timeout", 120.0)),
            min_silos=int(run_config.get("pdpfl-min-silos", 1)),
            log_path=flower_dir / EVENTS_FILE,
        )
        result = hooks.run(config, server, transport, out_dir, resume)
        summary = hooks.finish(config, result, out_dir)
        write_json(
            flower_dir / RESULT_FILE,
            {
                "status": "ok",
                "run_key": run_key,
                "silo_nodes": {str(s): str(n) for s, n in sorted(silo_nodes.items())},
                "lost": {str(s): why for s, why in sorted(transport.lost.items())},
                "startup_seconds": startup_s,
                "seconds": time.perf_counter() - t0,
                "completed": bool(result.get("completed", True)),
                "summary": _finite(summary),
            },
        )
    except BaseException as err:  # report every failure to the launcher, then let Flower see it
        write_json(
            flower_dir / RESULT_FILE,
            {
                "status": "error",
                "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(),
            },
        )
        raise


__all__ = ["client_app", "discover_silos", "server_app"]
