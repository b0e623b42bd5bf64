"""`pdpfl compare`: several methods over several seeds (the rPDP-FL paper's Figure 8).

Each (method, seed) run goes through the same simulator as ``pdpfl run``; the table reads each
run's typed privacy summary (ε and over-budget counts in the run's own unit), and each run's
folder is verified (its sealed checkpoint and ledgers) before its curve is read from it.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import typer

from pdpfl.cli._common import check_key_dir, fail, import_plugins, print_json
from pdpfl.cli.report import compare_table, fmt_acc, mechanism_table, typed_privacy
from pdpfl.cli.run import (
    _load,
    _load_federation,
    _prepare_out,
    _simulate,
    check_device,
    locked,
)

__all__ = ["compare_command", "compare_rows", "mechanism_columns", "register"]


def _method_overrides(method: str) -> list[str]:
    from pdpfl.config import get_method

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
        out.append(
            {
                "method": method,
                "runs": len(mine),
                "final_accuracy_mean": float(acc.mean()),
                "final_accuracy_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                "last3_mean_accuracy": float(last3.mean()),
                "over_budget": int(sum(r["over_budget"] or 0 for r in mine)),
                "epsilon": _max_epsilon([r.get("epsilon") for r in mine]),
                "unit": mine[-1].get("unit", "record"),
                "private": all(r.get("private", True) for r in mine),
                "seconds": float(sum(r["seconds"] for r in mine)),
                # σ and the group rates of the last seed (with realized group fractions they vary
                # slightly between seeds; the CSV has every run's values).
                **{k: v for k, v in mine[-1].items() if k == "sigma" or k.startswith("rate_")},
            }
        )
    return out


def run_row(method: str, seed: int, summary: dict[str, Any], adversary: str) -> dict[str, Any]:
    """One finished run as a comparison row; privacy numbers from its typed summary."""
    privacy = typed_privacy(summary)
    private = privacy is None or privacy.private
    return {
        "method": method,
        "seed": seed,
        "final_accuracy": summary["final_accuracy"],
        "last3_mean_accuracy": summary["last3_mean_accuracy"],
        "unit": privacy.unit if privacy is not None else summary.get("privacy_unit"),
        "private": private,
        "over_budget": None if privacy is None else privacy.over_budget_any(adversary),
        "epsilon": None if privacy is None else privacy.headline_epsilon(adversary),
        "seconds": round(float(summary["seconds"]), 3),
        **mechanism_columns(summary),
    }


def mechanism_columns(summary: dict[str, Any]) -> dict[str, Any]:
    """Extra comparison columns of client-level algorithms (IDP-FedAvg): the run's noise
    multiplier σ and each privacy group's sampling rate (``rate_<group>``); empty otherwise."""
    out: dict[str, Any] = {}
    privacy = typed_privacy(summary)
    if privacy is None or privacy.unit != "client":
        return out
    if privacy.info.get("noise_multiplier") is not None:
        out["sigma"] = privacy.info["noise_multiplier"]
    for g in privacy.groups:
        rate = g.info.get("rate", g.info.get("mean_rate"))
        if rate is not None:
            out[f"rate_{g.label}"] = rate
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
CSV_FIELDS = [
    "method",
    "seed",
    "final_accuracy",
    "last3_mean_accuracy",
    "over_budget",
    "seconds",
    "unit",
    "epsilon",
    "private",
]


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
        None,
        "--import",
        help="Python file or module to import first (e.g. one that calls "
        "@register_model). Repeatable.",
    ),
    device: str | None = typer.Option(
        None,
        "--device",
        help="Where silos train: auto, cpu, cuda, cuda:N or mps (overrides "
        "training.device; default cpu).",
    ),
) -> None:
    """Run several methods over several seeds and print mean ± std of the final accuracy.

    Also takes --methods M [M ...] (any registered method, e.g. rpdp minimum dropout
    privacy-free uniform:EPS centralized; default: the first four) and --seeds S [S ...]
    (default: the config's seed).
    """
    extra = _multi_values(list(ctx.args))
    for option in ("--methods", "--seeds"):
        if option in extra and not extra[option]:
            fail(
                f"{option}: no value given (e.g. --methods rpdp minimum --seeds 1 2); leave "
                "the option out for the default"
            )
    methods = list(
        dict.fromkeys(extra.get("--methods") or ["rpdp", "minimum", "dropout", "privacy-free"])
    )
    try:
        seeds = list(dict.fromkeys(int(s) for s in extra.get("--seeds", [])))
    except ValueError:
        fail(f"--seeds: expected integers, got {extra.get('--seeds')}")
    if any(s < 0 for s in seeds):
        fail("--seeds: seeds must be >= 0")
    from pdpfl.config import ConfigError, with_updates

    import_plugins(plugins)
    base = _load(
        config_path,
        [*(overrides or []), *([f"training.device={device}"] if device is not None else [])],
        data_dir,
    )
    check_device(base)
    check_key_dir()
    seeds = seeds or [base.seed]
    configs = {}
    for method in methods:
        for seed in seeds:
            try:
                configs[method, seed] = with_updates(
                    base, [*_method_overrides(method), f"seed={seed}"]
                )
            except ConfigError as err:
                fail(f"--methods {method}: " + "; ".join(err.problems))
    keep = out is not None
    out_dir = Path(out) if out is not None else Path()
    created = keep and not out_dir.exists()
    lock = contextlib.ExitStack()
    if keep:
        lock.enter_context(locked(out_dir, created=created))
    try:
        if keep:
            own = (
                *{m.replace(":", "-") for m in methods},
                *_previous_runs(out_dir),
                "compare.csv",
                "compare.png",
            )
            _prepare_out(out_dir, resume=False, force=force, outputs=own)
        sinks = []
        try:  # every output is validated (written once) before any training
            if csv_path is not None:
                sinks.append(_CsvRows(Path(csv_path), force=force, option="--csv"))
            if keep:
                sinks.append(_CsvRows(out_dir / "compare.csv", force=True, option="--out"))
        except typer.Exit:
            if created:
                shutil.rmtree(out_dir, ignore_errors=True)
            raise
        root = out_dir if keep else Path(tempfile.mkdtemp(prefix="pdpfl-compare-"))
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
                summary = _simulate(
                    cfg, run_dir, False, progress=False, federation=federations[key], created=True
                )
                row = run_row(method, seed, summary, cfg.privacy.adversary)
                rows.append(row)
                for sink in sinks:
                    sink.write(rows)
                curves.setdefault(method, []).append(_accuracy_curve(run_dir))
                if not as_json:
                    typer.echo(
                        f"{method:>14} seed {seed}: accuracy "
                        f"{fmt_acc(_nan(row['final_accuracy']))} "
                        f"({row['seconds']:.1f}s)",
                        err=True,
                    )
        except KeyboardInterrupt as err:
            from pdpfl.runtime.signals import exit_code, signal_name, signal_of

            where = ", ".join(str(s.path) for s in sinks)
            typer.echo(
                f"\ninterrupted ({signal_name(signal_of(err))}): {len(rows)} of {len(configs)} "
                "runs finished" + (f" (their rows are in {where})" if where else ""),
                err=True,
            )
            raise typer.Exit(code=exit_code(err)) from None
        finally:
            if not keep:
                shutil.rmtree(root, ignore_errors=True)
        table = compare_rows(rows)
        if keep:
            _write_compare_plot(out_dir / "compare.png", base.name, curves)
        if as_json:
            from pdpfl.checkpoint import finite as _finite

            print_json(_finite({"methods": table, "runs": rows}))  # ε = ∞ (no DP) becomes null
            return
        title = (
            f"{base.name}: final test accuracy, seed{'s' if len(seeds) > 1 else ''} "
            + ", ".join(map(str, seeds))
        )
        from rich.console import Console

        console = Console()
        console.print(compare_table(title, table))
        mech = mechanism_table(table)
        if mech is not None:
            console.print(mech)
        if keep:
            first = f"{methods[0].replace(':', '-')}/seed{seeds[0]}"
            typer.echo(
                f"outputs written to {out}:\n"
                f"  plot:  {out_dir / 'compare.png'} (test accuracy per round)\n"
                f"  table: {out_dir / 'compare.csv'} (one row per method and seed)\n"
                f"  runs:  {out_dir / first}/ ... (summary.json, epsilon.png)"
            )
        if csv_path is not None:
            typer.echo(f"rows written to {csv_path}")

    finally:
        lock.close()


def _previous_runs(root: Path) -> list[str]:
    """Sub-folders of ``root`` laid out by an earlier ``pdpfl compare`` (``METHOD/seedN/``)."""
    import re

    if not root.is_dir():
        return []
    return [
        d.name
        for d in root.iterdir()
        if d.is_dir()
        and not d.is_symlink()
        and any(d.iterdir())
        and all(re.fullmatch(r"seed\d+", c.name) and c.is_dir() for c in d.iterdir())
    ]


def _accuracy_curve(run_dir: Path) -> list[float]:
    """The run's accuracy per round, read from its folder once the folder verifies (its sealed
    checkpoint and ledgers, :func:`pdpfl.ledger.runfolder.open_run`; exit 2 naming a file that
    does not)."""
    from pdpfl.checkpoint import run_identity
    from pdpfl.ledger.runfolder import open_run
    from pdpfl.runtime.loop import read_metrics

    try:
        run_identity(run_dir)
        if (run_dir / "ledgers").is_dir():
            open_run(run_dir)
    except ValueError as err:
        fail(f"--out: {err}")
    return [_nan(m.get("accuracy")) for m in read_metrics(run_dir)]


def _write_compare_plot(path: Path, name: str, curves: dict[str, list[list[float]]]) -> None:
    """``compare.png``: mean pooled test accuracy per round (over seeds), one line per method."""
    from pdpfl.runtime.plots import missing_glyphs_quiet

    with missing_glyphs_quiet():
        _draw_compare_plot(path, name, curves)


def _draw_compare_plot(path: Path, name: str, curves: dict[str, list[list[float]]]) -> None:
    from matplotlib.ticker import MaxNLocator

    from pdpfl.runtime.plots import new_figure, nothing_to_draw, save_figure

    fig, ax = new_figure(5.5, 3.4)
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
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    else:
        nothing_to_draw(ax, "no test accuracy was measured")
    fig.tight_layout()
    save_figure(fig, path)


def register(app: typer.Typer) -> None:
    """Add ``compare`` to the main app."""
    app.command(
        "compare",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(compare_command)
