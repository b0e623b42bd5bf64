"""``REPORT.md``: tables with the paper's number beside pdpfl's, verdicts, explanations.

A report opens with its figures, then one section per experiment (each table row: the quantity,
the paper's value with its citation, pdpfl's mean ± std over seeds, and the verdict), then every
difference larger than the seeds' spread with its reason and the evidence behind it (a test or a
measurement made in the same run), the hyper-parameters and where they come from, what was
skipped and the command that fetches the missing data, and how to rerun.

The verdict rule (:func:`verdict`): pdpfl's mean m ± s (over its seeds) and the paper's value p
± s_p (over the paper's seeds, when the paper gives it) *agree* when |m − p| ≤ max(s, s_p); with
one seed and no published spread only equality agrees, so the report says "differs" and the
reason is required.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl.reproduce.published import PublishedEntry

__all__ = [
    "Explanation",
    "Report",
    "Section",
    "Verdict",
    "fmt",
    "fmt_pm",
    "markdown_table",
    "mean_std",
    "verdict",
]


def mean_std(values: Iterable[float | None]) -> tuple[float, float, int]:
    """Mean, sample standard deviation (0 for one value) and count of the finite values."""
    xs = np.array([float(v) for v in values if v is not None and math.isfinite(float(v))])
    if xs.size == 0:
        return math.nan, math.nan, 0
    return float(xs.mean()), float(xs.std(ddof=1)) if xs.size > 1 else 0.0, int(xs.size)


def fmt(x: float | None, digits: int = 4) -> str:
    """A number for a table (``–`` for missing, ``∞`` for infinity)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if math.isinf(x):
        return "∞"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.1f}"
    if x != 0 and abs(x) < 10.0 ** (1 - digits):
        return f"{x:.2g}"
    return f"{x:.{digits}f}"


def fmt_pm(mean: float, std: float, n: int, digits: int = 4) -> str:
    """``m ± s (n)``, or just ``m`` for one value."""
    if n == 0:
        return "–"
    if n == 1:
        return fmt(mean, digits)
    return f"{fmt(mean, digits)} ± {fmt(std, digits)}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table (cells are ``str()``-ed; ``|`` is escaped)."""

    def cell(v: object) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = [
        "| " + " | ".join(cell(h) for h in header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
    ]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class Verdict:
    """pdpfl's number against the paper's (see the module docstring)."""

    ours: float
    ours_std: float
    n: int
    paper: float
    paper_spread: float | None

    @property
    def tolerance(self) -> float:
        return max(self.ours_std if self.n > 1 else 0.0, self.paper_spread or 0.0)

    @property
    def difference(self) -> float:
        return self.ours - self.paper

    @property
    def agrees(self) -> bool:
        if not (math.isfinite(self.ours) and math.isfinite(self.paper)):
            return False
        return abs(self.difference) <= self.tolerance + 1e-12

    def label(self) -> str:
        if not math.isfinite(self.ours):
            return "not measured"
        if self.agrees:
            return "within spread"
        sign = "above" if self.difference > 0 else "below"
        return f"{sign} by {fmt(abs(self.difference), 3)} (spread {fmt(self.tolerance, 3)})"


def verdict(values: Iterable[float | None], entry: PublishedEntry | None) -> Verdict | None:
    """The verdict of pdpfl's per-seed ``values`` against a published number (None without)."""
    if entry is None or entry.value is None:
        return None
    m, s, n = mean_std(values)
    return Verdict(m, s, n, float(entry.value), entry.spread)


@dataclass(frozen=True)
class Explanation:
    """Why pdpfl's number differs from the paper's, and the evidence that shows it."""

    key: str
    reason: str
    evidence: str


#: A gap that one or two seeds cannot resolve: within two binomial standard errors of a test
#: accuracy (the noise of evaluating one run on a finite test set, before any training noise).
FEW_SEEDS = Explanation(
    "few-seeds",
    "Too few seeds to resolve this gap: it is within two standard errors √(p(1−p)/n) of a test "
    "accuracy measured on the run's n test records (each item names its gap, 2·SE and n) -- "
    "the noise of evaluating one run on a finite test set, before any training randomness; "
    "the spread of one or two seeds underestimates it. The full tier's seeds decide.",
    "the gap, 2·SE and n in each item (computed from this run's accuracies and test-set size); "
    "rerun with more `--seeds`.",
)


def binomial_se(accuracy: float, n_test: int) -> float:
    """Standard error of a test accuracy measured on ``n_test`` records."""
    if n_test <= 0 or not math.isfinite(accuracy):
        return math.nan
    p = min(max(accuracy, 0.0), 1.0)
    return math.sqrt(p * (1 - p) / n_test)


def within_test_noise(gap: float, accuracy: float, n_test: int, seeds: int) -> str | None:
    """With at most 2 seeds and ``|gap|`` within 2·SE of the test accuracy: the note that
    goes with :data:`FEW_SEEDS` (None otherwise)."""
    se = binomial_se(accuracy, n_test)
    if seeds > 2 or not math.isfinite(se) or abs(gap) > 2 * se:
        return None
    return f" (gap {abs(gap):.3f}, 2·SE {2 * se:.3f}, n = {n_test}, {seeds} seed(s))"


@dataclass
class Section:
    """One experiment's part of the report."""

    title: str
    blocks: list[str] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (relative path, caption)

    def add(self, text: str) -> None:
        self.blocks.append(text.strip())

    def figure(self, path: str, caption: str) -> None:
        self.figures.append((path, caption))


@dataclass
class Report:
    """A paper's ``REPORT.md`` (see the module docstring)."""

    title: str
    header: list[str] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    differences: list[tuple[str, Explanation]] = field(default_factory=list)
    unexplained: list[str] = field(default_factory=list)
    hyperparameters: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    footer: list[str] = field(default_factory=list)

    def section(self, title: str) -> Section:
        s = Section(title)
        self.sections.append(s)
        return s

    def differ(self, what: str, explanation: Explanation | None) -> None:
        """Record a difference beyond the spread, with its explanation (or as unexplained)."""
        if explanation is None:
            self.unexplained.append(what)
        else:
            self.differences.append((what, explanation))

    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        figures = [f for s in self.sections for f in s.figures]
        if figures:
            out += ["## Figures", ""]
            for path, caption in figures:
                out += [f"![{caption}]({path})", "", f"*{caption}*", ""]
        out += [*self.header, ""]
        for s in self.sections:
            out += [f"## {s.title}", ""]
            for b in s.blocks:
                out += [b, ""]
        out += ["## Differences from the paper beyond the seeds' spread", ""]
        if not self.differences and not self.unexplained:
            out += ["None: every measured number is within the spread of the paper's.", ""]
        grouped: dict[str, tuple[Explanation, list[str]]] = {}
        for what, ex in self.differences:
            grouped.setdefault(ex.key, (ex, []))[1].append(what)
        for ex, whats in grouped.values():
            out += [f"- **{'; '.join(whats)}** — {ex.reason} *Evidence:* {ex.evidence}", ""]
        for what in self.unexplained:
            out += [f"- **{what}** — not explained yet (no known cause; investigate).", ""]
        if self.hyperparameters:
            out += ["## Hyper-parameters", "", *self.hyperparameters, ""]
        if self.skipped:
            out += ["## Skipped (data not present)", ""]
            out += [f"- {s}" for s in self.skipped] + [""]
        out += self.footer
        return "\n".join(out).rstrip() + "\n"

    def write(self, path: Path) -> Path:
        from pdpfl.io import write_text

        write_text(path, self.markdown())
        return path
