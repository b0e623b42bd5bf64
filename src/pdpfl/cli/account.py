"""``pdpfl account``: ε per record sampling rate for a DP-SGD / rPDP-FL training plan."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from pdpfl.cli._common import fail, multi_value_command, plan_from_options, print_json


def _floats(values: list[str], name: str) -> list[float]:
    out: list[float] = []
    for v in values:
        for part in v.replace(",", " ").split():
            try:
                out.append(float(part))
            except ValueError:
                fail(f"{name}: not a number: {part!r}")
    return out


def account(
    sigma: float = typer.Option(..., "--sigma", help="Noise multiplier σ > 0."),
    delta: float = typer.Option(..., "--delta", help="Target δ in (0, 1)."),
    q: list[str] = typer.Option(
        None, "--q", help="Sampling rate(s) in [0, 1]: --q 0.01 0.1, a comma list, or repeated --q."
    ),
    q_file: Path | None = typer.Option(None, "--q-file", help="A .npy file of sampling rates."),
    steps: int = typer.Option(1, "--steps", help="τ: local steps per round (total if no --rounds)."),
    rounds: int | None = typer.Option(None, "--rounds", help="T federated rounds."),
    client_rate: float = typer.Option(1.0, "--client-rate", help="λ in (0, 1]."),
    adversary: str = typer.Option("third-party", "--adversary", help="third-party|server|both."),
    participations: int | None = typer.Option(
        None, "--participations", help="k ≤ T rounds the client took part in (server)."
    ),
    orders: list[str] = typer.Option(None, "--orders", help="Rényi orders > 1 (default grid)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """ε for each sampling rate q (rPDP-FL two-stage bound; centralized DP-SGD without --rounds)."""
    import numpy as np

    from pdpfl.privacy.adversary import as_adversary
    from pdpfl.privacy.orders import DEFAULT_ORDERS, check_orders
    from pdpfl.privacy.two_stage import plan_epsilon

    plan = plan_from_options(
        sigma=sigma, delta=delta, steps=steps, rounds=rounds, client_rate=client_rate
    )
    if bool(q) == (q_file is not None):
        fail("--q / --q-file: give exactly one of them")
    if q:
        rates = np.asarray(_floats(q, "--q"), dtype=np.float64)
        qname = "--q"
    else:
        try:
            rates = np.asarray(np.load(q_file, allow_pickle=False), dtype=np.float64).reshape(-1)
        except (OSError, ValueError) as exc:
            fail(f"--q-file: cannot read {q_file}: {exc}")
        qname = "--q-file"
    if rates.size == 0 or np.any(np.isnan(rates)) or np.any((rates < 0) | (rates > 1)):
        fail(f"{qname}: every sampling rate must be a number in [0, 1] (no NaN)")
    try:
        adv = as_adversary(adversary)
    except ValueError:
        fail(f"--adversary: expected third-party, server or both, got {adversary!r}")
    if participations is not None:
        if rounds is None:
            fail("--participations: needs --rounds")
        if not (0 <= participations <= rounds):
            fail(f"--participations: must be in [0, --rounds={rounds}], got {participations}")
    try:
        a = check_orders(_floats(orders, "--orders")) if orders else DEFAULT_ORDERS
    except ValueError:
        fail("--orders: every Rényi order must be a finite number > 1")
    eps, order = plan_epsilon(rates, plan, adv, participations, a)
    mechanism = {
        "type": "dp-sgd" if rounds is None else "rpdp-fl-two-stage",
        "noise_multiplier": sigma,
        "delta": delta,
        "steps": steps,
        "rounds": rounds,
        "client_rate": client_rate,
        "participations": participations,
        "n_orders": int(np.size(a)),
    }
    if as_json:
        print_json(
            {
                "epsilon": [float(e) if math.isfinite(e) else None for e in eps],
                "order": [float(o) for o in order],
                "adversary": adv.value,
                "mechanism": mechanism,
            }
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"pdpfl account — {adv.value} adversary, δ={delta:g}")
    table.add_column("q", justify="right")
    table.add_column("ε", justify="right")
    table.add_column("order α", justify="right")
    for qi, ei, oi in zip(rates, eps, order, strict=True):
        table.add_row(f"{qi:.6g}", f"{ei:.6g}", f"{oi:g}")
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add ``pdpfl account`` to the main app."""
    app.command("account", cls=multi_value_command("--q", "--orders"))(account)
