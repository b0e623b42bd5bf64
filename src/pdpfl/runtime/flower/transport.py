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

Late replies
------------
A reply is only ever pulled for the exchange that sent its request: once the server has moved
on, a late reply is never read. Protocol-stage requests (:meth:`FlowerTransport.exchange`) also
expire at the SuperLink when the server stops waiting (TTL = ``round_timeout_s``): a silo that
wakes up later finds no request to answer, and the SuperLink refuses a reply to an expired
request. Secure aggregation does not rely on this -- a late masked upload stays masked by its
self mask, which is never reconstructed -- but nothing late reaches the server either way.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from pdpfl.fl.api import Contribution, Params, PrivacyBoundaryError, Scalars
from pdpfl.ledger import PrivacySummary
from pdpfl.runtime.flower.codec import (
    CONTRIBUTION_RECORDS,
    EVALUATION_METRICS,
    EVALUATION_RECORDS,
    json_default,
    params_to_record,
    payload_to_records,
    records_to_contribution,
    records_to_payload,
    scalars_to_config,
)

#: Control fields of every pdpfl message (a ConfigRecord under this key).
CONTROL = "pdpfl"
#: The record of a silo's reply saying that its training diverged (``round``, ``cause``):
#: nothing was released, the run stops (:class:`pdpfl.errors.TrainingDiverged`).
DIVERGED = "diverged"
#: The (protocol, stage) names of a protocol-stage message (a ConfigRecord under this key).
STAGE = "stage"
ACTION_HELLO = "hello"
ACTION_FIT = "fit"
ACTION_EVALUATE = "evaluate"
#: A training request that carries the evaluation of the model it starts from.
ACTION_FIT_EVALUATE = "fit+evaluate"
#: Record names of that evaluation request in a training message: a ConfigRecord ``{"round": t}``
#: and the round's configuration (``EVALUATE_FIRST + ".config"``).
EVALUATE_FIRST = "evaluate"

#: If set, the ServerApp appends one JSON line per received reply to this file: the action and
#: every record name and key the reply carried (tests use it to check the privacy boundary).
MESSAGE_LOG_ENV = "PDPFL_MESSAGE_LOG"


#: Seconds between two pulls for replies (``Grid.send_and_receive`` waits 3 s between pulls;
#: a SuperNode pushes a reply at most every 0.5 s).
POLL_INTERVAL_S = 0.2


@dataclass
class _Pending:
    """Messages pushed for one exchange: message id → silo."""

    action: str
    round: int
    targets: list[int]
    pushed_at: float
    ids: dict[str, int] = field(default_factory=dict)


@dataclass
class _Prefetch:
    """The next round's announced training request (see :meth:`FlowerTransport.prefetch_fit`)."""

    selected: list[int]
    params: Params
    round: int
    config: Scalars
    #: True once the request has been sent (with the evaluation of ``params``).
    sent: bool = False
    #: The training messages whose replies :meth:`FlowerTransport.fit` still has to collect.
    pending: list[_Pending] = field(default_factory=list)
    #: Training replies already collected (with the evaluation they travelled with).
    replies: dict[int, RecordDict] = field(default_factory=dict)

    def starts_from(self, params: Params) -> bool:
        """True if the announced request trains from exactly ``params``."""
        return len(params) == len(self.params) and all(
            np.array_equal(np.asarray(a), b) for a, b in zip(params, self.params, strict=True)
        )

    def matches(
        self, selected: list[int], params: Params, round_index: int, config: Scalars
    ) -> bool:
        return (
            list(selected) == self.selected
            and int(round_index) == self.round
            and dict(config) == self.config
            and self.starts_from(params)
        )


def log_message(path: str | Path, action: str, silo: int, content: RecordDict) -> None:
    """Append one reply's record names and keys (never values) to ``path`` (JSON lines)."""
    records = {}
    for name, rec in content.items():
        records[name] = sorted(str(k) for k in rec.keys())
    with open(path, "a") as fh:
        fh.write(json.dumps({"action": action, "silo": silo, "records": records}) + "\n")


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
    prefetch
        Send each round's training request with the evaluation of the model it starts from, in
        one message per silo (:meth:`prefetch_fit`; default). False: two message exchanges
        (two polling waits) per round.
    final_round
        With ``evaluate_sampled``: the run's last round (0-based), in which every silo is asked.
    evaluate_sampled
        Evaluate only the silos a round's messages reach anyway (:meth:`evaluation_clients`;
        Flower's Simulation Engine: one operator, virtual silos) instead of every silo every
        round (default: a deployment, where each silo's own ledger is kept current).
    """

    def __init__(
        self,
        grid: Grid,
        silo_nodes: dict[int, int],
        *,
        run_key: str,
        public: dict[str, Any] | None = None,
        round_timeout_s: float = 120.0,
        min_silos: int = 1,
        log_path: str | Path | None = None,
        prefetch: bool = True,
        final_round: int | None = None,
        evaluate_sampled: bool = False,
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
        #: The round (0-based) in which each lost silo was lost.
        self.lost_round: dict[int, int] = {}
        self._message_log = os.environ.get(MESSAGE_LOG_ENV)
        self._prefetch: _Prefetch | None = None
        self.final_round = None if final_round is None else int(final_round)
        self.evaluate_sampled = bool(evaluate_sampled) and self.final_round is not None
        if not prefetch:  # the round loop then never announces rounds ahead
            self.prefetch_fit = None  # type: ignore[assignment,method-assign]

    # ------------------------------------------------------------------ messaging

    def _push(
        self,
        action: str,
        message_type: str,
        silos: list[int],
        round_index: int,
        content: Callable[[int], RecordDict],
        ttl: float | None = None,
    ) -> _Pending:
        """Send one message per reachable silo (no waiting); ``ttl`` default: timeout + 60 s
        (training requests may be announced a while before they are collected)."""
        targets = [s for s in silos if s not in self.lost]
        pending = _Pending(action, round_index, targets, time.perf_counter())
        if not targets:
            return pending
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
                    ttl=self.round_timeout_s + 60.0 if ttl is None else float(ttl),
                )
            )
        for silo, mid in zip(targets, self.grid.push_messages(messages), strict=True):
            pending.ids[mid] = silo
        return pending

    def _collect(self, pending: _Pending, **event: object) -> dict[int, RecordDict]:
        """Wait (bounded by ``round_timeout_s`` from now) for the replies of ``pending``."""
        t_wait = time.perf_counter()
        deadline = time.monotonic() + self.round_timeout_s
        received: dict[int, RecordDict] = {}
        waiting = {mid: silo for mid, silo in pending.ids.items() if silo not in self.lost}
        while waiting:
            for reply in self.grid.pull_messages(list(waiting)):
                silo = waiting.pop(reply.metadata.reply_to_message_id, None)
                if silo is None:
                    continue
                if reply.has_error():
                    self.lost[silo] = (
                        f"round {pending.round + 1} {pending.action}: error {reply.error.reason}"
                    )
                    self.lost_round.setdefault(silo, pending.round)
                elif (
                    DIVERGED in reply.content.config_records
                    and pending.action != ACTION_FIT_EVALUATE
                ):
                    # (an announced training's divergence is raised when its round collects it)
                    self._diverged(
                        pending.round, pending.action, silo, reply.content.config_records[DIVERGED]
                    )
                else:
                    received[silo] = reply.content
                    self._record_message(pending.action, silo, reply.content)
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(POLL_INTERVAL_S)
        now = time.perf_counter()
        for silo in pending.targets:
            if silo not in received and silo not in self.lost:
                self.lost[silo] = (
                    f"round {pending.round + 1} {pending.action}: no reply within "
                    f"{self.round_timeout_s:g} s"
                )
                self.lost_round.setdefault(silo, pending.round)
        self._log(
            {
                "round": pending.round,
                "action": pending.action,
                "sent": pending.targets,
                "replied": sorted(received),
                "lost": sorted(self.lost),
                "seconds": round(now - pending.pushed_at, 4),
                "wait_seconds": round(now - t_wait, 4),
                **event,
            }
        )
        reachable = len(self.client_ids) - len(self.lost)
        if reachable < self.min_silos:
            raise FlowerRunError(
                f"only {reachable} silo(s) reachable, fewer than min_silos={self.min_silos}: "
                + "; ".join(f"silo {s}: {why}" for s, why in sorted(self.lost.items()))
            )
        return received

    def _diverged(self, round_index: int, action: str, silo: int, record: Any) -> None:
        """A silo's training diverged: stop the run (as the simulator does), naming it."""
        from pdpfl.errors import TrainingDiverged

        self._log({"round": round_index, "action": action, "diverged": silo})
        raise TrainingDiverged(
            str(record.get("cause", "its update is not finite")),
            round_index=int(record.get("round", round_index)),
            silo=silo,
        )

    def _exchange(
        self,
        action: str,
        message_type: str,
        silos: list[int],
        round_index: int,
        content: Callable[[int], RecordDict],
        ttl: float | None = None,
    ) -> dict[int, RecordDict]:
        """Send one message per reachable silo and wait (bounded) for the replies."""
        return self._collect(self._push(action, message_type, silos, round_index, content, ttl))

    def _record_message(self, action: str, silo: int, content: RecordDict) -> None:
        """With ``PDPFL_MESSAGE_LOG`` set: one line per reply, every record name and key."""
        if not self._message_log:
            return
        log_message(self._message_log, action, silo, content)

    def _log(self, event: dict[str, Any]) -> None:
        if self.log_path is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a") as fh:
            fh.write(json.dumps(event) + "\n")

    # ------------------------------------------------------------------ Transport

    @staticmethod
    def _fit_content(params: Params, config: Scalars) -> Callable[[int], RecordDict]:
        def content(silo: int) -> RecordDict:
            return RecordDict(
                {"params": params_to_record(params), "config": scalars_to_config(config)}
            )

        return content

    def prefetch_fit(
        self, selected: list[int], params: Params, round_index: int, config: Scalars
    ) -> None:
        """Announce the next round's training request (the round loop calls this with plain
        summation only, right after aggregating the previous round, and then evaluates the same
        ``params``).

        :meth:`evaluate` then sends each selected silo *one* message: the training request of
        round ``round_index`` that also asks for the evaluation of ``params`` (the model it starts
        from) first. The silo evaluates, trains, and replies with both; each round costs one
        message exchange (one wait through Flower's 3 s SuperNode polling) instead of two. The
        events at every silo happen in the simulator's order (evaluation of round t, then
        training of round t + 1). :meth:`fit` then only hands over the replies -- if it is
        called with the same silos, parameters, round and configuration; otherwise the
        announced request's replies are dropped and a fresh request is sent (a silo answers a
        repeated request from its release cache: nothing is charged twice).
        """
        self._prefetch = _Prefetch(
            list(selected), [np.asarray(p).copy() for p in params], int(round_index), dict(config)
        )

    def fit(
        self, selected: list[int], params: Params, round_index: int, config: Scalars
    ) -> list[Contribution]:
        prefetch, self._prefetch = self._prefetch, None
        replies: dict[int, RecordDict] | None = None
        if prefetch is not None and prefetch.sent:
            if prefetch.matches(selected, params, round_index, config):
                replies = dict(prefetch.replies)
                for pending in prefetch.pending:
                    replies.update(self._collect(pending, prefetched=True))
            else:
                self._log({"round": round_index, "action": ACTION_FIT, "prefetch": "dropped"})
        if replies is None:
            replies = self._exchange(
                ACTION_FIT,
                MessageType.TRAIN,
                selected,
                round_index,
                self._fit_content(params, config),
            )
        contributions = []
        for silo in selected:  # the order of `selected`, as in the simulator
            if silo in replies and silo not in self.lost:
                rd = replies[silo]
                if DIVERGED in rd.config_records:  # an announced training that diverged
                    self._diverged(round_index, ACTION_FIT, silo, rd.config_records[DIVERGED])
                contributions.append(records_to_contribution(set(rd.keys()), rd))
        return contributions

    @staticmethod
    def _evaluation_metrics(silo: int, rd: RecordDict) -> Scalars:
        if "metrics" not in rd.metric_records:
            raise PrivacyBoundaryError(f"silo {silo}'s evaluation reply carries no metrics")
        metrics = dict(rd.metric_records["metrics"].items())
        if set(metrics) != EVALUATION_METRICS:
            raise PrivacyBoundaryError(
                f"silo {silo}'s evaluation carries {sorted(metrics)}; allowed: "
                f"{sorted(EVALUATION_METRICS)}"
            )
        return metrics

    def evaluation_clients(self, round_index: int, selected: list[int]) -> list[int]:
        """The silos that evaluate round ``round_index``'s model (and catch up their ledgers).

        Every silo, unless ``evaluate_sampled``; then, before the final round, only the silos
        that get a message anyway: the next round's sample when its training request was
        announced (:meth:`prefetch_fit`: the evaluation travels with it, one message per sampled
        silo), else the round's own ``selected``. The others' catch-up charges for the rounds
        they sat out are applied when they are next asked (:meth:`pdpfl.fl.template.Silo.
        begin_round` catches up first, before its pre-check and charge) and, for all of them
        at once, in the final round (every silo evaluates it), so a round costs messages in the
        sample, not in the federation. A run that stops before its final round is caught up by
        the operator after the engine stopped (:mod:`pdpfl.runtime.flower.catch_up`).
        """
        if not self.evaluate_sampled or (
            self.final_round is not None and round_index >= self.final_round
        ):
            return list(self.client_ids)
        prefetch = self._prefetch
        if prefetch is not None and not prefetch.sent:
            asked = set(prefetch.selected)
        else:
            asked = {int(s) for s in selected}
        return [s for s in self.client_ids if s in asked]

    def evaluate(
        self, client_ids: list[int], params: Params, round_index: int, config: Scalars
    ) -> dict[int, Scalars]:
        prefetch = self._prefetch
        folded: list[int] = []
        if prefetch is not None and not prefetch.sent:
            prefetch.sent = True
            if prefetch.starts_from(params):
                folded = [s for s in prefetch.selected if s in set(client_ids)]
        train_content = (
            self._fit_content(prefetch.params, prefetch.config) if prefetch is not None else None
        )

        def folded_content(silo: int) -> RecordDict:
            records = train_content(silo)  # type: ignore[misc]
            records.config_records[EVALUATE_FIRST] = ConfigRecord({"round": int(round_index)})
            records.config_records[EVALUATE_FIRST + ".config"] = scalars_to_config(config)
            return records

        pushed = []
        rest = [s for s in client_ids if s not in folded]
        if rest:
            pushed.append(
                self._push(
                    ACTION_EVALUATE,
                    MessageType.EVALUATE,
                    rest,
                    round_index,
                    self._fit_content(params, config),
                )
            )
        if folded:
            assert prefetch is not None and train_content is not None
            pushed.append(
                self._push(
                    ACTION_FIT_EVALUATE, MessageType.TRAIN, folded, prefetch.round, folded_content
                )
            )
            only_fit = [s for s in prefetch.selected if s not in set(folded)]
            if only_fit:
                prefetch.pending.append(
                    self._push(
                        ACTION_FIT, MessageType.TRAIN, only_fit, prefetch.round, train_content
                    )
                )
        elif prefetch is not None:  # announced for other parameters: train separately
            assert train_content is not None
            prefetch.pending.append(
                self._push(
                    ACTION_FIT, MessageType.TRAIN, prefetch.selected, prefetch.round, train_content
                )
            )
        out: dict[int, Scalars] = {}
        for pending in pushed:
            replies = self._collect(pending)
            for silo, rd in replies.items():
                names = set(rd.keys())
                if pending.action == ACTION_EVALUATE:
                    if names != EVALUATION_RECORDS:
                        raise PrivacyBoundaryError(
                            f"silo {silo}'s evaluate reply carries {sorted(names)}; allowed: "
                            f"{sorted(EVALUATION_RECORDS)}"
                        )
                else:
                    # its training's answer: a contribution, or that the training diverged
                    kept = {DIVERGED} if DIVERGED in names else CONTRIBUTION_RECORDS
                    if names != EVALUATION_RECORDS | kept:
                        raise PrivacyBoundaryError(
                            f"silo {silo}'s training + evaluation reply carries {sorted(names)}; "
                            f"allowed: {sorted(EVALUATION_RECORDS | CONTRIBUTION_RECORDS)}"
                        )
                    contribution = RecordDict({name: rd[name] for name in sorted(kept)})
                    prefetch.replies[silo] = contribution  # type: ignore[union-attr]
                out[silo] = self._evaluation_metrics(silo, rd)
        return {silo: out[silo] for silo in client_ids if silo in out}

    def exchange(
        self, protocol: str, stage: str, requests: dict[int, dict[str, Any]], round_index: int
    ) -> dict[int, dict[str, Any]]:
        """One stage of a multi-stage protocol: one ``query.stage`` message per silo.

        Each request payload travels exactly (:func:`~pdpfl.runtime.flower.codec.
        payload_to_records`); each reply is decoded the same way. Silos that do not answer (or
        answer with an error) are lost, as for training; the protocol sees only the replies.
        The requests expire when the wait ends (TTL = ``round_timeout_s``): a late reply can
        neither be delivered nor read.
        """
        for silo in requests:
            if silo not in self.silo_nodes:
                raise ValueError(f"exchange: unknown silo {silo}")

        def content(silo: int) -> RecordDict:
            records = RecordDict(payload_to_records(requests[silo]))
            records.config_records[STAGE] = ConfigRecord({"protocol": protocol, "stage": stage})
            return records

        replies = self._exchange(
            f"stage:{protocol}/{stage}",
            f"{MessageType.QUERY}.{STAGE}",
            sorted(requests),
            round_index,
            content,
            ttl=self.round_timeout_s,
        )
        return {silo: records_to_payload(set(rd.keys()), rd) for silo, rd in replies.items()}

    def lost_report(self, names: dict[int, str] | None = None) -> list[dict[str, Any]]:
        """The lost silos for ``summary.json``: the data's name, the index, the (1-based) round
        in which the silo was lost and why."""
        names = names or {}
        return [
            {
                "silo": str(names.get(s, s)),
                "index": int(s),
                "round": int(self.lost_round.get(s, 0)) + 1,
                "reason": why,
            }
            for s, why in sorted(self.lost.items())
        ]

    def privacy_summaries(self) -> dict[int, PrivacySummary | None]:
        """Nothing: in a deployment each silo's privacy summary stays at the silo."""
        return {}

    def client_states(self) -> dict[int, dict[str, Any]]:
        """References only: each silo's state (its records' ledger) stays on the silo's disk."""
        return {
            s: {"location": "silo", "run_key": self.run_key, "lost": s in self.lost}
            for s in self.client_ids
        }

    def load_client_states(self, states: dict[int, dict[str, Any]]) -> None:
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
