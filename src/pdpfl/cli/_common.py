"""Helpers shared by the CLI commands: uniform error reporting and JSON output."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click
import typer

if TYPE_CHECKING:
    from pdpfl.privacy.plan import TrainingPlan
    from pdpfl.privacy.unit import PrivacyUnit, SampledGaussianPlan

#: Exit code for invalid user input (same as Click's usage errors).
EXIT_BAD_INPUT = 2


def fail(message: str) -> NoReturn:
    """Print ``message`` to stderr and exit with code 2 (bad input)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=EXIT_BAD_INPUT)


def print_json(obj: object) -> None:
    """Print one JSON object on stdout (NaN/inf are rejected so output stays strict JSON)."""
    sys.stdout.write(json.dumps(obj, allow_nan=False, default=_default) + "\n")


def _default(obj: object) -> object:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def expand_multi_value(args: list[str], options: tuple[str, ...]) -> list[str]:
    """Rewrite ``--q 0.1 0.2`` as ``--q 0.1 --q 0.2`` for the given multi-value options.

    Click options take one value per occurrence; the CLI reference promises the familiar
    ``--opt V [V ...]`` form, so the values following such an option (up to the next token that
    starts with ``--``) are each given their own occurrence.
    """
    out: list[str] = []
    current: str | None = None
    for tok in args:
        if tok.startswith("--"):
            name = tok.split("=", 1)[0]
            current = name if name in options and "=" not in tok else None
            out.append(tok)
        elif current is not None and out[-1] != current:
            out.extend([current, tok])
        else:
            out.append(tok)
    return out


def multi_value_command(*options: str) -> type:
    """A Typer command class whose ``options`` accept ``--opt V [V ...]``."""
    from typer.core import TyperCommand

    class _MultiValueCommand(TyperCommand):
        def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
            return super().parse_args(ctx, expand_multi_value(list(args), options))

    return _MultiValueCommand


#: TrainingPlan field → the CLI option that sets it (for error messages).
_PLAN_OPTIONS = {
    "noise_multiplier": "--sigma",
    "delta": "--delta",
    "steps": "--steps",
    "rounds": "--rounds",
    "client_rate": "--client-rate",
    "noise": "--central-noise",
}


def plan_from_options(
    *,
    sigma: float,
    delta: float,
    steps: int,
    rounds: int | None,
    client_rate: float,
    noise: str = "continuous",
) -> TrainingPlan:
    """Build the :class:`~pdpfl.privacy.plan.TrainingPlan` from CLI options.

    The plan validates itself; its error (which names the field) is re-worded with the CLI
    option's name and exits with code 2, so every command reports bad plans the same way.
    """
    from pdpfl.privacy.plan import TrainingPlan

    try:
        return TrainingPlan(
            noise_multiplier=sigma,
            delta=delta,
            steps=steps,
            rounds=rounds,
            client_rate=client_rate,
            noise=noise,  # type: ignore[arg-type]
        )
    except ValueError as exc:
        field, _, rest = str(exc).partition(":")
        fail(f"{_PLAN_OPTIONS.get(field, field)}:{rest}")


def unit_plan_from_options(
    unit: PrivacyUnit, *, sigma: float, delta: float, rounds: int
) -> SampledGaussianPlan:
    """The client/user-level :class:`~pdpfl.privacy.unit.SampledGaussianPlan` from CLI options;
    its error is re-worded with the option's name (exit 2), as :func:`plan_from_options`."""
    from pdpfl.privacy.unit import SampledGaussianPlan

    try:
        return SampledGaussianPlan(unit, sigma, delta, rounds)
    except ValueError as exc:
        field, _, rest = str(exc).partition(":")
        fail(f"{_PLAN_OPTIONS.get(field, field)}:{rest}")


def parse_unit_and_accountant(unit: str, accountant: str) -> tuple[PrivacyUnit, str]:
    """``--unit`` and ``--accountant`` validated (exit 2 naming the option)."""
    from pdpfl.privacy.accountant import as_accountant_name
    from pdpfl.privacy.unit import as_unit

    try:
        unit_ = as_unit(unit)
    except ValueError:
        fail(f"--unit: expected record, client or user, got {unit!r}")
    try:
        acc = as_accountant_name(accountant)
    except ValueError:
        fail(f"--accountant: expected rdp or pld, got {accountant!r}")
    if acc == "pld":
        from pdpfl.errors import MissingExtra, require_extra

        try:
            require_extra("dp_accounting", "--accountant", "pld")
        except MissingExtra as err:
            fail(str(err))
    return unit_, acc


def import_plugins(specs: list[str] | None, option: str = "--import") -> None:
    """Import user modules (``my_models.py`` or ``package.module``) before a config is loaded,
    so that their ``@register_model`` / ``register_algorithm`` calls take effect."""
    import importlib
    import importlib.util

    for spec in specs or []:
        try:
            path = Path(spec)
            if spec.endswith(".py"):
                if not path.is_file():
                    fail(f"{option}: {spec} does not exist")
                name = f"pdpfl_plugin_{path.stem}"
                module_spec = importlib.util.spec_from_file_location(name, path)
                assert module_spec is not None and module_spec.loader is not None
                module = importlib.util.module_from_spec(module_spec)
                sys.modules[name] = module
                module_spec.loader.exec_module(module)
            else:
                importlib.import_module(spec)
        except typer.Exit:
            raise
        except Exception as err:  # noqa: BLE001 - any error in the user's module is bad input
            fail(f"{option}: importing {spec} failed: {type(err).__name__}: {err}")


def check_writable(path: str | Path, option: str) -> None:
    """Exit 2 naming ``option`` unless a file can be created at ``path`` (checked before any
    work, so a bad output path never costs a computation or leaves a partial file)."""
    import os

    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.exists() and p.is_dir():
        fail(f"{option}: {p} is a folder; give a file path")
    probe = parent
    while not probe.exists():  # the nearest existing ancestor must be a writable folder
        probe = probe.parent
    if not probe.is_dir():
        fail(f"{option}: cannot write {p} ({probe} is not a folder)")
    if not os.access(probe, os.W_OK):
        fail(f"{option}: cannot write {p} ({probe} is not writable)")


def check_key_dir(party: str = "operator") -> None:
    """Exit 2 naming ``PDPFL_KEY_DIR`` before any work when this machine's sealing keys cannot
    be kept there (a file where the folder should be, no write permission): a run seals its
    first checkpoint after its first round."""
    from pdpfl.runtime.preflight import check_key_dir as check

    try:
        check(party)
    except ValueError as err:
        fail(str(err))
