"""Per-round time of the Flower runtime vs the in-process simulator, and where it goes.

Runs the same config twice (simulation, then Flower on loopback with one SuperNode per silo)
and reports seconds per round, the Flower startup cost, the per-exchange wall time from
``flower/transport.jsonl`` and, from the silos' timing files, how much of an exchange is
spent starting the ClientApp process (interpreter + imports: ``clientapp_process_age_s``),
inside the ClientApp (``build_s``: silo from its data + state; ``compute_s``: training or
evaluation; ``save_s``: state) and in Flower's transport (SuperNode polling every 3 s, message
routing: ``flower_transport_s``).

    .venv/bin/python benchmarks/flower.py --json [--config examples/heart_disease.yaml]
        [--rounds 3] [--data-dir ../shared/data] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _median(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _import_seconds() -> float:
    """Wall time of a fresh Python that imports what a ClientApp process imports."""
    code = "import flwr.clientapp, torch, pdpfl.runtime.flower.apps, pdpfl.fl.factory"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "examples" / "heart_disease.yaml"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    from pdpfl.config import load_config
    from pdpfl.runtime.flower import run_flower
    from pdpfl.runtime.simulation import run_simulation

    config = load_config(
        args.config, [f"rounds={args.rounds}", *args.overrides], data_dir=args.data_dir
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        sim = run_simulation(config, out / "sim", progress=False)
        sim_total = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_flower(config, out / "flower", round_timeout_s=300, startup_timeout_s=300)
        flower_total = time.perf_counter() - t0

        sim_lines = [
            json.loads(x) for x in (out / "sim" / "metrics.jsonl").read_text().splitlines()
        ]
        fl_lines = [
            json.loads(x) for x in (out / "flower" / "metrics.jsonl").read_text().splitlines()
        ]
        server = json.loads((out / "flower" / "flower" / "server_result.json").read_text())
        events = [
            json.loads(x)
            for x in (out / "flower" / "flower" / "transport.jsonl").read_text().splitlines()
        ]
        timings = [
            json.loads(line)
            for path in (out / "flower" / "flower").glob("silo-*/run-*/timings-silo-*.jsonl")
            for line in path.read_text().splitlines()
        ]
        import numpy as np

        a = np.load(out / "sim" / "model.npz")
        b = np.load(out / "flower" / "model.npz")
        max_diff = max(float(np.max(np.abs(a[k] - b[k]))) for k in a.files)

    def per_round(lines: list[dict]) -> list[float]:
        secs = [m["seconds"] for m in lines]
        return [secs[0], *[b - a for a, b in zip(secs, secs[1:], strict=False)]]

    by_action: dict[str, dict[str, float | None]] = {}
    for action in ("fit", "evaluate"):
        ex = [e["seconds"] for e in events if e["action"] == action]
        tm = [t for t in timings if t["action"] == action]
        by_action[action] = {
            "exchange_s": _median(ex),
            "clientapp_build_s": _median([t["build_s"] for t in tm]),
            "clientapp_compute_s": _median([t["compute_s"] for t in tm]),
            "clientapp_save_s": _median([t["save_s"] for t in tm]),
            "clientapp_process_age_s": _median(
                [t["process_age_s"] for t in tm if t.get("process_age_s") is not None]
            ),
        }
        inside = sum(v or 0.0 for k, v in by_action[action].items() if k.startswith("clientapp"))
        by_action[action]["flower_transport_s"] = (
            None
            if by_action[action]["exchange_s"] is None
            else by_action[action]["exchange_s"] - inside
        )
    result = {
        "benchmark": "flower-vs-simulation",
        "config": str(Path(args.config).name),
        "silos": len(server["silo_nodes"]),
        "rounds": args.rounds,
        "simulation_s_per_round": _median(per_round(sim_lines)),
        "flower_s_per_round": _median(per_round(fl_lines)),
        "simulation_total_s": sim_total,
        "flower_total_s": flower_total,
        "flower_startup_s": server["startup_seconds"],
        "per_exchange": by_action,
        "clientapp_process_import_s": _import_seconds(),
        "max_abs_param_diff": max_diff,
        "final_accuracy": sim["final_accuracy"],
        "machine": f"{platform.machine()} {platform.python_version()}",
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
