"""The run's plots: ``accuracy.png`` (test accuracy per round) and ``epsilon.png`` (ε spent vs
budget per budget group and observer, in the run's unit). Both read the run's ``summary.json``
record; ``epsilon.png`` reads its typed privacy summary (``summary["privacy"]``).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsFloat, TypeVar

import numpy as np

from pdpfl.io import write_bytes
from pdpfl.ledger import PrivacySummary

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_M = TypeVar("_M", float, None)

__all__ = [
    "accuracy_figure",
    "epsilon_figure",
    "import_matplotlib",
    "missing_glyphs_quiet",
    "new_figure",
    "nothing_to_draw",
    "save_figure",
    "write_plots",
]


@contextlib.contextmanager
def missing_glyphs_quiet() -> Iterator[None]:
    """Drawing without matplotlib's one warning per character its font lacks (a run named in
    Chinese, Greek or Hebrew would print dozens): such characters are drawn as boxes, and the
    name is intact in ``summary.json`` and on the terminal."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
        yield


def import_matplotlib() -> None:
    """Import what :func:`write_plots` draws with (``Figure``, the Agg canvas, ``ticker``) now.

    For a caller that will draw the plots and can import them earlier at less cost: ``pdpfl
    run`` does it while the garbage collector is paused (:mod:`pdpfl.cli._process`).
    """
    import matplotlib.backends.backend_agg
    import matplotlib.figure
    import matplotlib.ticker  # noqa: F401


def write_plots(metrics: list[dict[str, Any]], summary: dict[str, Any], out: Path) -> None:
    """``accuracy.png`` (pooled test accuracy per round) and ``epsilon.png`` (ε spent vs budget).

    The figures are plain :class:`matplotlib.figure.Figure` objects rendered by the Agg canvas:
    pyplot (its backend selection and figure manager, ~0.3 s to import) is never loaded.
    """
    with missing_glyphs_quiet():
        for name, fig in (
            ("accuracy.png", accuracy_figure(metrics, summary)),
            ("epsilon.png", epsilon_figure(summary)),
        ):
            save_figure(fig, out / name)


def new_figure(width: float, height: float) -> tuple[Figure, Axes]:
    """A pyplot-free figure with one axes, drawn by the Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    ax: Axes = fig.subplots()
    return fig, ax


def nothing_to_draw(ax: Axes, why: str) -> None:
    """Say in the plot itself why it is empty (instead of drawing empty axes)."""
    ax.text(
        0.5,
        0.5,
        f"nothing to draw:\n{why}",
        ha="center",
        va="center",
        wrap=True,
        transform=ax.transAxes,
        fontsize=9,
    )
    ax.set_xticks([])
    ax.set_yticks([])


def accuracy_figure(metrics: list[dict[str, Any]], summary: dict[str, Any]) -> Figure:
    """Pooled and client-mean test accuracy per round (a note when nothing was measured)."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = new_figure(5, 3.2)
    ax.set_title(f"{summary['name']} ({summary['algorithm']})")
    rounds = [m["round"] + 1 for m in metrics]
    pooled = [_num(m.get("accuracy"), None) for m in metrics]
    if not metrics:
        nothing_to_draw(ax, "no round completed")
    elif all(v is None for v in pooled):
        nothing_to_draw(ax, "no silo has test records, so no accuracy was measured")
    else:
        ax.plot(
            rounds, [np.nan if v is None else v for v in pooled], marker="o", ms=3, label="pooled"
        )
        ax.plot(
            rounds,
            [_num(m.get("mean_client_accuracy"), np.nan) for m in metrics],
            ls="--",
            label="client mean",
        )
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
    fig.tight_layout()
    return fig


def _typed(summary: dict[str, Any]) -> PrivacySummary | None:
    data = summary.get("privacy")
    return PrivacySummary.from_dict(data) if isinstance(data, dict) else None


def epsilon_figure(summary: dict[str, Any]) -> Figure:
    """Max ε spent per budget group against its budget, per observer, on a log scale.

    The budget of each group is a black line; the bars are the largest ε any unit of the group
    (record, client or user: the run's unit) spent against third parties and against the
    server. Groups with excluded units (q = 0) and groups with units over budget are marked.
    """
    fig, ax = new_figure(5.5, 3.4)
    privacy = _typed(summary)
    unit = privacy.unit if privacy is not None else str(summary.get("privacy_unit", "unit"))
    ax.set_title(f"ε spent vs budget per budget group ({unit} level)")
    if privacy is None or not privacy.groups:
        why = (
            f"the per-{unit} privacy summaries stay at the silos"
            if str(summary.get("privacy_view", "")).startswith("coordinator")
            else "no privacy accounting in this run"
        )
        nothing_to_draw(ax, why)
        fig.tight_layout()
        return fig
    groups = privacy.groups
    x = np.arange(len(groups))
    budget = [_num(g.budget_max, None) for g in groups]
    spent = {o: [_num(g.spent_max.get(o), None) for g in groups] for o in privacy.observers}
    positive = [
        v for v in (*budget, *(v for vs in spent.values() for v in vs)) if v is not None and v > 0
    ]
    if not positive:
        nothing_to_draw(ax, "no finite ε was spent or budgeted")
        fig.tight_layout()
        return fig
    ax.set_yscale("log")
    lo, hi = min(positive) / 4, max(positive) * 6
    w = 0.72 / max(len(spent), 1)
    colors = {"third-party": "tab:blue", "server": "tab:orange"}
    if privacy.private:
        for k, (obs, values) in enumerate(spent.items()):
            offset = (k - (len(spent) - 1) / 2) * w
            ax.bar(
                x + offset,
                [v or 0.0 for v in values],
                w,
                bottom=0,
                label=f"max spent ({obs})",
                color=colors.get(obs),
            )
    ax.hlines(
        [b if b is not None else np.nan for b in budget],
        x - 0.45,
        x + 0.45,
        colors="black",
        linewidth=2,
        label="budget",
    )
    for k, g in enumerate(groups):
        notes = []
        over = [int(g.over_budget.get(o, 0)) for o in privacy.observers]
        if any(over) and privacy.private:
            notes.append("over budget " + "/".join(str(v) for v in over))
        if g.excluded:
            notes.append(f"excluded {g.excluded}")
        if notes:
            top = max(
                v for v in (budget[k], *(vs[k] for vs in spent.values()), lo) if v is not None
            )
            ax.text(
                x[k],
                top * 1.4,
                "\n".join(notes),
                ha="center",
                va="bottom",
                fontsize=7,
                color="tab:red",
            )
    ax.set_ylim(lo, hi)
    ax.set_xticks(x, [g.label for g in groups])
    ax.set_xlabel(f"budget group (ε; {unit}s)")
    ax.set_ylabel("ε (log scale)")
    if not privacy.private:
        ax.set_title(f"ε spent vs budget ({unit} level; no DP: ε = ∞, not drawn)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def _num(x: SupportsFloat | str | None, missing: _M) -> float | _M:
    """A finite float, or ``missing`` for None/NaN/inf (nothing drawn)."""
    if x is None:
        return missing
    try:
        v = float(x)
    except (TypeError, ValueError):
        return missing
    return v if np.isfinite(v) else missing


def save_figure(fig: Figure, path: Path) -> None:
    """``fig`` as a PNG at ``path`` (atomically, :func:`pdpfl.io.write_bytes`)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_bytes(path, buf.getvalue())
