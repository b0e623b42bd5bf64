"""The audit's outputs: ``audit.json``, ``audit.png`` (one panel per observer) and ``AUDIT.md``.

Every file is written atomically (:mod:`pdpfl.io`); the figure and the page read the same
``audit.json`` record (:meth:`pdpfl.audit.session.AuditResult.to_dict`).
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.io import write_bytes, write_json, write_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "AUDIT_OUTPUTS",
    "OBSERVER_TITLES",
    "audit_figure",
    "audit_markdown",
    "format_number",
    "write_audit",
]

#: The files an audit writes (``--force`` replaces exactly these).
AUDIT_OUTPUTS = ("audit.json", "audit.png", "AUDIT.md")

#: Observer -> its heading in the report and the CLI table.
OBSERVER_TITLES = {
    "third-party": "third party (final model)",
    "server": "server (every released update)",
}


def format_number(x: float | None, digits: int = 3) -> str:
    """``x`` for a table cell: ``digits`` significant digits, ``∞``, or ``–`` for none."""
    if x is None:
        return "–"
    x = float(x)
    if math.isinf(x):
        return "∞"
    return f"{x:.{digits}g}"


def write_audit(record: dict[str, Any], out: Path) -> None:
    """Write ``audit.json``, ``audit.png`` and ``AUDIT.md`` of ``record`` into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    write_json(out / "audit.json", record)
    fig = audit_figure(record)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130, bbox_inches="tight")
    plt.close(fig)
    write_bytes(out / "audit.png", buf.getvalue())
    write_text(out / "AUDIT.md", audit_markdown(record))


def audit_figure(record: dict[str, Any]) -> Figure:
    """Per observer: budget ε, the accountant's ε and the audited ε̂ per group (log scale)."""
    import matplotlib.pyplot as plt

    observers = list(record["observers"])
    fig, axes = plt.subplots(
        1, len(observers), figsize=(4.6 * len(observers), 3.6), squeeze=False, sharey=True
    )
    values = [
        v
        for rows in record["observers"].values()
        for g in rows
        for v in (g["budget"], g["spent_at_audit_delta"], g["epsilon_lower"])
        if v is not None and v > 0 and math.isfinite(v)
    ]
    floor = min(values) / 4 if values else 1e-2
    top = max(values) * 2 if values else 1.0
    for ax, obs in zip(axes[0], observers, strict=True):
        rows = record["observers"][obs]
        x = np.arange(len(rows))
        budget = [g["budget"] if g["budget"] else np.nan for g in rows]
        spent = [g["spent_at_audit_delta"] if g["spent_at_audit_delta"] else np.nan for g in rows]
        lower = np.array([g["epsilon_lower"] for g in rows], dtype=float)
        spent0 = [g["spent"] if g["spent"] else np.nan for g in rows]
        ax.bar(x, budget, width=0.6, color="0.85", label=f"budget ε (δ = {record['delta']:.0e})")
        ax.plot(
            x,
            spent0,
            "o",
            color="tab:blue",
            mfc="none",
            label=f"accountant ε (δ = {record['delta']:.0e})",
        )
        ax.plot(
            x, spent, "o", color="tab:blue", label=f"accountant ε (δ = {record['audit_delta']:.0e})"
        )
        shown = np.where(lower > 0, lower, np.nan)
        ax.plot(x, shown, "D", color="tab:red", label="audited lower bound ε̂")
        zero = np.flatnonzero(lower <= 0)
        ax.plot(
            x[zero],
            np.full(zero.size, floor * 1.05),
            "v",
            color="tab:red",
            mfc="none",
            label="ε̂ = 0" if zero.size else None,
        )
        ax.set_yscale("log")
        ax.set_ylim(floor, top)
        ax.set_xticks(x, [g["label"] for g in rows])
        ax.set_xlabel("budget group")
        ax.set_title(OBSERVER_TITLES.get(obs, obs), fontsize=10)
    axes[0][0].set_ylabel("ε")
    axes[0][-1].legend(fontsize=7, loc="upper left")
    verdict = (
        "VIOLATION"
        if record["violations"]
        else "inconclusive (saturated)"
        if record.get("inconclusive")
        else "consistent"
    )
    fig.suptitle(
        f"{record['name']} ({record['algorithm']}): one-run audit, "
        f"{record['canaries_per_group']} canaries per group — {verdict}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def _table(rows: list[dict[str, Any]], record: dict[str, Any]) -> list[str]:
    lines = [
        f"| group | budget ε | canary q | accountant ε (δ = {record['delta']:.0e}) | "
        f"accountant ε (δ = {record['audit_delta']:.0e}) | audited ε̂ | ε̂ Steinke | ε̂ f-DP | "
        "right / guesses | status | one-shot ε (estimate) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for g in rows:
        flag = " **> accountant**" if g["violated"] else ""
        lines.append(
            f"| {g['label']} | {format_number(g['budget'])} | {format_number(g['canary_rate'])} | "
            f"{format_number(g['spent'], 4)} | {format_number(g['spent_at_audit_delta'], 4)} | "
            f"{format_number(g['epsilon_lower'], 3)}{flag} | "
            f"{format_number(g['epsilon_lower_steinke'], 3)} | "
            f"{format_number(g['epsilon_lower_fdp'], 3)} | {g['correct']} / {g['guesses']} | "
            f"{g['status']} | {format_number(g.get('one_shot_epsilon'), 3)} |"
        )
    return lines


def _risk_table(rows: list[dict[str, Any]]) -> list[str]:
    """The accountant's risk card beside the attack rates the audit measured."""
    cards = [g for g in rows if g.get("risk")]
    if not cards:
        return []
    fprs = cards[0]["risk"]["fpr"]
    head = " | ".join(f"TPR at FPR {a:g}: bound / measured" for a in fprs)
    lines = [f"| group | {head} |", "| --- |" + " ---: |" * len(fprs)]
    for g in cards:
        cells = []
        for a, t in zip(fprs, g["risk"]["tpr_max"], strict=True):
            measured = g["measured_tpr"].get(f"{a:g}")
            cells.append(f"{format_number(t)} / {format_number(measured)}")
        lines.append(f"| {g['label']} | " + " | ".join(cells) + " |")
    return lines


def _verdict(record: dict[str, Any]) -> list[str]:
    if record["violations"]:
        return [
            "**Verdict: VIOLATION** -- an audited lower bound exceeds the accountant's ε "
            "(a privacy bug, or, with probability at most "
            f"{1 - record['confidence']:.0%}, chance):",
            "",
            *(f"- {v}" for v in record["violations"]),
            "",
        ]
    if record["inconclusive"]:
        return [
            "**Verdict: INCONCLUSIVE (saturated)** -- every audited ε̂ is at most the "
            "accountant's ε, but in these groups every guess was right and no test with this "
            "many canaries could have certified the accountant's ε: the audit had no power "
            "there.",
            "",
            *(f"- {v}" for v in record["inconclusive"]),
            "",
        ]
    return [
        "**Verdict: consistent** -- every audited lower bound is at most the accountant's ε.",
        "",
    ]


def _levels_text(record: dict[str, Any]) -> str:
    """How the audit's error is split among its tests (``Levels``; older records: uniform)."""
    planned = {
        f"{label} ({obs})": k
        for obs, groups in dict(record.get("planned") or {}).items()
        for label, k in dict(groups).items()
        if k is not None
    }
    if not planned:
        return (
            f"Bonferroni over {record['tests']} tests, each at level {record['level_per_test']:.2g}"
        )
    where = ", ".join(f"{name}: k = {k}" for name, k in planned.items())
    return (
        f"weighted Bonferroni over {record['tests']} tests: each group and observer gets "
        f"{record['level_per_group']:.2g}, half of it for the f-DP test at the number of guesses "
        f"planned from ideal canaries of the claim before any score was seen ({where}), "
        f"every other test at most {record['level_per_test']:.2g}"
    )


def audit_markdown(record: dict[str, Any]) -> str:
    """``AUDIT.md``: verdict, the figure, one table per observer, what the numbers mean."""
    m = record["canaries_per_group"]
    space = (
        "an audit-only block of parameters appended to the model"
        if record["space"] == "block"
        else "the model's own parameters"
    )
    lines = [
        f"# Privacy audit: {record['name']} ({record['algorithm']})",
        "",
        f"One-run audit (Steinke, Nasr & Jagielski, NeurIPS 2023; f-DP in one run: Mahloujifar, "
        f"Melis & Chaudhuri, ICML 2025; federated form: Andrew et al., ICLR 2024): {m} "
        f"white-box Dirac canaries per budget group ({record['unit']}-level units with the "
        f"group's budget), each included with probability ½ and trained once through the real "
        f"mechanism ({record['rounds']} rounds, {record['silos']} silo(s), randomness: "
        f"{record['randomness']}); coordinates in {space}; a control group of {m} canaries is "
        "never trained.",
        "",
        *_verdict(record),
        "![audit](audit.png)",
        "",
    ]
    for obs, rows in record["observers"].items():
        lines += [f"## {OBSERVER_TITLES.get(obs, obs)}", "", *_table(rows, record), ""]
        risk = _risk_table(rows)
        if risk:
            lines += [
                "Attack risk of the group's strongest unit: the accountant's bound on any "
                "membership attack's true-positive rate (TPR) at each false-positive rate (FPR), "
                "beside the rate the canaries' scores reached:",
                "",
                *risk,
                "",
            ]
    lines += [
        "## What the numbers mean",
        "",
        f"- ε̂ is a **lower bound**, not a guarantee: with probability at least "
        f"{record['confidence']:.0%}, *all* the ε̂ above (every group, every observer, both "
        f"statistics, every number of guesses on the ladder {record['ladder']}) hold "
        f"simultaneously ({_levels_text(record)}). It says the mechanism leaks *at least* this "
        "much; the accountant's ε says it leaks *at most* that much.",
        "- ε̂ Steinke holds for any mechanism (Steinke, Nasr & Jagielski 2023). ε̂ f-DP "
        "(Mahloujifar et al. 2025) is the accountant's ε for the least noise the guesses rule "
        "out in the group's own mechanism: a correct implementation exceeds the accountant's ε "
        "there with probability at most the level; it is a lower bound on the true ε when the "
        "implementation behaves like the accounted mechanism at some noise level. The audited "
        "ε̂ is the larger.",
        *(
            f"- Canary scores ({obs}): {how}."
            for obs, how in dict(record.get("scores") or {}).items()
        ),
        "- The one-shot ε (Andrew et al., ICLR 2024) fits a Gaussian to the included and the "
        "excluded canaries' scores and reads off the Gaussian mechanism's ε: an *estimate* of "
        "what this attack achieves, with no confidence -- never a bound.",
        "- A one-run audit with m canaries cannot certify much more than log(m)-sized ε "
        "(Steinke) and needs many canaries to approach a strong mechanism's ε (f-DP); a group "
        "whose every guess was right while no test could reach the accountant's ε is "
        "reported *inconclusive (saturated)*, with the number of canaries that would give it "
        "power.",
        "- The control group's canaries were never trained: its ε̂ must be 0 "
        "(the auditor is at chance there).",
        f"- Audit time: {record['seconds']:.1f} s of training, "
        f"{record.get('seconds_statistics', 0.0):.1f} s of statistics; details in "
        "`audit.json`.",
        "",
    ]
    return "\n".join(lines)
