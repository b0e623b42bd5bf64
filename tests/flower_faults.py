"""A reusable harness for real faults on a loopback Flower federation (issue #22).

:class:`FaultDrill` is passed as ``run_flower(..., on_started=drill)``; it watches the
coordinator's ``transport.jsonl`` (one event per message exchange: round, action, who was sent
a message, who replied, who is lost) and fires the faults registered with :meth:`FaultDrill.at`
when a matching event appears: SIGKILL a silo's SuperNode, SIGSTOP a silo's worker or SuperNode
and SIGCONT it later. Every fault is recorded (``fired``), every process of the federation is
remembered (``pids``) so the test can check that none is left.

:func:`replay_transport` builds an in-process transport that reproduces, stage by stage, which
silos answered in the Flower run, so the simulator can recompute the very aggregates the Flower
server released (reproducible randomness): the check that a faulty round ends with the correct
sum of its survivors, or with none.

Nothing here is specific to an algorithm: use it with any config and summation protocol.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pdpfl.runtime.flower.processes import LocalFederation, _signal, descendants
from pdpfl.runtime.simulation import InProcessTransport

Event = dict[str, Any]


def read_events(path: Path) -> list[Event]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def stage_event(round_index: int, action: str) -> Callable[[Event], bool]:
    """Matches the exchange ``action`` (e.g. ``"stage:secure/share"``) of ``round_index``."""
    return lambda e: e.get("round") == round_index and e.get("action") == action


class FaultDrill:
    """Fires faults on a running :class:`LocalFederation` when transport events appear."""

    def __init__(self, out_dir: Path, timeout_s: float = 300.0) -> None:
        self.events_file = Path(out_dir) / "flower" / "transport.jsonl"
        self.timeout_s = timeout_s
        self.plan: list[tuple[Callable[[Event], bool], str, int]] = []
        self.fired: list[tuple[str, int, float]] = []
        self.pids: set[int] = set()
        self.federation: LocalFederation | None = None
        self.errors: list[BaseException] = []

    def at(self, when: Callable[[Event], bool], fault: str, silo: int) -> FaultDrill:
        """At the first event matching ``when``: ``fault`` in ``kill`` (SIGKILL the SuperNode),
        ``stop-worker`` / ``stop-node`` (SIGSTOP), ``cont-worker`` / ``cont-node`` (SIGCONT)."""
        self.plan.append((when, fault, silo))
        return self

    # -- the running federation -----------------------------------------------------------
    def __call__(self, federation: LocalFederation) -> None:
        self.federation = federation
        self.pids.update(federation.all_processes())
        threading.Thread(target=self._watch, daemon=True).start()

    def _proc(self, fault: str, silo: int) -> Any:
        assert self.federation is not None
        if fault.endswith("worker"):
            workers = self.federation.workers
            assert len(workers) == len(self.federation.supernodes), "use workers='per-silo'"
            return workers[silo]
        return self.federation.supernodes[silo]

    @staticmethod
    def _signal_tree(pid: int, sig: int) -> None:
        """``sig`` to ``pid`` and what it started, by PID: the federation's children share the
        launcher's process group (a group signal would reach the test itself)."""
        for each in [pid, *descendants([pid])]:
            _signal(each, sig, group=False)

    def _fire(self, fault: str, silo: int) -> None:
        assert self.federation is not None
        self.pids.update(self.federation.all_processes())
        if fault == "kill":
            self.federation.kill_supernode(silo)
        else:
            sig = signal.SIGSTOP if fault.startswith("stop") else signal.SIGCONT
            self._signal_tree(self._proc(fault, silo).pid, sig)
        self.fired.append((fault, silo, time.monotonic()))

    def _watch(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        pending = list(self.plan)
        try:
            while pending and time.monotonic() < deadline:
                events = read_events(self.events_file)
                for item in list(pending):
                    when, fault, silo = item
                    if any(when(e) for e in events):
                        self._fire(fault, silo)
                        pending.remove(item)
                if self.federation is not None:
                    self.pids.update(self.federation.all_processes())
                time.sleep(0.02)
        except BaseException as err:  # reported by the test
            self.errors.append(err)
        finally:
            self.resume_all()

    def resume_all(self) -> None:
        """SIGCONT everything stopped (a stopped process must not outlive the drill)."""
        if self.federation is None:
            return
        for fault, silo, _ in list(self.fired):
            if fault.startswith("stop"):
                kind = fault.split("-", 1)[1]
                if not any(f == f"cont-{kind}" and s == silo for f, s, _ in self.fired):
                    self._signal_tree(self._proc(fault, silo).pid, signal.SIGCONT)

    def alive(self) -> list[int]:
        """Every process of the federation (and their descendants) still running."""
        found = self.pids | set(descendants(list(self.pids)))
        out = []
        for pid in found:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            try:  # a zombie of ours is not a running process
                with open(f"/proc/{pid}/stat") as fh:
                    if fh.read().split(")")[-1].split()[0] == "Z":
                        continue
            except OSError:
                continue
            out.append(pid)
        return out


def replay_transport(clients: dict[int, Any], events: list[Event]) -> InProcessTransport:
    """An in-process transport where, at each protocol stage of each round -- and at each
    plain training request (``fit``, ``fit+evaluate``) -- exactly the silos that replied in the
    Flower run (``events`` of its ``transport.jsonl``) answer."""
    replied = {
        (e["round"], e["action"].split("/", 1)[1]): set(e["replied"])
        for e in events
        if str(e.get("action", "")).startswith("stage:")
    }
    # A training reply counts if it arrived from a silo not lost by then (the transport drops
    # replies of silos it has given up on).
    trained: dict[int, set[int]] = {}
    for e in events:
        if e.get("action") in ("fit", "fit+evaluate") and "replied" in e:
            ok = set(e["replied"]) - {int(s) for s in e.get("lost", [])}
            trained.setdefault(int(e["round"]), set()).update(ok)

    class Replay(InProcessTransport):
        def exchange(self, protocol, stage, requests, round_index):
            answered = replied.get((int(round_index), stage), set())
            kept = {c: r for c, r in requests.items() if c in answered}
            return super().exchange(protocol, stage, kept, round_index)

        def fit(self, selected, params, round_index, config):
            answered = [c for c in selected if c in trained.get(int(round_index), set())]
            return super().fit(answered, params, round_index, config) if answered else []

    return Replay(clients)
