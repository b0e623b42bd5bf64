"""Benchmark: ε for 10⁴ distinct record rates at the rPDP-FL two-stage setting.

Setting: σ = 1, τ = 50, T = 15, λ = 0.5, δ = 1e-4, pdpfl's DEFAULT_ORDERS for everyone.
pdpfl evaluates all 10⁴ rates at once (:func:`pdpfl.privacy.two_stage.plan_epsilon`). Opacus
(``opacus.accountants.analysis.rdp.compute_rdp``) and dp-accounting
(``_compute_rdp_poisson_subsampled_gaussian``) are looped per rate, then composed with the same
Lemma 6 round bound and converted with the same rule; they take ≈ 0.1 s per rate, so they are
timed on a subsample and scaled to 10⁴ rates (reported as such).

Usage: ``python benchmarks/accounting.py --json [--n 10000] [--subsample 40] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

import numpy as np

from pdpfl.privacy import DEFAULT_ORDERS, TrainingPlan, plan_epsilon, rdp_to_epsilon, round_rdp


def _baseline_eps(rdp_fn, rates, plan):
    out = []
    for q in rates:
        step = np.asarray(rdp_fn(float(q)), dtype=float)[None, :]
        total = plan.rounds * round_rdp(step, plan.steps, plan.client_rate, DEFAULT_ORDERS)
        out.append(float(rdp_to_epsilon(total, DEFAULT_ORDERS, plan.delta)[0][0]))
    return np.array(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--subsample", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # dp-accounting logs one warning per dropped order

    from dp_accounting.rdp import rdp_privacy_accountant as dpa
    from opacus.accountants.analysis.rdp import compute_rdp

    plan = TrainingPlan(noise_multiplier=1.0, delta=1e-4, steps=50, rounds=15, client_rate=0.5)
    rng = np.random.default_rng(0)
    rates = np.unique(10 ** rng.uniform(-4, 0, args.n))
    while rates.size < args.n:
        rates = np.unique(np.concatenate([rates, 10 ** rng.uniform(-4, 0, args.n - rates.size)]))
    orders = DEFAULT_ORDERS

    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        eps, _ = plan_epsilon(rates, plan)
        times.append(time.perf_counter() - t0)
    pdpfl_s = statistics.median(times)

    sub = rates[np.linspace(0, rates.size - 1, args.subsample).astype(int)]
    scale = args.n / sub.size
    t0 = time.perf_counter()
    eps_op = _baseline_eps(
        lambda q: compute_rdp(q=q, noise_multiplier=1.0, steps=1, orders=list(orders)), sub, plan
    )
    opacus_s = (time.perf_counter() - t0) * scale
    t0 = time.perf_counter()
    eps_dp = _baseline_eps(
        lambda q: dpa._compute_rdp_poisson_subsampled_gaussian(q, 1.0, orders), sub, plan
    )
    dp_s = (time.perf_counter() - t0) * scale

    # agreement on the same fixed orders, then what the refined order gains
    ours_sub = plan_epsilon(sub, plan, refine=False)[0]
    rel_op = float(np.max(np.abs(ours_sub - eps_op) / eps_op))
    rel_dp = float(np.max(np.abs(ours_sub - eps_dp) / eps_dp))
    refined = plan_epsilon(sub, plan)[0]
    gain = float(np.max((eps_op - refined) / eps_op))
    never_looser = bool(np.all(refined <= eps_op * (1 + 1e-9)))
    result = {
        "n_rates": int(rates.size),
        "n_orders": int(orders.size),
        "setting": {"sigma": 1.0, "steps": 50, "rounds": 15, "client_rate": 0.5, "delta": 1e-4},
        "pdpfl_s": pdpfl_s,
        "opacus_s": opacus_s,
        "dp_accounting_s": dp_s,
        "baselines_subsample": int(sub.size),
        "baselines_scaled_to_n": True,
        "speedup_vs_opacus": opacus_s / pdpfl_s,
        "speedup_vs_dp_accounting": dp_s / pdpfl_s,
        "max_rel_diff": rel_op,
        "max_rel_diff_vs_dp_accounting": rel_dp,
        "refined_order_max_gain_vs_opacus": gain,
        "refined_never_looser_than_opacus": never_looser,
        "epsilon_range": [float(eps.min()), float(eps.max())],
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
