"""Privacy receipts: what one person spent, signed by the party whose ledger charged them.

A person whose record, account or device took part asks the silo that holds their data "what
did I spend?". A **receipt** (``pdpfl-receipt/1``) answers for that person alone:

* the statement: their unit (record, client or user) and id, the party that holds their ledger
  row, their budget, the ε spent against each observer (third parties, the coordinating
  server) and the rounds charged against each, whether they were stopped (sat out rounds so as
  not to exceed the budget) or never used, their sampling rate and noise multiplier, δ, the
  accountant, the mechanism (its published description and its SHA-256 fingerprint), the run
  id and how far the run folder was verified, the pdpfl version, the time of issue, and -- when
  the party keeps a budget store -- their lifetime ε over every run that charged them;
* a detached Ed25519 signature by the holder's long-term identity
  (:mod:`pdpfl.crypto.signing`) over the canonical encoding of the statement (JSON with sorted
  keys, no spaces, ASCII, finite numbers only -- :func:`canonical`), with the signer's public key
  record beside it.

It names no other person and carries nothing of anyone else's budget or row: the mechanism
description is the public plan (σ, rounds, rates of the plan), never the per-unit table.

:func:`verify_receipt` checks one offline: the format, the signature, that the signer is the
party the statement names, and -- given the party's public key from a source the person trusts
(``--key``; in a simulated run the run folder's ``keys/<party>.pub``) -- that it is that key. An
edited number changes the canonical encoding and fails the signature.

What a receipt proves, and what it does not: it proves that the holder of that key stated these
numbers for this person -- what its ledger charged, computed by pdpfl's accountant from the
counts it recorded. It does not prove that the party ran pdpfl honestly (added the noise,
recorded every round, used the published mechanism): a dishonest party can sign anything. Its
value is accountability: a signed statement that can be checked against the published mechanism
and held against the party.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl.crypto import IntegrityError
from pdpfl.crypto.keys import context
from pdpfl.crypto.signing import PartyIdentity, PartyPublicKey, load_identity, read_public_key
from pdpfl.ledger.core import PrivacyLedger
from pdpfl.ledger.describe import mechanism_to_dict
from pdpfl.ledger.runfolder import RunCheck

__all__ = [
    "FORMAT",
    "Receipt",
    "ReceiptError",
    "canonical",
    "holder_party",
    "issue_receipt",
    "issue_run_receipts",
    "issue_silo_receipts",
    "unit_statement",
    "verify_receipt",
]

FORMAT = "pdpfl-receipt/1"
_OBSERVERS = ("third-party", "server")


class ReceiptError(ValueError):
    """A receipt cannot be issued (no such person) or does not verify."""


def canonical(statement: dict[str, Any]) -> bytes:
    """The bytes a receipt's signature covers: sorted keys, no spaces, ASCII, finite numbers."""
    return json.dumps(
        statement, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def _message(statement: dict[str, Any]) -> bytes:
    return context(FORMAT, canonical(statement))


@dataclass(frozen=True)
class Receipt:
    """A signed statement (module docstring)."""

    statement: dict[str, Any]
    signer: PartyPublicKey
    signature: bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "statement": self.statement,
            "signature": {
                "algorithm": "Ed25519",
                "signer": self.signer.to_dict(),
                "value": self.signature.hex(),
            },
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, data: object) -> Receipt:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ReceiptError(f"not a {FORMAT} receipt")
        sig = data.get("signature")
        statement = data.get("statement")
        if not isinstance(sig, dict) or not isinstance(statement, dict):
            raise ReceiptError("a receipt needs a statement and a signature")
        if sig.get("algorithm") != "Ed25519":
            raise ReceiptError(f"unsupported signature algorithm {sig.get('algorithm')!r}")
        try:
            signer = PartyPublicKey.from_dict(sig.get("signer"), what="the receipt's signer key")
            value = bytes.fromhex(str(sig.get("value")))
        except (IntegrityError, ValueError) as err:
            raise ReceiptError(str(err)) from None
        return cls(statement, signer, value)


def _finite(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def holder_party(holder: str) -> str:
    """The party that holds a ledger file: ``client_3`` / ``ledger-silo-3`` → ``silo-3``,
    ``server`` → ``server``."""
    name = holder.rsplit("/", 1)[-1]
    for prefix in ("client_", "ledger-silo-"):
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            return f"silo-{name[len(prefix) :]}"
    return name


def mechanism_fingerprint(ledger: PrivacyLedger) -> str:
    """SHA-256 of the mechanism's canonical description and the accountant."""
    desc = {"mechanism": mechanism_to_dict(ledger.mechanism), "accountant": ledger.accountant}
    return hashlib.sha256(canonical(desc)).hexdigest()


def unit_statement(
    ledger: PrivacyLedger,
    unit_id: str,
    *,
    party: str,
    run: dict[str, Any],
    lifetime: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The statement of one person's receipt: their row of ``ledger`` only (module docstring).
    Raises :class:`ReceiptError` when ``unit_id`` has no row."""
    from pdpfl._version import __version__

    rows = np.flatnonzero(np.asarray(ledger.ids).astype(str) == str(unit_id))
    if rows.size == 0:
        raise ReceiptError(f"no {ledger.unit} with id {unit_id!r} in this ledger")
    i = int(rows[0])
    epsilon: dict[str, float | None] = {}
    charged: dict[str, int | None] = {}
    for obs in _OBSERVERS:
        if obs in ledger.observers:
            epsilon[obs] = _finite(ledger.spent_epsilon(obs)[i])
            charged[obs] = int(ledger.counts[obs][i])
        else:
            epsilon[obs] = None
            charged[obs] = None
    return {
        "unit": ledger.unit,
        "id": str(unit_id),
        "holder": party,
        "budget": _finite(ledger.budgets[i]),
        "epsilon": epsilon,
        "rounds_charged": charged,
        "rounds_recorded": int(ledger.rounds_recorded),
        "stopped": bool(ledger.stopped[i]),
        "excluded": bool(ledger.excluded[i]),
        "sampling_rate": _finite(ledger.rates[i]),
        "noise_multiplier": _finite(ledger.noise_multipliers[i]),
        "delta": _finite(ledger.mechanism.delta),
        "accountant": ledger.accountant,
        "mechanism": mechanism_to_dict(ledger.mechanism),
        "mechanism_fingerprint": mechanism_fingerprint(ledger),
        "run": run,
        "lifetime": lifetime,
        "pdpfl_version": __version__,
        "issued": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def issue_receipt(identity: PartyIdentity, statement: dict[str, Any]) -> Receipt:
    """Sign ``statement`` with ``identity`` (which must be the party it names as holder)."""
    if statement.get("holder") != identity.party:
        raise ReceiptError(
            f"the statement is about {statement.get('holder')}'s ledger; {identity.party} "
            "cannot sign it"
        )
    json.loads(canonical(statement))  # finite and JSON-able, or a ValueError here
    return Receipt(statement, identity.public(), identity.sign(_message(statement)))


def verify_receipt(
    receipt: Receipt, trusted: PartyPublicKey | dict[str, PartyPublicKey] | None = None
) -> PartyPublicKey:
    """Check ``receipt`` (module docstring); returns the signer's key. Raises
    :class:`ReceiptError` naming what fails. Without ``trusted`` only the signature under the
    key the receipt carries is checked (integrity, not who signed it)."""
    holder = receipt.statement.get("holder")
    if receipt.signer.party != holder:
        raise ReceiptError(
            f"signed by {receipt.signer.party}, but the statement is about {holder}'s ledger"
        )
    try:
        message = _message(receipt.statement)
    except ValueError as err:  # a NaN or inf put in by hand
        raise ReceiptError(f"the statement is not canonical JSON ({err})") from None
    if not receipt.signer.verify(message, receipt.signature):
        raise ReceiptError(
            "the signature does not verify: the statement was edited after it was signed, or "
            "the signature is not the signer's"
        )
    if trusted is not None:
        key = trusted if isinstance(trusted, PartyPublicKey) else trusted.get(str(holder))
        if key is None:
            raise ReceiptError(f"no trusted public key for {holder} among the keys given")
        if key.sign != receipt.signer.sign:
            raise ReceiptError(
                f"signed by key {receipt.signer.fingerprint}, not by {holder}'s key "
                f"{key.fingerprint} that you trust"
            )
    return receipt.signer


def _lifetime_row(store_root: Path, party: str, unit_id: str) -> dict[str, Any] | None:
    """The person's lifetime row in the party's budget store (None without a store)."""
    from pdpfl.ledger.lifetime import lifetime_table

    if not store_root.is_dir():
        return None
    try:
        table = lifetime_table(store_root)
    except ValueError:
        return None
    keep = [
        i
        for i in range(len(table["id"]))
        if str(table["id"][i]) == str(unit_id) and table["party"][i] == party
    ]
    if not keep:
        return None
    i = keep[0]
    return {
        "dataset": str(table["dataset"][i]),
        "runs": int(table["runs"][i]),
        "epsilon": {o: _finite(table[f"epsilon_{o.replace('-', '_')}"][i]) for o in _OBSERVERS},
        "remaining": {o: _finite(table[f"remaining_{o.replace('-', '_')}"][i]) for o in _OBSERVERS},
        "delta": _finite(table["delta"][i]),
        "note": "every run that charged this person, composed (not a sum of ε's)",
    }


def _summary(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / "summary.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def issue_run_receipts(
    run_dir: str | Path,
    check: RunCheck,
    unit_id: str,
    *,
    identity_file: str | Path | None = None,
) -> list[Receipt]:
    """The receipt(s) of ``unit_id`` from a run folder's verified ledgers ``check``
    (:class:`~pdpfl.ledger.runfolder.RunCheck`), each signed by the party holding the ledger
    (this machine's identity for it, or ``identity_file``). A run that published its parties'
    public keys (``keys/<party>.pub``) must be signed by those keys."""
    run_dir = Path(run_dir)
    base = run_dir if run_dir.is_dir() else run_dir.parent
    summary = _summary(base)
    stores = {
        str(s.get("party")): Path(str(s.get("store")))
        for s in ((summary.get("lifetime") or {}).get("stores") or [])
        if isinstance(s, dict)
    }
    run = {
        "run_id": check.run_id,
        "round": check.round,
        "verified": bool(check.verified),
        "verification": check.note,
        "algorithm": summary.get("algorithm"),
        "name": summary.get("name"),
    }
    out = []
    for holder, ledger in check.ledgers.items():
        if not np.any(np.asarray(ledger.ids).astype(str) == str(unit_id)):
            continue
        party = holder_party(holder)
        identity = load_identity(party, identity_file, create=False) if identity_file else None
        if identity is None:
            identity = load_identity(party, create=False) if _has_identity(party) else None
        if identity is None:
            raise ValueError(
                f"no signing key for {party} on this machine ($PDPFL_KEY_DIR/identity/"
                f"{party}.key); pass --key FILE with {party}'s identity file"
            )
        published = base / "keys" / f"{party}.pub"
        if published.is_file():
            key = read_public_key(published, party)
            if key.sign != identity.public().sign:
                raise ValueError(
                    f"{published}: the run published another key for {party} than the one "
                    "given to sign with; refusing to sign with a key the person cannot check"
                )
        lifetime = _lifetime_row(stores[party], party, unit_id) if party in stores else None
        statement = unit_statement(ledger, unit_id, party=party, run=run, lifetime=lifetime)
        out.append(issue_receipt(identity, statement))
    if not out:
        unit = next(iter(check.ledgers.values())).unit if check.ledgers else "unit"
        raise ReceiptError(f"no {unit} with id {unit_id!r} in {run_dir}")
    return out


def _has_identity(party: str) -> bool:
    from pdpfl.crypto.signing import default_identity_path

    return default_identity_path(party).is_file()


def issue_silo_receipts(
    state_dir: str | Path, silo: int, unit_id: str, *, run_key: str | None = None
) -> list[Receipt]:
    """A Flower silo's receipts for one of its own people, from its own state: the verified
    ledger in ``<state_dir>/run-<key>/`` (every run of the silo, or ``run_key``), signed with
    the identity in its state folder, with the lifetime from ``<state_dir>/budgets``."""
    from pdpfl.ledger.runfolder import open_silo_state

    root = Path(state_dir).expanduser()
    party = f"silo-{int(silo)}"
    folders = [root / f"run-{run_key}"] if run_key else sorted(root.glob("run-*"))
    folders = [f for f in folders if (f / f"ledger-silo-{int(silo)}.npz").is_file()]
    if not folders:
        raise ValueError(
            f"{root}: silo {silo} holds no ledger here (no run-*/ledger-silo-{silo}.npz)"
        )
    identity = load_identity(party, silo_identity_path(root, int(silo)), create=False)
    out = []
    for folder in folders:
        check = open_silo_state(folder)
        ledger = check.ledgers.get(f"ledger-silo-{int(silo)}")
        if ledger is None or not np.any(np.asarray(ledger.ids).astype(str) == str(unit_id)):
            continue
        run = {
            "run_id": folder.name[len("run-") :],
            "round": check.round,
            "verified": True,
            "verification": check.note,
        }
        lifetime = _lifetime_row(root / "budgets", party, unit_id)
        statement = unit_statement(ledger, unit_id, party=party, run=run, lifetime=lifetime)
        out.append(issue_receipt(identity, statement))
    if not out:
        raise ReceiptError(f"no unit with id {unit_id!r} in silo {silo}'s ledgers under {root}")
    return out


def silo_identity_path(state_dir: str | Path, silo: int) -> Path:
    """Where a Flower silo keeps its private identity: ``<state-dir>/identity/silo-<i>.key``."""
    return Path(state_dir).expanduser() / "identity" / f"silo-{int(silo)}.key"
