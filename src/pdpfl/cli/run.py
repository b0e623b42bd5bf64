"""`pdpfl run` and `pdpfl compare`: train a federation from a YAML config, compare methods.

Bad input (config problems, unknown methods, missing data) prints ``error: ...`` naming the
field or option and exits 2 before anything is written.
"""

from __future__ import annotations

import csv
import io
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import typer

from pdpfl.cli._common import fail, print_json

def _load(config_path: Path, overrides: list[str] | None, data_dir: str | None):
    from pdpfl.config import ConfigError, load_config

    try:
        return load_config(config_path, overrides or [], data_dir=data_dir)
    except ConfigError as err:
        fail("\n".join(err.problems) if len(err.problems) > 1 else err.problems[0])


def _load_federation(config: Any) -> Any:
    from pdpfl.runtime.simulation import load_federation_for

    try:
        return load_federation_for(config)
    except (ValueError, FileNotFoundError, KeyError, TypeError) as err:
        fail(f"data: {err}")


def _print_run_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    head = Table(title=f"{summary['name']} - {summary['algorithm']} (seed {summary['seed']})")
    head.add_column("final accuracy", justify="right")
    head.add_column("last-3 mean", justify="right")
    head.add_column("final loss", justify="right")
    head.add_column("over budget", justify="right")
    head.add_column("records stopped", justify="right")
    head.add_column("seconds", justify="right")
    head.add_row(
        _fmt(summary["final_accuracy"]),
        _fmt(summary["last3_mean_accuracy"]),
        _fmt(summary["final_loss"]),
        str(summary["over_budget"]),
        f"{summary['records_stopped']}/{summary['records']}",
        f"{summary['seconds']:.1f}",
    )
    console.print(head)
    if summary["per_group"]:
        t = Table(title="ε spent vs budget per budget group")
        for col in ("group", "records", "budget", "max ε third party", "mean util. third party",
                    "max ε server", "mean util. server", "over budget (3rd/srv)"):
            t.add_column(col, justify="right")
        for label, g in summary["per_group"].items():
            t.add_row(
                label, str(g["count"]), _fmt(g["budget"]),
                _fmt(g["max_spent_third_party"]), _fmt(g["mean_utilization_third_party"]),
                _fmt(g["max_spent_server"]), _fmt(g["mean_utilization_server"]),
                f"{g['over_budget_third_party']}/{g['over_budget_server']}",
            )
        console.print(t)


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def run_command(
    config_path: Path = typer.Argument(..., help="Experiment YAML (see examples/)."),
    out: Path | None = typer.Option(None, "--out", help="Output folder (default: output_dir)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in --out."),
    overrides: list[str] | None = typer.Option(
        None, "--set", help="key=value override (dotted; 'rounds' is T). Repeatable."
    ),
    data_dir: str | None = typer.Option(None, "--data-dir", help="Folder with the dataset files."),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json instead of tables."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    runtime: str | None = typer.Option(
        None, "--runtime", help="simulation (in-process) or flower (overrides the config)."
    ),
) -> None:
    """Train one federation (rPDP-FL or a baseline) and write metrics, summary, ledgers, plots."""
    extra = [*(overrides or []), *([f"runtime={runtime}"] if runtime is not None else [])]
    config = _load(config_path, extra, data_dir)
    out_dir = Path(out) if out is not None else Path(config.output_dir)
    from pdpfl.runtime.loop import has_checkpoint

    if not resume and has_checkpoint(out_dir):
        fail(f"--out: {out_dir} already holds a run; pass --resume or choose another folder")
    if config.runtime == "flower":
        from pdpfl.fl.registry import get_algorithm

        if get_algorithm(config.algorithm.name).simulation_only:
            fail(
                f"algorithm.name: {config.algorithm.name!r} runs only in the simulator "
                "(--runtime simulation)"
            )
        from pdpfl.runtime.flower import FlowerRunError, run_flower  # lazy: flwr is optional

        try:
            summary = run_flower(config, out_dir, resume)
        except FlowerRunError as err:  # a runtime failure, not bad input: exit 1, no traceback
            typer.echo(f"error: Flower federation failed: {err} (logs in {out_dir / 'flower'})", err=True)
            raise typer.Exit(code=1) from err
    else:
        summary = _simulate(config, out_dir, resume, progress=not (quiet or as_json))
    for warning in summary.get("warnings", []):
        typer.echo(f"warning: {warning}", err=True)
    if as_json:
        print_json(summary)
    else:
        _print_run_table(summary)
        typer.echo(f"outputs written to {out_dir}")


def _simulate(
    config: Any, out_dir: Path, resume: bool, *, progress: bool, federation: Any = None
) -> dict[str, Any]:
    from pdpfl.runtime.simulation import run_simulation

    if federation is None:
        federation = _load_federation(config)
    existed = out_dir.exists()
    try:
        return run_simulation(config, out_dir, resume, progress=progress, federation=federation)
    except ValueError as err:
        # Configuration problems discovered while building the mechanism: leave nothing behind.
        if not existed and out_dir.exists() and not (out_dir / "metrics.jsonl").exists():
            shutil.rmtree(out_dir, ignore_errors=True)
        fail(str(err))


def _method_overrides(method: str) -> list[str]:
    from pdpfl.fl.registry import get_method

    try:
        return get_method(method)[1]
    except ValueError as err:
        fail(f"--methods: {err}")


def compare_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per method: mean ± std (over seeds) of the final accuracy (Figure 8 of the paper)."""
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        acc = np.array([r["final_accuracy"] for r in mine], dtype=float)
        last3 = np.array([r["last3_mean_accuracy"] for r in mine], dtype=float)
        out.append({
            "method": method,
            "runs": len(mine),
            "final_accuracy_mean": float(acc.mean()),
            "final_accuracy_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
            "last3_mean_accuracy": float(last3.mean()),
            "over_budget": int(sum(r["over_budget"] for r in mine)),
            "epsilon": _max_epsilon([r.get("epsilon") for r in mine]),
            "seconds": float(sum(r["seconds"] for r in mine)),
        })
    return out


def _max_epsilon(values: list[Any]) -> float | None:
    """Largest headline ε over seeds (inf without DP; None if a run did not report one)."""
    if not values or any(v is None for v in values):
        return None
    return float(max(float(v) for v in values))


def _multi_values(args: list[str]) -> dict[str, list[str]]:
    """Parse ``--methods A B C --seeds 1 2`` (several values after one option) from extra args."""
    values: dict[str, list[str]] = {}
    current: str | None = None
    for token in args:
        if token.startswith("--"):
            name, _, inline = token.partition("=")
            if name not in ("--methods", "--seeds"):
                fail(f"{name}: no such option (see pdpfl compare --help)")
            current = name
            values.setdefault(name, [])
            if inline:
                values[name].extend(v for v in inline.split(",") if v)
        elif current is None:
            fail(f"unexpected argument {token!r} (give --methods and --seeds values after them)")
        else:
            values[current].extend(v for v in token.split(",") if v)
    return values


def compare_command(
    ctx: typer.Context,
    config_path: Path = typer.Argument(..., help="Experiment YAML (see examples/)."),
    csv_path: Path | None = typer.Option(None, "--csv", help="Write one row per (method, seed)."),
    out: Path | None = typer.Option(None, "--out", help="Keep each run's outputs under DIR."),
    overrides: list[str] | None = typer.Option(None, "--set", help="key=value override."),
    data_dir: str | None = typer.Option(None, "--data-dir", help="Folder with the dataset files."),
    as_json: bool = typer.Option(False, "--json", help="Print the table as one JSON object."),
) -> None:
    """Run several methods over several seeds and print mean ± std of the final accuracy.

    Also takes --methods M [M ...] (any registered method, e.g. rpdp minimum dropout
    privacy-free uniform:EPS centralized; default: the first four) and --seeds S [S ...]
    (default: the config's seed).
    """
    extra = _multi_values(list(ctx.args))
    methods = extra.get("--methods") or ["rpdp", "minimum", "dropout", "privacy-free"]
    try:
        seeds = [int(s) for s in extra.get("--seeds", [])]
    except ValueError:
        fail(f"--seeds: expected integers, got {extra.get('--seeds')}")
    if any(s < 0 for s in seeds):
        fail("--seeds: seeds must be >= 0")
    from pdpfl.config import ConfigError, with_updates

    base = _load(config_path, overrides, data_dir)
    seeds = seeds or [base.seed]
    configs = {}
    for method in methods:
        for seed in seeds:
            try:
                configs[method, seed] = with_updates(base, [*_method_overrides(method), f"seed={seed}"])
            except ConfigError as err:
                fail(f"--methods {method}: " + "; ".join(err.problems))
    keep = out is not None
    root = Path(out) if keep else Path(tempfile.mkdtemp(prefix="pdpfl-compare-"))
    rows: list[dict[str, Any]] = []
    try:
        federations: dict[int, Any] = {}
        for (method, seed), cfg in configs.items():
            if seed not in federations:
                federations[seed] = _load_federation(cfg)
            run_dir = root / method.replace(":", "-") / f"seed{seed}"
            if run_dir.exists():
                shutil.rmtree(run_dir)
            summary = _simulate(cfg, run_dir, False, progress=False, federation=federations[seed])
            row = {
                "method": method,
                "seed": seed,
                "final_accuracy": summary["final_accuracy"],
                "last3_mean_accuracy": summary["last3_mean_accuracy"],
                "over_budget": summary["over_budget"],
                "epsilon": summary.get("epsilon"),
                "seconds": round(float(summary["seconds"]), 3),
            }
            rows.append(row)
            if not as_json:
                typer.echo(
                    f"{method:>14} seed {seed}: accuracy {row['final_accuracy']:.4f} "
                    f"({row['seconds']:.1f}s)", err=True,
                )
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    table = compare_rows(rows)
    if csv_path is not None:
        from pdpfl.io import write_text

        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        write_text(csv_path, buf.getvalue())
    if as_json:
        from pdpfl.runtime.loop import _finite

        print_json(_finite({"methods": table, "runs": rows}))  # ε = ∞ (no DP) becomes null
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{base.name}: final test accuracy over seeds {', '.join(map(str, seeds))}")
    for col in ("method", "runs", "final accuracy (mean ± std)", "last-3 mean", "ε",
                "over budget", "seconds"):
        t.add_column(col, justify="right")
    for r in table:
        t.add_row(
            r["method"], str(r["runs"]),
            f"{r['final_accuracy_mean']:.4f} ± {r['final_accuracy_std']:.4f}",
            f"{r['last3_mean_accuracy']:.4f}", _epsilon_cell(r["epsilon"]), _over_budget_cell(r),
            f"{r['seconds']:.1f}",
        )
    Console().print(t)


def _epsilon_cell(eps: float | None) -> str:
    """The headline ε (max over seeds; ∞ without DP; - when the view has none)."""
    if eps is None:
        return "-"
    return "∞" if not np.isfinite(eps) else f"{eps:.4g}"


def _over_budget_cell(row: dict[str, Any]) -> str:
    """The privacy-free baseline has no DP at all (ε = ∞): say so instead of a bare count."""
    if row["method"] == "privacy-free":
        return f"all {row['over_budget']} (no DP)"
    return str(row["over_budget"])


def register(app: typer.Typer) -> None:
    """Add ``run`` and ``compare`` to the main app."""
    app.command("run")(run_command)
    app.command(
        "compare",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(compare_command)
