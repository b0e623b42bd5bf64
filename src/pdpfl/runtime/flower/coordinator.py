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
from typing import Any

from pdpfl.runtime.flower.apps import STATUS_FILE

__all__ = ["CoordinatorProgress", "silo_summaries"]


class CoordinatorProgress:
    """The coordinator's progress on stderr, read from the ServerApp's files: a rich bar on a
    terminal, plain lines without one (:mod:`pdpfl.runtime.progress`).

    Discovery: silos ready / connected. Rounds: the round bar with the sampled silos, the pooled
    accuracy and -- on loopback, where one operator owns every silo -- the ε headline collected
    from the local silos' own summaries (third party / server).
    """

    def __init__(self, out: Path, rounds: int, num_silos: int, *, enabled: bool) -> None:
        self.out, self.rounds, self.num_silos = out, rounds, num_silos
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None
        self._seen = 0
        self._status_mtime = 0.0
        self._run_key: str | None = None
        from pdpfl.runtime.progress import ProgressLines, interactive

        self._interactive = interactive()
        self._lines: ProgressLines | None = None

    def _start(self, completed: int) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(
            "silos", total=self.num_silos, completed=0, info="starting the federation"
        )
        self._seen = completed

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
        fmt = lambda x: "-" if x is None else f"{x:.3g}"  # noqa: E731
        return f" | ε max {fmt(tp)} (3rd) / {fmt(sv)} (server)"

    def _tick_lines(self) -> None:
        """Without a terminal: one plain line per round (at most about one a minute)."""
        from pdpfl.runtime.loop import read_metrics
        from pdpfl.runtime.progress import ProgressLines

        if self._lines is None:
            self._lines = ProgressLines(self.rounds)
            print(f"starting the Flower federation ({self.num_silos} silos)", file=sys.stderr)
        with contextlib.suppress(OSError, ValueError):
            lines = read_metrics(self.out)
            if len(lines) > self._seen:
                last = lines[-1]
                self._seen = len(lines)
                self._lines.round_done(
                    int(last.get("round", len(lines) - 1)) + 1,
                    last.get("accuracy"),
                    extra=self._epsilon().strip(" |"),
                )

    def tick(self) -> None:
        if not self.enabled:
            return
        if not self._interactive:
            self._tick_lines()
            return
        if self._progress is None:
            self._start(0)
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
                    self._progress.update(
                        self._task, completed=len(status.get("ready", [])), info=info
                    )
        from pdpfl.runtime.loop import read_metrics

        with contextlib.suppress(OSError, ValueError):
            lines = read_metrics(self.out)
            if lines and self._progress.tasks[0].description != "round":
                self._progress.update(
                    self._task, description="round", total=self.rounds, completed=0
                )
            if len(lines) > self._seen or (lines and self._seen == 0):
                last = lines[-1]
                acc = last.get("accuracy")
                info = f"sampled {last.get('selected')}"
                if isinstance(acc, float):
                    info += f" | acc {acc:.3f}"
                info += self._epsilon()
                self._progress.update(self._task, completed=len(lines), info=info)
                self._seen = len(lines)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def silo_summaries(flower_dir: Path, run_key: str, n: int) -> Any:
    """The typed merge of the local silos' own privacy summaries (None if none is written)."""
    from pdpfl.ledger import PrivacySummary

    parts = []
    for i in range(n):
        path = flower_dir / f"silo-{i}" / f"run-{run_key}" / f"privacy-summary-silo-{i}.json"
        with contextlib.suppress(OSError, ValueError):
            parts.append(PrivacySummary.from_dict(json.loads(path.read_text())))
    return PrivacySummary.merge(parts) if parts else None
