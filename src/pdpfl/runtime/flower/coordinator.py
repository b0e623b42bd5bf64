"""What the coordinator of a local Flower run shows while it runs, read from the ServerApp's
files: the silos as they connect, then the rounds (:class:`CoordinatorProgress`), and the local
silos' own privacy summaries merged (:func:`silo_summaries`; on loopback one operator owns every
silo).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pdpfl.runtime.flower.apps import STATUS_FILE

if TYPE_CHECKING:
    from pdpfl.ledger import PrivacySummary

__all__ = ["CoordinatorProgress", "silo_summaries"]


class CoordinatorProgress:
    """The coordinator's progress on stderr, read from the ServerApp's files, drawn by the one
    progress display (:class:`~pdpfl.runtime.progress.ProgressDisplay`: a rich bar on a
    terminal, plain lines without one).

    Discovery: silos ready / connected. Rounds: the round bar with the sampled silos, the pooled
    accuracy and -- on loopback, where one operator owns every silo -- the ε headline collected
    from the local silos' own summaries (third party / server).
    """

    def __init__(self, out: Path, rounds: int, num_silos: int, *, enabled: bool) -> None:
        from pdpfl.runtime.progress import ProgressDisplay

        self.out, self.rounds, self.num_silos = out, rounds, num_silos
        self.enabled = enabled
        self._seen = 0
        self._status_mtime = 0.0
        self._run_key: str | None = None
        self._display = ProgressDisplay(num_silos, enabled=enabled)
        self._started = False

    def _epsilon(self) -> str:
        if self._run_key is None:
            path = self.out / "flower" / "run_key"
            if path.exists():
                self._run_key = path.read_text().strip()
        if not self._run_key:
            return ""
        merged = silo_summaries(self.out / "flower", self._run_key, self.num_silos)
        if merged is None:
            return ""
        tp, sv = merged.spent_max("third-party"), merged.spent_max("server")
        if tp is None and sv is None:
            return ""
        return f" | ε max {_fmt(tp)} (3rd) / {_fmt(sv)} (server)"

    def _discovery(self) -> None:
        """The silos connecting (the ServerApp's ``status.json``), on the bar."""
        status_path = self.out / "flower" / STATUS_FILE
        with contextlib.suppress(OSError, ValueError):
            mtime = status_path.stat().st_mtime
            if mtime != self._status_mtime:
                self._status_mtime = mtime
                status = json.loads(status_path.read_text())
                if status.get("phase") == "discovery":
                    missing = status.get("missing", [])
                    info = f"{status.get('connected', 0)} connected"
                    if missing:
                        more = " …" if len(missing) > 8 else ""
                        shown = ", ".join(map(str, missing[:8])) + more
                        info += f"; waiting for silo(s) {shown}"
                    self._display.update(completed=len(status.get("ready", [])), info=info)

    def tick(self) -> None:
        """Read the ServerApp's files and move the display (about twice a second)."""
        if not self.enabled:
            return
        display = self._display
        if not self._started:
            self._started = True
            if display.interactive:
                display.start("silos", info="starting the federation")
            else:
                display.start("round", total=self.rounds)
                print(f"starting the Flower federation ({self.num_silos} silos)", file=sys.stderr)
        if display.interactive:
            self._discovery()
        from pdpfl.runtime.loop import read_metrics

        with contextlib.suppress(OSError, ValueError):
            lines = read_metrics(self.out)
            if lines and display.interactive and display.description != "round":
                display.start("round", total=self.rounds, completed=0)
            if len(lines) > self._seen or (lines and self._seen == 0 and display.interactive):
                last = lines[-1]
                self._seen = len(lines)
                acc = last.get("accuracy")
                info = f"sampled {last.get('selected')}"
                if isinstance(acc, float):
                    info += f" | acc {acc:.3f}"
                eps = self._epsilon()
                # the bar counts the lines written; a plain line names the round finished
                number = (
                    len(lines)
                    if display.interactive
                    else int(last.get("round", len(lines) - 1)) + 1
                )
                display.round_done(
                    number,
                    accuracy=acc,
                    extra=eps.strip(" |"),
                    info=info + eps,
                )

    def close(self) -> None:
        self._display.close()


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def silo_summaries(flower_dir: Path, run_key: str, n: int) -> PrivacySummary | None:
    """The typed merge of the local silos' own privacy summaries (None if none is written)."""
    from pdpfl.ledger import PrivacySummary

    parts = []
    for i in range(n):
        path = flower_dir / f"silo-{i}" / f"run-{run_key}" / f"privacy-summary-silo-{i}.json"
        with contextlib.suppress(OSError, ValueError):
            parts.append(PrivacySummary.from_dict(json.loads(path.read_text())))
    return PrivacySummary.merge(parts) if parts else None
