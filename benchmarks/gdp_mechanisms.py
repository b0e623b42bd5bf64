"""Benchmark: GDP conversions and the mechanisms-as-data RdpAccountant.

* ``gdp_epsilon`` for 10⁴ distinct μ in [0.01, 10] at δ = 1e-5 (one Brent solve per μ);
* ``RdpAccountant.epsilon(plan_event(q, plan))`` vs ``plan_epsilon(q, plan)`` for 10⁴ distinct
  rates (σ = 1, τ = 50, T = 15, λ = 0.5, δ = 1e-4): the overhead of describing the plan as data;
* ``tradeoff_to_epsilon`` of a client-sampled G_μ curve on ``alpha_grid(4001)``.

Usage: ``python benchmarks/gdp_mechanisms.py --json [--n 10000] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from pdpfl.privacy import RdpAccountant, TrainingPlan, plan_epsilon
from pdpfl.privacy.gdp import (
    alpha_grid,
    client_sampled_tradeoff,
    gaussian_tradeoff,
    gdp_epsilon,
    tradeoff_to_epsilon,
)
from pdpfl.privacy.mechanisms import plan_event


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    mus = np.geomspace(0.01, 10.0, args.n)
    rates = np.geomspace(1e-6, 1.0, args.n)
    plan = TrainingPlan(noise_multiplier=1.0, delta=1e-4, steps=50, rounds=15, client_rate=0.5)
    acc = RdpAccountant()
    a = alpha_grid(4001)
    g = client_sampled_tradeoff(a, gaussian_tradeoff(a, 2.0), 0.5)
    e_acc = acc.epsilon(plan_event(rates, plan), plan.delta)[0]
    e_ref = plan_epsilon(rates, plan)[0]
    out = {
        "n": args.n,
        "gdp_epsilon_s": _best(lambda: gdp_epsilon(mus, 1e-5), args.repeats),
        "accountant_plan_event_s": _best(
            lambda: acc.epsilon(plan_event(rates, plan), plan.delta), args.repeats
        ),
        "plan_epsilon_s": _best(lambda: plan_epsilon(rates, plan), args.repeats),
        "accountant_equals_plan_epsilon": bool(np.array_equal(e_acc, e_ref)),
        "tradeoff_to_epsilon_grid_points": int(a.size),
        "tradeoff_to_epsilon_s": _best(lambda: tradeoff_to_epsilon(a, g, 1e-5), args.repeats),
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
