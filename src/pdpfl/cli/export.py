"""`pdpfl export RUN_DIR`: the trained model as a file other tools load.

``--format safetensors`` (default) copies the run's named ``state_dict`` with its header (the
run's facts: config hash, ε summary, pdpfl version); ``--format torch`` writes a ``.pt``
``state_dict`` for ``torch.load(..., weights_only=True)``. pdpfl itself never loads pickles.

The run folder is verified first (issue #34): the model's seal (its tensors and header, ε
included, are the run's, at the round its checkpoint records) and the run's ledgers
(:func:`pdpfl.ledger.runfolder.open_run`); a model or ledger that does not verify is refused
(exit 2, the file named), and a folder that names no run is exported with a line saying so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from pdpfl.cli._common import fail

__all__ = ["export_command", "register"]


def export_command(
    run_dir: Path = typer.Argument(..., help="A run's output folder."),
    fmt: str = typer.Option("safetensors", "--format", help="safetensors or torch."),
    out: Path | None = typer.Option(None, "--out", help="Output file (default beside the run)."),
    round_: int | None = typer.Option(
        None, "--round", min=1, help="A round's model (runs with save_models: every-round)."
    ),
) -> None:
    """Export a run's global model (named state_dict) as safetensors or torch."""
    from pdpfl.io import write_bytes
    from pdpfl.runtime.model_file import MODEL_NAME, write_model

    if fmt not in ("safetensors", "torch"):
        fail(f"--format: expected safetensors or torch, got {fmt!r}")
    name = MODEL_NAME if round_ is None else f"models/round-{round_:04d}.safetensors"
    source = run_dir / name
    if not source.is_file():
        fail(
            f"RUN_DIR: no {name} in {run_dir}"
            + (" (was the run made with save_models: every-round?)" if round_ else "")
        )
    tensors, metadata, note = _verified(run_dir, source, final=round_ is None)
    suffix = ".safetensors" if fmt == "safetensors" else ".pt"
    stem = "model" if round_ is None else f"model-round-{round_:04d}"
    target = out if out is not None else run_dir / f"{stem}-export{suffix}"
    try:
        if fmt == "safetensors":
            write_model(target, list(tensors.values()), list(tensors), metadata)
        else:
            import io

            import torch

            buf = io.BytesIO()
            torch.save({k: torch.as_tensor(v) for k, v in tensors.items()}, buf)
            write_bytes(target, buf.getvalue())
    except OSError as err:
        fail(f"--out: cannot write {target} ({err.strerror or err})")
    typer.echo(note)
    typer.echo(f"{len(tensors)} parameters written to {target} ({fmt})")


def _verified(
    run_dir: Path, source: Path, *, final: bool
) -> tuple[dict[str, Any], dict[str, str], str]:
    """The model, verified with its run (module docstring); exit 2 naming the file otherwise."""
    import warnings

    from pdpfl.ledger.runfolder import UnverifiedRunWarning, open_run
    from pdpfl.runtime.model_file import verified_model

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnverifiedRunWarning)  # the note is printed
            tensors, metadata, note = verified_model(source, final=final)
            if (run_dir / "ledgers").is_dir():
                check = open_run(run_dir)
                note = f"{note}; ledgers {check.note}"
    except ValueError as err:
        fail(f"RUN_DIR: {err}")
    return tensors, metadata, note


def register(app: typer.Typer) -> None:
    """Add ``export`` to the main app."""
    app.command("export")(export_command)
