"""The round loop's :class:`~pdpfl.runtime.loop.Transport`, implemented with Flower messages.

The ServerApp hands a :class:`FlowerTransport` to the same
:func:`pdpfl.runtime.loop.run_federation` the in-process simulator uses. Every call becomes
one Flower message per silo (``ArrayRecord`` for parameters and deltas, ``ConfigRecord`` for
the public round configuration, ``MetricRecord`` for metrics), sent through the SuperLink with
a bounded wait.

Failure rule (documented in ``docs/flower.md``)
-----------------------------------------------
A silo whose reply is an error, or that does not reply within ``round_timeout_s``, is *lost*:

1. the round completes with the updates that did arrive (the lost silo's update, if any, is
   dropped; the server's Type I view still counts it as selected, which can only over-count);
2. a lost silo is not contacted again in this run; its silo-side ledger already holds the
   charge of every update it may have released, because a ClientApp persists its state
   *before* it replies (write-ahead), so the ledger never under-counts;
3. the run aborts with :class:`FlowerRunError` when fewer than ``min_silos`` silos remain;
   the checkpoint of the last completed round stays valid for ``resume``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from pdpfl.fl.api import Contribution, Params, PrivacyBoundaryError, Scalars
from pdpfl.runtime.flower.codec import (
    EVALUATION_RECORDS,
    json_default,
    params_to_record,
    records_to_contribution,
    records_to_scalars,
    scalars_to_config,
)

#: Control fields of every pdpfl message (a ConfigRecord under this key).
CONTROL = "pdpfl"
ACTION_HELLO = "hello"
ACTION_FIT = "fit"
ACTION_EVALUATE = "evaluate"

#: If set, the ServerApp appends one JSON line per received reply to this file: the action and
#: every record name and key the reply carried (tests use it to check the privacy boundary).
MESSAGE_LOG_ENV = "PDPFL_MESSAGE_LOG"


#: Seconds between two pulls for replies (``Grid.send_and_receive`` waits 3 s between pulls).
POLL_INTERVAL_S = 0.1


def send_and_receive(grid: Any, messages: list[Message], timeout_s: float) -> list[Message]:
    """Push ``messages`` and pull their replies until all arrived or ``timeout_s`` passed."""
    pending = set(grid.push_messages(messages))
    deadline = time.monotonic() + timeout_s
    replies: list[Message] = []
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(POLL_INTERVAL_S)
    return replies


class FlowerRunError(RuntimeError):
    """The Flower federation cannot continue (lost silos, startup failure, timeout)."""


def control_record(
    action: str, run_key: str, round_index: int = -1, public: str = "{}"
) -> ConfigRecord:
    """The control fields: action, run key, round, and the server's public setup (JSON)."""
    return ConfigRecord(
        {"action": action, "run_key": run_key, "round": int(round_index), "public": public}
    )


class FlowerTransport:
    """Reach the silos through a Flower ``Grid`` (see the module docstring for failures).

    Parameters
    ----------
    grid
        The ServerApp's ``flwr.serverapp.Grid``.
    silo_nodes
        Silo index → Flower node id (from each SuperNode's ``partition-id``).
    run_key
        Names the silo-side state of this run (kept across ``resume``).
    public
        JSON-able public setup sent with every message (e.g. the published calibration).
    round_timeout_s
        Longest wait for the replies of one message round.
    min_silos
        Abort when fewer silos than this remain reachable.
    log_path
        Optional JSON-lines file with one event per exchange (who was asked, who replied).
    """

    def __init__(
        self,
        grid: Any,
        silo_nodes: dict[int, int],
        *,
        run_key: str,
        public: dict[str, Any] | None = None,
        round_timeout_s: float = 120.0,
        min_silos: int = 1,
        log_path: str | Path | None = None,
    ) -> None:
        if round_timeout_s <= 0:
            raise ValueError(f"round_timeout_s: must be > 0, got {round_timeout_s}")
        self.grid = grid
        self.silo_nodes = dict(silo_nodes)
        self.client_ids: list[int] = sorted(self.silo_nodes)
        self.run_key = run_key
        self.public_json = json.dumps(public or {}, default=json_default)
        self.round_timeout_s = float(round_timeout_s)
        self.min_silos = int(min_silos)
        self.log_path = Path(log_path) if log_path is not None else None
        self.lost: dict[int, str] = {}
        self._message_log = os.environ.get(MESSAGE_LOG_ENV)

    # ------------------------------------------------------------------ messaging

    def _exchange(
        self,
        action: str,
        message_type: str,
        silos: list[int],
        round_index: int,
        content: Callable[[int], RecordDict],
    ) -> dict[int, RecordDict]:
        """Send one message per reachable silo and wait (bounded) for the replies."""
        targets = [s for s in silos if s not in self.lost]
        if not targets:
            return {}
        node_to_silo = {self.silo_nodes[s]: s for s in targets}
        messages = []
        for silo in targets:
            records = content(silo)
            records.config_records[CONTROL] = control_record(
                action, self.run_key, round_index, self.public_json
            )
            messages.append(
                Message(
                    records,
                    dst_node_id=self.silo_nodes[silo],
                    message_type=message_type,
                    group_id=str(round_index),
                    ttl=self.round_timeout_s + 30.0,
                )
            )
        t0 = time.perf_counter()
        replies = send_and_receive(self.grid, messages, self.round_timeout_s)
        seconds = time.perf_counter() - t0
        received: dict[int, RecordDict] = {}
        for reply in replies:
            silo = node_to_silo.get(reply.metadata.src_node_id)
            if silo is None:
                continue
            if reply.has_error():
                self.lost[silo] = f"round {round_index} {action}: error {reply.error.reason}"
            else:
                received[silo] = reply.content
                self._record_message(action, silo, reply.content)
        for silo in targets:
            if silo not in received and silo not in self.lost:
                self.lost[silo] = (
                    f"round {round_index} {action}: no reply within {self.round_timeout_s:g} s"
                )
        self._log(
            {
                "round": round_index,
                "action": action,
                "sent": targets,
                "replied": sorted(received),
                "lost": sorted(self.lost),
                "seconds": round(seconds, 4),
            }
        )
        reachable = len(self.client_ids) - len(self.lost)
        if reachable < self.min_silos:
            raise FlowerRunError(
                f"only {reachable} silo(s) reachable, fewer than min_silos={self.min_silos}: "
                + "; ".join(f"silo {s}: {why}" for s, why in sorted(self.lost.items()))
            )
        return received

    def _record_message(self, action: str, silo: int, content: RecordDict) -> None:
        if not self._message_log:
            return
        records = {}
        for name, rec in content.items():
            if isinstance(rec, ConfigRecord) or hasattr(rec, "keys"):
                records[name] = sorted(str(k) for k in rec.keys())
        with open(self._message_log, "a") as fh:
            fh.write(json.dumps({"action": action, "silo": silo, "records": records}) + "\n")

    def _log(self, event: dict[str, Any]) -> None:
        if self.log_path is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a") as fh:
            fh.write(json.dumps(event) + "\n")

    # ------------------------------------------------------------------ Transport

    def fit(
        self, selected: list[int], params: Params, round_index: int, config: Scalars
    ) -> list[Contribution]:
        def content(silo: int) -> RecordDict:
            return RecordDict(
                {"params": params_to_record(params), "config": scalars_to_config(config)}
            )

        replies = self._exchange(ACTION_FIT, MessageType.TRAIN, selected, round_index, content)
        contributions = []
        for silo in selected:  # the order of `selected`, as in the simulator
            if silo in replies:
                contributions.append(records_to_contribution(set(replies[silo].keys()), replies[silo]))
        return contributions

    def evaluate(
        self, client_ids: list[int], params: Params, round_index: int, config: Scalars
    ) -> dict[int, Scalars]:
        def content(silo: int) -> RecordDict:
            return RecordDict(
                {"params": params_to_record(params), "config": scalars_to_config(config)}
            )

        replies = self._exchange(
            ACTION_EVALUATE, MessageType.EVALUATE, client_ids, round_index, content
        )
        out: dict[int, Scalars] = {}
        for silo in client_ids:
            if silo in replies:
                rd = replies[silo]
                if not set(rd.keys()) <= EVALUATION_RECORDS:
                    raise PrivacyBoundaryError(
                        f"silo {silo}'s evaluate reply carries {sorted(rd.keys())}; allowed: "
                        f"{sorted(EVALUATION_RECORDS)}"
                    )
                out[silo] = records_to_scalars(
                    rd.metric_records["metrics"], rd.config_records.get("metrics.extra")
                )
        return out

    def privacy_summaries(self) -> dict[int, Scalars]:
        """Nothing: in a deployment each silo's privacy summary stays at the silo."""
        return {}

    def client_states(self) -> dict[int, dict]:
        """References only: each silo's state (its records' ledger) stays on the silo's disk."""
        return {
            s: {"location": "silo", "run_key": self.run_key, "lost": s in self.lost}
            for s in self.client_ids
        }

    def load_client_states(self, states: dict[int, dict]) -> None:
        """Nothing to send: on resume each silo reloads its own state file for ``run_key``."""
        for silo, state in states.items():
            if not (isinstance(state, dict) and state.get("location") == "silo"):
                raise FlowerRunError(
                    f"the checkpoint holds silo {silo}'s state itself (written by the simulation "
                    "runtime); resume it with runtime: simulation"
                )
            if state.get("run_key") != self.run_key:
                raise FlowerRunError(
                    f"checkpoint of silo {silo} belongs to run {state.get('run_key')}, "
                    f"not {self.run_key}"
                )
