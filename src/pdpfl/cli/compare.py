"""`pdpfl compare`: several methods over several seeds (the rPDP-FL paper's Figure 8).

Each (method, seed) run goes through the same simulator as ``pdpfl run``; the table reads each
run's typed privacy summary (ε and over-budget counts in the run's own unit), and each run's
folder is verified (its sealed checkpoint and ledgers) before its curve is read from it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import typer

from pdpfl.cli._common import check_key_dir, fail, import_plugins, print_json
from pdpfl.cli._experiment import (
    check_device,
    load_checked,
    load_federation,
    locked,
    prepare_out,
    simulate,
)
from pdpfl.reports.compare import (
    accuracy_curve,
    compare_rows,
    csv_text,
    nan_none,
    previous_runs,
    run_row,
    write_compare_plot,
)
from pdpfl.reports.tables import compare_table, fmt_acc, mechanism_table

__all__ = ["compare_command", "register"]


def _method_overrides(method: str) -> list[str]:
    from pdpfl.config import get_method

    try:
        return get_method(method)[1]
    except ValueError as err:
        fail(f"--methods: {err}")


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

        try:
            write_text(self.path, csv_text(rows))
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
    base = load_checked(
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
                *previous_runs(out_dir),
                "compare.csv",
                "compare.png",
            )
            prepare_out(out_dir, resume=False, force=force, outputs=own)
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
                    federations[key] = load_federation(cfg)
                run_dir = root / method.replace(":", "-") / f"seed{seed}"
                summary = simulate(
                    cfg, run_dir, False, progress=False, federation=federations[key], created=True
                )
                row = run_row(method, seed, summary, cfg.privacy.adversary)
                rows.append(row)
                for sink in sinks:
                    sink.write(rows)
                try:
                    curve = accuracy_curve(run_dir)
                except ValueError as err:
                    fail(f"--out: {err}")
                curves.setdefault(method, []).append(curve)
                if not as_json:
                    typer.echo(
                        f"{method:>14} seed {seed}: accuracy "
                        f"{fmt_acc(nan_none(row['final_accuracy']))} "
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
            write_compare_plot(out_dir / "compare.png", base.name, curves)
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


def register(app: typer.Typer) -> None:
    """Add ``compare`` to the main app."""
    app.command(
        "compare",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(compare_command)
