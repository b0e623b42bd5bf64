"""Each person's ε, by id: the ledgers of a run folder (or a silo's state folder) as one table.

A run writes one ledger file per party that accounts units (``ledgers/client_<i>.npz`` for the
silos' records or clients, ``ledgers/server.npz`` for ULDP-FL's users); a Flower silo keeps its
own (``ledger-silo-<i>.npz`` in its state folder). :func:`privacy_table` reads every ledger file
it finds and returns one row per unit: id, unit, holder (which ledger), budget, budget group,
rate, noise multiplier, rounds charged and ε spent per observer, stopped, excluded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pdpfl.ledger.core import PrivacyLedger
from pdpfl.ledger.store import load_ledger
from pdpfl.ledger.summary import PrivacySummary

__all__ = ["COLUMNS", "find_ledgers", "load_ledgers", "privacy_table", "select_id"]

#: Columns of :func:`privacy_table` and of ``privacy.csv``, in order.
COLUMNS = (
    "id",
    "unit",
    "holder",
    "budget",
    "group",
    "rate",
    "noise_multiplier",
    "rounds_third_party",
    "epsilon_third_party",
    "rounds_server",
    "epsilon_server",
    "stopped",
    "excluded",
)


def find_ledgers(path: str | Path) -> list[Path]:
    """Ledger files of a run folder (``ledgers/*.npz``) or a silo state folder
    (``ledger-*.npz``, also one level down in ``run-*/``), or ``path`` itself if it is one."""
    p = Path(path)
    if p.is_file():
        return [p]
    found = sorted((p / "ledgers").glob("*.npz")) if (p / "ledgers").is_dir() else []
    found += sorted(p.glob("ledger-*.npz")) + sorted(p.glob("run-*/ledger-*.npz"))
    return found


def load_ledgers(path: str | Path) -> dict[str, PrivacyLedger]:
    """Every ledger under ``path`` by holder name (file stem); ValueError when there is none."""
    files = find_ledgers(path)
    if not files:
        raise ValueError(
            f"{path}: no ledger files (a run folder holds ledgers/*.npz, a Flower silo's state "
            "folder ledger-silo-<i>.npz; a run without differential privacy has none)"
        )
    return {f.stem: load_ledger(f) for f in files}


def privacy_table(path: str | Path) -> dict[str, np.ndarray]:
    """One row per unit of every ledger under ``path`` (columns: :data:`COLUMNS`)."""
    parts = []
    for holder, ledger in load_ledgers(path).items():
        cols = ledger.table()
        n = ledger.n
        cols["id"] = np.asarray(cols["id"]).astype(str)
        cols["unit"] = np.full(n, ledger.unit)
        cols["holder"] = np.full(n, holder)
        parts.append(cols)
    return {c: np.concatenate([p[c] for p in parts]) for c in COLUMNS}


def merged_summary(path: str | Path) -> PrivacySummary:
    """The per-group summary of every unit under ``path`` (ledgers merged)."""
    return PrivacySummary.merge(ledger.summary() for ledger in load_ledgers(path).values())


def select_id(table: dict[str, np.ndarray], unit_id: str) -> dict[str, np.ndarray]:
    """The rows of ``table`` whose id is ``unit_id`` (compared as text)."""
    mask = table["id"] == str(unit_id)
    return {c: v[mask] for c, v in table.items()}
