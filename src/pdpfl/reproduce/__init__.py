"""``pdpfl reproduce``: each paper's headline experiments, beside the published numbers.

One module per paper (:mod:`~pdpfl.reproduce.rpdp_fl`, :mod:`~pdpfl.reproduce.idp_fedavg`,
:mod:`~pdpfl.reproduce.uldp_fl`, :mod:`~pdpfl.reproduce.prifedsync`) builds its experiments from
the shipped configs (``configs/*.yaml``, the schema of ``pdpfl run``), runs them through
:func:`pdpfl.runtime.simulation.run_simulation` (:mod:`~pdpfl.reproduce.runner`), reads every ε
from the runs' typed privacy summaries, and writes ``REPORT.md`` (:mod:`~pdpfl.reproduce.report`)
with figures in the papers' style (:mod:`~pdpfl.reproduce.figures`) and the papers' own numbers
(:mod:`~pdpfl.reproduce.published`, data files cited by table and figure) beside pdpfl's.

Tiers: ``smoke`` (one tiny experiment per paper, for the test-suite), ``quick`` (every
experiment, shortened: all four papers in under 15 minutes on 2 cores) and ``full`` (the papers'
settings the available data allows; its expected time is printed before it starts).
"""

from __future__ import annotations

import importlib
import math
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar, overload

from pdpfl.reproduce.published import PAPER_KEYS, load_published
from pdpfl.reproduce.report import Report
from pdpfl.reproduce.runner import TIERS, Context

__all__ = ["OUTPUTS", "PAPERS", "TIERS", "expected_seconds", "reproduce"]

#: Paper key -> module implementing ``run(ctx, report)`` and ``expected_seconds(tier)``.
PAPERS: dict[str, str] = {
    "rpdp-fl": "pdpfl.reproduce.rpdp_fl",
    "idp-fedavg": "pdpfl.reproduce.idp_fedavg",
    "uldp-fl": "pdpfl.reproduce.uldp_fl",
    "prifedsync": "pdpfl.reproduce.prifedsync",
}
assert tuple(PAPERS) == PAPER_KEYS

#: What ``pdpfl reproduce`` writes in its output folder (``--force`` replaces these only).
OUTPUTS: tuple[str, ...] = ("REPORT.md", "results.json", "figures", "runs", "budgets", *PAPER_KEYS)


K = TypeVar("K")


@overload
def finite(obj: Mapping[K, object]) -> dict[K, object]: ...


@overload
def finite(obj: object) -> object: ...


def finite(obj: object) -> object:
    """``obj`` with every non-finite float replaced by None (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def _module(paper: str) -> ModuleType:
    return importlib.import_module(PAPERS[paper])


def expected_seconds(paper: str, tier: str) -> float:
    """Rough wall time of ``paper`` (or ``all``) at ``tier`` on a 2-core machine."""
    papers = PAPER_KEYS if paper == "all" else (paper,)
    return float(sum(_module(p).expected_seconds(tier) for p in papers))


def _check(paper: str, tier: str) -> None:
    if paper != "all" and paper not in PAPERS:
        raise ValueError(f"paper: expected one of {', '.join(PAPERS)} or all, got {paper!r}")
    if tier not in TIERS:
        raise ValueError(f"tier: expected one of {', '.join(TIERS)}, got {tier!r}")


def prepare_out(out: Path, force: bool) -> None:
    """pdpfl's overwrite rule for the report folder: a folder that holds anything is refused
    unless ``force``, which removes only :data:`OUTPUTS`."""
    from pdpfl.runtime.outputs import OutputDirError

    if out.exists() and not out.is_dir():
        raise OutputDirError(f"--out: {out} exists and is not a folder")
    if out.is_dir():
        entries = sorted(p.name for p in out.iterdir() if not p.name.startswith(".pdpfl"))
        if entries and not force:
            shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
            raise OutputDirError(
                f"--out: {out} already holds files ({shown}); pass --force to "
                "replace pdpfl's reproduce outputs there, or choose another "
                "folder"
            )
        for name in OUTPUTS:
            p = out / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".pdpfl-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise OutputDirError(
            f"--out: cannot write to {out} ({err.strerror or err}); choose another folder"
        ) from None


def _machine() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores, Python "
        f"{platform.python_version()}; load average {load[0]:.2f} / {load[1]:.2f} / "
        f"{load[2]:.2f} at the start (other work on the machine slows the runs)"
    )


def _command(paper: str, tier: str, seeds: Sequence[int] | None, data_dir: str | None) -> str:
    parts = ["pdpfl reproduce", paper]
    if tier != "full":
        parts.append(f"--{tier}")
    if seeds:
        parts += ["--seeds", *map(str, seeds)]
    if data_dir:
        parts += ["--data-dir", str(data_dir)]
    return " ".join(parts)


def _run_paper(paper: str, ctx: Context, command: str) -> dict[str, Any]:
    pub = load_published(paper)
    mod = _module(paper)
    report = Report(f"Reproducing {pub.title}")
    started = time.perf_counter()
    report.header = [
        f"Paper: {pub.citation()} (text: `{pub.text}`; reference code: `{pub.reference_code}`). "
        f"Tier: **{ctx.tier}**. Machine: {_machine()}.",
        "",
        "Every number labelled *paper* is read from `src/pdpfl/reproduce/published/"
        f"{paper}.json`, where each value cites its table or figure; every ε is read from the "
        'run\'s typed privacy summary (`summary.json["privacy"]`). A difference larger than the '
        "seeds' spread (max of pdpfl's and the paper's standard deviation over seeds) is listed "
        "with its reason and evidence at the end.",
    ]
    ctx.log(f"[{paper}] {ctx.tier} tier -> {ctx.out}")
    mod.run(ctx, report)
    wall = time.perf_counter() - started
    report.header.insert(1, f"Wall time: {wall / 60:.1f} min for {ctx.runs} training runs.")
    report.footer = ["## Rerun", "", "```text", command, "```", ""]
    report.write(ctx.out / "REPORT.md")
    results = {
        "paper": paper,
        "tier": ctx.tier,
        "seconds": round(wall, 1),
        "runs": ctx.runs,
        "differences": [{"what": w, "reason": e.key} for w, e in report.differences],
        "unexplained": report.unexplained,
        "skipped": report.skipped,
        "results": ctx.records,
    }
    from pdpfl.io import write_json

    results = finite(results)
    write_json(ctx.out / "results.json", results)
    ctx.log(f"[{paper}] done in {wall / 60:.1f} min: {ctx.out / 'REPORT.md'}")
    return results


def reproduce(
    paper: str,
    *,
    out: str | os.PathLike[str],
    tier: str = "full",
    seeds: Sequence[int] | None = None,
    data_dir: str | None = None,
    force: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run ``paper`` (or ``all``) at ``tier`` and write ``REPORT.md`` into ``out``.

    Returns ``results.json``'s content (for ``all``: one entry per paper under ``papers``).
    """
    _check(paper, tier)
    if seeds is not None and any(int(s) < 0 for s in seeds):
        raise ValueError("seeds: must be >= 0")
    root = Path(out)
    prepare_out(root, force)
    say = log or (lambda msg: print(msg, file=sys.stderr))
    command = _command(paper, tier, seeds, data_dir)
    papers = list(PAPERS) if paper == "all" else [paper]
    done: dict[str, Any] = {}
    started = time.perf_counter()
    for p in papers:
        target = root / p if paper == "all" else root
        ctx = Context(tier, target, data_dir, tuple(seeds) if seeds else None, log=say)
        done[p] = _run_paper(p, ctx, command)
    if paper != "all":
        result: dict[str, Any] = done[paper]
        return result
    wall = time.perf_counter() - started
    lines = [
        "# pdpfl reproduce: all papers",
        "",
        f"Tier **{tier}**, {wall / 60:.1f} min in total. Machine: {_machine()}.",
        "",
    ]
    for p, res in done.items():
        lines.append(
            f"- [{load_published(p).title}]({p}/REPORT.md): {res['runs']} runs, "
            f"{res['seconds'] / 60:.1f} min, {len(res['differences'])} explained "
            f"difference(s), {len(res['unexplained'])} unexplained"
        )
    from pdpfl.io import write_json, write_text

    write_text(root / "REPORT.md", "\n".join(lines) + "\n")
    summary = finite({"paper": "all", "tier": tier, "seconds": round(wall, 1), "papers": done})
    write_json(root / "results.json", summary)
    return summary
