"""Terminal tables of ``pdpfl run``, ``pdpfl compare`` and ``pdpfl privacy`` (≤ 80 columns).

Every privacy number comes from the run's typed :class:`~pdpfl.ledger.PrivacySummary`
(``summary["privacy"]``) and is labelled with the run's unit: records, clients or users.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the ledger (and scipy under it) is imported when a table is drawn
    from rich.table import Table

    from pdpfl.ledger import PrivacySummary

__all__ = [
    "compare_table",
    "fmt",
    "fmt_acc",
    "group_table",
    "mechanism_table",
    "plural",
    "risk_table",
    "run_tables",
    "typed_privacy",
]


def fmt(x: object, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if not np.isfinite(x):
            return "∞" if x > 0 else "-"
        return f"{x:.{digits}g}"
    return str(x)


def fmt_acc(x: float | None) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.4f}"


def _fmt_use(x: float | None) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.2f}"


def plural(unit: str, count: int | None = None) -> str:
    """``record`` → ``records`` (``none`` → ``units``)."""
    word = "unit" if unit == "none" else unit
    return word if count == 1 else f"{word}s"


def typed_privacy(summary: dict[str, Any]) -> PrivacySummary | None:
    """The run's typed privacy summary (None in a view that has none)."""
    from pdpfl.ledger import PrivacySummary

    data = summary.get("privacy")
    return PrivacySummary.from_dict(data) if isinstance(data, dict) else None


def group_table(privacy: PrivacySummary, title: str) -> Table:
    """ε spent vs budget per budget group and observer (the rich table)."""
    from rich import box
    from rich.table import Table

    obs = privacy.observers
    short = {"third-party": "3rd", "server": "srv"}
    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for col in (
        "budget ε",
        plural(privacy.unit),
        *(f"max ε\n{'third party' if o == 'third-party' else o}" for o in obs),
        "mean use\n" + " / ".join(short[o] for o in obs),
        "over budget\n" + " / ".join(short[o] for o in obs),
    ):
        t.add_column(col, justify="right", no_wrap=True)
    for g in privacy.groups:
        over = [int(g.over_budget.get(o, 0)) for o in obs]
        t.add_row(
            g.label,
            str(g.units),
            *(fmt(g.spent_max.get(o)) for o in obs),
            " / ".join(_fmt_use(g.mean_utilization(o)) for o in obs),
            " / ".join(str(v) for v in over),
            style="red" if any(over) else None,
        )
    notes = []
    excluded = {g.label: g.excluded for g in privacy.groups if g.excluded}
    if excluded:
        notes.append(
            "excluded (q = 0): " + ", ".join(f"{n} in group {k}" for k, n in excluded.items())
        )
    for g in privacy.groups:
        if g.floor:
            notes.append(
                f"{g.floor} {plural(privacy.unit, g.floor)} contribute almost nothing at "
                f"ε = {g.label} for this plan (δ-only floor: ε = 0 at their rate)"
            )
    if privacy.lifetime and any(g.lifetime_max for g in privacy.groups):
        notes.append(
            "lifetime max ε (all runs on this data): "
            + ", ".join(
                f"{g.label}: " + " / ".join(fmt(g.lifetime_max.get(o)) for o in obs)
                for g in privacy.groups
            )
        )
    notes.append(f"mean use = mean of ε spent / budget over the group's {plural(privacy.unit)}")
    for key, value in privacy.approximate.items():
        notes.append(f"approximate (not a guarantee): {approximate_label(key)} = {fmt(value)}")
    t.caption = "\n".join(notes)
    return t


#: How the approximate figures of a privacy summary are named on the terminal.
_APPROXIMATE = {
    "clt_mu": "μ-GDP by the CLT (largest over clients)",
    "clt_mu_strong": "μ-GDP by the CLT, strong notion √(m−1)·μ",
}
_OBSERVER_WORDS = {"third-party": "third parties", "server": "the server"}


def approximate_label(key: str) -> str:
    """A reader's name for an approximate figure (``gdp-clt_epsilon_max_server`` → ``largest ε
    against the server, gdp-clt accountant``); an unknown key is shown as it is."""
    if key in _APPROXIMATE:
        return _APPROXIMATE[key]
    accountant, sep, observer = key.partition("_epsilon_max_")
    if sep and observer.replace("_", "-") in _OBSERVER_WORDS:
        who = _OBSERVER_WORDS[observer.replace("_", "-")]
        return f"largest ε against {who} ({accountant} accountant)"
    return key


def observers_text(observers: Iterable[object]) -> str:
    """``the server and third parties`` for the observers a number accounts for."""
    words = [_OBSERVER_WORDS.get(str(o), str(o)) for o in observers]
    return " and ".join(words) if words else "nobody"


def lost_silos_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """Headline rows for the silos a deployment lost: who, when, why, and which rounds
    aggregated how many silos (none when no silo was lost)."""
    silos = summary.get("silos") or {}
    lost = list(silos.get("lost") or [])
    if not lost:
        return []
    total = silos.get("total")
    who = "; ".join(
        f"{x['silo']} ({x['reason']})"
        if str(x["reason"]).startswith("round ")
        else f"{x['silo']} (round {x['round']}: {x['reason']})"
        for x in lost
    )
    spans = []
    for run in silos.get("aggregated") or []:
        first, last = run["rounds"]
        rounds = f"round {first}" if first == last else f"rounds {first}–{last}"
        spans.append(f"{rounds}: {run['silos']} of {total}")
    rows = [(f"lost silos ({len(lost)} of {total})", who)]
    if spans:
        rows.append(("silos aggregated", "; ".join(spans)))
    return rows


def risk_table(risk: dict[str, Any], title: str) -> Table:
    """The attack-risk card per budget group and observer (``summary["risk"]``)."""
    from rich import box
    from rich.table import Table

    fprs = list(risk.get("fpr") or [])
    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("budget ε", "observer", *(f"TPR ≤\nat FPR {100 * a:g} %" for a in fprs)):
        t.add_column(col, justify="right", no_wrap=True)
    for label, per in (risk.get("groups") or {}).items():
        for obs, card in per.items():
            t.add_row(label, obs, *(fmt(float(v), 3) for v in card["tpr_max"]))
    t.caption = (
        "the largest true-positive rate any membership attack on one "
        f"{risk.get('unit', 'unit')} of the group reaches at each false-positive rate "
        "(an upper bound, from the accountant's privacy-loss distribution)"
    )
    if risk.get("headline"):
        t.caption += f"\n{risk['headline']}"
    return t


def run_tables(summary: dict[str, Any]) -> list[Any]:
    """The run's headline and its per-budget-group table (rich renderables)."""
    from rich import box
    from rich.table import Table

    title = f"{summary['name']} · {summary['algorithm']} · seed {summary['seed']}"
    head = Table(title=title, show_header=False, box=box.SIMPLE, title_justify="left")
    head.add_column("quantity", style="bold")
    head.add_column("value")
    privacy = typed_privacy(summary)
    unit = str(summary.get("privacy_unit", "record"))
    head.add_row("final test accuracy", fmt(summary.get("final_accuracy")))
    head.add_row("mean of the last 3 rounds", fmt(summary.get("last3_mean_accuracy")))
    head.add_row("final test loss", fmt(summary.get("final_loss")))
    aggregation = summary.get("aggregation") or {}
    if aggregation.get("protocol", "plain") != "plain":
        head.add_row(
            "aggregation",
            f"{aggregation['protocol']} (server sees {aggregation.get('server_sees', 'the sum')})",
        )
    if privacy is None:
        head.add_row(f"{plural(unit)} over budget", "kept at the silos (deployment)")
    elif not privacy.private:
        head.add_row(f"{plural(privacy.unit)} over budget", f"all {privacy.units} (no DP: ε = ∞)")
    else:
        from pdpfl.ledger import observers_of

        u = plural(privacy.unit)
        against = [o for o in observers_of(summary["adversary"]) if o in privacy.observers]
        head.add_row(
            f"{u} over budget",
            f"{summary['over_budget']} of {privacy.units} (against {observers_text(against)})",
        )
        for obs in privacy.observers:
            life = privacy.lifetime_max(obs)
            head.add_row(
                f"max ε ({obs})",
                fmt(privacy.spent_max(obs)) + ("" if life is None else f" · lifetime {fmt(life)}"),
            )
        head.add_row(f"{u} stopped early", str(privacy.stopped))
        if privacy.excluded:
            head.add_row(f"{u} excluded (q = 0)", str(privacy.excluded))
        if privacy.floor:
            head.add_row(f"{u} at the δ-only floor", f"{privacy.floor} (ε = 0: they add ~nothing)")
        if privacy.lifetime:
            head.add_row("lifetime budgets", _lifetime_cell(privacy, summary))
    from pdpfl.ledger.risk import worst_card

    worst = worst_card(summary.get("risk"))
    if worst is not None:  # the accountant's bound on any membership attack (ledger.risk)
        label, obs, tpr = worst
        head.add_row("attack TPR at FPR 1 %", f"≤ {tpr:.3g} (group {label}, {obs})")
    head.add_row(
        "rounds",
        f"{summary['rounds_completed']}"
        + ("" if summary.get("completed", True) else " (interrupted)"),
    )
    for label, value in lost_silos_rows(summary):
        head.add_row(label, value, style="yellow")
    head.add_row("training seconds", f"{summary['seconds']:.1f}")
    out = [head]
    if privacy is not None and privacy.private and privacy.groups:
        out.append(
            group_table(privacy, f"ε spent vs budget, per budget group ({plural(privacy.unit)})")
        )
    return out


def _lifetime_cell(privacy: PrivacySummary, summary: dict[str, Any]) -> str:
    """Whether the budget store limited this run, and how many units earlier runs charged."""
    u = plural(privacy.unit)
    runs = (summary.get("lifetime") or {}).get("earlier_runs")
    earlier = f"{privacy.prior} {u} charged by earlier runs" + (f" ({runs} run(s))" if runs else "")
    if privacy.lifetime == "respend":
        return f"NOT enforced (lifetime.allow_respend); {earlier}"
    return f"enforced; {earlier}"


def compare_table(title: str, table: list[dict[str, Any]]) -> Table:
    """The ``pdpfl compare`` table (± std only when there are several seeds)."""
    from rich import box
    from rich.table import Table

    several = any(r["runs"] > 1 for r in table)
    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column("method", no_wrap=True)
    t.add_column("runs", justify="right")
    t.add_column("accuracy" + ("\nmean ± std" if several else ""), justify="right", no_wrap=True)
    t.add_column("last-3\nmean", justify="right")
    t.add_column("ε", justify="right", no_wrap=True)
    t.add_column("over\nbudget", justify="right", no_wrap=True)
    t.add_column("seconds", justify="right")
    for r in table:
        acc = fmt_acc(r["final_accuracy_mean"])
        if r["runs"] > 1:
            acc += f" ± {fmt_acc(r['final_accuracy_std'])}"
        t.add_row(
            r["method"],
            str(r["runs"]),
            acc,
            fmt_acc(r["last3_mean_accuracy"]),
            _epsilon_cell(r),
            _over_budget_cell(r),
            f"{r['seconds']:.1f}",
        )
    units = dict.fromkeys(r.get("unit", "record") for r in table if r.get("private", True))
    t.caption = "accuracy: pooled test accuracy after the last round; ε and over budget per " + (
        ", ".join(plural(u, 1) for u in units) if units else "record"
    )
    if len(units) > 1:
        t.caption += " (" + ", ".join(f"{r['method']}: {r.get('unit')}" for r in table) + ")"
    return t


def mechanism_table(table: list[dict[str, Any]]) -> Table | None:
    """σ and each privacy group's sampling rate of client-level algorithms (IDP-FedAvg), as a
    second table so the main one stays within 80 columns; ``None`` when no method has them."""
    from rich import box
    from rich.table import Table

    extra = list(
        dict.fromkeys(k for r in table for k in r if k == "sigma" or k.startswith("rate_"))
    )
    if not extra:
        return None
    t = Table(title="mechanism (last seed)", box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column("method", no_wrap=True)
    for k in extra:
        t.add_column("σ" if k == "sigma" else f"q[{k[5:]}]", justify="right", no_wrap=True)
    for r in table:
        t.add_row(r["method"], *[fmt(r.get(k)) for k in extra])
    return t


def _over_budget_cell(row: dict[str, Any]) -> str:
    """A run without DP (ε = ∞): say so instead of a bare count."""
    if not row.get("private", True):
        return "all (no DP)"
    return str(row["over_budget"])


def _epsilon_cell(row: dict[str, Any]) -> str:
    """The headline ε (max over seeds; ∞ without DP; - when the view has none)."""
    if not row.get("private", True):
        return "∞"
    eps = row.get("epsilon")
    if eps is None:
        return "-"
    return "∞" if not np.isfinite(eps) else f"{eps:.4g}"
