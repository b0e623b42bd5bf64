"""`pdpfl audit CONFIG`: an empirical lower bound ε̂ per budget group, beside the accountant's ε.

Plants m white-box canaries per budget group (each included with probability ½), trains the
configured federation once in-process through the real mechanism, and bounds each group's ε
from what each observer sees (:mod:`pdpfl.audit`). Writes ``audit.json``, ``audit.png`` and
``AUDIT.md`` to ``--out`` (default ``<output_dir>/audit``). Exit status: 0 consistent (every ε̂
at most the accountant's ε, and every group's test could have failed or did not saturate), 1
violation (an ε̂ above the accountant's ε: a found privacy bug; the outputs say which), 4
inconclusive (saturated: every guess right in a group whose test could not have failed; the
outputs say how many canaries would give it power), 2 bad input (nothing written).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from pdpfl.cli._common import check_key_dir, fail, print_json

if TYPE_CHECKING:
    from rich.table import Table

    from pdpfl.audit import AuditSession, AuditSettings
    from pdpfl.config import ExperimentConfig

__all__ = ["audit_command", "register"]

#: Exit status of an audit that found ε̂ above the accountant's ε.
EXIT_VIOLATION = 1
#: Most canaries per group: :data:`pdpfl.audit.session.MAX_CANARIES` (repeated here so that the
#: CLI starts without importing the audit; a test checks that the two agree).
MAX_CANARIES = 1_000_000

#: Exit status of an audit whose test saturated where it could not have failed (no power).
EXIT_INCONCLUSIVE = 4

_OBSERVERS = {
    "third-party": ("third-party",),
    "server": ("server",),
    "both": ("third-party", "server"),
}


def _session(config: ExperimentConfig, settings: AuditSettings) -> AuditSession:
    from pdpfl.audit import AuditSession, AuditUnsupported
    from pdpfl.runtime.simulation import load_federation_for

    try:
        federation = load_federation_for(config)
    except (ValueError, FileNotFoundError, KeyError, TypeError) as err:
        fail(f"data: {err}")
    try:
        return AuditSession.create(config, settings, federation=federation)
    except AuditUnsupported as err:
        fail(str(err))
    except ValueError as err:
        fail(str(err))


def _table(record: dict[str, Any], obs: str) -> Table:
    from rich import box
    from rich.table import Table

    from pdpfl.audit.report import OBSERVER_TITLES, format_number

    t = Table(title=f"audit: {OBSERVER_TITLES[obs]}", box=box.SIMPLE_HEAD, title_justify="left")
    d1 = f"{record['audit_delta']:.0e}"
    for col in (
        "group",
        "q",
        f"ε acct\nδ={d1}",
        f"ε̂\nδ={d1}",
        "ε̂\nSteinke",
        "ε̂\nf-DP",
        "right /\nguesses",
        "TPR≤ at\nFPR 1%",
        "status",
    ):
        t.add_column(col, justify="right", no_wrap=True, min_width=len(col.split()[0]))
    for g in record["observers"][obs]:
        risk = g.get("risk")
        tpr = None if not risk else risk["tpr_max"][risk["fpr"].index(0.01)]
        t.add_row(
            g["label"],
            format_number(g["canary_rate"]),
            format_number(g["spent_at_audit_delta"], 4),
            format_number(g["epsilon_lower"]),
            format_number(g["epsilon_lower_steinke"]),
            format_number(g["epsilon_lower_fdp"]),
            f"{g['correct']} / {g['guesses']}",
            format_number(tpr),
            g["status"].replace(" (saturated)", "*"),
            style="red" if g["violated"] else "yellow" if g["saturated"] else None,
        )
    t.caption = (
        f"ε̂: lower bound, simultaneous {record['confidence']:.0%} confidence over all "
        f"{record['tests']} tests; control = canaries never trained (ε̂ must be 0); "
        "inconclusive* = saturated (no power); TPR≤: the accountant's bound on any attack"
    )
    return t


def audit_command(
    config_path: Path = typer.Argument(..., help="Experiment YAML (see examples/)."),
    canaries: int = typer.Option(
        1000,
        "--canaries",
        min=2,
        max=MAX_CANARIES,
        help="Canaries per budget group (and in the control group), 2 to 1,000,000.",
    ),
    observer: str = typer.Option(
        "both", "--observer", help="third-party (final model), server (every release) or both."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Output folder (default: <output_dir>/audit)."
    ),
    seed: int | None = typer.Option(
        None,
        "--seed",
        help="Seed of the audit's own coins (canaries, coordinates, hosts); "
        "default: a CSPRNG. The training's randomness is the config's (--set "
        "randomness=reproducible makes the whole audit reproducible).",
    ),
    overrides: list[str] | None = typer.Option(
        None, "--set", help="key=value override (dotted). Repeatable."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print audit.json instead of tables."),
    data_dir: str | None = typer.Option(None, "--data-dir", help="Folder with the dataset files."),
    space: str = typer.Option(
        "auto",
        "--space",
        help="auto, model (the model's own coordinates) or block (an "
        "audit-only block appended to the model; auto: block when the model is too small).",
    ),
    delta: float | None = typer.Option(
        None,
        "--delta",
        help="δ of the audit (default: the config's δ or 1/(100·M) if "
        "smaller); the accountant's ε is recomputed at it.",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite a previous audit in --out."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Audit a config empirically: a lower bound ε̂ per budget group and observer."""
    from pdpfl.audit import AUDIT_OUTPUTS, AuditSettings
    from pdpfl.audit.report import write_audit
    from pdpfl.cli._experiment import load_checked
    from pdpfl.runtime.outputs import OutputDirError, prepare_output_dir

    if observer not in _OBSERVERS:
        fail(f"--observer: expected third-party, server or both, got {observer!r}")
    if space not in ("auto", "model", "block"):
        fail(f"--space: expected auto, model or block, got {space!r}")
    if delta is not None and not 0 < delta < 1:
        fail(f"--delta: must be in (0, 1), got {delta}")
    config = load_checked(config_path, list(overrides or []), data_dir)
    check_key_dir()
    settings = AuditSettings(
        canaries=canaries,
        observers=_OBSERVERS[observer],
        space=space,  # type: ignore[arg-type]
        seed=seed,
        delta=delta,
    )
    session = _session(config, settings)
    out_dir = Path(out) if out is not None else Path(config.output_dir) / "audit"
    created = not out_dir.exists()
    try:
        prepare_output_dir(
            out_dir,
            overwrite=force,
            option="--out",
            flags=("--force", "--force"),
            outputs=AUDIT_OUTPUTS,
        )
    except OutputDirError as err:
        fail(str(err))
    try:
        result = session.execute(progress=not (quiet or as_json))
    except BaseException as err:
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            shutil.rmtree(out_dir, ignore_errors=True)
        if isinstance(err, KeyboardInterrupt):  # Ctrl-C, SIGTERM or SIGHUP
            from pdpfl.runtime.signals import exit_code, signal_name, signal_of

            typer.echo(
                f"\ninterrupted ({signal_name(signal_of(err))}): the audit's one training run "
                f"did not finish, so there is nothing to bound; nothing was written to {out_dir} "
                "(run the audit again)",
                err=True,
            )
            raise typer.Exit(code=exit_code(err)) from None
        raise
    record = result.to_dict()
    write_audit(record, out_dir)
    for warning in record["warnings"]:
        typer.echo(f"warning: {warning}", err=True)
    if as_json:
        print_json(record)
    else:
        from rich.console import Console

        console = Console()
        for obs in record["observers"]:
            console.print(_table(record, obs))
        typer.echo(f"audit written to {out_dir} (AUDIT.md, audit.json, audit.png)")
    if result.violations:
        typer.echo(
            "error: the audit found ε̂ above the accountant's ε (a privacy bug, or "
            f"chance with probability at most {1 - settings.confidence:.0%}):",
            err=True,
        )
        for line in result.violations:
            typer.echo(f"  {line}", err=True)
        raise typer.Exit(code=EXIT_VIOLATION)
    if result.inconclusive:
        typer.echo(
            "inconclusive (saturated): the test could not have failed in these groups "
            "(exit status 4):",
            err=True,
        )
        for line in result.inconclusive:
            typer.echo(f"  {line}", err=True)
        raise typer.Exit(code=EXIT_INCONCLUSIVE)


def register(app: typer.Typer) -> None:
    """Add ``audit`` to the main app."""
    app.command("audit")(audit_command)
