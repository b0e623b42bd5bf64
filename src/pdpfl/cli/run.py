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

import contextlib
import shlex
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from pdpfl.cli._common import check_key_dir, fail, import_plugins, print_json
from pdpfl.cli._process import collector_paused

#: Exit code after Ctrl-C (128 + SIGINT), as shells report it; SIGTERM gives 143, SIGHUP 129
#: (:func:`pdpfl.runtime.signals.exit_code`).
EXIT_INTERRUPTED = 130
#: Exit code of a run whose training diverged (non-finite model, update or loss).
EXIT_DIVERGED = 3
#: Exit code of a run that stopped because a file could not be written (disk full, quota):
#: not bad input (2), the finished rounds are kept and a resume continues.
EXIT_WRITE_FAILED = 1
#: Runtimes that run the pdpfl Flower apps.
FLOWER_RUNTIMES = ("flower", "flower-simulation")


def _load(config_path: Path, overrides: list[str] | None, data_dir: str | None):
    from pdpfl.config import ConfigError, load_config

    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        what = "is not a folder" if Path(data_dir).expanduser().exists() else "does not exist"
        fail(f"--data-dir: {data_dir} {what} (give the folder that holds the dataset files)")
    try:
        config = load_config(config_path, overrides or [], data_dir=data_dir)
    except ConfigError as err:
        fail("\n".join(err.problems) if len(err.problems) > 1 else err.problems[0])
    check_extras(config)
    return config


def check_extras(config: Any, runtime_field: str | None = None) -> None:
    """Exit 2 naming the field and the extra (``pip install 'pdpfl[EXTRA]'``) when the config
    chose a feature whose optional extra is not installed -- before any output is written
    (``runtime_field``: check ``runtime: flower`` too; flower-simulation is checked by
    :func:`check_simulation_engine`)."""
    from pdpfl.errors import MissingExtra, require_extra

    try:
        if config.privacy.accountant == "pld":
            require_extra("dp_accounting", "privacy.accountant", "accountant: pld")
        if runtime_field is not None and config.runtime == "flower":
            require_extra("flwr", runtime_field, "runtime flower")
    except MissingExtra as err:
        fail(str(err))


def check_device(config: Any) -> None:
    """Exit 2 (``error: training.device: ...``) when the configured device is not here."""
    if config.training.device == "cpu":
        return
    from pdpfl.fl.common import training_device

    try:
        training_device(config)
    except ValueError as err:
        fail(str(err))


def _load_federation(config: Any) -> Any:
    from pdpfl.runtime.simulation import load_federation_for

    try:
        return load_federation_for(config)
    except (ValueError, FileNotFoundError, KeyError, TypeError) as err:
        fail(f"data: {err}")


@contextlib.contextmanager
def locked(out_dir: Path, *, created: bool, option: str = "--out") -> Iterator[None]:
    """Hold ``out_dir``'s exclusive lock (one run per folder), or exit 2 naming its holder."""
    from pdpfl.runtime.lock import FolderLocked, folder_lock

    if out_dir.exists() and not out_dir.is_dir():
        fail(f"{option}: {out_dir} exists and is not a folder")
    lock_file = out_dir / ".pdpfl.lock"
    had_lock = lock_file.exists()
    lock = folder_lock(out_dir, option=option)
    try:
        lock.__enter__()
    except FolderLocked as err:
        fail(str(err))
    except OSError as err:
        fail(f"{option}: cannot write to {out_dir} ({err.strerror or err}); choose another folder")
    try:
        yield
    finally:
        if (
            not created
            and not had_lock
            and not any(
                (out_dir / name).exists()
                for name in (
                    "metrics.jsonl",
                    "summary.json",
                    "checkpoint.npz",
                    "compare.csv",
                    "audit.json",
                )
            )
        ):
            # a refused command leaves no trace in a folder it did not create (the lock file
            # is removed while still held: a process that opened it meanwhile is refused)
            lock_file.unlink(missing_ok=True)
        lock.__exit__(None, None, None)
        if (
            created
            and out_dir.is_dir()
            and not any(p.name != ".pdpfl.lock" for p in out_dir.iterdir())
        ):
            shutil.rmtree(out_dir, ignore_errors=True)  # nothing of ours was written


def _prepare_out(out_dir: Path, *, resume: bool, force: bool, **kwargs: Any) -> None:
    """Validate (and create) an output folder, or exit 2 naming ``--out`` and the remedy."""
    from pdpfl.runtime.outputs import OutputDirError, prepare_output_dir

    try:
        prepare_output_dir(
            out_dir,
            resume=resume,
            overwrite=force,
            option="--out",
            flags=("--force", "--resume"),
            **kwargs,
        )
    except OutputDirError as err:
        fail(str(err))


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
        config = _load(config_path, extra, data_dir)
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
        _prepare_out(out_dir, resume=resume, force=force)
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
                summary = _simulate(
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


def check_simulation_engine(config: Any, option: str) -> None:
    """Exit 2 when Flower's Simulation Engine is not installed here (``pdpfl[simulation]``) or
    cannot run ``config`` (a protocol that keeps secrets in a silo's memory between stages)."""
    import importlib.util

    if importlib.util.find_spec("flwr") is None or importlib.util.find_spec("ray") is None:
        fail(
            f"{option}: flower-simulation needs the simulation extra: "
            "pip install 'pdpfl[simulation]'"
        )
    from pdpfl.runtime.flower.simulation_engine import check_simulation

    try:
        check_simulation(config)
    except ValueError as err:
        fail(str(err))


def _flower(
    config: Any, out_dir: Path, resume: bool, *, progress: bool, hint: str, engine: bool = False
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
        typer.echo(
            f"error: {err}\n  every finished round and every ledger charge is kept in "
            f"{out_dir} (summary.json says completed: false)",
            err=True,
        )
        raise typer.Exit(code=EXIT_DIVERGED) from None
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


def _simulate(
    config: Any,
    out_dir: Path,
    resume: bool,
    *,
    progress: bool,
    federation: Any = None,
    created: bool = False,
    allow_over_budget: bool = False,
) -> dict[str, Any]:
    """Run the simulator into an output folder already checked by :func:`_prepare_out`;
    configuration problems found while building exit 2, leaving nothing behind in a folder
    this command created."""
    from pdpfl.errors import TrainingDiverged
    from pdpfl.runtime.simulation import SetupWarning, simulate_into

    try:
        if federation is None:
            federation = _load_federation(config)
        with warnings.catch_warnings():
            # printed once from the summary at the end
            warnings.simplefilter("ignore", SetupWarning)
            return simulate_into(
                config,
                out_dir,
                resume,
                progress=progress,
                federation=federation,
                allow_over_budget=allow_over_budget,
            )
    except TrainingDiverged as err:  # outputs (completed: false) are written; exit 3
        typer.echo(
            f"error: {err}\n  every finished round and every ledger charge is kept in "
            f"{out_dir} (summary.json says completed: false)",
            err=True,
        )
        raise typer.Exit(code=EXIT_DIVERGED) from None
    except ValueError as err:
        _discard(out_dir, created)
        fail(str(err))
    except typer.Exit:
        _discard(out_dir, created)
        raise


def _discard(out_dir: Path, created: bool) -> None:
    """Remove a folder this command created when no round was written into it."""
    if created and out_dir.exists() and not (out_dir / "metrics.jsonl").exists():
        shutil.rmtree(out_dir, ignore_errors=True)


def register(app: typer.Typer) -> None:
    """Add ``run`` to the main app."""
    app.command("run")(run_command)
