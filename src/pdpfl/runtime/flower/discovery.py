"""Silo discovery: the ServerApp waits for one SuperNode per silo and maps each silo index to
its Flower node (:func:`discover_silos`), reporting its progress in ``status.json``
(:class:`Status`). A failure is named as what it was (:func:`setup_failure`): a SuperNode lost
during set-up, a silo that failed while starting, or a bad SuperNode configuration.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, cast

from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid

from pdpfl.io import write_json
from pdpfl.runtime.flower.codec import config_to_scalars
from pdpfl.runtime.flower.transport import (
    ACTION_HELLO,
    CONTROL,
    MESSAGE_LOG_ENV,
    FlowerRunError,
    control_record,
    log_message,
)

__all__ = ["Status", "discover_silos", "setup_failure"]


class Status:
    """``<out>/flower/status.json``: what the ServerApp is doing (read by the launcher)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.state: dict[str, Any] = {}

    def update(self, **fields: object) -> None:
        self.state.update(fields, time=time.time())
        try:
            write_json(self.path, self.state)
        except OSError:  # progress only: never fail the run for it
            pass


def setup_failure(node: int, code: int, reason: str) -> str:
    """What a SuperNode's error reply during discovery means, in words (Flower's error codes):
    the node went away, or its silo (the pdpfl ClientApp) failed while starting."""
    from flwr.common.constant import ErrorCode

    if code in (
        ErrorCode.NODE_UNAVAILABLE,
        ErrorCode.MESSAGE_UNAVAILABLE,
        ErrorCode.REPLY_MESSAGE_UNAVAILABLE,
    ):
        return (
            f"SuperNode node {node} was lost during set-up ({reason}); start it again (same "
            "--silo and --state-dir)"
        )
    if code in (ErrorCode.CLIENT_APP_RAISED_EXCEPTION, ErrorCode.CLIENT_APP_CRASHED):
        return f"the silo on node {node} failed while starting: {reason}"
    if code == ErrorCode.LOAD_CLIENT_APP_EXCEPTION:
        return f"node {node} could not load the pdpfl ClientApp: {reason}"
    return f"node {node} answered with an error during set-up: {reason}"


def discover_silos(
    grid: Grid,
    num_silos: int,
    run_key: str,
    timeout_s: float,
    *,
    status: Status | None = None,
    require_state: bool = False,
    poll_s: float = 0.2,
) -> tuple[dict[int, int], dict[int, dict[str, Any]]]:
    """Wait for ``num_silos`` SuperNodes and map silo index → node id via their partition-id.

    Each SuperNode is asked (once, as soon as it connects) for its ``partition-id`` and public
    facts; answers are collected while other nodes are still connecting. Raises
    :class:`FlowerRunError` when ``timeout_s`` has passed -- naming the silos that did not
    answer and the connected nodes that stayed silent -- when ``partition-id`` values are not
    exactly ``0 .. num_silos-1``, or, with ``require_state`` (resume), when a silo has no state
    for the run (its ledger would restart from zero).
    """
    t_start = time.monotonic()
    deadline = t_start + timeout_s
    silo_nodes: dict[int, int] = {}
    infos: dict[int, dict[str, Any]] = {}
    problems: list[str] = []  # bad SuperNode configuration
    failures: list[str] = []  # a SuperNode or its silo that failed while starting
    asked: dict[int, float] = {}  # node -> when it was asked
    pending: dict[str, int] = {}  # message id -> node
    connected: list[int] = []
    last_report = -1.0
    while True:
        now = time.monotonic()
        connected = list(grid.get_node_ids())
        new = [n for n in connected if n not in asked]
        if new:
            messages = [
                Message(
                    RecordDict({CONTROL: control_record(ACTION_HELLO, run_key)}),
                    dst_node_id=node,
                    message_type=f"{MessageType.QUERY}.{ACTION_HELLO}",
                    ttl=max(30.0, deadline - now + 30.0),
                )
                for node in new
            ]
            for node, mid in zip(new, grid.push_messages(messages), strict=True):
                asked[node] = now
                pending[mid] = node
        if pending:
            for reply in grid.pull_messages(list(pending)):
                node = pending.pop(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
                if reply.has_error():
                    failures.append(setup_failure(node, reply.error.code, str(reply.error.reason)))
                    continue
                hello = reply.content.config_records["hello"]
                silo = int(cast(int, hello["partition-id"]))
                if os.environ.get(MESSAGE_LOG_ENV):
                    log_message(os.environ[MESSAGE_LOG_ENV], ACTION_HELLO, silo, reply.content)
                declared = int(cast(int, hello["num-partitions"]))
                if not 0 <= silo < num_silos:
                    problems.append(f"node {node}: partition-id={silo} not in [0, {num_silos})")
                elif declared not in (-1, num_silos):
                    problems.append(
                        f"node {node}: num-partitions={declared}, the config has {num_silos}"
                    )
                elif silo in silo_nodes:
                    problems.append(f"node {node}: partition-id={silo} already taken")
                elif require_state and not bool(hello["has-state"]):
                    problems.append(
                        f"silo {silo} (node {node}) has no state for run {run_key}: its ledger "
                        "would restart from zero; start its SuperNode with the same --state-dir"
                    )
                else:
                    silo_nodes[silo] = node
                    infos[silo] = config_to_scalars(reply.content.config_records["info"])
        if failures or problems:
            raise FlowerRunError(
                "; ".join(
                    ([f"set-up failed: {'; '.join(failures)}"] if failures else [])
                    + ([f"bad SuperNode configuration: {'; '.join(problems)}"] if problems else [])
                )
            )
        missing = sorted(set(range(num_silos)) - set(silo_nodes))
        if now - last_report >= 2.0 or not missing:
            last_report = now
            if status is not None:
                status.update(
                    phase="discovery",
                    silos=num_silos,
                    connected=len(connected),
                    ready=sorted(silo_nodes),
                    missing=missing,
                    waited_s=round(now - t_start, 1),
                )
        if not missing:
            return silo_nodes, infos
        if now >= deadline:
            silent = sorted(n for n in asked if n not in silo_nodes.values())
            raise FlowerRunError(
                f"silos {missing} did not connect within {timeout_s:g} s "
                f"({len(connected)} SuperNode(s) connected"
                + (f", {len(silent)} of them did not answer" if silent else "")
                + "; start one SuperNode per silo with --node-config "
                "'partition-id=i num-partitions=N')"
            )
        time.sleep(poll_s)
