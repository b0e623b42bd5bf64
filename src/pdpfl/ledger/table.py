"""Each person's ε, by id: the ledgers of a run folder (or a silo's state folder) as one table.

A run writes one ledger file per party that accounts units (``ledgers/client_<i>.npz`` for the
silos' records or clients, ``ledgers/server.npz`` for ULDP-FL's users); a Flower silo keeps its
own (``ledger-silo-<i>.npz`` in its state folder). :func:`privacy_table` reads every ledger file
it finds and returns one row per unit: id, unit, holder (which ledger), budget, budget group,
rate, noise multiplier, rounds charged and ε spent per observer, stopped, excluded.

Every ledger is read through :func:`pdpfl.ledger.runfolder.open_run`: a run folder's ledgers
are verified against the run's checkpoint (seal, run id, round, manifest) before anything is
reported; a folder that names no run is reported as unverified.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pdpfl.ledger.core import PrivacyLedger
from pdpfl.ledger.runfolder import RunCheck, open_run
from pdpfl.ledger.summary import PrivacySummary

__all__ = [
    "COLUMNS",
    "find_ledgers",
    "load_ledgers",
    "merged_summary",
    "privacy_table",
    "select_id",
    "summary_of",
    "table_of",
]

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
    """Every ledger under ``path`` by holder name (file stem), verified (:func:`open_run`);
    ValueError when there is none, :class:`~pdpfl.ledger.runfolder.RunFolderError` when a file
    does not verify."""
    return open_run(path).ledgers


def table_of(check: RunCheck) -> dict[str, np.ndarray]:
    """One row per unit of the verified ledgers ``check`` (columns: :data:`COLUMNS`)."""
    parts = []
    for holder, ledger in check.ledgers.items():
        cols = ledger.table()
        n = ledger.n
        cols["id"] = np.asarray(cols["id"]).astype(str)
        cols["unit"] = np.full(n, ledger.unit)
        cols["holder"] = np.full(n, holder)
        parts.append(cols)
    return {c: np.concatenate([p[c] for p in parts]) for c in COLUMNS}


def summary_of(check: RunCheck) -> PrivacySummary:
    """The per-group summary of the verified ledgers ``check`` (merged)."""
    return PrivacySummary.merge(ledger.summary() for ledger in check.ledgers.values())


def privacy_table(path: str | Path) -> dict[str, np.ndarray]:
    """One row per unit of every ledger under ``path``, verified (columns: :data:`COLUMNS`)."""
    return table_of(open_run(path))


def merged_summary(path: str | Path) -> PrivacySummary:
    """The per-group summary of every unit under ``path`` (ledgers verified, merged)."""
    return summary_of(open_run(path))


def select_id(table: dict[str, np.ndarray], unit_id: str) -> dict[str, np.ndarray]:
    """The rows of ``table`` whose id is ``unit_id`` (compared as text)."""
    mask = table["id"] == str(unit_id)
    return {c: v[mask] for c, v in table.items()}
