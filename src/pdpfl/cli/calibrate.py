"""`pdpfl calibrate`: personal budgets → per-unit sampling rates (certified by default).

``--unit record`` (default, rPDP-FL plan), ``client`` or ``user`` (T rounds of a
Poisson-subsampled Gaussian at the unit's rate); ``--accountant rdp`` (default) or ``pld``.
With ``--epsilon-max``, σ is chosen with RDP, as ``pdpfl run`` does.

Example::

    pdpfl calibrate --scenario bounded-mix-gauss --n 100000 --epsilon-max 10 \
        --delta 1e-3 --steps 5 --rounds 20 --client-rate 0.5 --out q.npy --json
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pdpfl.cli._common import (
    check_writable,
    fail,
    parse_unit_and_accountant,
    plan_from_options,
    print_json,
    unit_plan_from_options,
)

#: Largest --n for --scenario (one float64 budget and rate per record are held in memory).
MAX_RECORDS = 100_000_000

if TYPE_CHECKING:
    import numpy as np


def register(app: typer.Typer) -> None:
    """Add ``pdpfl calibrate`` to ``app``."""
    app.command("calibrate")(calibrate_command)


def _read_budgets(path: Path, column: str | None) -> np.ndarray:
    """The budgets of ``--budgets``: a ``record_id,epsilon`` table is read as ``pdpfl run``
    reads ``budgets.file`` (ids checked: unique integers; rates in the file's row order),
    anything else by :func:`pdpfl.budgets.load_budgets`. Problems exit 2 naming ``--budgets``
    (or ``--column``)."""
    import csv

    import numpy as np

    from pdpfl.budgets import load_budgets
    from pdpfl.data.budget_table import is_budget_table, read_table

    if path.is_dir():
        fail(f"--budgets: {path} is a folder; give a .npy or .csv budgets file")
    if not path.exists():
        fail(f"--budgets: {path} does not exist")
    if column is None and is_budget_table(path):
        try:
            return np.asarray(read_table(path).values, dtype=np.float64)
        except ValueError as err:
            fail(f"--budgets: {str(err).removeprefix('budgets.file: ')}")
    if column is None and path.suffix.lower() == ".csv":
        try:
            with path.open(newline="", encoding="utf-8-sig") as fh:
                header = next(csv.reader(fh), [])
        except (OSError, UnicodeDecodeError, csv.Error):
            header = []
        named = [h.strip() for h in header if h.strip()]
        if len(header) > 1 and not all(_is_number(h) for h in named):
            fail(
                f"--budgets: {path.name} has {len(header)} columns ({', '.join(named)}); name "
                "the one that holds ε with --column NAME, or give a record_id,epsilon table"
            )
    try:
        return load_budgets(path, column=column)
    except (ValueError, FileNotFoundError) as err:
        text = str(err)
        if text.startswith("column:"):
            fail(f"--column:{text.removeprefix('column:')}")
        fail(f"--budgets: {text}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def calibrate_command(
    delta: Annotated[float, typer.Option("--delta", help="Target δ, in (0, 1).")],
    budgets: Annotated[
        Path | None,
        typer.Option(
            "--budgets",
            help="Budget file: .npy (1-D), or .csv: one column, a record_id,epsilon table "
            "(as for pdpfl run's budgets.file), or any table with --column.",
        ),
    ] = None,
    column: Annotated[
        str | None, typer.Option("--column", help="CSV column name holding ε.")
    ] = None,
    scenario: Annotated[
        str | None,
        typer.Option(
            "--scenario", help="Preference scenario instead of a file (e.g. bounded-mix-gauss)."
        ),
    ] = None,
    n: Annotated[int | None, typer.Option("--n", help="Number of records for --scenario.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for --scenario budgets.")] = 0,
    sigma: Annotated[float | None, typer.Option("--sigma", help="Noise multiplier σ.")] = None,
    epsilon_max: Annotated[
        float | None,
        typer.Option("--epsilon-max", help="Choose σ so that q = 1 spends this ε (rPDP-FL rule)."),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(
            "--steps", help="Local steps per round τ (>= 1; record unit, required there)."
        ),
    ] = None,
    rounds: Annotated[
        int | None,
        typer.Option(
            "--rounds", help="Rounds T (>= 1); omit for a centralized plan of --steps steps."
        ),
    ] = None,
    client_rate: Annotated[
        float, typer.Option("--client-rate", help="Client sampling rate λ in (0, 1].")
    ] = 1.0,
    adversary: Annotated[
        str, typer.Option("--adversary", help="third-party | server | both.")
    ] = "third-party",
    method: Annotated[
        str,
        typer.Option("--method", help="certified | scf | scf-paper | binary-search."),
    ] = "certified",
    unit: Annotated[
        str,
        typer.Option("--unit", help="record (rPDP-FL) | client (IDP-FedAvg) | user (ULDP-FL)."),
    ] = "record",
    accountant: Annotated[
        str,
        typer.Option("--accountant", help="rdp | pld (tighter: larger rates at the same budgets)."),
    ] = "rdp",
    allow_exclusion: Annotated[
        bool,
        typer.Option(
            "--allow-exclusion", help="Give q = 0 to budgets below the smallest achievable ε."
        ),
    ] = False,
    central_noise: Annotated[
        str,
        typer.Option(
            "--central-noise",
            help="continuous | discrete: the central noise (privacy.central_noise; the "
            "DP-SGD step's, or IDP-FedAvg's server with --unit client; discrete: the exact "
            "discrete Gaussian on a grid, accounted by rdp only).",
        ),
    ] = "continuous",
    out: Annotated[Path | None, typer.Option("--out", help="Write the rates here (.npy).")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as one JSON object.")
    ] = False,
) -> None:
    """Map personal privacy budgets to Poisson sampling rates and report utilization."""
    import numpy as np

    from pdpfl.budgets import assign_budgets, make_scenario
    from pdpfl.calibration import calibrate, noise_for_max_budget
    from pdpfl.io import save_npy
    from pdpfl.seeding import numpy_generator

    if (budgets is None) == (scenario is None):
        fail("give exactly one of --budgets FILE or --scenario NAME")
    if (sigma is None) == (epsilon_max is None):
        fail("give exactly one of --sigma S or --epsilon-max E")
    if out is not None and out.suffix.lower() != ".npy":
        fail(f"--out: rates are written as .npy, got {out.name!r}")
    if out is not None:
        check_writable(out, "--out")
    from pdpfl.privacy.unit import PrivacyUnit

    unit_, accountant = parse_unit_and_accountant(unit, accountant)
    if central_noise not in ("continuous", "discrete"):
        fail(f"--central-noise: expected continuous or discrete, got {central_noise!r}")
    if central_noise == "discrete":
        if unit_ is PrivacyUnit.USER:
            fail(
                "--central-noise: discrete is the central noise of the record-level DP-SGD step "
                "(rPDP-FL) and of IDP-FedAvg's central server (--unit client); use --unit record "
                "or client, or continuous"
            )
        if accountant != "rdp":
            fail(
                f"--accountant: {accountant} cannot interpret the central discrete Gaussian "
                "(--central-noise discrete); use rdp"
            )
    # σ is searched when --epsilon-max is given: validate the rest of the plan with σ = 1.
    if unit_ is PrivacyUnit.RECORD:
        if steps is None:
            fail("--steps: local steps per round τ (>= 1) is required for --unit record")
        plan = plan_from_options(
            sigma=1.0 if sigma is None else sigma,
            delta=delta,
            steps=steps,
            rounds=rounds,
            client_rate=client_rate,
            noise=central_noise,
        )
    else:
        name = unit_.value
        if rounds is None:
            fail(
                f"--rounds: a {name}-level mechanism is T rounds of a Poisson-subsampled "
                "Gaussian; give --rounds T"
            )
        if steps is not None:
            fail(
                f"--steps: a {name}-level mechanism releases one noisy update per round; "
                "drop --steps"
            )
        if client_rate != 1.0:
            fail(
                f"--client-rate: the {name}'s own sampling rate is what is calibrated; "
                "drop --client-rate"
            )
        if adversary != "third-party":
            fail(
                f"--adversary: {name}-level DP is stated against third parties (the central "
                "aggregator is trusted) — use --adversary third-party"
            )
        mech = unit_plan_from_options(
            unit_, sigma=1.0 if sigma is None else sigma, delta=delta, rounds=rounds
        )
        plan = mech.as_training_plan()
        if central_noise == "discrete":  # IDP-FedAvg central: the exact discrete rounds
            import dataclasses

            plan = dataclasses.replace(plan, noise="discrete")
    if epsilon_max is not None and not (np.isfinite(epsilon_max) and epsilon_max > 0):
        fail(f"--epsilon-max: must be a finite ε > 0, got {epsilon_max}")

    try:
        if budgets is not None:
            eps = _read_budgets(budgets, column)
        else:
            if n is None or n < 1:
                fail("--n: number of records (>= 1) is required with --scenario")
            if n > MAX_RECORDS:
                fail(f"--n: at most {MAX_RECORDS:,} records, got {n:,}")
            assert scenario is not None  # exactly one of --budgets / --scenario (checked above)
            eps = assign_budgets(make_scenario(scenario), n, numpy_generator(seed, "budgets"))
    except (ValueError, FileNotFoundError) as exc:
        fail(f"--budgets: {exc}" if budgets is not None else f"--scenario: {exc}")

    try:
        if epsilon_max is not None:
            plan = plan.with_noise(noise_for_max_budget(epsilon_max, plan, adversary))
        result = calibrate(
            eps, plan, method, adversary, allow_exclusion=allow_exclusion, accountant=accountant
        )
    except ValueError as exc:
        fail(str(exc))

    if out is not None:
        try:
            save_npy(out, result.rates)
        except OSError as err:
            fail(f"--out: cannot write {out} ({err.strerror or err})")
    report = result.report.to_dict()
    for warning in report["warnings"]:
        typer.echo(f"warning: {warning}", err=True)
    report["unit"] = unit_.value
    report["out"] = str(out) if out is not None else None
    if as_json:
        print_json(report)
        return

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.4f}"

    typer.echo(
        f"{report['method']} ({report['unit']} unit, {report['adversary']}, "
        f"{report['accountant']}): n={report['n']} "
        f"distinct={report['distinct_budgets']} σ={report['sigma']:.6g} "
        f"over_budget={report['over_budget']} excluded={report['excluded']} "
        f"utilization min={fmt(report['min_utilization'])} "
        f"median={fmt(report['median_utilization'])} in {report['seconds']:.3f}s"
        + (f" -> {out}" if out is not None else "")
    )
