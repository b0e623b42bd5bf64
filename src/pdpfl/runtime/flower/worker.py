"""The warm silo worker: the pdpfl ClientApp without a new process for every message.

A Flower 1.41 SuperNode in its default ``subprocess`` isolation starts ``flower-superexec``, which
launches a fresh ``flwr-clientapp`` process for *every* message: the interpreter starts, imports
Flower, torch and pdpfl, rebuilds the silo from its data and state file, answers, and exits
(≈ 9 s per message on a 2-core machine with four silos). A SuperNode started with
``--isolation process`` instead waits for an external executor to claim its tasks through its
local Runtime API. This module is that executor, kept warm:

* it claims each ClientApp task of the SuperNode(s) it serves (``AcquireTask``, signed with the
  SuperNode's SuperExec secret: Flower's HMAC authentication of executors), pulls the message
  with the task's token, runs the installed pdpfl ClientApp
  (:data:`pdpfl.runtime.flower.apps.client_app`) *in this process*, and pushes the reply and the
  task's outcome back -- exactly the Runtime API calls ``flwr-clientapp`` makes;
* torch, the silo's data, its algorithm (model, ledger, counters) and its secret randomness stay
  in this process's memory between messages (:mod:`pdpfl.runtime.flower.silo`); the silo's state
  file and ledger are still written to the silo's disk *before* each reply leaves;
* it only talks to Runtime APIs on loopback, and only runs pdpfl's own ClientApp: a run whose
  Flower app names another ``clientapp`` component is answered with an error.

One worker may serve several SuperNodes (the loopback launcher hosts all local silos in one
worker, like the in-process simulator hosts all silo objects in one process); messages are
handled one at a time. A deployment runs one worker per SuperNode (``pdpfl flower supernode``
starts both).

    python -m pdpfl.runtime.flower.worker --runtime-api 127.0.0.1:9094 \\
        --auth-secret-file /var/lib/pdpfl/superexec.secret [--parent-pid PID]
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from pdpfl.runtime.flower.hooks import WARM_ENV

#: The only ClientApp a worker runs (the component a pdpfl Flower app names).
CLIENTAPP_REF = "pdpfl.runtime.flower.apps:client_app"
#: How often the worker asks a SuperNode for a task (``AcquireTask``), by seconds since that
#: SuperNode's last task: often right after one (a queued message follows within a second),
#: then less, then rarely (an idle SuperNode pulls from its SuperLink every 3 s anyway). Each
#: poll is an HTTP request that the SuperNode answers: polling ten SuperNodes at 20/s each
#: costs about a CPU core.
POLL_SCHEDULE: tuple[tuple[float, float], ...] = ((1.5, 0.05), (8.0, 0.2))
IDLE_POLL_INTERVAL_S = 0.5


def poll_interval(since_last_task_s: float) -> float:
    """Seconds to wait before the next ``AcquireTask`` (see :data:`POLL_SCHEDULE`)."""
    for window, interval in POLL_SCHEDULE:
        if since_last_task_s < window:
            return interval
    return IDLE_POLL_INTERVAL_S


#: Seconds between task heartbeats while a message is being handled.
HEARTBEAT_INTERVAL_S = 5.0


@dataclass(frozen=True)
class NodeLink:
    """How the worker reaches one SuperNode: its Runtime API and its SuperExec secret."""

    address: str
    secret: bytes | None = None


def check_loopback(address: str) -> str:
    """``address`` (``host:port``) if its host is a loopback address; ValueError otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--runtime-api: expected host:port, got {address!r}")
    host = host.strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(
            f"--runtime-api: {address!r} is not a loopback address; the worker only talks to a "
            "SuperNode on the same host (127.0.0.1)"
        )
    return address


def read_secret(path: str | Path) -> bytes:
    """The SuperExec secret shared with the SuperNode (raw bytes; must be private to the user)."""
    p = Path(path).expanduser()
    data = p.read_bytes()
    if not data:
        raise ValueError(f"--auth-secret-file: {p} is empty")
    if os.name == "posix" and p.stat().st_mode & 0o077:
        raise ValueError(f"--auth-secret-file: {p} is readable by other users (chmod 600 it)")
    return data


def write_secret(path: str | Path) -> Path:
    """Create a fresh random SuperExec secret file (mode 600) and return its path."""
    import secrets

    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p.with_suffix(p.suffix + ".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(secrets.token_hex(32).encode("ascii"))
    os.replace(p.with_suffix(p.suffix + ".tmp"), p)
    return p


def _component(fab_content: bytes) -> str | None:
    from flwr.common.config import get_fab_config

    config = get_fab_config(fab_content)
    app = config.get("tool", {}).get("flwr", {}).get("app", {})
    component = app.get("components", {}).get("clientapp")
    return None if component is None else str(component)


class Worker:
    """Serve the ClientApp tasks of one or more SuperNodes until :meth:`stop` is called."""

    def __init__(self, links: Sequence[NodeLink]) -> None:
        if not links:
            raise ValueError("--runtime-api: give at least one SuperNode Runtime API address")
        for link in links:
            check_loopback(link.address)
        self.links = list(links)
        self._stop = threading.Event()
        #: One ClientApp call at a time in this process (silo objects and torch are
        #: process-wide); pulling messages and pushing replies overlap across SuperNodes.
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.handled = 0

    # -------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        os.environ[WARM_ENV] = "1"
        # Warm up: everything a message needs is imported once, here.
        import pdpfl.runtime.flower.apps  # noqa: F401
        import pdpfl.runtime.flower.silo  # noqa: F401

        for link in self.links:
            thread = threading.Thread(
                target=self._serve, args=(link,), name=f"pdpfl-worker {link.address}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 3.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def wait(self) -> None:
        while not self._stop.is_set():
            self._stop.wait(0.5)

    # -------------------------------------------------------------------------- task loop

    def _client(self, address: str, interceptors: list[Any]) -> Any:
        import httpx
        from flwr.supercore.retry.retry_invoker import RetryInvoker, exponential
        from flwr.supercore.runtime import RuntimeHttpClient

        # Not Flower's default HTTP retry policy, which signals SIGINT to its own process on
        # an HTTP 401 (a task token that expired): one failed task must not stop the worker.
        retry = RetryInvoker(
            wait_gen_factory=lambda: exponential(max_delay=2),
            recoverable_exceptions=httpx.TransportError,
            max_tries=5,
            max_time=15.0,
        )
        return RuntimeHttpClient.from_server_address(
            server_address=address,
            insecure=True,  # loopback only (checked), as Flower's own SuperExec connects
            root_certificates=None,
            interceptors=interceptors,
            retry_invoker=retry,
        )

    def _serve(self, link: NodeLink) -> None:
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.constant import TaskType
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor

        interceptors: list[Any] = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
        if link.secret is not None:
            from flwr.supercore.interceptors.http.superexec_auth import (
                SuperExecAuthHttpInterceptor,
            )

            interceptors.append(
                SuperExecAuthHttpInterceptor(
                    master_secret=link.secret,
                    protected_methods={"/flwr.proto.Runtime/AcquireTask"},
                )
            )
        client = None
        last_task = -1e9
        while not self._stop.is_set():
            try:
                if client is None:
                    client = self._client(link.address, interceptors)
                res = client.AcquireTask(
                    AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
                )
                claimed = bool(res.HasField("task") and res.token)
                if claimed:
                    self._run_task(link.address, res.token)
            except Exception as err:  # SuperNode not up yet, or gone: retry until stopped
                _log(f"waiting for the SuperNode at {link.address} ({type(err).__name__}: {err})")
                if client is not None:
                    client.close()
                    client = None
                self._stop.wait(1.0)
                continue
            now = time.monotonic()
            if claimed:
                last_task = now
                continue
            self._stop.wait(poll_interval(now - last_task))
        if client is not None:
            client.close()

    def _run_task(self, address: str, token: str) -> None:
        """What ``flwr-clientapp`` does for one task, in this process."""
        from flwr.app import Error, Message
        from flwr.common.constant import ErrorCode, SubStatus
        from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest
        from flwr.supercore.interceptors import (
            RuntimeTokenHttpInterceptor,
            RuntimeVersionHttpInterceptor,
        )
        from flwr.supernode.runtime.run_clientapp import (
            pull_task_input,
            push_message,
            push_task_output,
        )

        from pdpfl.runtime.flower.apps import client_app

        client = self._client(
            address,
            [
                RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                RuntimeTokenHttpInterceptor(token),
            ],
        )
        done = threading.Event()

        def heartbeat() -> None:
            while not done.wait(HEARTBEAT_INTERVAL_S):
                try:
                    client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
                except Exception:  # the task ends anyway; Flower expires it if we are gone
                    return

        beat = threading.Thread(target=heartbeat, daemon=True)
        message = context = reply = None
        status, details = SubStatus.FAILED, "ClientApp task failed"
        try:
            beat.start()  # keeps the task's token alive while it waits for the lock
            message, context, _run, fab = pull_task_input(client)
            component = _component(fab.content)
            if component != CLIENTAPP_REF:
                raise PermissionError(
                    f"this pdpfl worker only runs {CLIENTAPP_REF}, the app names {component!r}"
                )
            with self._lock:  # the silo's computation, one message at a time
                reply = client_app(message=message, context=context)
                self.handled += 1
            status, details = SubStatus.COMPLETED, ""
        except Exception as ex:
            reason = f"{type(ex)}:<'{ex}'>"
            _log(f"ClientApp raised {reason}")
            details = reason
            if message is not None:
                reply = Message(
                    Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason),
                    reply_to=message,
                )
        finally:
            try:
                if reply is not None and context is not None:
                    push_message(client, reply, context)
                push_task_output(client=client, context=context, sub_status=status, details=details)
            except Exception as err:
                _log(f"could not push the reply to {address}: {err}")
            done.set()
            client.close()


def _log(text: str) -> None:
    print(f"[pdpfl-worker {os.getpid()}] {text}", file=sys.stderr, flush=True)


def _monitor_parent(pid: int, worker: Worker) -> None:
    def watch() -> None:
        while True:
            time.sleep(0.5)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                worker._stop.set()
                return
            except PermissionError:
                pass

    threading.Thread(target=watch, daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pdpfl.runtime.flower.worker",
        description="Serve the pdpfl ClientApp for SuperNodes started with --isolation process.",
    )
    parser.add_argument(
        "--runtime-api",
        action="append",
        required=True,
        metavar="HOST:PORT",
        help="a SuperNode's Runtime API on loopback (repeatable: one per SuperNode)",
    )
    parser.add_argument(
        "--auth-secret-file",
        action="append",
        default=[],
        metavar="FILE",
        help="the SuperNode's --superexec-auth-secret-file (one per --runtime-api, same order)",
    )
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when it exits")
    parser.add_argument("--ready-file", default=None, help="touched once the worker is warm")
    args = parser.parse_args(argv)
    if args.auth_secret_file and len(args.auth_secret_file) != len(args.runtime_api):
        parser.error("--auth-secret-file: give one per --runtime-api, or none")
    try:
        links = [
            NodeLink(
                check_loopback(address),
                read_secret(args.auth_secret_file[i]) if args.auth_secret_file else None,
            )
            for i, address in enumerate(args.runtime_api)
        ]
    except (OSError, ValueError) as err:
        parser.error(str(err))
    worker = Worker(links)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        worker._stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.parent_pid is not None:
        _monitor_parent(args.parent_pid, worker)
    worker.start()
    if args.ready_file:
        Path(args.ready_file).write_text(str(os.getpid()))
    _log(f"serving {', '.join(link.address for link in links)}")
    worker.wait()
    worker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
