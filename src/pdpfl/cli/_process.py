"""The garbage collector around a console command (issue #26 item 4: ``pdpfl run``'s wall time).

Importing torch (and, at its first optimizer step, ``torch._dynamo`` and sympy), scipy and
matplotlib builds a graph of ~470,000 objects that the collector traverses again and again:
during the imports (each full collection scans everything imported so far), during the run
and twice more at interpreter exit, ~0.4 s of exit alone, without finding garbage in it. Two
measures, both only when :func:`pdpfl.cli.main` runs the command in a process of its own
(``ENDS_PROCESS``; tests call the app through click's ``CliRunner`` and see neither):

* :func:`collector_paused` around a command's imports and config parsing: the collector is
  off there, and the graph built is then frozen (:func:`gc.freeze`) before the work starts, so
  later collections skip it. ``pdpfl run`` (simulator) also imports its plotting library
  there: imported amid the run's objects after training, it cost ~0.07 s more. The few
  thousand garbage objects of the setup (~7,700 for ``pdpfl run``, mostly import-time
  temporaries) are frozen with it: they are freed at exit instead of during the run (see
  :func:`lighten_exit`), nothing of theirs is skipped.
* :func:`lighten_exit` after the command: the whole graph is frozen, so that exit's
  collections skip it, but only when no object has a finalizer that exit would run through
  the collector (:func:`exit_needs_collector`); otherwise the exit is the normal one.
  ``atexit`` handlers (logging's flush and close, ``weakref.finalize``, child processes), the
  flush of the standard streams and the finalization of objects freed by reference counting
  happen either way; the kernel releases file locks and descriptors.
"""

from __future__ import annotations

import contextlib
import gc
import io
import sys
import types
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["ENDS_PROCESS", "collector_paused", "exit_needs_collector", "lighten_exit"]

#: Set by :func:`pdpfl.cli.main`: the command runs in a process that ends after it.
ENDS_PROCESS = False

#: Finalizers that only warn (a misused grammar), harmless to skip at exit.
_HARMLESS_FINALIZERS = {("pyparsing.core", "Forward")}


@contextlib.contextmanager
def collector_paused() -> Iterator[bool]:
    """Imports and config parsing without the collector; the graph they built is then frozen.

    A no-op unless :data:`ENDS_PROCESS` (and the collector is on); yields whether it paused.
    The collector is on again when the block ends, however it ends; objects created after it
    are collected as usual.
    """
    if not ENDS_PROCESS or not gc.isenabled():
        yield False
        return
    gc.disable()
    try:
        yield True
    finally:
        gc.freeze()
        gc.enable()


def lighten_exit() -> None:
    """Freeze every object before the interpreter exits, when that skips nothing that matters.

    Objects frozen earlier (:func:`collector_paused`) are first returned to the collector's
    view, so that the check sees them too: when anything needs the collector, the exit is the
    normal one and frees them all.
    """
    gc.unfreeze()
    try:
        needed = exit_needs_collector(gc.get_objects())
    except Exception:  # never let the check change how the command ends: exit as usual
        needed = True
    if not needed:
        gc.freeze()


def exit_needs_collector(objects: Iterable[Any]) -> bool:
    """Whether any object has a finalizer with an effect: an open writable file other than
    the standard streams and in-memory buffers (finalization flushes it), a suspended
    generator or coroutine with cleanup code (``finally``/``with``), or any other ``__del__``
    (temporary files, user classes), except the few in :data:`_HARMLESS_FINALIZERS`."""
    std: set[int] = set()
    for stream in (
        sys.stdin,
        sys.stdout,
        sys.stderr,
        sys.__stdin__,
        sys.__stdout__,
        sys.__stderr__,
    ):
        buffer = getattr(stream, "buffer", None)
        for part in (stream, buffer, getattr(buffer, "raw", None)):
            if part is not None:
                std.add(id(part))
    frames = {
        types.GeneratorType: ("gi_frame", "gi_code"),
        types.CoroutineType: ("cr_frame", "cr_code"),
        types.AsyncGeneratorType: ("ag_frame", "ag_code"),
    }
    plain: dict[type, bool] = {}  # type -> no finalizer that matters
    for obj in objects:
        kind = type(obj)
        no_finalizer = plain.get(kind)
        if no_finalizer is None:
            no_finalizer = plain[kind] = not hasattr(kind, "__del__") or (
                (kind.__module__, kind.__qualname__) in _HARMLESS_FINALIZERS
            )
        if no_finalizer:
            continue
        if isinstance(obj, io.IOBase):
            if id(obj) in std or kind in (io.BytesIO, io.StringIO):  # nothing to lose
                continue
            try:
                harmless = bool(obj.closed or not obj.writable())
            except Exception:  # a file that cannot say needs the collector
                harmless = False
            if harmless:
                continue
            return True
        attrs = frames.get(kind)
        if attrs is not None:
            frame, code = (getattr(obj, a) for a in attrs)
            if frame is None or not code.co_exceptiontable:  # finished, or nothing to clean
                continue
        return True
    return False
