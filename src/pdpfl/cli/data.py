"""`pdpfl data` commands: list the benchmark federations, describe one, fetch its files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

from pdpfl.cli._common import fail, print_json

data_app = typer.Typer(
    help="Benchmark federations: list, describe, fetch files.", no_args_is_help=True
)


def _parse_pairs(pairs: list[str], option: str) -> dict[str, Any]:
    """``["k=v", ...]`` → dict; values are parsed as JSON when possible (numbers, bools).

    NaN and ±inf (``NaN``, ``Infinity``, ``1e999``) are refused naming the key."""
    out: dict[str, Any] = {}
    for item in pairs:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            fail(f"{option} expects KEY=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if isinstance(value, float) and not math.isfinite(value):
            fail(f"{option} {key.strip()}: must be a finite number, got {raw}")
        out[key.strip()] = value
    return out


@data_app.command("list")
def list_datasets(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """List the registered datasets and partitions."""
    from pdpfl.data import DATASETS, PARTITIONS

    info = {
        "datasets": {
            n: {
                "description": d.description,
                "default_clients": d.default_clients,
                "fixed_silos": d.fixed_silos,
                "options": list(d.options),
                "needs_files": d.needs_files,
            }
            for n, d in DATASETS.items()
        },
        "partitions": {n: list(p) for n, p in PARTITIONS.items()},
    }
    if as_json:
        print_json(info)
        return
    for n, d in DATASETS.items():
        typer.echo(f"{n:15s} {d.description}")
    typer.echo(
        "partitions: "
        + ", ".join(f"{n}({', '.join(p)})" if p else n for n, p in PARTITIONS.items())
    )


@data_app.command("describe")
def describe(
    name: str = typer.Argument(..., help="Dataset name (see `pdpfl data list`)."),
    num_clients: int | None = typer.Option(None, "--num-clients", help="Number of silos."),
    partition: str = typer.Option(
        "iid", "--partition", help="iid, n-way-k-shot, shards or dirichlet."
    ),
    param: list[str] = typer.Option(
        [], "--param", "-p", help="Partition parameter KEY=VALUE (repeatable)."
    ),
    option: list[str] = typer.Option(
        [], "--option", "-o", help="Dataset option KEY=VALUE (repeatable)."
    ),
    seed: int = typer.Option(42, "--seed", help="Seed of the partition and splits."),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Folder holding the dataset files."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Build a federation and print its one-screen summary (counts per silo and label)."""
    from pdpfl.data import ChecksumError, DataFileNotFoundError, load_federation

    params = _parse_pairs(param, "--param")
    options = _parse_pairs(option, "--option")
    try:
        fed = load_federation(
            name,
            num_clients=num_clients,
            partition=partition,
            partition_params=params or None,
            seed=seed,
            data_dir=data_dir,
            **options,
        )
    except (ValueError, DataFileNotFoundError, ChecksumError) as exc:
        fail(str(exc))
    summary = fed.describe()
    if as_json:
        print_json(summary)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{summary['name']}: {summary['features']} features, {summary['classes']} classes"
    )
    for col in ("silo", "train", "test", "train labels"):
        table.add_column(col)
    for c in summary["clients"]:
        labels = " ".join(f"{k}:{v}" for k, v in c["label_counts"].items() if v)
        table.add_row(c["name"], str(c["train"]), str(c["test"]), labels)
    table.add_row("total", str(summary["total_train"]), str(summary["total_test"]), "")
    Console().print(table)


@data_app.command("fetch")
def fetch(
    name: str = typer.Argument(..., help="heart-disease, mnist, mnist-10k or cifar10."),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Folder searched before the cache."
    ),
) -> None:
    """Find (or download into the cache) and verify the files of a dataset; print their paths."""
    from pdpfl.data import ChecksumError, DataFileNotFoundError, resolve_file
    from pdpfl.data.registry import file_specs

    try:
        specs = file_specs(name)
        paths = [resolve_file(s, data_dir) for s in specs]
    except (ValueError, DataFileNotFoundError, ChecksumError) as exc:
        fail(str(exc))
    print_json(
        {"name": name, "files": {s.filename: str(p) for s, p in zip(specs, paths, strict=True)}}
    )


def register(app: typer.Typer) -> None:
    """Add the `data` command group to ``app``."""
    app.add_typer(data_app, name="data")
