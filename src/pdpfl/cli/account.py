"""``pdpfl account``: ε per sampling rate for a privacy unit's mechanism.

* ``--unit record`` (default): DP-SGD / rPDP-FL training plan (τ steps per round, client rate λ;
  third-party and server views, rPDP-FL Theorem 1);
* ``--unit client`` / ``--unit user``: T rounds of a Poisson-subsampled Gaussian with the unit's
  own rate q (IDP-FedAvg clients, ULDP-FL users), accounted against third parties.

``--accountant rdp`` (default) or ``pld`` (privacy-loss distributions; prints both bounds).

Orders: without ``--orders`` ε is minimized over pdpfl's default orders with a continuous
refinement of the best one; ``--orders 2 3 4`` are honoured exactly (the minimum over exactly
those orders, so integer-order numbers of Opacus, dp-accounting or a paper's code are
reproduced). ``--refine`` / ``--no-refine`` sets the refinement explicitly.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pdpfl.cli._common import (
    fail,
    multi_value_command,
    parse_unit_and_accountant,
    plan_from_options,
    print_json,
    unit_plan_from_options,
)

if TYPE_CHECKING:
    from pdpfl.privacy.plan import TrainingPlan
    from pdpfl.privacy.unit import SampledGaussianPlan


def _floats(values: list[str], name: str) -> list[float]:
    out: list[float] = []
    for v in values:
        for part in v.replace(",", " ").split():
            try:
                out.append(float(part))
            except ValueError:
                fail(f"{name}: not a number: {part!r}")
    return out


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def account(
    sigma: Annotated[float, typer.Option("--sigma", help="Noise multiplier σ > 0.")],
    delta: Annotated[float, typer.Option("--delta", help="Target δ in (0, 1).")],
    q: Annotated[
        list[str] | None,
        typer.Option(
            "--q", help="Sampling rate(s) in [0, 1]: --q 0.01 0.1, a comma list, or repeated --q."
        ),
    ] = None,
    q_file: Annotated[
        Path | None, typer.Option("--q-file", help="A .npy file of sampling rates.")
    ] = None,
    steps: Annotated[
        int, typer.Option("--steps", help="τ: local steps per round (total if no --rounds).")
    ] = 1,
    rounds: Annotated[int | None, typer.Option("--rounds", help="T federated rounds.")] = None,
    client_rate: Annotated[
        float, typer.Option("--client-rate", help="λ in (0, 1] (record unit).")
    ] = 1.0,
    adversary: Annotated[
        str, typer.Option("--adversary", help="third-party|server|both.")
    ] = "third-party",
    participations: Annotated[
        int | None,
        typer.Option("--participations", help="k ≤ T rounds the client took part in (server)."),
    ] = None,
    orders: Annotated[
        list[str] | None,
        typer.Option(
            "--orders", help="Rényi orders > 1, used exactly (default: pdpfl's grid, refined)."
        ),
    ] = None,
    refine: Annotated[
        bool | None,
        typer.Option(
            "--refine/--no-refine",
            help="Refine the best order continuously (default: only without --orders).",
        ),
    ] = None,
    unit: Annotated[
        str,
        typer.Option("--unit", help="record (rPDP-FL) | client (IDP-FedAvg) | user (ULDP-FL)."),
    ] = "record",
    accountant: Annotated[
        str,
        typer.Option("--accountant", help="rdp | pld (privacy-loss distribution; prints both)."),
    ] = "rdp",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """ε for each sampling rate q of the unit's mechanism (rPDP-FL two-stage bound for records)."""
    import numpy as np

    from pdpfl.privacy.accountant import mechanism_epsilon
    from pdpfl.privacy.adversary import as_adversary
    from pdpfl.privacy.orders import DEFAULT_ORDERS, check_orders
    from pdpfl.privacy.unit import PrivacyUnit

    unit_, acc = parse_unit_and_accountant(unit, accountant)
    try:
        adv = as_adversary(adversary)
    except ValueError:
        fail(f"--adversary: expected third-party, server or both, got {adversary!r}")

    if unit_ is PrivacyUnit.RECORD:
        mech: TrainingPlan | SampledGaussianPlan = plan_from_options(
            sigma=sigma, delta=delta, steps=steps, rounds=rounds, client_rate=client_rate
        )
        if participations is not None:
            if rounds is None:
                fail("--participations: needs --rounds")
            if not (0 <= participations <= rounds):
                fail(f"--participations: must be in [0, --rounds={rounds}], got {participations}")
    else:
        name = unit_.value
        if rounds is None:
            fail(
                f"--rounds: a {name}-level mechanism is T rounds of a Poisson-subsampled "
                "Gaussian; give --rounds T"
            )
        if steps != 1:
            fail(
                f"--steps: a {name}-level mechanism releases one noisy update per round "
                "(no local steps to account); drop --steps"
            )
        if client_rate != 1.0:
            fail(f"--client-rate: the {name}'s own sampling rate is --q; drop --client-rate")
        if participations is not None:
            fail("--participations: only for the record-level server view")
        if adv.value != "third-party":
            fail(
                f"--adversary: {name}-level DP (central noise at the aggregator) is stated "
                "against third parties; the aggregator sees the clipped updates and is trusted "
                "— use --adversary third-party"
            )
        mech = unit_plan_from_options(unit_, sigma=sigma, delta=delta, rounds=rounds)

    if bool(q) == (q_file is not None):
        fail("--q / --q-file: give exactly one of them")
    if q:
        rates = np.asarray(_floats(q, "--q"), dtype=np.float64)
        qname = "--q"
    else:
        assert q_file is not None  # exactly one of --q / --q-file (checked above)
        try:
            rates = np.asarray(np.load(q_file, allow_pickle=False), dtype=np.float64).reshape(-1)
        except (OSError, ValueError) as exc:
            fail(f"--q-file: cannot read {q_file}: {exc}")
        qname = "--q-file"
    if rates.size == 0 or np.any(np.isnan(rates)) or np.any((rates < 0) | (rates > 1)):
        fail(f"{qname}: every sampling rate must be a number in [0, 1] (no NaN)")
    try:
        a = check_orders(_floats(orders, "--orders")) if orders else DEFAULT_ORDERS
    except ValueError:
        fail("--orders: every Rényi order must be a finite number > 1")
    refined = (not orders) if refine is None else bool(refine)

    observers = ("third-party", "server") if adv.value == "both" else (adv.value,)
    n = rates.size
    best = np.full(n, -np.inf)
    eps_rdp = np.full(n, -np.inf)
    eps_pld = np.full(n, -np.inf)
    order = np.full(n, np.nan)
    interval = np.full(n, np.nan)
    pld = None
    if acc == "pld":
        from pdpfl.privacy.pld import PldAccountant

        pld = PldAccountant(rate_grid_rel_step=0.0, rdp_orders=a, rdp_refine=refined)  # exact q
    for obs in observers:
        if unit_ is PrivacyUnit.RECORD and obs == "server" and mech.rounds is not None:
            k = mech.rounds if participations is None else participations
        else:
            k = mech.planned_rounds
        e_r, o_r = mechanism_epsilon(
            mech, rates, obs, k, accountant="rdp", orders=a, refine=refined
        )
        e = e_r
        if pld is not None:
            raw, h = pld.pld_epsilon(mech.round_event(rates, obs), k, delta)
            e = np.minimum(e_r, raw)
            take = raw >= eps_pld
            eps_pld = np.where(take, raw, eps_pld)
            interval = np.where(take, h, interval)
        take = e_r >= eps_rdp
        eps_rdp = np.where(take, e_r, eps_rdp)
        order = np.where(take, o_r, order)
        best = np.maximum(best, e)

    mechanism = {
        "type": (
            "dp-sgd"
            if unit_ is PrivacyUnit.RECORD and rounds is None
            else "rpdp-fl-two-stage"
            if unit_ is PrivacyUnit.RECORD
            else "poisson-subsampled-gaussian"
        ),
        "unit": unit_.value,
        "noise_multiplier": sigma,
        "delta": delta,
        "steps": steps,
        "rounds": rounds,
        "client_rate": client_rate,
        "participations": participations,
        "n_orders": int(np.size(a)),
        "refine": refined,
    }
    if as_json:
        out = {
            "epsilon": [_num(e) for e in best],
            "order": [_num(o) for o in order],
            "adversary": adv.value,
            "unit": unit_.value,
            "accountant": acc,
            "mechanism": mechanism,
        }
        if pld is not None:
            out["epsilon_rdp"] = [_num(e) for e in eps_rdp]
            out["epsilon_pld"] = [_num(e) for e in eps_pld]
            out["pld_interval"] = [_num(h) for h in interval]
        print_json(out)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"pdpfl account — {unit_.value} unit, {adv.value} adversary, δ={delta:g}, "
        f"accountant {acc}"
    )
    table.add_column("q", justify="right")
    table.add_column("ε", justify="right")
    if pld is not None:
        table.add_column("ε RDP", justify="right")
        table.add_column("ε PLD", justify="right")
        table.add_column("PLD interval", justify="right")
    table.add_column("RDP order α", justify="right")
    for i, qi in enumerate(rates):
        row = [f"{qi:.6g}", f"{best[i]:.6g}"]
        if pld is not None:
            row += [f"{eps_rdp[i]:.6g}", f"{eps_pld[i]:.6g}", f"{interval[i]:.3g}"]
        row.append("-" if math.isnan(order[i]) else f"{order[i]:.6g}")
        table.add_row(*row)
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add ``pdpfl account`` to the main app."""
    app.command("account", cls=multi_value_command("--q", "--orders"))(account)
