"""`pdpfl run`: train a federation from a YAML config.

Bad input (config problems, unknown methods, missing data, an output folder that cannot be
used) prints ``error: ...`` naming the field or option and exits 2 before any training.

The output rule, shared with :func:`pdpfl.runtime.simulation.run_simulation`: a folder that
already holds files is refused unless ``--force`` (pdpfl's previous outputs there are replaced)
or ``--resume`` (continue the run checkpointed there). Ctrl-C, SIGTERM and SIGHUP stop the run
keeping every finished round, and print the command that continues it (exit 128 + the signal:
130, 143, 129; :mod:`pdpfl.runtime.signals`).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from pdpfl.cli._common import check_key_dir, fail, import_plugins, print_json
from pdpfl.cli._experiment import (
    check_device,
    check_extras,
    check_simulation_engine,
    diverged,
    load_checked,
    locked,
    prepare_out,
    simulate,
)
from pdpfl.cli._process import collector_paused

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig

#: Exit code after Ctrl-C (128 + SIGINT), as shells report it; SIGTERM gives 143, SIGHUP 129
#: (:func:`pdpfl.runtime.signals.exit_code`).
EXIT_INTERRUPTED = 130
#: Exit code of a run that stopped because a file could not be written (disk full, quota):
#: not bad input (2), the finished rounds are kept and a resume continues.
EXIT_WRITE_FAILED = 1
#: Runtimes that run the pdpfl Flower apps.
FLOWER_RUNTIMES = ("flower", "flower-simulation")


def _resume_hint(
    config_path: Path,
    out_dir: Path,
    overrides: list[str],
    data_dir: str | None,
    runtime: str | None,
    plugins: list[str],
    device: str | None = None,
) -> str:
    parts = ["pdpfl", "run", str(config_path), "--out", str(out_dir), "--resume"]
    for plugin in plugins:
        parts += ["--import", plugin]
    for o in overrides:
        parts += ["--set", o]
    if data_dir is not None:
        parts += ["--data-dir", data_dir]
    if runtime is not None:
        parts += ["--runtime", runtime]
    if device is not None:
        parts += ["--device", device]
    return shlex.join(parts)


def _interrupted(out_dir: Path, rounds: int, hint: str, err: BaseException) -> None:
    from pdpfl.runtime.loop import has_checkpoint, load_checkpoint
    from pdpfl.runtime.signals import exit_code, signal_name, signal_of

    why = signal_name(signal_of(err))
    try:
        ckpt = load_checkpoint(out_dir) if has_checkpoint(out_dir) else None
    except ValueError:
        ckpt = None
    done = int(ckpt["next_round"]) if ckpt is not None else 0
    if done:
        typer.echo(
            f"\ninterrupted ({why}): {done} of {rounds} rounds are saved in {out_dir}; "
            f"continue with\n  {hint}",
            err=True,
        )
    else:
        typer.echo(
            f"\ninterrupted ({why}) before the first round finished: nothing was saved",
            err=True,
        )
    raise typer.Exit(code=exit_code(err))


def run_command(
    config_path: Path = typer.Argument(..., help="Experiment YAML (see examples/)."),
    out: Path | None = typer.Option(None, "--out", help="Output folder (default: output_dir)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in --out."),
    force: bool = typer.Option(
        False, "--force", help="Overwrite pdpfl's outputs in a folder that holds a previous run."
    ),
    overrides: list[str] | None = typer.Option(
        None, "--set", help="key=value override (dotted; 'rounds' is T). Repeatable."
    ),
    data_dir: str | None = typer.Option(None, "--data-dir", help="Folder with the dataset files."),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json instead of tables."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    runtime: str | None = typer.Option(
        None,
        "--runtime",
        help="simulation (in-process), flower (SuperLink + SuperNodes on "
        "loopback) or flower-simulation (Flower's Simulation Engine, Ray; needs "
        "pdpfl[simulation]); overrides the config.",
    ),
    plugins: list[str] | None = typer.Option(
        None,
        "--import",
        help="Python file or module to import first (e.g. one that calls "
        "@register_model). Repeatable.",
    ),
    device: str | None = typer.Option(
        None,
        "--device",
        help="Where silos train: auto, cpu, cuda, cuda:N or mps (overrides "
        "training.device; default cpu).",
    ),
    allow_over_budget: bool = typer.Option(
        False,
        "--allow-over-budget",
        help="With --resume --set rounds=N past the plan: extend even though an algorithm whose "
        "units cannot sit out takes some over their budget (refused otherwise; the summary "
        "then says budgets are exceeded).",
    ),
) -> None:
    """Train one federation (rPDP-FL or a baseline) and write metrics, summary, ledgers, plots."""
    if resume and force:
        fail("--resume and --force: choose one (continue the run, or replace it)")
    if allow_over_budget and not resume:
        fail("--allow-over-budget: only meaningful with --resume (extending a finished run)")
    extra = [
        *(overrides or []),
        *([f"runtime={runtime}"] if runtime is not None else []),
        *([f"training.device={device}"] if device is not None else []),
    ]
    with collector_paused() as paused:  # imports and parsing: no garbage worth its passes
        import_plugins(plugins)
        config = load_checked(config_path, extra, data_dir)
        if paused and config.runtime == "simulation":  # the plots are drawn in this process
            from pdpfl.runtime.plots import import_matplotlib

            import_matplotlib()
    check_device(config)
    check_key_dir()  # the first checkpoint is sealed after the first round: check it now
    out_dir = Path(out) if out is not None else Path(config.output_dir)
    if config.runtime in FLOWER_RUNTIMES:
        if config.algorithm.simulation_only:
            fail(
                f"algorithm.name: {config.algorithm.name!r} runs only in the simulator "
                "(--runtime simulation)"
            )
    check_extras(config, "--runtime" if runtime is not None else "runtime")
    if config.runtime == "flower-simulation":
        check_simulation_engine(config, "--runtime" if runtime is not None else "runtime")
    existed = out_dir.exists()
    hint = _resume_hint(
        config_path, out_dir, list(overrides or []), data_dir, runtime, list(plugins or []), device
    )
    with locked(out_dir, created=not existed):
        prepare_out(out_dir, resume=resume, force=force)
        try:
            if config.runtime in FLOWER_RUNTIMES:
                summary = _flower(
                    config,
                    out_dir,
                    resume,
                    progress=not (quiet or as_json),
                    hint=hint,
                    engine=config.runtime == "flower-simulation",
                )
            else:
                summary = simulate(
                    config,
                    out_dir,
                    resume,
                    progress=not (quiet or as_json),
                    created=not existed,
                    allow_over_budget=allow_over_budget,
                )
        except KeyboardInterrupt as err:
            _interrupted(out_dir, config.training.rounds, hint, err)
        except OSError as err:  # a full disk, a quota: the finished rounds are kept; exit 1
            from pdpfl.runtime.outputs import OutputWriteError

            text = str(err) if isinstance(err, OutputWriteError) else f"out_dir: {err}"
            typer.echo(
                f"error: --out{text.removeprefix('out_dir')}\n  once fixed, continue with\n"
                f"  {hint}",
                err=True,
            )
            raise typer.Exit(code=EXIT_WRITE_FAILED) from None
    for warning in summary.get("warnings", []):
        typer.echo(f"warning: {warning}", err=True)
    if as_json:
        print_json(summary)
    else:
        from rich.console import Console

        from pdpfl.reports.tables import run_tables

        console = Console()
        for table in run_tables(summary):
            console.print(table)
        ledgers = " and per-unit ledgers (pdpfl privacy)" if (out_dir / "ledgers").is_dir() else ""
        typer.echo(
            f"outputs written to {out_dir} (summary.json, metrics.jsonl, model{ledgers})\n"
            f"  plots: {out_dir / 'accuracy.png'}, {out_dir / 'epsilon.png'}"
        )


def _flower(
    config: ExperimentConfig,
    out_dir: Path,
    resume: bool,
    *,
    progress: bool,
    hint: str,
    engine: bool = False,
) -> dict[str, Any]:
    from pdpfl.errors import TrainingDiverged
    from pdpfl.runtime.flower import (  # lazy: flwr is optional
        FlowerInterrupted,
        FlowerRunError,
        run_flower,
    )

    try:
        if engine:
            from pdpfl.runtime.flower.simulation_engine import run_flower_simulation

            return run_flower_simulation(config, out_dir, resume, progress=progress)
        return run_flower(config, out_dir, resume, progress=progress)
    except TrainingDiverged as err:  # outputs (completed: false) are written; exit 3
        diverged(err, out_dir)
    except FlowerRunError as err:  # a runtime failure, not bad input: exit 1, no traceback
        typer.echo(
            f"error: Flower federation failed: {err} (logs in {out_dir / 'flower'})", err=True
        )
        raise typer.Exit(code=1) from err
    except FlowerInterrupted as stop:  # every Flower process is already stopped
        from pdpfl.runtime.signals import exit_code, signal_name, signal_of

        typer.echo(
            f"\ninterrupted ({signal_name(signal_of(stop))}) after {stop.rounds_done} "
            f"round(s); every Flower process was stopped. Resume with:\n  {hint}",
            err=True,
        )
        raise typer.Exit(code=exit_code(stop)) from None


def register(app: typer.Typer) -> None:
    """Add ``run`` to the main app."""
    app.command("run")(run_command)
