"""What tighter accounting buys (issue #15): RDP on a fixed grid, RDP at the optimal order, PLD.

For the paper's two settings (rPDP-FL §7: σ such that a record sampled with q = 1 spends
ε_max = 10 under pdpfl's default RDP accountant; third-party view):

* Heart: τ = 50, T = 15, λ = 1, δ = 1e-3;
* MNIST: τ = 50, T = 15, λ = 0.5, δ = 1e-4;

it reports, over q ∈ [1e-4, 1]:

* ``eps``: ε at each q by the RDP grid alone (``RdpAccountant(refine=False)``, the 123 fixed
  orders of earlier releases), by RDP at the continuously refined optimal order (the default),
  and by the PLD accountant (``accountant: pld``);
* ``rates``: the certified calibration's mean sampling rate per budget group (ThreeLevels
  ε = 0.1 / 1 / 5, 70 / 20 / 10 %) under each accountant, at the same budgets and σ;
* ``scale``: the one-time PLD grid fit for certified calibration, then calibrating 10⁶ distinct
  budgets with it (seconds).

Usage::

    .venv/bin/python benchmarks/pld.py --json [--skip-scale]

Accuracy at the same budgets is measured with the CLI (see benchmarks/RESULTS.md), e.g.
``pdpfl compare examples/heart_disease.yaml --methods rpdp --seeds 1 2 3 --set
privacy.accountant=pld``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

from pdpfl.calibration import noise_for_max_budget
from pdpfl.calibration.certified import _CACHE, CertifiedEstimator
from pdpfl.privacy.accountant import RdpAccountant, mechanism_epsilon
from pdpfl.privacy.orders import DEFAULT_ORDERS
from pdpfl.privacy.plan import TrainingPlan

SETTINGS = {
    "heart": {"delta": 1e-3, "steps": 50, "rounds": 15, "client_rate": 1.0},
    "mnist": {"delta": 1e-4, "steps": 50, "rounds": 15, "client_rate": 0.5},
}
QS = (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)
LEVELS = ((0.1, 0.7), (1.0, 0.2), (5.0, 0.1))


def _plan(setting: dict) -> TrainingPlan:
    template = TrainingPlan(noise_multiplier=1.0, **setting)
    sigma = noise_for_max_budget(10.0, template)
    return TrainingPlan(noise_multiplier=sigma, **setting)


def _eps(plan: TrainingPlan, qs: np.ndarray) -> dict[str, list[float]]:
    grid, _ = mechanism_epsilon(
        plan, qs, "third-party", accountant=RdpAccountant(DEFAULT_ORDERS, refine=False)
    )
    best, _ = mechanism_epsilon(plan, qs, "third-party", accountant="rdp")
    pld, _ = mechanism_epsilon(plan, qs, "third-party", accountant="pld")
    return {"rdp_grid": grid.tolist(), "rdp_optimal": best.tolist(), "pld": pld.tolist()}


def _rates(plan: TrainingPlan) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    budgets = np.array([b for b, _ in LEVELS])
    for acc in ("rdp", "pld"):
        t0 = time.perf_counter()
        est = CertifiedEstimator.fit(plan, "third-party", accountant=acc)
        q = np.asarray(est.rates(budgets), dtype=float)
        out[acc] = {f"eps={b:g}": float(r) for b, r in zip(budgets, q, strict=True)}
        out[acc]["fit_s"] = time.perf_counter() - t0
        # mean rate over the ThreeLevels mix (the expected batch grows with it)
        out[acc]["mean_rate"] = float(sum(r * w for r, (_, w) in zip(q, LEVELS, strict=True)))
    return out


def _scale(plan: TrainingPlan, n: int, seed: int) -> dict[str, float]:
    import pdpfl.privacy.accountant as accountant_module
    from pdpfl.budgets import BoundedMixGauss

    budgets = BoundedMixGauss().sample(n, np.random.default_rng(seed))
    _CACHE.clear()  # the certified grid's memo and the PLD accountants' caches: a cold fit
    accountant_module._INSTANCES.clear()
    t0 = time.perf_counter()
    est = CertifiedEstimator.fit(plan, "third-party", accountant="pld")
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    est.rates(budgets)
    apply_s = time.perf_counter() - t0
    return {
        "pld_grid_fit_s": fit_s,
        "pld_apply_s": apply_s,
        "budgets": int(budgets.size),
        "distinct": int(np.unique(budgets).size),
        "grid_points": int(est.q_grid.size),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--n", type=int, default=1_000_000, help="budgets for the scale test")
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--only-scale", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    qs = np.array(QS)
    result: dict[str, object] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "q": list(QS),
    }
    if not args.skip_scale:  # first, so that the grid fit is cold
        result["scale"] = _scale(_plan(SETTINGS["mnist"]), args.n, args.seed)
    for name, setting in ({} if args.only_scale else SETTINGS).items():
        plan = _plan(setting)
        t0 = time.perf_counter()
        eps = _eps(plan, qs)
        result[name] = {
            "sigma": plan.noise_multiplier,
            "eps": eps,
            "eps_seconds": time.perf_counter() - t0,
            "rates": _rates(plan),
        }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name in SETTINGS:
        if name not in result:
            continue
        r = result[name]
        print(f"{name}: σ = {r['sigma']:.4f}")
        print(f"  {'q':>8} {'RDP grid':>10} {'RDP opt':>10} {'PLD':>10}")
        for i, q in enumerate(QS):
            e = r["eps"]
            print(
                f"  {q:>8g} {e['rdp_grid'][i]:>10.4f} {e['rdp_optimal'][i]:>10.4f} "
                f"{e['pld'][i]:>10.4f}"
            )
        for acc, rates in r["rates"].items():
            print(f"  rates ({acc}): " + ", ".join(f"{k}: {v:.4g}" for k, v in rates.items()))
    if "scale" in result:
        print("scale:", result["scale"])


if __name__ == "__main__":
    main()
