"""Helpers shared by the CLI commands: uniform error reporting and JSON output."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer

#: Exit code for invalid user input (same as Click's usage errors).
EXIT_BAD_INPUT = 2


def fail(message: str) -> NoReturn:
    """Print ``message`` to stderr and exit with code 2 (bad input)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=EXIT_BAD_INPUT)


def print_json(obj: Any) -> None:
    """Print one JSON object on stdout (NaN/inf are rejected so output stays strict JSON)."""
    sys.stdout.write(json.dumps(obj, allow_nan=False, default=_default) + "\n")


def _default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
