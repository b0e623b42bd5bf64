"""Draw a run's plots in a second interpreter that imports matplotlib while the run trains.

``pdpfl run`` calls :func:`start` before it loads its config: the child imports matplotlib and
:mod:`pdpfl.runtime.plots` (0.3–0.6 s, most of the plots' cost) on the machine's other core
while the run imports torch, calibrates and trains. At the end,
:func:`pdpfl.runtime.plots.write_plots` hands it the metrics and the summary (JSON on its stdin;
no pickle) and waits for it: the child draws the same figures with the same code and writes
each PNG as the in-process path does (temporary file, then rename). If the child cannot be
started, fails or takes longer than :data:`TIMEOUT_S`, the run draws the plots itself, so the
outputs never depend on it. :func:`stop` ends an unused child (its stdin closes: it exits
without writing anything). ``PDPFL_PLOT_WORKER=0`` turns the worker off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["ENV", "TIMEOUT_S", "draw", "start", "stop"]

#: Environment variable: ``0`` disables the worker (the plots are then drawn in-process).
ENV = "PDPFL_PLOT_WORKER"
#: Seconds the run waits for the child's plots before drawing them itself.
TIMEOUT_S = 120.0

_proc: subprocess.Popen[bytes] | None = None


def start() -> None:
    """Start the child (once; nothing if disabled or if it cannot be started)."""
    global _proc
    if _proc is not None or os.environ.get(ENV, "1") == "0":
        return
    try:
        _proc = subprocess.Popen(
            [sys.executable, "-m", "pdpfl.runtime.plot_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    except OSError:
        _proc = None


def draw(metrics: list[dict[str, Any]], summary: dict[str, Any], out: Path) -> bool:
    """Have the child write ``accuracy.png`` and ``epsilon.png`` in ``out``; True if it did."""
    global _proc
    proc, _proc = _proc, None
    if proc is None:
        return False
    try:
        payload = json.dumps({"metrics": metrics, "summary": summary, "out": str(out)})
        proc.communicate(payload.encode("utf-8"), timeout=TIMEOUT_S)
    except (TypeError, ValueError, OSError, subprocess.TimeoutExpired):
        _end(proc)
        return False
    return proc.returncode == 0


def stop() -> None:
    """End an unused child: it sees its stdin close and exits without writing."""
    global _proc
    proc, _proc = _proc, None
    if proc is not None:
        _end(proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    try:
        if proc.stdin is not None and not proc.stdin.closed:
            proc.stdin.close()
        proc.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()


def main() -> int:
    """The child: import the plotting stack, then draw what arrives on stdin (if anything)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    from matplotlib.figure import Figure  # noqa: F401
    from matplotlib.ticker import MaxNLocator  # noqa: F401

    from pdpfl.runtime.plots import draw_plots

    raw = sys.stdin.buffer.read()
    if not raw:  # the run ended without plots (an error, or no plots wanted)
        return 0
    data = json.loads(raw)
    draw_plots(data["metrics"], data["summary"], Path(data["out"]))
    return 0


if __name__ == "__main__":  # pragma: no cover - the child process
    sys.exit(main())
