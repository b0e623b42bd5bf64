"""``pdpfl privacy``'s library side: per-unit rows and CSV of a run's verified ledgers, each
unit's own attack-risk card and answer (``--id``), and the budget store's lifetime tables
(``--store``; :mod:`pdpfl.ledger.lifetime`).
"""

from __future__ import annotations

import csv
import io
from typing import Any

import numpy as np

__all__ = [
    "describe_lifetime",
    "describe_unit",
    "ledger_csv",
    "store_csv",
    "store_groups",
    "store_table",
    "table_rows",
    "unit_risk_cards",
]


def ledger_csv(table: dict[str, np.ndarray]) -> str:
    """``privacy.csv``: one row per unit, the ledger table's columns."""
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


def table_rows(table: dict[str, np.ndarray]) -> list[dict[str, object]]:
    """The table as JSON-able rows (a non-finite float becomes None)."""
    out = []
    for i in range(len(table["id"])):
        row: dict[str, object] = {}
        for c, v in table.items():
            x = v[i].item() if isinstance(v[i], np.generic) else v[i]
            row[c] = None if isinstance(x, float) and not np.isfinite(x) else x
        out.append(row)
    return out


def unit_risk_cards(
    ledgers: dict[str, Any], rows: list[dict[str, object]], ledger_of: dict[str, str]
) -> list[dict[str, dict[str, object]]]:
    """Each row's own attack-risk card per observer, from its holder's (verified) ledger
    (``ledger_of``: a holder shown by the silo's name → its ledger file's stem)."""
    from pdpfl.ledger.risk import unit_risk
    from pdpfl.ledger.runfolder import POOLED_LEDGER

    out = []
    for row in rows:
        holder = str(row["holder"])
        stem = ledger_of.get(holder, holder)
        if stem not in ledgers:  # a client's row of the simulator's pooled ledger
            stem = POOLED_LEDGER
        cards = unit_risk(ledgers[stem], str(row["id"]))
        out.append(
            {
                obs: {**card.to_dict(), "sentence": card.sentence(str(row["unit"]))}
                for obs, card in cards.items()
            }
        )
    return out


def describe_unit(row: dict[str, object], observers: tuple[str, ...]) -> str:
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


def store_csv(table: dict[str, np.ndarray]) -> str:
    """``--store --out FILE``: one row per unit of the lifetime table."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(list(table))
    for row in table_rows(table):
        writer.writerow(["" if v is None else repr(v) if isinstance(v, float) else v
                         for v in row.values()])  # fmt: skip
    return buf.getvalue()


def store_groups(
    table: dict[str, np.ndarray], runs: dict[str, list[dict[str, object]]]
) -> list[dict[str, object]]:
    """Per store: its runs and, per budget group, units, lifetime max ε, over budget, the
    least remaining."""
    out: list[dict[str, object]] = []
    for folder in dict.fromkeys(table["store"].tolist()):
        m = table["store"] == folder
        groups = []
        labels = dict.fromkeys(table["group"][m].tolist())
        lowest = {k: float(table["budget"][m & (table["group"] == k)].min()) for k in labels}
        for label in sorted(labels, key=lambda k: lowest[k]):
            g = m & (table["group"] == label)
            row: dict[str, object] = {"group": label, "units": int(g.sum())}
            for tag in ("third_party", "server"):
                e = table[f"epsilon_{tag}"][g].astype(float)
                b = table["budget"][g].astype(float)
                known = ~np.isnan(e)
                row[f"lifetime_max_{tag}"] = float(e[known].max()) if known.any() else None
                row[f"over_budget_{tag}"] = int((e[known] > b[known] * (1 + 1e-9)).sum())
                rem = table[f"remaining_{tag}"][g].astype(float)
                row[f"remaining_min_{tag}"] = float(np.nanmin(rem)) if known.any() else None
            groups.append(row)
        first = int(np.flatnonzero(m)[0])
        out.append(
            {
                "store": folder,
                "party": str(table["party"][first]),
                "dataset": str(table["dataset"][first]),
                "unit": str(table["unit"][first]),
                "units": int(m.sum()),
                "delta": float(table["delta"][first]),
                "runs": runs.get(str(folder), []),
                "groups": groups,
            }
        )
    return out


def store_table(entry: dict[str, object]) -> object:
    """One store's rich table (its groups; the runs in the caption)."""
    from rich import box
    from rich.table import Table

    from pdpfl.reports.tables import fmt, plural

    unit = str(entry["unit"])
    runs = list(entry["runs"])  # type: ignore[call-overload]
    t = Table(
        title=f"{entry['party']} · dataset {str(entry['dataset'])[:12]} · {len(runs)} run(s) · "
        f"{entry['units']} {plural(unit)}",
        box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    for col in ("budget ε", plural(unit), "lifetime ε\n3rd / srv", "over\n3rd / srv",
                "least left\n3rd / srv"):  # fmt: skip
        t.add_column(col, justify="right", no_wrap=True)
    for g in entry["groups"]:  # type: ignore[attr-defined]
        t.add_row(
            str(g["group"]),
            str(g["units"]),
            f"{fmt(g['lifetime_max_third_party'])} / {fmt(g['lifetime_max_server'])}",
            f"{g['over_budget_third_party']} / {g['over_budget_server']}",
            f"{fmt(g['remaining_min_third_party'])} / {fmt(g['remaining_min_server'])}",
        )
    lines = [f"lifetime ε at δ = {fmt(entry['delta'])}: every run composed (not a sum of ε's)"]
    for r in runs:
        lines.append(
            f"run {str(r['run'])[:16]} {r['started']} {r['algorithm']} ({r['name']}): "
            + ("no DP" if not r["private"] else f"{r['accountant']}, δ = {fmt(r['delta'])}")
            + ("" if r["enforced"] else ", lifetime not enforced (allow_respend)")
        )
    t.caption = "\n".join(lines)
    return t


def describe_lifetime(row: dict[str, object], runs: list[dict[str, object]]) -> str:
    """One unit's lifetime answer (``--store --id``) with the runs that charged it."""

    def num(x: object) -> str:
        return "-" if x is None else f"{float(x):.4g}"  # type: ignore[arg-type]

    charged = set(str(row["run_ids"]).split(";")) if row["run_ids"] else set()
    lines = [
        f"{row['unit']} {row['id']} ({row['party']}, dataset {str(row['dataset'])[:12]}): "
        f"budget ε = {num(row['budget'])}, {row['runs']} run(s) charged it",
        f"  third party: lifetime ε {num(row['epsilon_third_party'])}, remaining "
        f"{num(row['remaining_third_party'])}",
        f"  server:      lifetime ε {num(row['epsilon_server'])}, remaining "
        f"{num(row['remaining_server'])}",
        f"  (at δ = {num(row['delta'])}; the runs composed, not their ε's summed)",
    ]
    for r in runs:
        if str(r["run"]) in charged:
            lines.append(
                f"  run {str(r['run'])[:16]} {r['started']} {r['algorithm']} ({r['name']})"
            )
    return "\n".join(lines)
