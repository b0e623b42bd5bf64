"""``pdpfl compare``'s library side: one row per finished run, the table per method, the
accuracy curves read from verified run folders, ``compare.png`` (the rPDP-FL paper's Figure 8).

Every privacy number comes from the run's typed :class:`~pdpfl.ledger.PrivacySummary`.
"""

from __future__ import annotations

import csv
import io
import warnings
from pathlib import Path
from typing import Any, SupportsFloat

import numpy as np

from pdpfl.reports.tables import typed_privacy

__all__ = [
    "CSV_FIELDS",
    "accuracy_curve",
    "compare_rows",
    "csv_text",
    "mechanism_columns",
    "nan_none",
    "previous_runs",
    "run_row",
    "write_compare_plot",
]


def compare_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per method: mean ± std (over seeds) of the final accuracy (Figure 8 of the paper)."""
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        acc = np.array([nan_none(r["final_accuracy"]) for r in mine], dtype=float)
        last3 = np.array([nan_none(r["last3_mean_accuracy"]) for r in mine], dtype=float)
        out.append(
            {
                "method": method,
                "runs": len(mine),
                "final_accuracy_mean": float(acc.mean()),
                "final_accuracy_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                "last3_mean_accuracy": float(last3.mean()),
                "over_budget": int(sum(r["over_budget"] or 0 for r in mine)),
                "epsilon": _max_epsilon([r.get("epsilon") for r in mine]),
                "unit": mine[-1].get("unit", "record"),
                "private": all(r.get("private", True) for r in mine),
                "seconds": float(sum(r["seconds"] for r in mine)),
                # σ and the group rates of the last seed (with realized group fractions they vary
                # slightly between seeds; the CSV has every run's values).
                **{k: v for k, v in mine[-1].items() if k == "sigma" or k.startswith("rate_")},
            }
        )
    return out


def run_row(method: str, seed: int, summary: dict[str, Any], adversary: str) -> dict[str, Any]:
    """One finished run as a comparison row; privacy numbers from its typed summary."""
    privacy = typed_privacy(summary)
    private = privacy is None or privacy.private
    return {
        "method": method,
        "seed": seed,
        "final_accuracy": summary["final_accuracy"],
        "last3_mean_accuracy": summary["last3_mean_accuracy"],
        "unit": privacy.unit if privacy is not None else summary.get("privacy_unit"),
        "private": private,
        "over_budget": None if privacy is None else privacy.over_budget_any(adversary),
        "epsilon": None if privacy is None else privacy.headline_epsilon(adversary),
        "seconds": round(float(summary["seconds"]), 3),
        **mechanism_columns(summary),
    }


def mechanism_columns(summary: dict[str, Any]) -> dict[str, Any]:
    """Extra comparison columns of client-level algorithms (IDP-FedAvg): the run's noise
    multiplier σ and each privacy group's sampling rate (``rate_<group>``); empty otherwise."""
    out: dict[str, Any] = {}
    privacy = typed_privacy(summary)
    if privacy is None or privacy.unit != "client":
        return out
    if privacy.info.get("noise_multiplier") is not None:
        out["sigma"] = privacy.info["noise_multiplier"]
    for g in privacy.groups:
        rate = g.info.get("rate", g.info.get("mean_rate"))
        if rate is not None:
            out[f"rate_{g.label}"] = rate
    return out


def nan_none(x: SupportsFloat | str | None) -> float:
    """NaN for a missing value."""
    return float("nan") if x is None else float(x)


def _max_epsilon(values: list[Any]) -> float | None:
    """Largest headline ε over seeds (inf without DP; None if a run did not report one)."""
    if not values or any(v is None for v in values):
        return None
    return float(max(float(v) for v in values))


#: Columns of ``--csv`` / ``compare.csv`` (one row per finished run).
CSV_FIELDS = [
    "method",
    "seed",
    "final_accuracy",
    "last3_mean_accuracy",
    "over_budget",
    "seconds",
    "unit",
    "epsilon",
    "private",
]


def csv_text(rows: list[dict[str, Any]]) -> str:
    """The CSV of ``rows`` (:data:`CSV_FIELDS` first, then any mechanism columns)."""
    buf = io.StringIO()
    extra = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in CSV_FIELDS]
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS + extra, restval="")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def previous_runs(root: Path) -> list[str]:
    """Sub-folders of ``root`` laid out by an earlier ``pdpfl compare`` (``METHOD/seedN/``)."""
    import re

    if not root.is_dir():
        return []
    return [
        d.name
        for d in root.iterdir()
        if d.is_dir()
        and not d.is_symlink()
        and any(d.iterdir())
        and all(re.fullmatch(r"seed\d+", c.name) and c.is_dir() for c in d.iterdir())
    ]


def accuracy_curve(run_dir: Path) -> list[float]:
    """The run's accuracy per round, read from its folder once the folder verifies (its sealed
    checkpoint and ledgers, :func:`pdpfl.ledger.runfolder.open_run`; exit 2 naming a file that
    does not: ValueError naming it)."""
    from pdpfl.checkpoint import run_identity
    from pdpfl.ledger.runfolder import open_run
    from pdpfl.runtime.loop import read_metrics

    run_identity(run_dir)
    if (run_dir / "ledgers").is_dir():
        open_run(run_dir)
    return [nan_none(m.get("accuracy")) for m in read_metrics(run_dir)]


def write_compare_plot(path: Path, name: str, curves: dict[str, list[list[float]]]) -> None:
    """``compare.png``: mean pooled test accuracy per round (over seeds), one line per method."""
    from pdpfl.runtime.plots import missing_glyphs_quiet

    with missing_glyphs_quiet():
        _draw_compare_plot(path, name, curves)


def _draw_compare_plot(path: Path, name: str, curves: dict[str, list[list[float]]]) -> None:
    from matplotlib.ticker import MaxNLocator

    from pdpfl.runtime.plots import new_figure, nothing_to_draw, save_figure

    fig, ax = new_figure(5.5, 3.4)
    ax.set_title(f"{name}: test accuracy per round")
    drawn = False
    for method, runs in curves.items():
        length = min((len(r) for r in runs), default=0)
        if not length:
            continue
        acc = np.array([r[:length] for r in runs], dtype=float)
        if not np.isfinite(acc).any():
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # rounds where every seed is NaN
            mean = np.nanmean(acc, axis=0)
        ax.plot(np.arange(1, length + 1), mean, marker="o", ms=3, label=method)
        drawn = True
    if drawn:
        ax.set_xlabel("round")
        ax.set_ylabel("pooled test accuracy")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    else:
        nothing_to_draw(ax, "no test accuracy was measured")
    fig.tight_layout()
    save_figure(fig, path)
