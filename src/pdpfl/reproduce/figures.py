"""Figures in the papers' style, written atomically as PNG.

* :func:`curves_figure` -- test accuracy per round, one line per method with a band over the
  seeds (min to max), the paper's curve dashed in the same colour (rPDP-FL Fig. 8, ULDP-FL
  Figs. 4-7, PriFedSync Fig. 4.1);
* :func:`budget_figure` -- ε spent vs budget per budget group and method (log scale);
* :func:`xy_figure` -- a quantity against a parameter, pdpfl's points beside the paper's
  (ULDP-FL Fig. 2 and Fig. 10, PriFedSync's μ);
* :func:`bars_figure` -- grouped bars (Tables 2 and 3, ULDP-FL Fig. 12).
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["Panel", "bars_figure", "budget_figure", "curves_figure", "xy_figure"]

_COLOURS = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:gray",
    "tab:olive",
    "tab:cyan",
)


def _plt() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: Path) -> Path:
    from pdpfl.io import write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_bytes(path, buf.getvalue())
    _plt().close(fig)
    return path


@dataclass
class Panel:
    """One accuracy-per-round panel: per method the per-seed curves, and the paper's curve."""

    title: str
    runs: dict[str, list[list[float]]] = field(default_factory=dict)
    published: dict[str, Sequence[float]] = field(default_factory=dict)
    ylabel: str = "test accuracy"


def _band(runs: list[list[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    length = min((len(r) for r in runs), default=0)
    if not length:
        return None
    acc = np.array([r[:length] for r in runs], dtype=float)
    if not np.isfinite(acc).any():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(acc, axis=0), np.nanmin(acc, axis=0), np.nanmax(acc, axis=0)


def curves_figure(path: Path, title: str, panels: Sequence[Panel], *, columns: int = 3) -> Path:
    """A grid of accuracy-per-round panels (see the module docstring)."""
    plt = _plt()
    cols = max(1, min(columns, len(panels)))
    rows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    methods = list(dict.fromkeys(m for p in panels for m in (*p.runs, *p.published)))
    colour = {m: _COLOURS[i % len(_COLOURS)] for i, m in enumerate(methods)}
    for ax, panel in zip(axes.flat, panels, strict=False):
        ax.set_title(panel.title, fontsize=9)
        for m, runs in panel.runs.items():
            band = _band(runs)
            if band is None:
                continue
            mean, lo, hi = band
            x = np.arange(1, mean.size + 1)
            ax.plot(x, mean, color=colour[m], marker="o", ms=2.5, lw=1.4, label=f"{m} (pdpfl)")
            if len(runs) > 1:
                ax.fill_between(x, lo, hi, color=colour[m], alpha=0.18, lw=0)
        for m, curve in panel.published.items():
            if len(curve):
                ax.plot(
                    np.arange(1, len(curve) + 1),
                    curve,
                    color=colour[m],
                    ls="--",
                    lw=1.1,
                    label=f"{m} (paper)",
                )
        ax.set_xlabel("round", fontsize=8)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(
            handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=7, frameon=False
        )
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.08 if handles else 0, 1, 0.95))
    return _save(fig, path)


def budget_figure(
    path: Path, title: str, groups: Mapping[str, Sequence[tuple[str, float, float]]]
) -> Path:
    """ε spent (bars) vs budget (black ticks) per budget group, one bar per method.

    ``groups[method]`` is a list of ``(group label, budget, largest ε spent)``; methods without
    DP (ε = ∞) are drawn as hatched bars at the top of the axis.
    """
    plt = _plt()
    labels = list(dict.fromkeys(g for rows in groups.values() for g, _, _ in rows))
    methods = list(groups)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.2 * len(labels) * max(1, len(methods)) / 2), 3.4))
    width = 0.8 / max(1, len(methods))
    finite = [
        v
        for rows in groups.values()
        for _, b, s in rows
        for v in (b, s)
        if math.isfinite(v) and v > 0
    ]
    top = max(finite, default=1.0) * 4
    for i, m in enumerate(methods):
        for g, budget, spent in groups[m]:
            x = labels.index(g) + (i - (len(methods) - 1) / 2) * width
            inf = not math.isfinite(spent)
            ax.bar(
                x,
                top if inf else max(spent, 1e-6),
                width * 0.9,
                color=_COLOURS[i % len(_COLOURS)],
                hatch="//" if inf else None,
                alpha=0.5 if inf else 0.85,
                label=m if g == groups[m][0][0] else None,
            )
            ax.plot([x - width / 2, x + width / 2], [budget, budget], color="black", lw=1.5)
    ax.set_yscale("log")
    ax.set_xticks(range(len(labels)), [f"ε = {g}" for g in labels], fontsize=8)
    ax.set_ylabel("largest ε spent (bars) vs budget (—)", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return _save(fig, path)


def xy_figure(
    path: Path,
    title: str,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    xlabel: str,
    ylabel: str,
    logy: bool = False,
    logx: bool = False,
    published: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
) -> Path:
    """pdpfl's series (solid, markers) beside the paper's (open markers, dashed)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    names = list(dict.fromkeys([*series, *(published or {})]))
    colour = {m: _COLOURS[i % len(_COLOURS)] for i, m in enumerate(names)}
    for m, (x, y) in series.items():
        ax.plot(x, y, marker="o", ms=3.5, lw=1.4, color=colour[m], label=f"{m} (pdpfl)")
    for m, (x, y) in (published or {}).items():
        ax.plot(
            x, y, marker="s", ms=5, mfc="none", ls="--", lw=1, color=colour[m], label=f"{m} (paper)"
        )
    if logy:
        ax.set_yscale("log")
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def bars_figure(
    path: Path,
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    ylabel: str,
    logy: bool = False,
) -> Path:
    """Grouped bars: one group per category, one bar per series (NaN: no bar)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(categories) * max(1, len(series)) / 2), 3.4))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [c + (i - (len(series) - 1) / 2) * width for c in range(len(categories))]
        ys = [float(v) if v is not None else math.nan for v in values]
        ax.bar(xs, ys, width * 0.9, color=_COLOURS[i % len(_COLOURS)], label=name)
    ax.set_xticks(range(len(categories)), list(categories), fontsize=7)
    if logy:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return _save(fig, path)
