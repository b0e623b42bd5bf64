"""Calibration benchmark: certified on 10⁶ distinct budgets; SCF and BinarySearch on 10³.

Run::

    .venv/bin/python benchmarks/calibration.py --json

Setting: the rPDP-FL tutorial plan (δ = 1e-3, τ = 5, T = 20, λ = 0.5) with σ chosen so that
q = 1 spends ε_max = 10 (rPDP-FL's rule), third-party adversary, BoundedMixGauss budgets
(distinct floats, clipped to [0.1, 10]). Over-budget counts are measured with the exact
accountant. Paper reference (rPDP-FL Table 3, 1,000 individual budgets, centralized DP-SGD):
SCF 14.1 s, BinarySearch 597.8 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

from pdpfl.budgets import BoundedMixGauss
from pdpfl.calibration import calibrate, noise_for_max_budget
from pdpfl.calibration.certified import _CACHE, CertifiedEstimator
from pdpfl.privacy.plan import TrainingPlan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--n-large", type=int, default=1_000_000)
    parser.add_argument("--n-small", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    template = TrainingPlan(noise_multiplier=1.0, delta=1e-3, steps=5, rounds=20, client_rate=0.5)
    t0 = time.perf_counter()
    sigma = noise_for_max_budget(10.0, template)
    sigma_s = time.perf_counter() - t0
    plan = TrainingPlan(noise_multiplier=sigma, delta=1e-3, steps=5, rounds=20, client_rate=0.5)
    rng = np.random.default_rng(args.seed)
    large = BoundedMixGauss().sample(args.n_large, rng)
    small = BoundedMixGauss().sample(args.n_small, rng)

    out: dict[str, object] = {"sigma": sigma, "sigma_search_s": sigma_s}
    _CACHE.clear()  # time a fresh fit (the grid is memoized per plan)
    t0 = time.perf_counter()
    cert = calibrate(large, plan, "certified", allow_exclusion=True)
    out["certified_1e6_s"] = time.perf_counter() - t0
    _CACHE.clear()
    t0 = time.perf_counter()
    estimator = CertifiedEstimator.fit(plan)
    out["certified_fit_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    estimator.rates(large)
    out["certified_apply_1e6_s"] = time.perf_counter() - t0
    out["certified_grid_points"] = int(estimator.q_grid.size)
    out["certified_1e6_distinct"] = cert.report.distinct_budgets
    cert_small = calibrate(small, plan, "certified", allow_exclusion=True)
    t0 = time.perf_counter()
    scf = calibrate(small, plan, "scf")
    out["scf_1e3_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    bs = calibrate(small, plan, "binary-search", allow_exclusion=True)
    out["binary_search_1e3_s"] = time.perf_counter() - t0
    out["over_budget"] = {
        "certified_1e6": cert.report.over_budget,
        "certified_1e3": cert_small.report.over_budget,
        "scf_1e3": scf.report.over_budget,
        "binary_search_1e3": bs.report.over_budget,
    }
    spent_ratio = None
    if scf.report.over_budget:
        from pdpfl.calibration._accounting import exact_epsilon

        spent_ratio = float(np.max(exact_epsilon(scf.rates, plan) / small))
    out["scf_max_spent_over_budget_ratio"] = spent_ratio
    out["scf_r2"] = scf.report.details["r2"]
    out["median_utilization"] = {
        "certified_1e6": cert.report.median_utilization,
        "scf_1e3": scf.report.median_utilization,
        "binary_search_1e3": bs.report.median_utilization,
    }
    out["min_utilization"] = {
        "certified_1e6": cert.report.min_utilization,
        "binary_search_1e3": bs.report.min_utilization,
    }
    out["excluded_1e6"] = cert.report.excluded
    out["machine"] = (
        f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
