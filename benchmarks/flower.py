"""Per-round time of the Flower runtime vs the in-process simulator, and where it goes.

Runs one config in the simulator and then on Flower (loopback, one SuperNode per silo) in each
requested variant, in the same process run, and reports for each:

* ``s_per_round`` -- median seconds per round after the first (from ``metrics.jsonl``), next to
  the simulator's, and ``overhead_s_per_round`` = Flower − simulation;
* ``startup_s`` -- launcher start (SuperLink, SuperNodes, workers) and silo discovery;
* per message exchange (medians over the steady rounds and silos, from ``transport.jsonl`` and the
  silos' ``timings-silo-i.jsonl``): ``exchange_s`` (push → last reply at the server; for a
  prefetched training request, from the end of the evaluation it was queued behind),
  ``process_start_s`` (a per-message ClientApp process: interpreter start, imports, pulling the
  message; 0 for a warm worker), ``silo_build_s`` (silo rebuilt from its data and state file),
  ``compute_s`` (training or evaluation), ``save_s`` (state + ledger written before replying),
  and ``transport_polling_s`` = exchange − the silo's own time (SuperLink/SuperNode transport,
  the SuperNode's 3 s polling, the SuperExec's polling);
* ``max_abs_param_diff`` to the simulator's model (``randomness: reproducible``: 0).

Variants: ``per-message`` -- Flower's stock one-process-per-message ClientApp, no prefetch (the
"before"); ``warm`` -- the pdpfl silo worker + each round's training request sent with the
evaluation of the model it starts from, one message per silo and round (the "after");
``warm-no-prefetch`` -- the worker alone (an evaluation and a training exchange per round).

    PYTHONPATH=src .venv/bin/python benchmarks/flower.py --json \\
        [--config examples/heart_disease.yaml] [--rounds 4] [--data-dir ../shared/data] \\
        [--variants per-message,warm] [--set key=value ...]
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

VARIANTS = {
    "per-message": {"mode": "per-message", "prefetch": False},
    "warm": {"mode": "warm", "prefetch": True},
    "warm-no-prefetch": {"mode": "warm", "prefetch": False},
}


def _median(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def per_round(lines: list[dict[str, Any]]) -> list[float]:
    secs = [m["seconds"] for m in lines]
    return [b - a for a, b in zip(secs, secs[1:], strict=False)]


#: Exchange types and the silo-side work of each: a training request that carries the
#: evaluation of the model it starts from runs both at the silo.
EXCHANGES = {"fit": ("fit",), "evaluate": ("evaluate",), "fit+evaluate": ("evaluate", "fit")}


def breakdown(out: Path) -> dict[str, Any]:
    """Medians per exchange type over the rounds after the first."""
    flower = out / "flower"
    events = [e for e in _lines(flower / "transport.jsonl") if "seconds" in e and e["round"] > 0]
    timings = [
        t
        for path in flower.glob("silo-*/run-*/timings-silo-*.jsonl")
        for t in _lines(path)
        if t["round"] > 0
    ]

    def silo_side(action: str) -> dict[str, float]:
        tm = [t for t in timings if t["action"] in (action, f"{action}-replay")]
        start = [0.0 if t["warm"] else float(t["process_age_s"] or 0.0) for t in tm]
        inside = [
            s + t["build_s"] + t["compute_s"] + t["save_s"] for s, t in zip(start, tm, strict=True)
        ]
        return {
            "process_start_s": _median(start) or 0.0,
            "silo_build_s": _median([t["build_s"] for t in tm]) or 0.0,
            "compute_s": _median([t["compute_s"] for t in tm]) or 0.0,
            "save_s": _median([t["save_s"] for t in tm]) or 0.0,
            "inside_s": _median(inside) or 0.0,
        }

    result: dict[str, Any] = {}
    for action, parts in EXCHANGES.items():
        # A training request queued behind an exchange counts only the wait after it.
        ex = [
            e["wait_seconds"] if e.get("prefetched") else e["seconds"]
            for e in events
            if e["action"] == action
        ]
        if not ex:
            continue
        sides = [silo_side(p) for p in parts]
        row: dict[str, Any] = {"exchange_s": _median(ex)}
        for key in ("process_start_s", "silo_build_s", "compute_s", "save_s"):
            row[key] = sum(side[key] for side in sides)
        row["transport_polling_s"] = row["exchange_s"] - sum(side["inside_s"] for side in sides)
        result[action] = row
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "examples" / "heart_disease.yaml"))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--variants", default="per-message,warm")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"--variants: unknown {v!r}; choose from {', '.join(VARIANTS)}")

    import numpy as np

    from pdpfl.config import load_config
    from pdpfl.runtime.flower import run_flower
    from pdpfl.runtime.simulation import run_simulation

    config = load_config(
        args.config,
        [f"rounds={args.rounds}", "randomness=reproducible", *args.overrides],
        data_dir=args.data_dir,
    )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        sim = run_simulation(config, out / "sim", progress=False)
        sim_total = time.perf_counter() - t0
        sim_round = _median(per_round(_lines(out / "sim" / "metrics.jsonl")))
        reference = np.load(out / "sim" / "model.npz")
        for name in variants:
            run_dir = out / name
            t0 = time.perf_counter()
            run_flower(config, run_dir, round_timeout_s=300, **VARIANTS[name])
            total = time.perf_counter() - t0
            server = json.loads((run_dir / "flower" / "server_result.json").read_text())
            model = np.load(run_dir / "model.npz")
            s_round = _median(per_round(_lines(run_dir / "metrics.jsonl")))
            results[name] = {
                **VARIANTS[name],
                "s_per_round": s_round,
                "overhead_s_per_round": None if s_round is None else s_round - (sim_round or 0.0),
                "total_s": total,
                "startup_s": server["startup_seconds"],
                "per_exchange": breakdown(run_dir),
                "max_abs_param_diff": max(
                    float(np.max(np.abs(reference[k] - model[k]))) for k in reference.files
                ),
            }
    before, after = results.get("per-message"), results.get("warm")
    report = {
        "benchmark": "flower-vs-simulation",
        "config": Path(args.config).name,
        "silos": len(server["silo_nodes"]),
        "rounds": args.rounds,
        "simulation_s_per_round": sim_round,
        "simulation_total_s": sim_total,
        "final_accuracy": sim["final_accuracy"],
        "variants": results,
        "speedup_per_round": (
            before["s_per_round"] / after["s_per_round"]
            if before and after and after["s_per_round"]
            else None
        ),
        "target_s_per_round": None if sim_round is None else sim_round + 3.0 + 2.0,
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python "
        f"{platform.python_version()}, load {os.getloadavg()[0]:.1f}",
    }
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
