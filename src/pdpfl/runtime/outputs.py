"""Run outputs: ``summary.json``, the final model, the silos' ledgers and PNG plots.

Every file is written atomically (:mod:`pdpfl.io`). ``metrics.jsonl`` and the checkpoint are
written every round by :func:`pdpfl.runtime.loop.run_federation`.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl.config import ExperimentConfig, config_hash, config_to_dict
from pdpfl.io import save_npz, write_bytes, write_json
from pdpfl.runtime.loop import _finite, privacy_overview

ADVERSARY_TAGS = {"third-party": ("third_party",), "server": ("server",),
                  "both": ("third_party", "server")}


def per_group(overview: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per budget group: count, budget, max ε spent and mean utilization for both adversaries."""
    groups: dict[str, dict[str, Any]] = {}
    for key, value in overview.items():
        if not key.startswith("group."):
            continue
        label, stat = key[len("group."):].rsplit(".", 1)
        groups.setdefault(label, {})[stat] = value
    out: dict[str, dict[str, Any]] = {}
    for label, stats in groups.items():
        count = int(stats.get("count", 0))
        row: dict[str, Any] = {"count": count, "budget": stats.get("budget")}
        for tag in ("third_party", "server"):
            row[f"max_spent_{tag}"] = stats.get(f"max_spent_{tag}")
            s = stats.get(f"sum_utilization_{tag}")
            row[f"mean_utilization_{tag}"] = (s / count) if (s is not None and count) else None
            row[f"over_budget_{tag}"] = int(stats.get(f"over_budget_{tag}", 0))
        out[label] = row
    return dict(sorted(out.items(), key=lambda kv: (kv[1]["budget"] or 0.0)))


#: What one unit's neighbouring relation is, per privacy unit of the algorithm registry.
NEIGHBOURING = {
    "record": "add/remove one record (rPDP-FL: record-level, per-record ε)",
    "client": "add/remove one client (all of its data)",
    "user": "add/remove one user (all of their records in every silo)",
    "none": "none (no differential privacy)",
}


def privacy_warnings(config: ExperimentConfig, overview: dict[str, Any]) -> list[str]:
    """Warnings a run must show: observers whose view exceeds budgets that were not enforced."""
    out = []
    over_sv = int(overview.get("over_budget_server", 0))
    over_tp = int(overview.get("over_budget_third_party", 0))
    private = bool(overview.get("n_records")) and overview.get("eps_third_party_max") not in (
        None,
        float("inf"),
    )
    if private and config.privacy.adversary == "third-party" and over_sv:
        out.append(
            f"privacy.adversary is third-party: the coordinating server's view exceeds the budget "
            f"of {over_sv} record(s) (it sees which silos took part); use adversary: both to "
            "enforce budgets against the server too"
        )
    if private and config.privacy.adversary == "server" and over_tp:
        out.append(
            f"privacy.adversary is server: third parties' view exceeds the budget of {over_tp} "
            "record(s); use adversary: both"
        )
    if int(overview.get("excluded", 0)):
        out.append(
            f"{int(overview['excluded'])} record(s) were excluded (q = 0: budget below the "
            "smallest achievable ε; privacy.allow_exclusion is on)"
        )
    return out


def build_summary(
    config: ExperimentConfig, result: dict[str, Any], view: str = "operator"
) -> dict[str, Any]:
    """The ``summary.json`` record of a finished (or interrupted) run.

    ``view="operator"`` (simulator): the privacy numbers merge every silo's own summary, which
    only an operator who owns all silos can see. ``view="coordinator"`` (a deployment): the
    silos' summaries stay at the silos; the privacy fields say so.
    """
    from pdpfl.fl.registry import get_algorithm
    from pdpfl.randomness import REPRODUCIBLE_LABEL, SECURE_LABEL

    metrics = result["metrics"]
    accs = [m["accuracy"] for m in metrics if m.get("accuracy") is not None]
    server_state = result.get("server_state") or {}
    unit = get_algorithm(config.algorithm.name).unit
    summary = {
        "name": config.name,
        "algorithm": config.algorithm.name,
        "seed": config.seed,
        "randomness": SECURE_LABEL if config.randomness == "secure" else REPRODUCIBLE_LABEL,
        "privacy_unit": unit,
        "neighbouring": NEIGHBOURING.get(unit, unit),
        "adversary": config.privacy.adversary,
        "rounds_completed": len(metrics),
        "completed": bool(result.get("completed", True)),
        "final_accuracy": accs[-1] if accs else None,
        "last3_mean_accuracy": float(np.mean(accs[-3:])) if accs else None,
        "final_loss": metrics[-1]["loss"] if metrics else None,
        "final_mean_client_accuracy": metrics[-1].get("mean_client_accuracy") if metrics else None,
        "participation": {str(k): v for k, v in server_state.get("participation", {}).items()},
        "empty_rounds": server_state.get("empty_rounds"),
        "seconds": float(result["seconds"]),
        "config": config_to_dict(config),
        "config_hash": config_hash(config),
    }
    summary.update(
        privacy_fields(
            config, result.get("privacy") or {}, view, server=server_state.get("privacy")
        )
    )
    summary["warnings"] = list(summary["warnings"]) + list(server_state.get("warnings") or [])
    summary["epsilon"] = headline_epsilon(config, summary["eps_spent_max"])
    return summary


def headline_epsilon(config: ExperimentConfig, eps_spent_max: dict[str, Any]) -> float | None:
    """The run's headline ε: the largest ε spent by any unit against the configured
    observer(s) (``inf`` without DP; ``None`` when not known in this view)."""
    values = [eps_spent_max.get(t) for t in ADVERSARY_TAGS[config.privacy.adversary]]
    if not values or any(v is None for v in values):
        return None
    return float(max(values))


def privacy_fields(
    config: ExperimentConfig,
    silo_summaries: dict[int, Any],
    view: str,
    server: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary's privacy headline from silo summaries (empty in the coordinator's view).

    ``server``: the server algorithm's own privacy view (e.g. ULDP-FL's user-level ledger,
    which lives at the server), merged in every view.

    ``view``: ``operator`` (the simulator, which owns every silo), ``operator-collected`` (the
    loopback Flower launcher, which reads the local silos' state folders after the run) or
    ``coordinator`` (a deployment: silo summaries stay at the silos).
    """
    labels = {
        "operator": "operator: merged from every silo's own summary (simulator)",
        "operator-collected": "operator: collected from the local silos' state folders "
        "after the run (loopback launcher)",
        "coordinator": "coordinator: per-record privacy summaries stay at the silos",
    }
    if view == "coordinator" and server:
        silo_summaries = {}
    elif view == "coordinator":
        return {
            "privacy_view": labels[view],
            "over_budget": None,
            "over_budget_third_party": None,
            "over_budget_server": None,
            "records": None,
            "records_stopped": None,
            "records_excluded": None,
            "warnings": [],
            "eps_spent_max": {"third_party": None, "server": None},
            "per_group": {},
        }
    overview = privacy_overview(
        {**silo_summaries, "server": server} if server else silo_summaries
    )
    tags = ADVERSARY_TAGS[config.privacy.adversary]
    return {
        "privacy_view": labels.get(view, view),
        "over_budget": max(int(overview.get(f"over_budget_{t}", 0)) for t in tags),
        "over_budget_third_party": int(overview.get("over_budget_third_party", 0)),
        "over_budget_server": int(overview.get("over_budget_server", 0)),
        "records": int(overview.get("n_records", 0)),
        "records_stopped": int(overview.get("stopped", 0)),
        "records_excluded": int(overview.get("excluded", 0)),
        "warnings": privacy_warnings(config, overview),
        "eps_spent_max": {
            "third_party": overview.get("eps_third_party_max"),
            "server": overview.get("eps_server_max"),
        },
        "per_group": per_group(overview),
    }


def write_outputs(
    config: ExperimentConfig,
    result: dict[str, Any],
    out_dir: str | Path,
    *,
    clients: dict[int, Any] | None = None,
    plots: bool = True,
    view: str = "operator",
) -> dict[str, Any]:
    """Write ``summary.json``, ``model.npz``, ``ledgers/`` and plots; return the summary."""
    out = Path(out_dir)
    summary = build_summary(config, result, view=view)
    save_npz(out / "model.npz", **{f"p{i:03d}": p for i, p in enumerate(result["params"])})
    for cid, client in (clients or {}).items():
        ledger = getattr(client, "ledger", None)
        if ledger is not None:
            ledger.save(out / "ledgers" / f"client_{cid}.npz")
    if plots:
        write_plots(result["metrics"], summary, out)
    write_json(out / "summary.json", _finite(summary))
    return summary


def write_plots(metrics: list[dict[str, Any]], summary: dict[str, Any], out: Path) -> None:
    """``accuracy.png`` (pooled test accuracy per round) and ``epsilon.png`` (ε spent vs budget)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [m["round"] + 1 for m in metrics]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(rounds, [m["accuracy"] for m in metrics], marker="o", ms=3, label="pooled")
    ax.plot(rounds, [m.get("mean_client_accuracy") for m in metrics], ls="--", label="client mean")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{summary['name']} ({summary['algorithm']})")
    ax.legend()
    fig.tight_layout()
    _save_fig(fig, out / "accuracy.png")
    plt.close(fig)

    groups = summary["per_group"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    if groups:
        labels = list(groups)
        x = np.arange(len(labels))
        budget = [_num(g["budget"]) for g in groups.values()]
        tp = [_num(g["max_spent_third_party"]) for g in groups.values()]
        sv = [_num(g["max_spent_server"]) for g in groups.values()]
        ax.bar(x - 0.27, budget, 0.27, label="budget")
        ax.bar(x, tp, 0.27, label="max spent (third party)")
        ax.bar(x + 0.27, sv, 0.27, label="max spent (server)")
        ax.set_xticks(x, labels)
        ax.set_xlabel("budget group")
        ax.set_ylabel("ε")
        ax.legend(fontsize=7)
        raw = [g["max_spent_third_party"] for g in groups.values()]
        if any(v is None or not np.isfinite(v) for v in raw):
            ax.set_title("ε spent vs budget (no DP: ε = ∞, not drawn)")
    if not ax.get_title():
        ax.set_title("ε spent vs budget")
    fig.tight_layout()
    _save_fig(fig, out / "epsilon.png")
    plt.close(fig)


def _num(x: Any) -> float:
    """A bar height: None/NaN/inf become 0 (nothing drawn)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if np.isfinite(v) else 0.0


def _save_fig(fig: Any, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_bytes(path, buf.getvalue())
