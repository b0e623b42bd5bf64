"""`pdpfl tune CONFIG --grid key=v1,v2 ...`: private hyper-parameter search, accounted.

A random number of trials (Papernot & Steinke, ICLR 2022: Poisson or truncated negative
binomial), each a real run of a candidate drawn from the grid; only the best is released, and
every unit's ε for the whole search is computed per observer before any trial runs
(:mod:`pdpfl.tune`). A search some unit's budget cannot pay for is refused (exit 2, nothing
trained). ``--plan`` prints the search's ε without training.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import typer

from pdpfl.cli._common import fail, import_plugins, multi_value_command, print_json

if TYPE_CHECKING:
    from pdpfl.data.federation import Federation
    from pdpfl.ledger import PrivacySummary

__all__ = ["register", "tune_command"]


class _SearchOptions(TypedDict):
    """The options ``plan_search`` and ``tune`` share."""

    distribution: str
    expected_trials: float | None
    eta: float
    max_trials: int | None
    trial_budget_fraction: float
    federation: Federation


def _epsilon_rows(summary: PrivacySummary) -> list[str]:
    lines: list[str] = []
    for g in summary.groups:
        spent = ", ".join(f"{g.spent_max[o]:.4g} ({o})" for o in summary.observers)
        over = sum(g.over_budget.values())
        lines.append(
            f"  budget {g.label:>8}: {g.units:>6} {summary.unit}s, search ε ≤ {spent}"
            + (f", {over} over budget" if over else "")
        )
    return lines


def tune_command(
    config_path: Path = typer.Argument(..., help="Experiment YAML (see examples/)."),
    grid: list[str] = typer.Option(
        ..., "--grid", help="key=v1,v2,... (several allowed): the candidates' values."
    ),
    out: Path = typer.Option(Path("runs/tune"), "--out", help="Output folder."),
    distribution: str = typer.Option(
        "poisson", "--distribution", help="Number of trials: poisson (Thm 3) or tnb (Thm 2)."
    ),
    expected_trials: float | None = typer.Option(
        None, "--expected-trials", help="E[K] (default: the number of candidates, at least 2)."
    ),
    eta: float = typer.Option(0.0, "--eta", help="η of the truncated negative binomial (> -1)."),
    max_trials: int | None = typer.Option(
        None, "--max-trials", help="Stop after this many trials (default: δ-negligible tail)."
    ),
    fraction: float = typer.Option(
        1.0,
        "--trial-budget-fraction",
        help="Calibrate each trial for this part of every budget (rPDP-FL family, IDP-FedAvg).",
    ),
    plan_only: bool = typer.Option(
        False, "--plan", help="Print the search's ε per budget group; train nothing."
    ),
    force: bool = typer.Option(False, "--force", help="Replace a previous search in --out."),
    overrides: list[str] | None = typer.Option(None, "--set", help="key=value override."),
    data_dir: str | None = typer.Option(None, "--data-dir", help="Folder with the dataset files."),
    as_json: bool = typer.Option(False, "--json", help="Print result.json on stdout."),
    plugins: list[str] | None = typer.Option(
        None, "--import", help="Python file or module to import first. Repeatable."
    ),
) -> None:
    """Private random search over --grid; releases the best trial with the search's total ε."""
    from pdpfl.cli._experiment import load_checked, load_federation
    from pdpfl.runtime.outputs import OutputDirError
    from pdpfl.tune import TuneRefused, parse_grid, plan_search, tune

    import_plugins(plugins)
    if distribution not in ("poisson", "tnb"):
        fail(f"--distribution: expected poisson or tnb, got {distribution!r}")
    if expected_trials is not None and not (
        expected_trials > (0 if distribution == "poisson" else 1)
    ):
        fail("--expected-trials: must be > 0 (poisson) or > 1 (tnb)")
    if not eta > -1:
        fail(f"--eta: must be > -1, got {eta}")
    if max_trials is not None and max_trials < 1:
        fail(f"--max-trials: must be >= 1, got {max_trials}")
    if not 0 < fraction <= 1:
        fail(f"--trial-budget-fraction: must be in (0, 1], got {fraction}")
    try:
        parsed = parse_grid(grid)
    except ValueError as err:
        fail(str(err))
    config = load_checked(config_path, overrides, data_dir)
    federation = load_federation(config)
    options = _SearchOptions(
        distribution=distribution,
        expected_trials=expected_trials,
        eta=eta,
        max_trials=max_trials,
        trial_budget_fraction=fraction,
        federation=federation,
    )
    try:
        if plan_only:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="pdpfl-tune-") as tmp:
                plan = plan_search(config, parsed, work_dir=tmp, **options)
            summary = plan.cost.summary()
            if as_json:
                print_json({"privacy": summary.to_dict(), "refused": plan.refused})
                return
            typer.echo(
                f"{len(plan.candidates)} candidate(s), E[K] = {plan.distribution.mean:.3g}, "
                f"at most {plan.cost.cap} trials"
            )
            typer.echo("\n".join(_epsilon_rows(summary)))
            if plan.refused:
                fail(plan.refusal())
            return
        result = tune(
            config,
            parsed,
            out,
            overwrite=force,
            log_fn=lambda msg: typer.echo(msg, err=True),
            **options,
        )
    except TuneRefused as err:
        fail(str(err))
    except OutputDirError as err:
        fail(str(err))
    except ValueError as err:
        text = str(err)
        fail(text if ":" in text.split(" ", 1)[0] else f"--grid: {text}")
    if as_json:
        print_json(result.to_dict())
        return
    if result.selected is None:
        typer.echo("no trial ran (K = 0) or every trial diverged: nothing is released")
    else:
        typer.echo(
            f"selected: {' '.join(result.selected)} (final accuracy {result.accuracy:.4f}); "
            f"model: {Path(result.out) / str(result.run_dir)}"
        )
    typer.echo("whole search, every trial included:")
    typer.echo("\n".join(_epsilon_rows(result.privacy)))
    typer.echo(f"outputs: {Path(result.out) / 'result.json'}")


def register(app: typer.Typer) -> None:
    """Add ``tune`` to the main app."""
    app.command("tune", cls=multi_value_command("--grid"))(tune_command)
