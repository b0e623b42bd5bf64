"""Stop signals while Flower's Simulation Engine runs (``--runtime flower-simulation``).

Ctrl-C (SIGINT), SIGTERM or SIGHUP must stop the ServerApp at its next grid call (its finished
rounds are checkpointed), let Flower stop its actors in order, and then let ``pdpfl run`` catch
the silos' ledgers up (:mod:`pdpfl.runtime.flower.catch_up`) and print the resume command, as
:mod:`pdpfl.runtime.signals` promises for every command. Two things stand in the way:

* raising ``KeyboardInterrupt`` inside the engine's loop leaves Flower's threads waiting on
  actors Ray already shut down: :func:`stop_on_signals` only sets events (the ServerApp's grid
  raises once ``stopped`` is set); a second signal raises at once;
* ``ray.init`` (called by Flower's Ray backend once the engine starts) installs Ray's own
  SIGTERM handler in this process -- its core worker's, which shuts the worker down and exits
  (status 1), and its C++ failure-signal handler, which aborts (134): no checkpoint message, no
  catch-up. The failure-signal handler is turned off by the environment
  (``RAY_DISABLE_FAILURE_SIGNAL_HANDLER``, set by the launcher); for the other, a watcher thread
  waits until Ray is initialized and then has the main thread (where alone handlers can be
  set) install this module's handlers again, by a SIGUSR1 directed at it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from pdpfl.io import STOP_SIGNALS
from pdpfl.runtime.signals import Interrupted

__all__ = ["REINSTALL_SIGNAL", "stop_on_signals"]

#: The signal the watcher sends the main thread to install the handlers again after Ray's.
REINSTALL_SIGNAL = signal.SIGUSR1
#: Seconds between two looks at whether Ray is initialized.
POLL_S = 0.1


def _ray_initialized() -> bool:
    ray = sys.modules.get("ray")  # imported by Flower's backend, never here
    check = getattr(ray, "is_initialized", None)  # None while Flower still imports it
    try:
        return bool(callable(check) and check())
    except Exception:  # a half-initialized Ray: look again
        return False


@contextlib.contextmanager
def stop_on_signals(
    interrupted: threading.Event, stopped: threading.Event, received: list[int]
) -> Iterator[None]:
    """Within the block (main thread only; elsewhere nothing changes), the first SIGINT,
    SIGTERM or SIGHUP sets ``interrupted`` and ``stopped``; a second raises
    :class:`~pdpfl.runtime.signals.Interrupted`. Every signal received is appended to
    ``received``. The handlers are installed again once Ray is initialized (module docstring),
    and the previous ones restored when the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if interrupted.is_set():
            raise Interrupted(signum)
        interrupted.set()
        stopped.set()

    watched = [sig for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN]

    def install(signum: int = 0, frame: FrameType | None = None) -> None:
        for sig in watched:
            signal.signal(sig, handler)

    previous = {sig: signal.getsignal(sig) for sig in [*watched, REINSTALL_SIGNAL]}
    install()
    signal.signal(REINSTALL_SIGNAL, install)
    done = threading.Event()
    main = threading.main_thread().ident

    def watch() -> None:
        while not done.wait(POLL_S):
            if _ray_initialized():
                if main is not None:
                    signal.pthread_kill(main, REINSTALL_SIGNAL)
                return

    watcher = threading.Thread(target=watch, name="pdpfl-signals", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(timeout=1.0)
        for sig, old in previous.items():
            signal.signal(sig, old)
