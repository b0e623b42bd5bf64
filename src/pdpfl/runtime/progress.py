"""Progress without a terminal: one plain line per round, at most about one per minute.

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
from typing import Any, TextIO

__all__ = ["ProgressLines", "interactive"]


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
        self, round_number: int, accuracy: Any = None, privacy: Any = None, extra: str = ""
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


def _epsilon_text(privacy: Any) -> str:
    """``max ε 0.5 (third party), 0.7 (server)`` from a typed privacy summary (or nothing)."""
    if privacy is None or not getattr(privacy, "private", True):
        return ""
    values = []
    for obs in getattr(privacy, "observers", ()):
        spent = privacy.spent_max(obs)
        if spent is not None and math.isfinite(float(spent)):
            values.append(f"{float(spent):.4g} ({obs.replace('-', ' ')})")
    return ("max ε " + ", ".join(values)) if values else ""
