"""Run outputs: ``summary.json``, the final model, the silos' ledgers and PNG plots.

Every file is written atomically (:mod:`pdpfl.io`). ``metrics.jsonl`` and the checkpoint are
written every round by :func:`pdpfl.runtime.loop.run_federation`.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl.config import ExperimentConfig, config_hash, config_to_dict
from pdpfl.io import save_npz, write_bytes, write_json
from pdpfl.runtime.loop import (
    CHECKPOINT_NAME,
    LEGACY_CHECKPOINT_NAME,
    METRICS_NAME,
    _finite,
    has_checkpoint,
    privacy_overview,
)

#: What a run writes into its output folder; ``overwrite=True`` removes exactly these.
RUN_OUTPUTS = (
    CHECKPOINT_NAME,
    LEGACY_CHECKPOINT_NAME,
    METRICS_NAME,
    "summary.json",
    "model.npz",
    "accuracy.png",
    "epsilon.png",
    "ledgers",
    "flower",
    "budgets.csv",
)


class OutputDirError(ValueError):
    """The output folder cannot be used (not a folder, not writable, or holds other files)."""


def prepare_output_dir(
    out_dir: str | os.PathLike[str],
    *,
    resume: bool = False,
    overwrite: bool = False,
    option: str = "out_dir",
    flags: tuple[str, str] = ("overwrite=True", "resume=True"),
    outputs: tuple[str, ...] = RUN_OUTPUTS,
) -> Path:
    """Apply pdpfl's one overwrite rule to ``out_dir`` and make sure it is a writable folder.

    The rule (CLI, :func:`~pdpfl.runtime.simulation.run_simulation` and ``pdpfl compare``): a
    folder that holds anything is refused unless ``overwrite`` (pdpfl's own outputs in it are
    removed, other files are left alone) or ``resume`` (the folder must hold a run checkpoint).
    A missing folder is created. Problems raise :class:`OutputDirError` naming ``option`` and
    the remedy (``flags`` are the overwrite/resume spellings to suggest).
    """
    out = Path(out_dir)
    force_flag, resume_flag = flags
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"{option}: {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".pdpfl-write-test-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OutputDirError(
            f"{option}: cannot write to {out} ({err.strerror or err}); choose another folder"
        ) from None
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return out
    shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
    if resume:
        if has_checkpoint(out):
            return out
        raise OutputDirError(
            f"{option}: nothing to resume in {out} (no {CHECKPOINT_NAME}; it holds {shown}); "
            f"pass {force_flag} to start a new run there, or choose another folder"
        )
    if overwrite:
        for name in outputs:
            target = out / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
        return out
    if has_checkpoint(out):
        raise OutputDirError(
            f"{option}: {out} already holds a run; pass {resume_flag} to continue it, "
            f"{force_flag} to overwrite it, or choose another folder"
        )
    raise OutputDirError(
        f"{option}: {out} is not empty (it holds {shown}); pass {force_flag} to overwrite "
        "pdpfl's outputs there, or choose another folder"
    )


ADVERSARY_TAGS = {"third-party": ("third_party",), "server": ("server",),
                  "both": ("third_party", "server")}


def per_group(overview: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per budget group: count, budget, excluded records (q = 0), max ε spent and mean
    utilization for both adversaries."""
    groups: dict[str, dict[str, Any]] = {}
    for key, value in overview.items():
        if not key.startswith("group."):
            continue
        label, stat = key[len("group."):].rsplit(".", 1)
        groups.setdefault(label, {})[stat] = value
    out: dict[str, dict[str, Any]] = {}
    for label, stats in groups.items():
        count = int(stats.get("count", 0))
        row: dict[str, Any] = {
            "count": count,
            "budget": stats.get("budget"),
            "excluded": int(stats.get("excluded", 0)),
        }
        for tag in ("third_party", "server"):
            row[f"max_spent_{tag}"] = stats.get(f"max_spent_{tag}")
            s = stats.get(f"sum_utilization_{tag}")
            row[f"mean_utilization_{tag}"] = (s / count) if (s is not None and count) else None
            row[f"over_budget_{tag}"] = int(stats.get(f"over_budget_{tag}", 0))
        for extra in ("rate", "noise_multiplier"):  # client-level algorithms (IDP-FedAvg)
            if extra in stats:
                row[extra] = stats[extra]
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
    if int(overview.get("capped", 0)):
        out.append(
            f"{int(overview['capped'])} record(s) have budgets above ε_max and were trained at "
            "q = 1, spending less than their budget (budgets.cap_at_epsilon_max is on)"
        )
    return out


def aggregation_fields(config: ExperimentConfig) -> dict[str, Any]:
    """How updates were summed and what that means for the server observer."""
    hidden = getattr(config, "participation", "visible") == "hidden"
    private_weights = getattr(config.algorithm, "weights", None) == "private"
    protocol = "private-weighting" if private_weights else config.aggregation
    out: dict[str, Any] = {
        "protocol": protocol,
        "participation": "hidden" if hidden else "visible",
        "server_sees": (
            "every update" if protocol == "plain" else "only the sum of the updates"
        ),
    }
    if hidden:
        out["server_observer"] = (
            "accounted like the third party (λ-amplified, rPDP-FL Theorem 1): every silo sends "
            "a masked contribution every round, so the server cannot tell who took part"
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
        "aggregation": aggregation_fields(config),
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
            "records_capped": None,
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
        "records_capped": int(overview.get("capped", 0)),
        "warnings": privacy_warnings(config, overview),
        "eps_spent_max": {
            "third_party": overview.get("eps_third_party_max"),
            "server": overview.get("eps_server_max"),
        },
        "per_group": per_group(overview),
        **(
            {"noise_multiplier": overview["noise_multiplier"]}
            if "noise_multiplier" in overview
            else {}
        ),
    }


def write_outputs(
    config: ExperimentConfig,
    result: dict[str, Any],
    out_dir: str | Path,
    *,
    clients: dict[int, Any] | None = None,
    plots: bool = True,
    view: str = "operator",
    warnings: list[str] | None = None,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``summary.json``, ``model.npz``, ``ledgers/`` and plots; return the summary (as
    written: values that are not finite numbers, such as ε = ∞ without DP, are None).

    ``warnings`` (problems found before training, e.g. silos without test records) are
    listed first in the summary's ``warnings``; ``data`` describes the federation trained on
    (``summary["data"]``).
    """
    out = Path(out_dir)
    summary = build_summary(config, result, view=view)
    if warnings:
        summary["warnings"] = [*warnings, *summary.get("warnings", [])]
    if data is not None:
        summary["data"] = data
    save_npz(out / "model.npz", **{f"p{i:03d}": p for i, p in enumerate(result["params"])})
    for cid, client in (clients or {}).items():
        ledger = getattr(client, "ledger", None)
        if ledger is not None:
            ledger.save(out / "ledgers" / f"client_{cid}.npz")
    summary = _finite(summary)  # what is returned is what is on disk: NaN/inf become None
    if plots:
        write_plots(result["metrics"], summary, out)
    write_json(out / "summary.json", summary)
    return summary


def write_plots(metrics: list[dict[str, Any]], summary: dict[str, Any], out: Path) -> None:
    """``accuracy.png`` (pooled test accuracy per round) and ``epsilon.png`` (ε spent vs budget)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, fig in (("accuracy.png", accuracy_figure(metrics, summary)),
                      ("epsilon.png", epsilon_figure(summary))):
        _save_fig(fig, out / name)
        plt.close(fig)


def _nothing_to_draw(ax: Any, why: str) -> None:
    """Say in the plot itself why it is empty (instead of drawing empty axes)."""
    ax.text(0.5, 0.5, f"nothing to draw:\n{why}", ha="center", va="center", wrap=True,
            transform=ax.transAxes, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def accuracy_figure(metrics: list[dict[str, Any]], summary: dict[str, Any]) -> Any:
    """Pooled and client-mean test accuracy per round (a note when nothing was measured)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.set_title(f"{summary['name']} ({summary['algorithm']})")
    rounds = [m["round"] + 1 for m in metrics]
    pooled = [_num(m.get("accuracy"), None) for m in metrics]
    if not metrics:
        _nothing_to_draw(ax, "no round completed")
    elif all(v is None for v in pooled):
        _nothing_to_draw(ax, "no silo has test records, so no accuracy was measured")
    else:
        ax.plot(rounds, [np.nan if v is None else v for v in pooled], marker="o", ms=3,
                label="pooled")
        ax.plot(rounds, [_num(m.get("mean_client_accuracy"), np.nan) for m in metrics],
                ls="--", label="client mean")
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend()
    fig.tight_layout()
    return fig


def epsilon_figure(summary: dict[str, Any]) -> Any:
    """Max ε spent per budget group against its budget, on a log scale.

    The budget of each group is a black line; the bars are the largest ε any record of the group
    spent against third parties and against the server. Groups with excluded records (q = 0)
    and groups with records over budget are marked above their bars.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    groups = summary.get("per_group") or {}
    ax.set_title("ε spent vs budget per budget group")
    if not groups:
        why = ("the per-record privacy summaries stay at the silos"
               if str(summary.get("privacy_view", "")).startswith("coordinator")
               else "no privacy accounting in this run")
        _nothing_to_draw(ax, why)
        fig.tight_layout()
        return fig
    labels = list(groups)
    x = np.arange(len(labels))
    rows = list(groups.values())
    budget = [_num(g.get("budget"), None) for g in rows]
    tp = [_num(g.get("max_spent_third_party"), None) for g in rows]
    sv = [_num(g.get("max_spent_server"), None) for g in rows]
    positive = [v for v in (*budget, *tp, *sv) if v is not None and v > 0]
    if not positive:
        _nothing_to_draw(ax, "no finite ε was spent or budgeted")
        fig.tight_layout()
        return fig
    ax.set_yscale("log")
    lo, hi = min(positive) / 4, max(positive) * 6
    w = 0.36
    infinite = any(g.get("max_spent_third_party") is None
                   or not np.isfinite(float(g["max_spent_third_party"])) for g in rows)
    if not infinite:
        ax.bar(x - w / 2, [v or 0.0 for v in tp], w, bottom=0, label="max spent (third party)",
               color="tab:blue")
        ax.bar(x + w / 2, [v or 0.0 for v in sv], w, bottom=0, label="max spent (server)",
               color="tab:orange")
    ax.hlines([b if b is not None else np.nan for b in budget], x - 0.45, x + 0.45,
              colors="black", linewidth=2, label="budget")
    for k, g in enumerate(rows):
        notes = []
        over = (int(g.get("over_budget_third_party") or 0), int(g.get("over_budget_server") or 0))
        if any(over) and not infinite:
            notes.append(f"over budget {over[0]}/{over[1]}")
        if int(g.get("excluded") or 0):
            notes.append(f"excluded {int(g['excluded'])}")
        if notes:
            top = max(v for v in (budget[k], tp[k], sv[k], lo) if v is not None)
            ax.text(x[k], top * 1.4, "\n".join(notes), ha="center", va="bottom", fontsize=7,
                    color="tab:red")
    ax.set_ylim(lo, hi)
    ax.set_xticks(x, labels)
    ax.set_xlabel("budget group (ε)")
    ax.set_ylabel("ε (log scale)")
    if infinite:
        ax.set_title("ε spent vs budget (no DP: ε = ∞, not drawn)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def _num(x: Any, missing: Any = 0.0) -> Any:
    """A finite float, or ``missing`` for None/NaN/inf (nothing drawn)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return missing
    return v if np.isfinite(v) else missing


def _save_fig(fig: Any, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_bytes(path, buf.getvalue())
