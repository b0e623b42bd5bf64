"""Run independent chunks of big-integer arithmetic on several cores.

gmpy2 holds the GIL, so threads do not help; :func:`run_chunks` forks worker processes (the
POSIX ``fork`` start method), which inherit the caller's precomputed tables and keys through
copy-on-write memory instead of receiving them in a message. The calling process computes the
first chunk itself while the workers compute the others. Only the chunk descriptions (small
NumPy arrays, ranges) and the results (integers) cross process boundaries -- never a private
key, which refuses to be pickled. Where ``fork`` is unavailable, or for one worker, the chunks
run in the caller.

A worker count of ``None`` means :func:`default_workers` (both cores of a 2-core machine; at
most 2 by default so as not to crowd other processes). Parallel runs only pay when each chunk is
large (a fork of a big process costs tens of milliseconds): callers decide with
:func:`worth_parallel`.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

__all__ = ["default_workers", "run_chunks", "split", "worth_parallel"]

#: What a forked worker reads by inheritance (token -> the ``shared`` argument of a job).
_SHARED: dict[int, Any] = {}
S = TypeVar("S")
C = TypeVar("C")
R = TypeVar("R")
_TOKENS = itertools.count()

#: Estimated work (in modular multiplications) below which forking does not pay.
MIN_PARALLEL_MULTIPLICATIONS = 20_000


def default_workers() -> int:
    """min(2, usable CPUs)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cpus = os.cpu_count() or 1
    return max(1, min(2, cpus))


def resolve_workers(workers: int | None) -> int:
    if workers is None:
        return default_workers()
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"secure.workers: expected an integer >= 1, got {workers!r}")
    return workers


def worth_parallel(multiplications: float, workers: int | None) -> int:
    """The number of workers to use for a job of about ``multiplications`` operations."""
    w = resolve_workers(workers)
    return w if multiplications >= MIN_PARALLEL_MULTIPLICATIONS else 1


def split(total: int, parts: int) -> list[range]:
    """``total`` items as ``parts`` contiguous, nearly equal ranges (no empty range)."""
    parts = max(1, min(int(parts), int(total))) if total else 1
    base, extra = divmod(int(total), parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        out.append(range(start, stop))
        start = stop
    return out


def _fork_available() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def _run(func: Callable[[S, C], R], token: int, chunk: C) -> R:
    shared: S = _SHARED[token]  # what run_chunks stored under this token
    return func(shared, chunk)


def run_chunks(
    func: Callable[[S, C], R], shared: S, chunks: Sequence[C], workers: int | None
) -> list[R]:
    """``[func(shared, chunk) for chunk in chunks]`` on up to ``workers`` processes.

    ``func`` must be a module-level function; ``shared`` reaches forked workers by inheritance.
    """
    w = resolve_workers(workers)
    if w <= 1 or len(chunks) <= 1 or not _fork_available():
        return [func(shared, c) for c in chunks]
    token = next(_TOKENS)
    _SHARED[token] = shared
    try:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=min(w - 1, len(chunks) - 1), mp_context=ctx) as ex:
            futures = [ex.submit(_run, func, token, c) for c in chunks[1:]]
            first = func(shared, chunks[0])
            return [first, *(f.result() for f in futures)]
    finally:
        _SHARED.pop(token, None)
