"""The command-line modules stay thin: argument handling that calls library functions.

Issue #40 item 4: the logic of a command lives in the library (``pdpfl.reports`` for what the
commands show about finished runs, ``pdpfl.runtime.flower.services`` for the Flower services,
``pdpfl.runtime.lock`` for the output folder, ...); a ``pdpfl/cli/*.py`` module parses options,
calls them and maps their errors to exit codes. The limit is the one reached (the goal is about
150 lines; a module's typer option declarations alone take 40-90 of its lines; the largest are
``calibrate.py``, ``privacy.py``, ``compare.py`` and ``run.py``, 260-285 lines), so a module
that grows past it is a sign that library logic moved back into the CLI.
"""

from __future__ import annotations

from pathlib import Path

CLI = Path(__file__).resolve().parents[1] / "src" / "pdpfl" / "cli"

#: The most lines any ``pdpfl/cli`` module may have.
LIMIT = 300


def test_no_cli_module_exceeds_the_limit() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted(CLI.glob("*.py"))}
    assert len(sizes) >= 10
    over = {name: n for name, n in sizes.items() if n > LIMIT}
    assert not over, (
        f"pdpfl/cli modules over {LIMIT} lines (move their logic to the library): {over}"
    )
