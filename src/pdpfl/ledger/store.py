"""Ledger files: one ``.npz`` per ledger, no pickle, written atomically.

A ledger file holds every row (id, budget, rate, σ, counters per observer, sat-out rounds) and
the mechanism description as JSON, so that :func:`load_ledger` rebuilds a ledger that reports
exactly what the original did (``pdpfl privacy RUN_DIR``). Mechanism descriptions are frozen
dataclasses of :mod:`pdpfl.privacy`; only classes from that package are ever rebuilt.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl.integrity import is_sealed, seal, unseal
from pdpfl.io import write_bytes
from pdpfl.ledger.core import PrivacyLedger, counter_key
from pdpfl.ledger.describe import mechanism_from_dict, mechanism_to_dict
from pdpfl.privacy.unit import UnitMechanism

__all__ = [
    "FORMAT",
    "ledger_bytes",
    "ledger_from_bytes",
    "load_ledger",
    "mechanism_from_dict",
    "mechanism_to_dict",
    "save_ledger",
]

FORMAT = "pdpfl-ledger-v2"


def ledger_bytes(ledger: PrivacyLedger) -> bytes:
    """The ``.npz`` bytes of ``ledger`` (every row and the mechanism), unsealed."""
    meta = {
        "format": FORMAT,
        "unit": ledger.unit,
        "mechanism": mechanism_to_dict(ledger.mechanism),
        "accountant": ledger.accountant,
        "rounds_recorded": ledger.rounds_recorded,
    }
    arrays: dict[str, np.ndarray] = {
        "meta": np.array(json.dumps(meta)),
        "ids": ledger.ids,
        "budgets": ledger.budgets,
        "rates": ledger.rates,
        "noise_multipliers": ledger.noise_multipliers,
        "orders": np.zeros(0) if ledger.orders is None else ledger.orders,
        "sat_out_rounds": ledger.sat_out_rounds,
    }
    for obs, counts in ledger.counts.items():
        arrays[counter_key(obs)] = counts
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy stubs: **kwds
    return buf.getvalue()


def save_ledger(
    ledger: PrivacyLedger,
    path: str | Path,
    *,
    identity: str | None = None,
    party: str = "operator",
) -> None:
    """Write ``ledger`` atomically as ``.npz`` (every row and the mechanism).

    With ``identity`` the file is sealed with ``party``'s key (:mod:`pdpfl.integrity`): an
    edited copy no longer loads. A run's ledgers are written by
    :func:`pdpfl.ledger.runfolder.seal_ledgers` (identity and manifest).
    """
    data = ledger_bytes(ledger)
    if identity is not None:
        data = seal(data, purpose="ledger", identity=identity, party=party)
    write_bytes(path, data)


def load_ledger(path: str | Path, *, party: str = "operator") -> PrivacyLedger:
    """Rebuild a ledger written by :func:`save_ledger` (ValueError for anything else; a sealed
    file must verify with ``party``'s key). One file on its own: a *run*'s ledgers are read
    verified by :func:`pdpfl.ledger.runfolder.open_run`."""
    p = Path(path)
    data = p.read_bytes() if p.is_file() else b""
    if is_sealed(data):
        data, _ = unseal(data, purpose="ledger", party=party, what=str(p))
    return ledger_from_bytes(data, str(p))


def ledger_from_bytes(data: bytes, what: str) -> PrivacyLedger:
    """Rebuild a ledger from :func:`ledger_bytes` (ValueError naming ``what`` otherwise)."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                found = meta.get("format") if isinstance(meta, dict) else None
                raise ValueError(f"not a {FORMAT} ledger file (format {found!r})")
            mechanism = mechanism_from_dict(meta["mechanism"])
            if not isinstance(mechanism, UnitMechanism):
                raise ValueError("the stored mechanism is not a UnitMechanism")
            ledger = PrivacyLedger(
                z["budgets"],
                z["rates"],
                mechanism,
                ids=z["ids"],
                noise_multipliers=z["noise_multipliers"],
                orders=z["orders"] if z["orders"].size else None,
                accountant=str(meta.get("accountant", "rdp")),
            )
            state: dict[str, Any] = {k: z[k] for k in z.files if k.endswith("_rounds")}
    except (OSError, KeyError, TypeError, json.JSONDecodeError, EOFError) as exc:
        raise ValueError(f"{what}: not a readable pdpfl ledger file ({exc})") from None
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    except Exception as exc:  # zipfile.BadZipFile and the like: a corrupted file
        raise ValueError(f"{what}: not a readable pdpfl ledger file ({exc})") from None
    state["rounds_recorded"] = int(meta["rounds_recorded"])
    ledger.load_state_dict(state)
    return ledger
