"""`pdpfl calibrate` commands (registered on the main app)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to app (filled in by the owning feature)."""
