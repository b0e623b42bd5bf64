"""Privacy receipts on the command line (issue #34).

* ``pdpfl verify-receipt FILE [--key PUBLIC_KEY]`` -- check a receipt offline: exit 0 when it
  verifies (and, with ``--key``, is signed by that key), 1 when it does not, 2 when the file is
  not a receipt. ``--key``: the signing party's public key file (``keys/silo-<i>.pub`` of a
  simulated run, or what the silo published) or a folder of them.
* ``pdpfl flower identity --state-dir DIR --silo I`` -- a SuperNode's long-term identity: created
  in its state folder on first use; prints (or writes, ``--out``) its public key file, which the
  other silos are given (``pdpfl flower supernode --peer-keys``) and people check receipts with.
* ``pdpfl flower receipt --state-dir DIR --silo I --id X --out FILE`` -- a silo's receipt for one
  of its own people, from its own state (its verified ledger, its identity, its budget store).

Receipts from a run folder: ``pdpfl privacy RUN --id X --receipt FILE``. What a receipt proves
and what it does not: :mod:`pdpfl.ledger.receipts`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from pdpfl.cli._common import fail, print_json
from pdpfl.cli.flower import flower_app

__all__ = ["register", "verify_receipt_command"]

#: Exit status of a receipt that does not verify (2 is bad input, as everywhere).
EXIT_INVALID = 1


def _num(x: object) -> str:
    return "-" if x is None else f"{float(x):.4g}"  # type: ignore[arg-type]


def verify_receipt_command(
    file: Path = typer.Argument(..., help="A receipt (pdpfl privacy --receipt)."),
    key: Path | None = typer.Option(
        None,
        "--key",
        help="The signer's public key file (e.g. RUN/keys/silo-0.pub) or a folder of them: "
        "check that the receipt is signed by it.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Check a privacy receipt offline (exit 0 valid, 1 invalid, 2 not a receipt)."""
    from pdpfl.crypto import IntegrityError
    from pdpfl.crypto.signing import PartyPublicKey, read_public_key, read_public_keys
    from pdpfl.ledger.receipts import Receipt, ReceiptError, verify_receipt

    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        fail(f"FILE: not a readable receipt ({err})")
    items = data if isinstance(data, list) else [data]
    try:
        receipts = [Receipt.from_dict(item) for item in items]
    except ReceiptError as err:
        fail(f"FILE: {err}")
    trusted: PartyPublicKey | dict[str, PartyPublicKey] | None = None
    if key is not None:
        try:
            trusted = read_public_keys(key) if key.is_dir() else read_public_key(key)
        except IntegrityError as err:
            fail(f"--key: {err}")
    results: list[dict[str, Any]] = []
    ok = True
    for r in receipts:
        try:
            signer = verify_receipt(r, trusted)
            results.append(
                {
                    "valid": True,
                    "signer": signer.party,
                    "fingerprint": signer.fingerprint,
                    "statement": r.statement,
                }
            )
        except ReceiptError as err:
            ok = False
            results.append({"valid": False, "error": str(err), "statement": r.statement})
    if as_json:
        print_json({"valid": ok, "key_checked": trusted is not None, "receipts": results})
    else:
        for res in results:
            st = res["statement"]
            if not res["valid"]:
                typer.echo(f"INVALID receipt: {res['error']}")
                continue
            eps = st.get("epsilon") or {}
            rounds = st.get("rounds_charged") or {}
            run = st.get("run") or {}
            typer.echo(
                f"valid receipt: {st.get('unit')} {st.get('id')}, signed by {res['signer']} "
                f"(key {res['fingerprint']})"
            )
            typer.echo(
                f"  budget ε = {_num(st.get('budget'))}; spent: third party "
                f"{_num(eps.get('third-party'))} ({rounds.get('third-party')} round(s)), server "
                f"{_num(eps.get('server'))} ({rounds.get('server')} round(s)); "
                + ("stopped" if st.get("stopped") else "not stopped")
            )
            typer.echo(
                f"  run {run.get('run_id')}, accountant {st.get('accountant')}, δ = "
                f"{_num(st.get('delta'))}, mechanism {str(st.get('mechanism_fingerprint'))[:16]}"
                f", pdpfl {st.get('pdpfl_version')}"
            )
            life = st.get("lifetime")
            if isinstance(life, dict):
                le = life.get("epsilon") or {}
                typer.echo(
                    f"  for life ({life.get('runs')} run(s)): third party "
                    f"{_num(le.get('third-party'))}, server {_num(le.get('server'))}"
                )
        if trusted is None and ok:
            typer.echo(
                "the signer's key was not checked against one you trust: compare its fingerprint "
                "with the party's published key, or pass --key"
            )
    if not ok:
        raise typer.Exit(code=EXIT_INVALID)


@flower_app.command("identity")
def identity_command(
    state_dir: Path = typer.Option(..., "--state-dir", help="The SuperNode's state folder."),
    silo: int = typer.Option(..., "--silo", min=0, help="This institution's silo index i."),
    out: Path | None = typer.Option(None, "--out", help="Write the public key file here."),
) -> None:
    """Create (first time) this silo's long-term identity and print its public key file."""
    from pdpfl.crypto.signing import load_identity, write_public_key
    from pdpfl.ledger.receipts import silo_identity_path

    root = state_dir.expanduser()
    if root.exists() and not root.is_dir():
        fail(f"--state-dir: {state_dir} is a file, not a folder")
    identity = load_identity(f"silo-{silo}", silo_identity_path(root, silo))
    public = identity.public()
    if out is not None:
        try:
            write_public_key(out, public)
        except OSError as err:
            fail(f"--out: cannot write {out} ({err.strerror or err})")
        typer.echo(f"silo-{silo}'s public key (fingerprint {public.fingerprint}) written to {out}")
        return
    typer.echo(json.dumps(public.to_dict(), indent=2))


@flower_app.command("receipt")
def flower_receipt_command(
    state_dir: Path = typer.Option(..., "--state-dir", help="The SuperNode's state folder."),
    silo: int = typer.Option(..., "--silo", min=0, help="This institution's silo index i."),
    unit_id: str = typer.Option(..., "--id", help="The person (unit id)."),
    out: Path = typer.Option(..., "--out", help="Where to write the receipt."),
    run_key: str | None = typer.Option(None, "--run", help="One run's key (default: every run)."),
) -> None:
    """A silo's signed receipt for one of its own people, from its own state."""
    from pdpfl.io import write_text
    from pdpfl.ledger.receipts import ReceiptError, issue_silo_receipts

    if not state_dir.expanduser().is_dir():
        fail(f"--state-dir: {state_dir} is not a folder")
    try:
        receipts = issue_silo_receipts(state_dir, silo, unit_id, run_key=run_key)
    except ReceiptError as err:
        fail(f"--id: {err}")
    except (ValueError, FileNotFoundError) as err:
        fail(f"--state-dir: {err}")
    text = (
        receipts[0].to_json()
        if len(receipts) == 1
        else "[\n" + ",\n".join(r.to_json().rstrip() for r in receipts) + "\n]\n"
    )
    try:
        write_text(out, text)
    except OSError as err:
        fail(f"--out: cannot write {out} ({err.strerror or err})")
    typer.echo(f"{len(receipts)} receipt(s) for {unit_id} written to {out}")


def register(app: typer.Typer) -> None:
    """Add ``verify-receipt`` to the main app (the flower commands register on import)."""
    app.command("verify-receipt")(verify_receipt_command)
