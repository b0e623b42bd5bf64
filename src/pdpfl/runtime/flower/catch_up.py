"""The Simulation Engine's last step: every silo's ledger caught up to the rounds the run reached.

On ``--runtime flower-simulation`` a round asks only the silos its messages reach anyway
(:meth:`~pdpfl.runtime.flower.transport.FlowerTransport.evaluation_clients`). A silo left out
of rounds owes their Type II (third-party) charges -- rPDP-FL §6.2: third parties do not see who
was sampled, so every active record pays every round -- and pays them when it is next asked
(:meth:`pdpfl.fl.template.Silo.begin_round` catches up before its pre-check and charge); every
silo evaluates the final round. A run that stops *before* its final round -- its training
diverged, it was interrupted (Ctrl-C, SIGTERM, SIGHUP), too few silos remained -- would leave
the silos not asked since their last message with those charges unpaid, and its ledgers and
summary under-counting their ε against the in-process simulator.

:func:`catch_up_silos` is the fix, run by the operator's process after the engine stopped (Ray's
actors are gone: no message can race it) and before the run's ledgers are collected and its
summary written (:func:`~pdpfl.runtime.flower.launcher.collect_result`), whatever the outcome.
For every silo whose sealed state has accounted fewer rounds than the run reached, it rebuilds
the silo from its data and state folder as a virtual SuperNode does for a message
(:class:`~pdpfl.runtime.flower.silo.SiloHost`: the silo's lock, its state verified, its budget
store opened), charges the rounds it sat out (:meth:`~pdpfl.fl.template.Silo.catch_up`: the
pre-check and the charge of each round, in order; no randomness, nothing released) and writes
its state, ledger and own summary. This is *the* catch-up the silo's next message would have
applied, not a server-side estimate: the ledgers equal the simulator's for the same rounds (the
silos that already charged a round the run did not reach -- a training request announced with
the last evaluation -- keep that charge: more, never less), and a resumed run goes on exactly as
an uninterrupted one (a caught-up silo's next message has nothing left to catch up; a silo never
asked before the stop now has the state a resume requires of every silo).

How far
-------
* The rounds the run reached (:func:`rounds_reached`): those its checkpoint holds, less a last
  round that diverged (it published no model; the silos sampled in it charged it before
  training, as in the simulator).
* A silo lost during the run (``lost_round`` of the ServerApp's result): through the round it
  was lost in (it may have been in that round's sample: conservative), never past the rounds
  reached.

A silo that cannot be caught up (its state fails verification, its data does not load) is named
in the :class:`CatchUpReport`; :func:`note_behind` puts it in the summary (``silos_behind`` and
a warning): its ledger then lacks those rounds, and the summary says so. The report is also
written to ``<out>/flower/catch_up.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from pdpfl.checkpoint import finite_record, has_checkpoint, load_checkpoint, read_metrics
from pdpfl.io import STOP_SIGNALS, write_json
from pdpfl.runtime.flower.apps import PUBLIC_FILE, RESULT_FILE, RUN_KEY_FILE
from pdpfl.runtime.flower.codec import decode_config
from pdpfl.runtime.flower.hooks import DEFAULT_HOOKS, PARTITION_ID, load_hooks
from pdpfl.runtime.flower.silo import Silo, SiloHost, silo_folder

__all__ = ["CATCH_UP_FILE", "CatchUpReport", "catch_up_silos", "note_behind", "rounds_reached"]

log = logging.getLogger(__name__)

#: The catch-up's report, under ``<out>/flower/``.
CATCH_UP_FILE = "catch_up.json"


@dataclass
class CatchUpReport:
    """What :func:`catch_up_silos` did."""

    #: The rounds the run reached (every silo's ledger is caught up to them, a lost one to the
    #: round it was lost in).
    rounds: int
    #: Silo → the rounds its ledger had accounted before it was caught up.
    caught_up: dict[int, int] = field(default_factory=dict)
    #: Silo → why it could not be caught up (its ledger lacks rounds it sat out).
    behind: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "caught_up": {str(s): r for s, r in sorted(self.caught_up.items())},
            "behind": {str(s): why for s, why in sorted(self.behind.items())},
            "seconds": round(self.seconds, 4),
        }


def rounds_reached(out: Path) -> int:
    """The rounds whose model the run in ``out`` published: the checkpoint's rounds (or, if it
    cannot be read, the metrics lines'), less a last round that diverged."""
    lines = read_metrics(out)
    try:
        ckpt = load_checkpoint(out) if has_checkpoint(out) else None
    except ValueError:
        ckpt = None
    done = int(ckpt["next_round"]) if ckpt is not None else len(lines)
    if any(int(m["round"]) == done - 1 and m.get("diverged") for m in lines):
        done -= 1
    return max(done, 0)


def _lost_rounds(flower_dir: Path) -> dict[int, int]:
    """Silo → the round it was lost in, from the ServerApp's result (none without one)."""
    path = flower_dir / RESULT_FILE
    try:
        lost = json.loads(path.read_text()).get("lost_round") or {}
    except (OSError, ValueError):
        return {}
    return {int(s): int(r) for s, r in lost.items()}


@contextlib.contextmanager
def _stopping(note: str) -> Iterator[None]:
    """Stop signals during the catch-up are reported on stderr and otherwise ignored (as a
    second signal is while a command stops, :mod:`pdpfl.runtime.signals`): the catch-up is what
    keeps the ledgers an upper bound. SIGKILL remains."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            os.write(2, f"\n{note}\n".encode())

    previous = {
        sig: signal.signal(sig, handler)
        for sig in STOP_SIGNALS
        if signal.getsignal(sig) not in (signal.SIG_IGN, None)
    }
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _catch_up(
    host: SiloHost,
    run_config: Mapping[str, Any],
    node_config: Mapping[str, Any],
    run_key: str,
    public: str,
    until: int,
) -> None:
    """Rebuild one silo from its folder, charge rounds ``next_round .. until - 1`` it sat out,
    and write its state, ledger and summary (the silo's lock held throughout)."""
    silo = host.silo(run_config, node_config, run_key)
    client = silo.ensure_client(public)
    catch_up = getattr(client, "catch_up", None)
    if not callable(catch_up):
        raise TypeError(
            f"silo {silo.silo}'s algorithm ({type(client).__name__}) has no catch_up "
            "(pdpfl.fl.template.Silo)"
        )
    t0 = time.perf_counter()
    catch_up(int(until))
    silo.save("catch-up", int(until) - 1, time.perf_counter() - t0, None)


def catch_up_silos(
    out: Path, run_config: Mapping[str, Any], node_configs: Sequence[Mapping[str, Any]]
) -> CatchUpReport:
    """Catch every silo of the engine run in ``out`` up to the rounds the run reached (module
    docstring), after the engine stopped; returns (and writes) the report."""
    t0 = time.perf_counter()
    flower_dir = out / "flower"
    report = CatchUpReport(rounds_reached(out))
    key_path = flower_dir / RUN_KEY_FILE
    run_key = key_path.read_text().strip() if key_path.exists() else ""
    if report.rounds <= 0 or not run_key:
        return report  # no round published: nothing to catch up
    public_path = flower_dir / PUBLIC_FILE
    public = public_path.read_text() if public_path.exists() else None
    lost = _lost_rounds(flower_dir)
    hooks = load_hooks(str(run_config.get("pdpfl-hooks", DEFAULT_HOOKS)))
    config = hooks.config_from_dict(decode_config(str(run_config["pdpfl-config"])))
    host = SiloHost()
    note = "already stopping: catching up the silos' ledgers (kill -9 to abort)"
    with _stopping(note):
        for node_config in node_configs:
            index = int(node_config[PARTITION_ID])
            until = min(report.rounds, lost[index] + 1) if index in lost else report.rounds
            folder = silo_folder(node_config, run_key)
            try:
                before = Silo(hooks, config, index, dict(node_config), run_key, folder)
                done = before.accounted_rounds()
                if done >= until:
                    continue
                if public is None:
                    raise FileNotFoundError(f"the server's public setup {public_path} is missing")
                _catch_up(host, run_config, node_config, run_key, public, until)
                report.caught_up[index] = done
            except Exception as err:  # named in the summary: its ledger lacks those rounds
                report.behind[index] = f"{type(err).__name__}: {err}"
            finally:
                host.clear()
    report.seconds = time.perf_counter() - t0
    if report.caught_up or report.behind:
        log.info(
            "caught up %d silo ledger(s) to round %d in %.1f s%s",
            len(report.caught_up),
            report.rounds,
            report.seconds,
            f"; {len(report.behind)} could not be" if report.behind else "",
        )
    write_json(flower_dir / CATCH_UP_FILE, report.to_dict())
    return report


def note_behind(summary: dict[str, Any], report: CatchUpReport, out: Path) -> dict[str, Any]:
    """The summary (rewritten in ``out``) saying which silos' ledgers could not be caught up:
    their ε under-counts the rounds they sat out. Unchanged when every silo was caught up."""
    if not report.behind:
        return summary
    noted = dict(summary)
    noted["silos_behind"] = [
        {"index": s, "rounds": report.rounds, "reason": why}
        for s, why in sorted(report.behind.items())
    ]
    sentence = (
        f"the ledgers of silo(s) {sorted(report.behind)} could not be caught up to round "
        f"{report.rounds}: their ε lacks the third-party charges of the rounds they sat out "
        "since they were last asked (see silos_behind)"
    )
    noted["warnings"] = [*summary.get("warnings", []), sentence]
    noted = finite_record(noted)
    write_json(out / "summary.json", noted)
    return noted
