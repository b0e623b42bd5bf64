"""Wall time and final accuracy of rPDP-FL vs the baselines on the example federations.

Runs ``examples/heart_disease.yaml`` and ``examples/mnist10k_iid.yaml`` under the ThreeLevels,
BoundedPareto and BoundedMixGauss budget scenarios for rPDP / Minimum / Dropout / PrivacyFree
and several seeds, in-process, and prints ONE JSON object.

    .venv/bin/python benchmarks/federated.py --json [--data-dir ../shared/data]
        [--datasets heart_disease mnist10k_iid] [--seeds 42 43 44] [--set rounds=5 ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {
    "three-levels": {"values": [0.1, 1.0, 5.0], "ratios": [0.7, 0.2, 0.1]},
    "bounded-pareto": {},
    "bounded-mix-gauss": {},
}
METHODS = ("rpdp", "minimum", "dropout", "privacy-free")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true", help="print one JSON object (default)")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--datasets", nargs="+", default=["heart_disease", "mnist10k_iid"])
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS))
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[42, 43, 44])
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    torch.set_num_threads(2)

    from pdpfl.config import load_config, with_updates
    from pdpfl.runtime.simulation import load_federation_for, run_simulation

    results = []
    tmp = Path(tempfile.mkdtemp(prefix="pdpfl-bench-"))
    try:
        for ds in args.datasets:
            base = load_config(
                ROOT / "examples" / f"{ds}.yaml", args.overrides, data_dir=args.data_dir
            )
            for scenario in args.scenarios:
                for seed in args.seeds:
                    cfg_s = with_updates(base, [f"budgets.scenario={scenario}", f"seed={seed}"])
                    cfg_s = cfg_s.model_copy(
                        update={
                            "budgets": cfg_s.budgets.model_copy(
                                update={"params": SCENARIOS[scenario]}
                            )
                        }
                    )
                    fed = load_federation_for(cfg_s)
                    for method in args.methods:
                        cfg = with_updates(cfg_s, [f"algorithm.name={method}"])
                        t0 = time.perf_counter()
                        s = run_simulation(
                            cfg,
                            tmp / f"{ds}-{scenario}-{method}-{seed}",
                            progress=False,
                            federation=fed,
                        )
                        wall = time.perf_counter() - t0
                        results.append(
                            {
                                "dataset": ds,
                                "scenario": scenario,
                                "method": method,
                                "seed": seed,
                                "final_accuracy": s["final_accuracy"],
                                "last3_mean_accuracy": s["last3_mean_accuracy"],
                                "over_budget": s["over_budget"],
                                "train_seconds": s["seconds"],
                                "wall_seconds": wall,
                            }
                        )
                        print(json.dumps(results[-1]), file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    table = {}
    for r in results:
        key = f"{r['dataset']}/{r['scenario']}/{r['method']}"
        table.setdefault(key, []).append(r)
    summary = {
        key: {
            "seeds": len(rs),
            "final_accuracy_mean": float(np.mean([r["final_accuracy"] for r in rs])),
            "final_accuracy_std": float(np.std([r["final_accuracy"] for r in rs], ddof=1))
            if len(rs) > 1
            else 0.0,
            "wall_seconds_mean": float(np.mean([r["wall_seconds"] for r in rs])),
            "over_budget": int(sum(r["over_budget"] for r in rs)),
        }
        for key, rs in table.items()
    }
    print(
        json.dumps(
            {
                "benchmark": "federated",
                "machine": (
                    f"{platform.machine()} {platform.python_version()} torch {torch.__version__}"
                ),
                "args": {k: v for k, v in vars(args).items() if k != "json"},
                "summary": summary,
                "runs": results,
            }
        )
    )


if __name__ == "__main__":
    main()
