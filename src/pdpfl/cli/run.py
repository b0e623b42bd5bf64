"""`pdpfl run` and `pdpfl compare`: train a federation from a YAML config, compare methods.

Bad input (config problems, unknown methods, missing data, an output folder that cannot be
used) prints ``error: ...`` naming the field or option and exits 2 before any training.

The output rule, shared with :func:`pdpfl.runtime.simulation.run_simulation`: a folder that
already holds files is refused unless ``--force`` (pdpfl's previous outputs there are replaced)
or ``--resume`` (continue the run checkpointed there). Ctrl-C stops after saving the last
finished round and prints the command that continues the run (exit 130).
"""

from __future__ import annotations

import csv
import io
import json
import shlex
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import typer

from pdpfl.cli._common import fail, import_plugins, print_json

#: Exit code after Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130



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


def _prepare_out(out_dir: Path, *, resume: bool, force: bool, **kwargs: Any) -> None:
    """Validate (and create) an output folder, or exit 2 naming ``--out`` and the remedy."""
    from pdpfl.runtime.outputs import OutputDirError, prepare_output_dir

    try:
        prepare_output_dir(out_dir, resume=resume, overwrite=force, option="--out",
                           flags=("--force", "--resume"), **kwargs)
    except OutputDirError as err:
        fail(str(err))


# ------------------------------------------------------------------------------- tables


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if not np.isfinite(x):
            return "∞" if x > 0 else "-"
        return f"{x:.{digits}g}"
    return str(x)


def _console() -> Any:
    from rich.console import Console

    return Console()


def run_tables(summary: dict[str, Any]) -> list[Any]:
    """The run's headline and its per-budget-group table (rich renderables, ≤ 80 columns)."""
    from rich import box
    from rich.table import Table

    title = f"{summary['name']} · {summary['algorithm']} · seed {summary['seed']}"
    head = Table(title=title, show_header=False, box=box.SIMPLE, title_justify="left")
    head.add_column("quantity", style="bold")
    head.add_column("value")
    no_dp = summary["algorithm"] == "privacy-free"
    records = summary.get("records")
    head.add_row("final test accuracy", _fmt(summary.get("final_accuracy")))
    head.add_row("mean of the last 3 rounds", _fmt(summary.get("last3_mean_accuracy")))
    head.add_row("final test loss", _fmt(summary.get("final_loss")))
    if records is None:
        head.add_row("records over budget", "kept at the silos (deployment)")
    elif no_dp:
        head.add_row("records over budget", f"all {records} (no DP: ε = ∞)")
    else:
        head.add_row(
            "records over budget",
            f"{summary['over_budget']} of {records} (adversary: {summary['adversary']})",
        )
        head.add_row("records stopped early", str(summary.get("records_stopped", 0)))
        if summary.get("records_excluded"):
            head.add_row("records excluded (q = 0)", str(summary["records_excluded"]))
    head.add_row("rounds", f"{summary['rounds_completed']}"
                 + ("" if summary.get("completed", True) else " (interrupted)"))
    head.add_row("training seconds", f"{summary['seconds']:.1f}")
    out = [head]
    groups = summary.get("per_group") or {}
    if groups and not no_dp:
        t = Table(title="ε spent vs budget, per budget group", box=box.SIMPLE_HEAD,
                  title_justify="left")
        for col in ("budget ε", "records", "max ε\nthird party", "max ε\nserver",
                    "mean use\n3rd / srv", "over budget\n3rd / srv"):
            t.add_column(col, justify="right", no_wrap=True)
        for label, g in groups.items():
            over = (g["over_budget_third_party"], g["over_budget_server"])
            t.add_row(
                label, str(g["count"]),
                _fmt(g["max_spent_third_party"]), _fmt(g["max_spent_server"]),
                f"{_fmt_use(g['mean_utilization_third_party'])} / "
                f"{_fmt_use(g['mean_utilization_server'])}",
                f"{over[0]} / {over[1]}", style="red" if any(over) else None,
            )
        excluded = {k: g.get("excluded", 0) for k, g in groups.items() if g.get("excluded")}
        if excluded:
            t.caption = "excluded (q = 0): " + ", ".join(
                f"{n} in group {k}" for k, n in excluded.items())
        t.caption = (t.caption + "\n" if t.caption else "") + (
            "mean use = mean of ε spent / budget over the group's records")
        out.append(t)
    return out


def _fmt_use(x: Any) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.2f}"


def _print_run_table(summary: dict[str, Any]) -> None:
    console = _console()
    for table in run_tables(summary):
        console.print(table)


def compare_table(title: str, table: list[dict[str, Any]]) -> Any:
    """The ``pdpfl compare`` table (≤ 80 columns; ± std only when there are several seeds)."""
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
        acc = _fmt_acc(r["final_accuracy_mean"])
        if r["runs"] > 1:
            acc += f" ± {_fmt_acc(r['final_accuracy_std'])}"
        t.add_row(r["method"], str(r["runs"]), acc, _fmt_acc(r["last3_mean_accuracy"]),
                  "∞" if r["method"] == "privacy-free" else _epsilon_cell(r.get("epsilon")),
                  _over_budget_cell(r), f"{r['seconds']:.1f}")
    t.caption = "accuracy: pooled test accuracy after the last round"
    return t


def mechanism_table(table: list[dict[str, Any]]) -> Any:
    """σ and each privacy group's sampling rate of client-level algorithms (IDP-FedAvg), as a
    second table so the main one stays within 80 columns; ``None`` when no method has them."""
    from rich import box
    from rich.table import Table

    extra = list(dict.fromkeys(
        k for r in table for k in r if k == "sigma" or k.startswith("rate_")
    ))
    if not extra:
        return None
    t = Table(title="mechanism (last seed)", box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column("method", no_wrap=True)
    for k in extra:
        t.add_column("σ" if k == "sigma" else f"q[{k[5:]}]", justify="right", no_wrap=True)
    for r in table:
        t.add_row(r["method"], *[_fmt(r.get(k)) for k in extra])
    return t


def _fmt_acc(x: Any) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.4f}"


def _over_budget_cell(row: dict[str, Any]) -> str:
    """The privacy-free baseline has no DP at all (ε = ∞): say so instead of a bare count."""
    if row["method"] == "privacy-free":
        return "all (no DP)"
    return str(row["over_budget"])


# ------------------------------------------------------------------------------- pdpfl run


def _resume_hint(config_path: Path, out_dir: Path, overrides: list[str], data_dir: str | None,
                 runtime: str | None, plugins: list[str]) -> str:
    parts = ["pdpfl", "run", str(config_path), "--out", str(out_dir), "--resume"]
    for plugin in plugins:
        parts += ["--import", plugin]
    for o in overrides:
        parts += ["--set", o]
    if data_dir is not None:
        parts += ["--data-dir", data_dir]
    if runtime is not None:
        parts += ["--runtime", runtime]
    return shlex.join(parts)


def _interrupted(out_dir: Path, rounds: int, hint: str) -> None:
    from pdpfl.runtime.loop import has_checkpoint, read_metrics

    done = len(read_metrics(out_dir)) if out_dir.is_dir() else 0
    if has_checkpoint(out_dir) and done:
        typer.echo(
            f"\ninterrupted: {done} of {rounds} rounds are saved in {out_dir}; continue with\n"
            f"  {hint}", err=True,
        )
    else:
        typer.echo("\ninterrupted before the first round finished: nothing was saved", err=True)
    raise typer.Exit(code=EXIT_INTERRUPTED)


def run_command(
    config_path: Path = typer.Argument(..., help="Experiment YAML (see examples/)."),
    out: Path | None = typer.Option(None, "--out", help="Output folder (default: output_dir)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in --out."),
    force: bool = typer.Option(
        False, "--force", help="Overwrite pdpfl's outputs in a folder that holds a previous run."
    ),
    overrides: list[str] | None = typer.Option(
        None, "--set", help="key=value override (dotted; 'rounds' is T). Repeatable."
    ),
    data_dir: str | None = typer.Option(None, "--data-dir", help="Folder with the dataset files."),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json instead of tables."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    runtime: str | None = typer.Option(
        None, "--runtime", help="simulation (in-process) or flower (overrides the config)."
    ),
    plugins: list[str] | None = typer.Option(
        None, "--import", help="Python file or module to import first (e.g. one that calls "
        "@register_model). Repeatable."
    ),
) -> None:
    """Train one federation (rPDP-FL or a baseline) and write metrics, summary, ledgers, plots."""
    if resume and force:
        fail("--resume and --force: choose one (continue the run, or replace it)")
    import_plugins(plugins)
    extra = [*(overrides or []), *([f"runtime={runtime}"] if runtime is not None else [])]
    config = _load(config_path, extra, data_dir)
    out_dir = Path(out) if out is not None else Path(config.output_dir)
    if config.runtime == "flower":
        from pdpfl.fl.registry import get_algorithm

        if get_algorithm(config.algorithm.name).simulation_only:
            fail(
                f"algorithm.name: {config.algorithm.name!r} runs only in the simulator "
                "(--runtime simulation)"
            )
    existed = out_dir.exists()
    _prepare_out(out_dir, resume=resume, force=force)
    hint = _resume_hint(config_path, out_dir, list(overrides or []), data_dir, runtime,
                        list(plugins or []))
    try:
        if config.runtime == "flower":
            summary = _flower(config, out_dir, resume, progress=not (quiet or as_json), hint=hint)
        else:
            summary = _simulate(config, out_dir, resume, progress=not (quiet or as_json),
                                created=not existed)
    except KeyboardInterrupt:
        _interrupted(out_dir, config.training.rounds, hint)
    for warning in summary.get("warnings", []):
        typer.echo(f"warning: {warning}", err=True)
    if as_json:
        print_json(summary)
    else:
        _print_run_table(summary)
        typer.echo(f"outputs written to {out_dir} (summary.json, metrics.jsonl, model, ledgers)\n"
                   f"  plots: {out_dir / 'accuracy.png'}, {out_dir / 'epsilon.png'}")


def _flower(config: Any, out_dir: Path, resume: bool, *, progress: bool,
            hint: str) -> dict[str, Any]:
    from pdpfl.runtime.flower import (  # lazy: flwr is optional
        FlowerInterrupted,
        FlowerRunError,
        run_flower,
    )

    try:
        return run_flower(config, out_dir, resume, progress=progress)
    except FlowerRunError as err:  # a runtime failure, not bad input: exit 1, no traceback
        typer.echo(f"error: Flower federation failed: {err} (logs in {out_dir / 'flower'})",
                   err=True)
        raise typer.Exit(code=1) from err
    except FlowerInterrupted as stop:  # every Flower process is already stopped
        typer.echo(
            f"\ninterrupted after {stop.rounds_done} round(s); every Flower process was "
            f"stopped. Resume with:\n  {hint}", err=True,
        )
        raise typer.Exit(code=EXIT_INTERRUPTED) from None


def _simulate(
    config: Any,
    out_dir: Path,
    resume: bool,
    *,
    progress: bool,
    federation: Any = None,
    created: bool = False,
) -> dict[str, Any]:
    """Run the simulator into an output folder already checked by :func:`_prepare_out`;
    configuration problems found while building exit 2, leaving nothing behind in a folder
    this command created."""
    from pdpfl.runtime.simulation import SetupWarning, simulate_into

    try:
        if federation is None:
            federation = _load_federation(config)
        with warnings.catch_warnings():
            # printed once from the summary at the end
            warnings.simplefilter("ignore", SetupWarning)
            return simulate_into(config, out_dir, resume, progress=progress,
                                 federation=federation)
    except ValueError as err:
        _discard(out_dir, created)
        fail(str(err))
    except typer.Exit:
        _discard(out_dir, created)
        raise


def _discard(out_dir: Path, created: bool) -> None:
    """Remove a folder this command created when no round was written into it."""
    if created and out_dir.exists() and not (out_dir / "metrics.jsonl").exists():
        shutil.rmtree(out_dir, ignore_errors=True)


# --------------------------------------------------------------------------- pdpfl compare


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
        acc = np.array([_nan(r["final_accuracy"]) for r in mine], dtype=float)
        last3 = np.array([_nan(r["last3_mean_accuracy"]) for r in mine], dtype=float)
        out.append({
            "method": method,
            "runs": len(mine),
            "final_accuracy_mean": float(acc.mean()),
            "final_accuracy_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
            "last3_mean_accuracy": float(last3.mean()),
            "over_budget": int(sum(r["over_budget"] or 0 for r in mine)),
            "epsilon": _max_epsilon([r.get("epsilon") for r in mine]),
            "seconds": float(sum(r["seconds"] for r in mine)),
            # σ and the group rates of the last seed (with realized group fractions they vary
            # slightly between seeds; the CSV has every run's values).
            **{k: v for k, v in mine[-1].items() if k == "sigma" or k.startswith("rate_")},
        })
    return out


def mechanism_columns(summary: dict[str, Any]) -> dict[str, Any]:
    """Extra comparison columns of client-level algorithms (IDP-FedAvg): the run's noise
    multiplier σ and each privacy group's sampling rate (``rate_<group>``); empty otherwise."""
    out: dict[str, Any] = {}
    if summary.get("noise_multiplier") is not None:
        out["sigma"] = summary["noise_multiplier"]
    for label, group in (summary.get("per_group") or {}).items():
        if group.get("rate") is not None:
            out[f"rate_{label}"] = group["rate"]
    return out


def _nan(x: Any) -> float:
    return float("nan") if x is None else float(x)


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


#: Columns of ``--csv`` / ``compare.csv`` (one row per finished run).
CSV_FIELDS = ["method", "seed", "final_accuracy", "last3_mean_accuracy", "over_budget", "seconds"]


class _CsvRows:
    """A CSV file rewritten atomically after every finished run (validated before training)."""

    def __init__(self, path: Path, *, force: bool, option: str) -> None:
        self.path, self.option = path, option
        if path.is_dir():
            fail(f"{option}: {path} is a folder; give a file name such as {path / 'runs.csv'}")
        if path.exists() and not force:
            fail(f"{option}: {path} already exists; pass --force to overwrite it")
        self.write([])  # fails now, before any training, if the place is not writable

    def write(self, rows: list[dict[str, Any]]) -> None:
        from pdpfl.io import write_text

        buf = io.StringIO()
        extra = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in CSV_FIELDS]
        writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS + extra, restval="")
        writer.writeheader()
        writer.writerows(rows)
        try:
            write_text(self.path, buf.getvalue())
        except OSError as err:
            fail(f"{self.option}: cannot write {self.path} ({err.strerror or err})")


def compare_command(
    ctx: typer.Context,
    config_path: Path = typer.Argument(..., help="Experiment YAML (see examples/)."),
    csv_path: Path | None = typer.Option(None, "--csv", help="Write one row per (method, seed)."),
    out: Path | None = typer.Option(
        None, "--out", help="Keep each run's outputs, compare.csv and compare.png under DIR."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite a previous comparison."),
    overrides: list[str] | None = typer.Option(None, "--set", help="key=value override."),
    data_dir: str | None = typer.Option(None, "--data-dir", help="Folder with the dataset files."),
    as_json: bool = typer.Option(False, "--json", help="Print the table as one JSON object."),
    plugins: list[str] | None = typer.Option(
        None, "--import", help="Python file or module to import first (e.g. one that calls "
        "@register_model). Repeatable."
    ),
) -> None:
    """Run several methods over several seeds and print mean ± std of the final accuracy.

    Also takes --methods M [M ...] (any registered method, e.g. rpdp minimum dropout
    privacy-free uniform:EPS centralized; default: the first four) and --seeds S [S ...]
    (default: the config's seed).
    """
    extra = _multi_values(list(ctx.args))
    methods = list(dict.fromkeys(extra.get("--methods") or
                                 ["rpdp", "minimum", "dropout", "privacy-free"]))
    try:
        seeds = list(dict.fromkeys(int(s) for s in extra.get("--seeds", [])))
    except ValueError:
        fail(f"--seeds: expected integers, got {extra.get('--seeds')}")
    if any(s < 0 for s in seeds):
        fail("--seeds: seeds must be >= 0")
    from pdpfl.config import ConfigError, with_updates

    import_plugins(plugins)
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
    created = keep and not Path(out).exists()
    if keep:
        own = (*{m.replace(":", "-") for m in methods}, *_previous_runs(Path(out)),
               "compare.csv", "compare.png")
        _prepare_out(Path(out), resume=False, force=force, outputs=own)
    sinks = []
    try:  # every output is validated (written once) before any training
        if csv_path is not None:
            sinks.append(_CsvRows(Path(csv_path), force=force, option="--csv"))
        if keep:
            sinks.append(_CsvRows(Path(out) / "compare.csv", force=True, option="--out"))
    except typer.Exit:
        if created:
            shutil.rmtree(Path(out), ignore_errors=True)
        raise
    root = Path(out) if keep else Path(tempfile.mkdtemp(prefix="pdpfl-compare-"))
    rows: list[dict[str, Any]] = []
    curves: dict[str, list[list[float]]] = {}
    try:
        # one federation per seed and data section (methods may change the data options, e.g.
        # declare the user histograms public)
        federations: dict[tuple[int, str], Any] = {}
        for (method, seed), cfg in configs.items():
            key = (seed, json.dumps(cfg.data.model_dump(mode="json"), sort_keys=True))
            if key not in federations:
                federations[key] = _load_federation(cfg)
            run_dir = root / method.replace(":", "-") / f"seed{seed}"
            summary = _simulate(cfg, run_dir, False, progress=False, federation=federations[key],
                                created=True)
            row = {
                "method": method,
                "seed": seed,
                "final_accuracy": summary["final_accuracy"],
                "last3_mean_accuracy": summary["last3_mean_accuracy"],
                "over_budget": summary["over_budget"],
                "epsilon": summary.get("epsilon"),
                "seconds": round(float(summary["seconds"]), 3),
                **mechanism_columns(summary),
            }
            rows.append(row)
            for sink in sinks:
                sink.write(rows)
            curves.setdefault(method, []).append(_accuracy_curve(run_dir))
            if not as_json:
                typer.echo(
                    f"{method:>14} seed {seed}: accuracy {_fmt_acc(_nan(row['final_accuracy']))} "
                    f"({row['seconds']:.1f}s)", err=True,
                )
    except KeyboardInterrupt:
        where = ", ".join(str(s.path) for s in sinks)
        typer.echo(f"\ninterrupted: {len(rows)} of {len(configs)} runs finished"
                   + (f" (their rows are in {where})" if where else ""), err=True)
        raise typer.Exit(code=EXIT_INTERRUPTED) from None
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    table = compare_rows(rows)
    if keep:
        _write_compare_plot(Path(out) / "compare.png", base.name, curves)
    if as_json:
        from pdpfl.runtime.loop import _finite

        print_json(_finite({"methods": table, "runs": rows}))  # ε = ∞ (no DP) becomes null
        return
    title = f"{base.name}: final test accuracy, seed{'s' if len(seeds) > 1 else ''} " + ", ".join(
        map(str, seeds))
    _console().print(compare_table(title, table))
    mech = mechanism_table(table)
    if mech is not None:
        _console().print(mech)
    if keep:
        first = f"{methods[0].replace(':', '-')}/seed{seeds[0]}"
        typer.echo(
            f"outputs written to {out}:\n"
            f"  plot:  {Path(out) / 'compare.png'} (test accuracy per round)\n"
            f"  table: {Path(out) / 'compare.csv'} (one row per method and seed)\n"
            f"  runs:  {Path(out) / first}/ ... (summary.json, epsilon.png)"
        )
    if csv_path is not None:
        typer.echo(f"rows written to {csv_path}")


def _previous_runs(root: Path) -> list[str]:
    """Sub-folders of ``root`` laid out by an earlier ``pdpfl compare`` (``METHOD/seedN/``)."""
    import re

    if not root.is_dir():
        return []
    return [
        d.name for d in root.iterdir()
        if d.is_dir() and not d.is_symlink() and any(d.iterdir())
        and all(re.fullmatch(r"seed\d+", c.name) and c.is_dir() for c in d.iterdir())
    ]


def _accuracy_curve(run_dir: Path) -> list[float]:
    from pdpfl.runtime.loop import read_metrics

    return [_nan(m.get("accuracy")) for m in read_metrics(run_dir)]


def _write_compare_plot(path: Path, name: str, curves: dict[str, list[list[float]]]) -> None:
    """``compare.png``: mean pooled test accuracy per round (over seeds), one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pdpfl.runtime.outputs import _nothing_to_draw, _save_fig

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
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
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7)
    else:
        _nothing_to_draw(ax, "no test accuracy was measured")
    fig.tight_layout()
    _save_fig(fig, path)
    plt.close(fig)


def _epsilon_cell(eps: float | None) -> str:
    """The headline ε (max over seeds; ∞ without DP; - when the view has none)."""
    if eps is None:
        return "-"
    return "∞" if not np.isfinite(eps) else f"{eps:.4g}"



def register(app: typer.Typer) -> None:
    """Add ``run`` and ``compare`` to the main app."""
    app.command("run")(run_command)
    app.command(
        "compare",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(compare_command)
