"""`pdpfl reproduce PAPER`: a paper's headline experiments beside its published numbers.

Runs :func:`pdpfl.reproduce.reproduce` and writes ``REPORT.md`` (opening with the figures),
``figures/``, ``results.json`` and every run's outputs under ``runs/`` into ``--out``. Tiers:
``--smoke`` (seconds; one tiny experiment per paper), ``--quick`` (all four papers in under 15
minutes on 2 cores) and the default full tier, whose expected time is printed first. Exit 2 for
bad input (nothing written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdpfl.cli._common import check_key_dir, fail, multi_value_command, print_json

__all__ = ["register", "reproduce_command"]


def reproduce_command(
    paper: Annotated[str, typer.Argument(help="rpdp-fl, idp-fedavg, uldp-fl, prifedsync or all.")],
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="Every experiment, shortened (all four papers in under 15 minutes on 2 cores).",
        ),
    ] = False,
    smoke: Annotated[
        bool,
        typer.Option(
            "--smoke", help="One tiny experiment per paper (seconds; what the test-suite runs)."
        ),
    ] = False,
    seeds: Annotated[
        list[int] | None,
        typer.Option("--seeds", help="Seeds (several values allowed); default: the tier's."),
    ] = None,
    data_dir: Annotated[
        str | None,
        typer.Option("--data-dir", help="Folder with the dataset files (nothing is downloaded)."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Output folder (default runs/reproduce/PAPER).")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a previous report in --out.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print results.json on stdout.")] = False,
) -> None:
    """Run a paper's headline experiments and write REPORT.md beside the published numbers."""
    from pdpfl.reproduce import PAPERS, expected_seconds, reproduce
    from pdpfl.runtime.outputs import OutputDirError

    if paper != "all" and paper not in PAPERS:
        fail(f"PAPER: expected one of {', '.join(PAPERS)} or all, got {paper!r}")
    if quick and smoke:
        fail("--quick, --smoke: choose one tier")
    if seeds is not None and any(s < 0 for s in seeds):
        fail(f"--seeds: seeds must be >= 0, got {seeds}")
    if data_dir is not None and not Path(data_dir).is_dir():
        fail(f"--data-dir: {data_dir} is not a folder")
    check_key_dir()
    tier = "smoke" if smoke else "quick" if quick else "full"
    target = out if out is not None else Path("runs") / "reproduce" / paper
    minutes = expected_seconds(paper, tier) / 60
    typer.echo(
        f"pdpfl reproduce {paper} ({tier} tier): expected about {minutes:.0f} min on "
        "2 CPU cores (more on a busy machine); writing to " + str(target),
        err=True,
    )
    try:
        result = reproduce(
            paper,
            out=target,
            tier=tier,
            seeds=seeds or None,
            data_dir=data_dir,
            force=force,
            log=lambda msg: typer.echo(msg, err=True),
        )
    except OutputDirError as err:
        fail(str(err))
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM or SIGHUP (pdpfl.runtime.signals)
        from pdpfl.runtime.signals import exit_code, signal_name, signal_of

        typer.echo(
            f"\ninterrupted ({signal_name(signal_of(err))}): the runs finished so far are "
            f"under {target / 'runs'}",
            err=True,
        )
        raise typer.Exit(code=exit_code(err)) from None
    if as_json:
        print_json(result)
        return
    typer.echo(f"report: {target / 'REPORT.md'}")


def register(app: typer.Typer) -> None:
    """Add ``reproduce`` to the main app."""
    app.command("reproduce", cls=multi_value_command("--seeds"))(reproduce_command)
