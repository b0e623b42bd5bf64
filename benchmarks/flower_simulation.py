"""Flower's Simulation Engine (``--runtime flower-simulation``, Ray) vs the in-process simulator.

Runs one config (default: IDP-FedAvg on the MNIST-10k client federation) with ``--clients N``
first in the in-process simulator, then under :func:`flwr.simulation.run_simulation` with one
virtual SuperNode per client, in the same process run, and prints one JSON object:

* ``simulation`` / ``engine``: ``total_s`` (wall clock of the whole call, data loading and -- for
  the engine -- Ray's start and shutdown included), ``s_per_round`` (median seconds per round
  after the first, from ``metrics.jsonl``), and for the engine ``startup_s`` (Ray up and every
  virtual SuperNode's hello answered) and per message (medians over the clients' own
  ``timings-silo-i.jsonl``): ``build_s`` (client rebuilt from its data and state folder: every
  message, see ``docs/flower.md``), ``compute_s``, ``save_s``;
* ``ratio_per_round`` = engine / simulation;
* ``max_abs_param_diff`` of the final models (``randomness: reproducible``: ≤ 1e-6 expected);
* ``machine``: CPUs, Python, the 1-minute load average before and after.

Needs Ray (``pip install 'pdpfl[simulation]'``).

    .venv/bin/python benchmarks/flower_simulation.py --clients 100 --rounds 3 \\
        --data-dir ../shared/data [--config examples/idp_fedavg_mnist10k.yaml] \\
        [--set algorithm.clients_per_round=10 ...] [--num-cpus 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _median(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def per_round(out: Path) -> float | None:
    secs = [m["seconds"] for m in _lines(out / "metrics.jsonl")]
    return _median([b - a for a, b in zip(secs, secs[1:], strict=False)])


def silo_timings(out: Path) -> dict[str, Any]:
    """Medians of the clients' own per-message timings (engine run)."""
    rows = [
        t for p in (out / "flower").glob("silo-*/run-*/timings-silo-*.jsonl") for t in _lines(p)
    ]
    return {
        "messages": len(rows),
        "build_s": _median([t["build_s"] for t in rows]),
        "compute_s": _median([t["compute_s"] for t in rows]),
        "save_s": _median([t["save_s"] for t in rows]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "examples" / "idp_fedavg_mnist10k.yaml"))
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per Ray actor")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--skip-simulation", action="store_true")
    parser.add_argument("--json", action="store_true", help="one line")
    args = parser.parse_args()

    import numpy as np

    from pdpfl.config import load_config
    from pdpfl.runtime.flower.simulation_engine import run_flower_simulation
    from pdpfl.runtime.simulation import run_simulation

    load_before = os.getloadavg()[0]
    config = load_config(
        args.config,
        [
            f"rounds={args.rounds}",
            f"data.num_clients={args.clients}",
            "randomness=reproducible",
            f"flower.simulation.client_resources.num_cpus={args.num_cpus}",
            *args.overrides,
        ],
        data_dir=args.data_dir,
    )
    report: dict[str, Any] = {
        "benchmark": "flower-simulation-engine-vs-simulation",
        "config": Path(args.config).name,
        "algorithm": config.algorithm.name,
        "dataset": config.data.dataset,
        "clients": args.clients,
        "rounds": args.rounds,
        "overrides": args.overrides,
        "num_cpus_per_actor": args.num_cpus,
    }
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        os.environ.setdefault("PDPFL_KEY_DIR", str(out / "keys"))
        sim_round = None
        if not args.skip_simulation:
            t0 = time.perf_counter()
            sim = run_simulation(config, out / "sim", progress=False)
            report["simulation"] = {
                "total_s": time.perf_counter() - t0,
                "s_per_round": per_round(out / "sim"),
                "final_accuracy": sim.get("final_accuracy"),
            }
            sim_round = report["simulation"]["s_per_round"]
        t0 = time.perf_counter()
        eng = run_flower_simulation(config, out / "engine", round_timeout_s=3600.0)
        total = time.perf_counter() - t0
        server = json.loads((out / "engine" / "flower" / "server_result.json").read_text())
        eng_round = per_round(out / "engine")
        report["engine"] = {
            "total_s": total,
            "startup_s": server["startup_seconds"],
            "s_per_round": eng_round,
            "final_accuracy": eng.get("final_accuracy"),
            "per_message": silo_timings(out / "engine"),
        }
        if sim_round and eng_round:
            report["ratio_per_round"] = eng_round / sim_round
        if not args.skip_simulation:
            a, b = np.load(out / "sim" / "model.npz"), np.load(out / "engine" / "model.npz")
            report["max_abs_param_diff"] = max(float(np.max(np.abs(a[k] - b[k]))) for k in a.files)
    report["machine"] = (
        f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}, "
        f"load {load_before:.1f} before / {os.getloadavg()[0]:.1f} after"
    )
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
