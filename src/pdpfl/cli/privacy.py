"""`pdpfl privacy RUN_DIR`: what each person spent, by id, against every observer.

Reads the ledgers a run wrote (``RUN_DIR/ledgers/*.npz``; a Flower silo's state folder holds
its own ``ledger-silo-<i>.npz``), prints the per-budget-group table in the run's unit and
writes ``privacy.csv`` (one row per unit: id, unit, budget, ε spent per observer, rounds
charged, stopped, excluded). ``--id X`` answers for one person.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import typer

from pdpfl.cli._common import fail, print_json

__all__ = ["privacy_command", "register"]


def _csv_text(table: dict[str, np.ndarray]) -> str:
    from pdpfl.ledger.table import COLUMNS

    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(COLUMNS)
    n = len(table["id"])
    for i in range(n):
        row = []
        for c in COLUMNS:
            v = table[c][i]
            if isinstance(v, np.floating | float):
                row.append("" if np.isnan(v) else repr(float(v)))
            elif isinstance(v, np.bool_ | bool):
                row.append("true" if v else "false")
            else:
                row.append(str(v.item() if isinstance(v, np.generic) else v))
        writer.writerow(row)
    return buf.getvalue()


def _rows(table: dict[str, np.ndarray]) -> list[dict[str, object]]:
    out = []
    for i in range(len(table["id"])):
        row: dict[str, object] = {}
        for c, v in table.items():
            x = v[i].item() if isinstance(v[i], np.generic) else v[i]
            row[c] = None if isinstance(x, float) and not np.isfinite(x) else x
        out.append(row)
    return out


def privacy_command(
    run_dir: Path = typer.Argument(..., help="A run's output folder, or a silo's state folder."),
    unit_id: str | None = typer.Option(None, "--id", help="Answer for one person (unit id)."),
    out: Path | None = typer.Option(
        None, "--out", help="Where to write the per-unit table (default RUN_DIR/privacy.csv)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Each person's ε spent (per observer) against their budget, from a run's ledgers."""
    from pdpfl.io import write_text
    from pdpfl.ledger.table import merged_summary, privacy_table, select_id
    from pdpfl.runtime.outputs import holder_names, with_silo_names

    if not run_dir.exists():
        fail(f"RUN_DIR: {run_dir} does not exist")
    try:
        table = privacy_table(run_dir)
        summary = merged_summary(run_dir)
    except ValueError as err:
        fail(f"RUN_DIR: {err}")
    stems = table["holder"].copy()
    table = with_silo_names(table, holder_names(run_dir if run_dir.is_dir() else run_dir.parent))
    if unit_id is not None:
        chosen = select_id(table, unit_id)
        if not len(chosen["id"]) and summary.unit == "client":
            # a client is a silo: its ledger file's name (client_<i>) also answers
            chosen = {c: v[stems == str(unit_id)] for c, v in table.items()}
        rows = _rows(chosen)
        if not rows:
            fail(
                f"--id: no {summary.unit} with id {unit_id!r} in {run_dir} "
                f"({len(table['id'])} {summary.unit}s; ids are in privacy.csv)"
            )
        if as_json:
            print_json({"id": unit_id, "rows": rows})
            return
        for row in rows:
            typer.echo(_describe(row, summary.observers))
        return
    target = (
        out
        if out is not None
        else (run_dir if run_dir.is_dir() else run_dir.parent) / "privacy.csv"
    )
    try:
        write_text(target, _csv_text(table))
    except OSError as err:
        fail(f"--out: cannot write {target} ({err.strerror or err})")
    if as_json:
        print_json({"summary": summary.to_dict(), "csv": str(target)})
        return
    from rich.console import Console

    from pdpfl.cli.report import group_table, plural

    Console().print(
        group_table(
            summary, f"ε spent vs budget, per budget group ({summary.units} {plural(summary.unit)})"
        )
    )
    typer.echo(f"per-{summary.unit} table written to {target}")


def _describe(row: dict[str, object], observers: tuple[str, ...]) -> str:
    """One unit's answer: budget, rate, σ, and ε spent against each observer its ledger
    accounts for (a client-level ledger accounts for third parties only)."""

    def num(x: object) -> str:
        return "-" if x is None else f"{float(x):.4g}"  # type: ignore[arg-type]

    holder = "" if row["holder"] == row["id"] else f" (held by {row['holder']})"
    lines = [
        f"{row['unit']} {row['id']}{holder}: budget ε = {num(row['budget'])}, "
        f"sampling rate {num(row['rate'])}, noise multiplier {num(row['noise_multiplier'])}"
    ]
    for obs, label in (("third-party", "third party:"), ("server", "server:     ")):
        if obs in observers:
            tag = obs.replace("-", "_")
            lines.append(
                f"  {label} ε spent {num(row[f'epsilon_{tag}'])} over "
                f"{row[f'rounds_{tag}']} charged round(s)"
            )
    if row["excluded"]:
        lines.append("  excluded: never sampled (budget below the smallest achievable ε)")
    elif row["stopped"]:
        lines.append("  stopped: sat out rounds so as not to exceed the budget")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add ``privacy`` to the main app."""
    app.command("privacy")(privacy_command)
