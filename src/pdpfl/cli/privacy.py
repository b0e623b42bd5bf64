"""`pdpfl privacy RUN_DIR` / `pdpfl privacy --store STORE`: what each person spent, by id.

``RUN_DIR``: reads the ledgers a run wrote (``RUN_DIR/ledgers/*.npz``; a Flower silo's state
folder holds its own ``ledger-silo-<i>.npz``), prints the per-budget-group table in the run's
unit and writes ``privacy.csv`` (one row per unit: id, unit, budget, ε spent per observer,
rounds charged, stopped, excluded), and prints each group's attack-risk card (the largest TPR
any membership attack reaches at FPR 0.1 / 1 / 10 %: :mod:`pdpfl.ledger.risk`). ``--id X``
answers for one person, their own card included; ``--receipt FILE`` writes that person a signed
privacy receipt (:mod:`pdpfl.ledger.receipts`). Every ledger is verified against the run first
(:func:`pdpfl.ledger.runfolder.open_run`: an unsealed, foreign or stale ledger is refused, exit
2, naming the file) and every report says what was verified.

``--store STORE``: a person's budget for life -- every run that ever charged the budget stores
under ``STORE`` (:mod:`pdpfl.ledger.lifetime`): the runs, and per budget group the lifetime ε
per observer (all runs composed), the units over budget and what remains; ``--out FILE``
writes one row per unit, ``--id X`` answers for one person with the runs that charged them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import typer

from pdpfl.cli._common import fail, print_json
from pdpfl.reports.privacy import (
    describe_lifetime,
    describe_unit,
    ledger_csv,
    store_csv,
    store_groups,
    store_table,
    table_rows,
    unit_risk_cards,
)

if TYPE_CHECKING:
    from pdpfl.ledger import PrivacySummary
    from pdpfl.ledger.runfolder import RunCheck

__all__ = ["privacy_command", "register"]


def privacy_command(
    run_dir: Path | None = typer.Argument(
        None, help="A run's output folder, or a silo's state folder."
    ),
    store: Path | None = typer.Option(
        None,
        "--store",
        help="A budget store folder (lifetime budgets across runs): the default is "
        "$PDPFL_BUDGET_DIR or ~/.local/share/pdpfl/budgets; a Flower silo's is "
        "STATE_DIR/budgets.",
    ),
    unit_id: str | None = typer.Option(None, "--id", help="Answer for one person (unit id)."),
    out: Path | None = typer.Option(
        None, "--out", help="Where to write the per-unit table (default RUN_DIR/privacy.csv)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    receipt: Path | None = typer.Option(
        None,
        "--receipt",
        help="With --id X: write X's signed privacy receipt to this file (check it offline with "
        "pdpfl verify-receipt).",
    ),
    key_file: Path | None = typer.Option(
        None,
        "--key",
        help="With --receipt: the signing party's private identity file (default: the one this "
        "machine keeps for it in $PDPFL_KEY_DIR/identity).",
    ),
) -> None:
    """Each person's ε spent (per observer) against their budget: in one run (RUN_DIR) or for
    life (--store)."""
    from pdpfl.io import write_text
    from pdpfl.ledger.table import select_id
    from pdpfl.runtime.outputs import holder_names, holder_stems, with_silo_names

    if store is not None:
        if run_dir is not None:
            fail("--store: give either RUN_DIR or --store STORE, not both")
        if receipt is not None:
            fail("--receipt: receipts are issued for a run (RUN_DIR), not for a budget store")
        _store_command(store, unit_id, out, as_json)
        return
    if run_dir is None:
        fail("RUN_DIR: give a run's output folder, or --store STORE for lifetime budgets")
    if not run_dir.exists():
        fail(f"RUN_DIR: {run_dir} does not exist")
    check, table, summary = _verified(run_dir)
    if receipt is not None:
        if unit_id is None:
            fail("--receipt: name the person with --id X (a receipt is for one person)")
        _write_receipt(run_dir, check, unit_id, receipt, as_json, key_file)
        return
    names = holder_names(run_dir if run_dir.is_dir() else run_dir.parent)  # display names only
    stems = holder_stems(table, names)
    table = with_silo_names(table, names)
    if unit_id is not None:
        chosen = select_id(table, unit_id)
        if not len(chosen["id"]) and summary.unit == "client":
            # a client is a silo: its ledger file's name (client_<i>) also answers
            chosen = {c: v[stems == str(unit_id)] for c, v in table.items()}
        rows = table_rows(chosen)
        if not rows:
            fail(
                f"--id: no {summary.unit} with id {unit_id!r} in {run_dir} "
                f"({len(table['id'])} {summary.unit}s; ids are in privacy.csv)"
            )
        ledger_of = {name: stem for stem, name in names.items()}  # the silo's name → its file
        cards = (
            unit_risk_cards(check.ledgers, rows, ledger_of) if _has_pld() else [{} for _ in rows]
        )
        if as_json:
            print_json(
                {"id": unit_id, "rows": rows, "risk": cards, "verification": check.to_dict()}
            )
            return
        typer.echo(check.note)
        for row, card in zip(rows, cards, strict=True):
            typer.echo(describe_unit(row, summary.observers))
            for obs, sentence in card.items():
                typer.echo(f"  attack risk ({obs}): {sentence['sentence']}")
        return
    target = (
        out
        if out is not None
        else (run_dir if run_dir.is_dir() else run_dir.parent) / "privacy.csv"
    )
    try:
        write_text(target, ledger_csv(table))
    except OSError as err:
        fail(f"--out: cannot write {target} ({err.strerror or err})")
    from pdpfl.ledger.risk import risk_section

    # the risk cards read the accountant's PLD (the pld extra); a base install reports ε only
    risk = risk_section(list(check.ledgers.values()), summary.unit) if _has_pld() else None
    if as_json:
        print_json(
            {
                "summary": summary.to_dict(),
                "csv": str(target),
                "risk": risk,
                "verification": check.to_dict(),
            }
        )
        return
    from rich.console import Console

    from pdpfl.reports.tables import group_table, plural, risk_table

    console = Console()
    console.print(
        group_table(
            summary, f"ε spent vs budget, per budget group ({summary.units} {plural(summary.unit)})"
        )
    )
    if risk is not None:
        console.print(risk_table(risk, f"attack risk, per budget group ({plural(summary.unit)})"))
    typer.echo(check.note)
    typer.echo(f"per-{summary.unit} table written to {target}")


def _has_pld() -> bool:
    from pdpfl.ledger.risk import available

    return available()


def _verified(run_dir: Path) -> tuple[RunCheck, dict[str, np.ndarray], PrivacySummary]:
    """The run's ledgers verified (:func:`~pdpfl.ledger.runfolder.open_run`), its table and its
    summary; a folder that fails is refused (exit 2, the file named)."""
    import warnings

    from pdpfl.ledger.runfolder import UnverifiedRunWarning, open_run
    from pdpfl.ledger.table import summary_of, table_of

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnverifiedRunWarning)  # the report prints the note
            check = open_run(run_dir)
        return check, table_of(check), summary_of(check)
    except ValueError as err:
        fail(f"RUN_DIR: {err}")


def _write_receipt(
    run_dir: Path, check: RunCheck, unit_id: str, target: Path, as_json: bool, key_file: Path | None
) -> None:
    """``--receipt FILE``: the signed receipt of one person (:mod:`pdpfl.ledger.receipts`)."""
    from pdpfl.ledger.receipts import ReceiptError, issue_run_receipts

    try:
        receipts = issue_run_receipts(run_dir, check, unit_id, identity_file=key_file)
    except ReceiptError as err:
        fail(f"--id: {err}")
    except ValueError as err:
        fail(f"--receipt: {err}")
    from pdpfl.io import write_text

    if len(receipts) == 1:
        text = receipts[0].to_json()
    else:  # one person with units in several ledgers (a record id in two silos): one each
        text = "[\n" + ",\n".join(r.to_json().rstrip() for r in receipts) + "\n]\n"
    try:
        write_text(target, text)
    except OSError as err:
        fail(f"--receipt: cannot write {target} ({err.strerror or err})")
    if as_json:
        print_json({"receipt": str(target), "receipts": [r.statement for r in receipts]})
        return
    for r in receipts:
        typer.echo(f"receipt for {r.statement['unit']} {unit_id} signed by {r.signer.party} "
                   f"(key {r.signer.fingerprint}) written to {target}")  # fmt: skip
    typer.echo(f"check it with: pdpfl verify-receipt {target}")


def _store_command(store: Path, unit_id: str | None, out: Path | None, as_json: bool) -> None:
    """``pdpfl privacy --store STORE`` (module docstring)."""
    from pdpfl.integrity import IntegrityError
    from pdpfl.ledger.budget_store import BudgetStore, find_stores
    from pdpfl.ledger.lifetime import lifetime_table, store_runs

    if not store.expanduser().is_dir():
        fail(f"--store: {store} is not a folder (a budget store root, e.g. $PDPFL_BUDGET_DIR)")
    try:
        table = lifetime_table(store)
        runs = {
            str(BudgetStore(root, party, key).folder): store_runs(
                BudgetStore(root, party, key).open(lock=False)
            )
            for root, party, key in find_stores(store)
        }
    except IntegrityError as err:
        fail(f"--store: {err}")
    except ValueError as err:
        fail(f"--store: {err}")
    if unit_id is not None:
        keep = np.array([str(v) == unit_id for v in table["id"]], dtype=bool)
        rows = table_rows({k: v[keep] for k, v in table.items()})
        if not rows:
            fail(f"--id: no unit with id {unit_id!r} in the budget stores under {store}")
        if as_json:
            print_json({"id": unit_id, "rows": rows, "runs": runs})
            return
        for row in rows:
            typer.echo(describe_lifetime(row, runs.get(str(row["store"]), [])))
        return
    if out is not None:
        from pdpfl.io import write_text

        try:
            write_text(out, store_csv(table))
        except OSError as err:
            fail(f"--out: cannot write {out} ({err.strerror or err})")
    if as_json:
        print_json({"stores": store_groups(table, runs), "csv": None if out is None else str(out)})
        return
    from rich.console import Console

    console = Console()
    for entry in store_groups(table, runs):
        console.print(store_table(entry))
    if out is not None:
        typer.echo(f"per-unit table written to {out}")
    else:
        typer.echo("--out FILE writes one row per unit (lifetime ε per observer, runs)")


def register(app: typer.Typer) -> None:
    """Add ``privacy`` to the main app."""
    app.command("privacy")(privacy_command)
