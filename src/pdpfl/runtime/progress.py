"""The one progress display of every command: a rich bar on a terminal, plain lines without one.

:class:`ProgressDisplay` is what the round loop (``pdpfl run``, ``pdpfl audit``, ...) and the
Flower coordinator (``pdpfl flower run``, ``--runtime flower``) show on standard error: on a
terminal a rich bar (``round 3/40 ━━━━ acc 0.412 0:00:09``), otherwise :class:`ProgressLines`.

Progress without a terminal: one plain line per round, at most about one per minute.
A run started by a scheduler, ``nohup``, CI or with its output piped has no terminal for a
progress bar; it used to print nothing until it ended, so a slow run and a hung one looked the
same. When standard output or standard error is not a terminal, the round loop (and the
loopback Flower launcher) log plain lines to standard error instead, as Flower and Lightning do::

    round 1/40 · 0:00:03 elapsed · accuracy 0.4121 · max ε 0.0991 (third party), 0.0991 (server)

The first and the last round are always logged; in between, a round is logged when at least
``interval_s`` (60 s) passed since the previous line -- one line per round for runs whose rounds
take a minute or more, one per minute for faster ones.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from pdpfl.ledger import PrivacySummary

__all__ = ["ProgressDisplay", "ProgressLines", "interactive"]


def interactive() -> bool:
    """True when both standard output and standard error are terminals (a progress bar can be
    drawn and seen)."""
    try:
        return bool(sys.stdout.isatty() and sys.stderr.isatty())
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class ProgressLines:
    """Plain progress lines (see the module docstring)."""

    def __init__(
        self,
        total: int,
        completed: int = 0,
        *,
        interval_s: float = 60.0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.interval_s = int(total), float(interval_s)
        self.stream = stream
        self.clock = clock
        self.started = clock()
        self.last_printed: float | None = None
        self.done = int(completed)

    def round_done(
        self,
        round_number: int,
        accuracy: object = None,
        privacy: PrivacySummary | None = None,
        extra: str = "",
    ) -> str | None:
        """Record that ``round_number`` (1-based) finished; returns the line if one was logged."""
        self.done = int(round_number)
        now = self.clock()
        due = (
            self.last_printed is None
            or self.done >= self.total
            or now - self.last_printed >= self.interval_s
        )
        if not due:
            return None
        self.last_printed = now
        parts = [f"round {self.done}/{self.total}", f"{_clock(now - self.started)} elapsed"]
        if isinstance(accuracy, int | float) and math.isfinite(float(accuracy)):
            parts.append(f"accuracy {float(accuracy):.4f}")
        eps = _epsilon_text(privacy)
        if eps:
            parts.append(eps)
        if extra:
            parts.append(extra)
        line = " · ".join(parts)
        stream = self.stream if self.stream is not None else sys.stderr
        print(line, file=stream, flush=True)
        return line


def _epsilon_text(privacy: PrivacySummary | None) -> str:
    """``max ε 0.5 (third party), 0.7 (server)`` from a typed privacy summary (or nothing)."""
    if privacy is None or not getattr(privacy, "private", True):
        return ""
    values = []
    for obs in getattr(privacy, "observers", ()):
        spent = privacy.spent_max(obs)
        if spent is not None and math.isfinite(float(spent)):
            values.append(f"{float(spent):.4g} ({obs.replace('-', ' ')})")
    return ("max ε " + ", ".join(values)) if values else ""


class ProgressDisplay:
    """A rich bar on a terminal, :class:`ProgressLines` without one, nothing when disabled.

    Progress shows from :meth:`start` on (the bar's description, total and info can change: the
    Flower coordinator shows the silos connecting, then the rounds); :meth:`round_done` reports
    a finished round either way (``info`` is the bar's text, ``accuracy``/``privacy``/``extra``
    the plain line's).
    """

    def __init__(
        self,
        total: int,
        completed: int = 0,
        *,
        enabled: bool = True,
        terminal: bool | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.total, self.completed = int(total), int(completed)
        self.enabled = bool(enabled)
        self.interactive = interactive() if terminal is None else bool(terminal)
        self.stream = stream
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._lines: ProgressLines | None = None

    @property
    def drawing(self) -> bool:
        """Whether a rich bar is on screen."""
        return self._progress is not None

    @property
    def description(self) -> str | None:
        """The bar's current description (None without a bar)."""
        return None if self._progress is None else str(self._progress.tasks[0].description)

    def start(
        self,
        description: str = "round",
        *,
        total: int | None = None,
        completed: int | None = None,
        info: str = "",
    ) -> None:
        """Start showing progress (when enabled): draw the bar on a terminal, or start the
        plain lines' clock without one. Called again: change the bar's description, total or
        position (the plain lines keep their clock)."""
        if not self.enabled:
            return
        if total is not None:
            self.total = int(total)
        if completed is not None:
            self.completed = int(completed)
        if not self.interactive:
            if self._lines is None:
                self._lines = ProgressLines(self.total, self.completed, stream=self.stream)
            return
        if self._progress is not None and self._task is not None:
            self._progress.update(
                self._task, description=description, total=self.total, completed=self.completed
            )
            return
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
            description, total=self.total, completed=self.completed, info=info
        )

    def update(self, *, completed: int | None = None, advance: int = 0, info: str = "") -> None:
        """Move the bar (no-op without one)."""
        if self._progress is None or self._task is None:
            return
        if completed is not None:
            self._progress.update(self._task, completed=int(completed), info=info)
        else:
            self._progress.update(self._task, advance=advance, info=info)

    def round_done(
        self,
        round_number: int,
        *,
        accuracy: object = None,
        privacy: PrivacySummary | None = None,
        extra: str = "",
        info: str | None = None,
    ) -> None:
        """Round ``round_number`` (1-based) finished: the bar moves to it, or a plain line."""
        if not self.enabled:
            return
        if self.interactive:
            if info is None:
                ok = isinstance(accuracy, float) and math.isfinite(accuracy)
                info = f"acc {accuracy:.3f}" if ok else ""
            self.update(completed=int(round_number), info=info)
            return
        if self._lines is None:
            self.start()
        assert self._lines is not None
        self._lines.round_done(int(round_number), accuracy, privacy, extra)

    def close(self) -> None:
        """Stop the bar (idempotent)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
