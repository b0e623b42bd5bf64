"""What the commands that run an experiment share (``run``, ``compare``, ``tune``, ``audit``):
load and check the config, load the federation, hold and prepare the output folder, run the
simulator into it; each problem exits 2 naming its field or option (``error: ...``)."""

from __future__ import annotations

import contextlib
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from pdpfl.cli._common import fail

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig
    from pdpfl.data.federation import Federation

__all__ = [
    "EXIT_DIVERGED",
    "check_device",
    "check_extras",
    "check_simulation_engine",
    "load_checked",
    "diverged",
    "load_federation",
    "locked",
    "prepare_out",
    "simulate",
]

#: Exit code of a run whose training diverged (non-finite model, update or loss).
EXIT_DIVERGED = 3


def load_checked(
    config_path: Path, overrides: list[str] | None, data_dir: str | None
) -> ExperimentConfig:
    """The validated config (``--data-dir`` checked; extras checked), or exit 2 naming the
    field."""
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


def check_extras(config: ExperimentConfig, runtime_field: str | None = None) -> None:
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


def check_device(config: ExperimentConfig) -> None:
    """Exit 2 (``error: training.device: ...``) when the configured device is not here."""
    if config.training.device == "cpu":
        return
    from pdpfl.dp.device import training_device_for

    try:
        training_device_for(config.training.device)  # the setting, not the whole config
    except ValueError as err:
        fail(str(err))


def load_federation(config: ExperimentConfig) -> Federation:
    """The config's federation, or exit 2 (``error: data: ...``)."""
    from pdpfl.runtime.simulation import load_federation_for

    try:
        return load_federation_for(config)
    except (ValueError, FileNotFoundError, KeyError, TypeError) as err:
        fail(f"data: {err}")


@contextlib.contextmanager
def locked(out_dir: Path, *, created: bool, option: str = "--out") -> Iterator[None]:
    """Hold ``out_dir``'s exclusive lock (:func:`pdpfl.runtime.lock.output_folder`: one run per
    folder, no trace of a command that wrote nothing), or exit 2 naming its holder."""
    from pdpfl.runtime.lock import output_folder

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(output_folder(out_dir, created=created, option=option))
        except ValueError as err:  # not a folder; FolderLocked
            fail(str(err))
        except OSError as err:
            fail(
                f"{option}: cannot write to {out_dir} ({err.strerror or err}); choose another "
                "folder"
            )
        yield


def prepare_out(
    out_dir: Path, *, resume: bool, force: bool, outputs: tuple[str, ...] | None = None
) -> None:
    """Validate (and create) an output folder, or exit 2 naming ``--out`` and the remedy."""
    from pdpfl.runtime.outputs import RUN_OUTPUTS, OutputDirError, prepare_output_dir

    try:
        prepare_output_dir(
            out_dir,
            resume=resume,
            overwrite=force,
            option="--out",
            flags=("--force", "--resume"),
            outputs=RUN_OUTPUTS if outputs is None else outputs,
        )
    except OutputDirError as err:
        fail(str(err))


def check_simulation_engine(config: ExperimentConfig, option: str) -> None:
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


def simulate(
    config: ExperimentConfig,
    out_dir: Path,
    resume: bool,
    *,
    progress: bool,
    federation: Federation | None = None,
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
            federation = load_federation(config)
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
        diverged(err, out_dir)
    except ValueError as err:
        discard_new(out_dir, created)
        fail(str(err))
    except typer.Exit:
        discard_new(out_dir, created)
        raise


def diverged(err: Exception, out_dir: Path) -> NoReturn:
    """A diverged run (any runtime): its outputs say ``completed: false``; exit 3."""
    typer.echo(
        f"error: {err}\n  every finished round and every ledger charge is kept in "
        f"{out_dir} (summary.json says completed: false)",
        err=True,
    )
    raise typer.Exit(code=EXIT_DIVERGED) from None


def discard_new(out_dir: Path, created: bool) -> None:
    """Remove a folder this command created when no round was written into it."""
    if created and out_dir.exists() and not (out_dir / "metrics.jsonl").exists():
        shutil.rmtree(out_dir, ignore_errors=True)
