"""Stop signals: SIGTERM and SIGHUP end a command exactly as Ctrl-C (SIGINT) does.

Schedulers stop work with SIGTERM (SLURM, Kubernetes, systemd, ``docker stop``) and a closed
terminal or SSH session sends SIGHUP. Python turns only SIGINT into an exception
(``KeyboardInterrupt``), so without this module SIGTERM and SIGHUP kill the process where it
stands: no resume command, a temporary file left beside a checkpoint, Flower children left
running. :func:`stop_signals_interrupt` makes the three signals raise :class:`Interrupted` (a
``KeyboardInterrupt`` that remembers its signal), so that every ``except KeyboardInterrupt``
path -- keep the finished rounds, stop child processes, print the resume command -- runs for
all of them, and :func:`exit_code` gives the shell's convention ``128 + signal`` (130 for
SIGINT, 143 for SIGTERM, 129 for SIGHUP).

A signal never splits a round's files: the writes of :mod:`pdpfl.io` and the round's save in
:func:`pdpfl.checkpoint.save_round` hold these signals until they are done
(:func:`pdpfl.io.signals_deferred`), then deliver them.

Handlers can only be installed in the main thread; elsewhere these helpers do nothing (the
signal is then handled by whatever the main thread installed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from pdpfl.io import STOP_SIGNALS

__all__ = ["STOP_SIGNALS", "Interrupted", "exit_code", "signal_name", "stop_signals_interrupt"]


class Interrupted(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM or SIGHUP) received while a command ran."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(f"stopped by {signal_name(signum)}")
        self.signum = int(signum)


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15 (the number itself for an unknown signal)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signal_of(err: BaseException) -> int:
    """The signal behind an interruption (SIGINT for a plain ``KeyboardInterrupt``)."""
    return int(getattr(err, "signum", signal.SIGINT))


def exit_code(err: BaseException) -> int:
    """The exit status of a command stopped by ``err``: 128 + its signal (130, 143, 129)."""
    return 128 + signal_of(err)


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` in the main
    thread (at most once: a second signal while the first one unwinds is reported on stderr
    and otherwise ignored, so that the clean-up -- stopping child processes, writing the
    finished rounds' outputs -- completes; SIGKILL remains for an impatient operator).

    A signal that was ignored when the block started (``nohup`` ignores SIGHUP) stays ignored.
    The previous handlers are restored when the block ends.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal raised
        if raised:
            with contextlib.suppress(OSError):
                os.write(2, f"\n{signal_name(signum)}: already stopping\n".encode())
            return
        raised = True
        raise Interrupted(signum)

    previous: dict[int, object] = {}
    try:
        for sig in STOP_SIGNALS:
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN:
                continue
            previous[sig] = current
            signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
