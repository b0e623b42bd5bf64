"""pdpfl's logging: the standard :mod:`logging` module under the ``pdpfl`` logger.

Library code logs to ``logging.getLogger(__name__)`` and configures nothing (as a library
should). The CLI sets the level from ``-v``/``-vv``/``--log-level`` and writes to the terminal
(stderr); a run additionally writes ``run.log`` in its output folder (:func:`log_to_file`).

This module imports nothing of pdpfl: every layer may use it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["LEVELS", "configure", "level_of", "log_to_file"]

#: Accepted ``--log-level`` values.
LEVELS = ("debug", "info", "warning", "error")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def level_of(verbose: int, log_level: str | None) -> int:
    """``--log-level`` wins; otherwise warning, ``-v`` info, ``-vv`` debug."""
    if log_level is not None:
        name = log_level.strip().lower()
        if name not in LEVELS:
            raise ValueError(f"--log-level: expected one of {', '.join(LEVELS)}, got {log_level!r}")
        return int(getattr(logging, name.upper()))
    return logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG


def configure(level: int) -> None:
    """Send the ``pdpfl`` logger's records at ``level`` and above to stderr (idempotent)."""
    logger = logging.getLogger("pdpfl")
    logger.setLevel(level)
    if not any(getattr(h, "_pdpfl_console", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        handler._pdpfl_console = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    for h in logger.handlers:
        if getattr(h, "_pdpfl_console", False):
            h.setLevel(level)


@contextmanager
def log_to_file(path: str | Path) -> Iterator[None]:
    """Also write the ``pdpfl`` logger's records (INFO and above, or the configured lower
    level) to ``path`` (appended) while the block runs."""
    logger = logging.getLogger("pdpfl")
    handler = logging.FileHandler(Path(path), encoding="utf-8")
    handler.setFormatter(logging.Formatter(_FORMAT))
    level = logger.level if logger.level and logger.level < logging.INFO else logging.INFO
    handler.setLevel(level)
    before = logger.level
    if not logger.level or logger.level > level:
        logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()
        logger.setLevel(before)
