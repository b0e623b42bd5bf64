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


def _round_files(run_dir: Path) -> list[int]:
    """The rounds whose model a run kept (``models/round-NNNN.safetensors``), sorted."""
    import re

    folder = run_dir / "models"
    if not folder.is_dir():
        return []
    found = (re.fullmatch(r"round-(\d+)\.safetensors", p.name) for p in folder.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def _rounds_of(run_dir: Path) -> int | None:
    """Rounds the run completed (``summary.json``, else ``metrics.jsonl``); None if unknown."""
    import json

    try:
        return int(json.loads((run_dir / "summary.json").read_text())["rounds_completed"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from pdpfl.checkpoint import read_metrics

    try:
        return len(read_metrics(run_dir)) or None
    except (OSError, ValueError):
        return None


def _check_round(run_dir: Path, round_: int) -> None:
    """Exit 2 naming ``--round`` when the run kept no model for that round."""
    kept = _round_files(run_dir)
    if round_ in kept:
        return
    done = _rounds_of(run_dir)
    ran = f"the run has {done} round(s)" if done is not None else "the run's round count is unknown"
    if not kept:
        fail(
            f"--round: {run_dir} kept no per-round models ({ran}; only the final model, "
            "model.safetensors, without --round): per-round models need save_models: "
            "every-round in the config"
        )
    span = f"{kept[0]}" if len(kept) == 1 else f"{kept[0]} to {kept[-1]}"
    fail(f"--round: {ran}, with models for rounds {span}; got {round_}")


def export_command(
    run_dir: Path = typer.Argument(..., help="A run's output folder."),
    fmt: str = typer.Option("safetensors", "--format", help="safetensors or torch."),
    out: Path | None = typer.Option(None, "--out", help="Output file (default beside the run)."),
    round_: int | None = typer.Option(
        None, "--round", min=1, help="A round's model (runs with save_models: every-round)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Export a run's global model (named state_dict) as safetensors or torch."""
    from pdpfl.cli._common import check_writable
    from pdpfl.io import write_bytes
    from pdpfl.runtime.model_file import MODEL_NAME, write_model

    if fmt not in ("safetensors", "torch"):
        fail(f"--format: expected safetensors or torch, got {fmt!r}")
    if not run_dir.is_dir():
        what = "is not a folder" if run_dir.exists() else "does not exist"
        fail(f"RUN_DIR: {run_dir} {what} (give a run's output folder)")
    if round_ is not None:
        _check_round(run_dir, round_)
    name = MODEL_NAME if round_ is None else f"models/round-{round_:04d}.safetensors"
    source = run_dir / name
    if not source.is_file():
        fail(
            f"RUN_DIR: no {name} in {run_dir}"
            + (
                " (was the run made with save_models: every-round?)"
                if round_
                else " (a finished pdpfl run writes it)"
            )
        )
    suffix = ".safetensors" if fmt == "safetensors" else ".pt"
    stem = "model" if round_ is None else f"model-round-{round_:04d}"
    target = out if out is not None else run_dir / f"{stem}-export{suffix}"
    option = "--out" if out is not None else "RUN_DIR"
    if target.exists() and not target.is_dir():
        if (
            target.resolve() == source.resolve()
            or target.resolve().parent == (run_dir / "models").resolve()
        ):
            fail(f"{option}: {target} is the run's own model file; give another file")
        if not force:
            fail(f"{option}: {target} already exists; pass --force to overwrite it")
    check_writable(target, "--out")
    tensors, metadata, note = _verified(run_dir, source, final=round_ is None)
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
