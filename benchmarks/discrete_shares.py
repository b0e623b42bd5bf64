"""Discrete vs continuous noise shares, end to end (issue #33, "Done when").

Runs one example config with ``privacy.noise_shares: discrete`` and ``continuous`` for several
seeds, interleaved (discrete, continuous, discrete, ...) so that machine load hits both alike,
at the same planned ε (``privacy.epsilon_max``: σ is calibrated against each mode's own
accountant), and reports per mode: the final accuracy (mean of the last 3 rounds' global test
accuracy) with its standard error, the ε spent, the wall seconds per round (the run's seconds /
rounds, calibration and setup included; and the median round alone, from ``metrics.jsonl``)
and the bits per coordinate on the wire (uint32 shares
vs the Z_2^64 fixed-point ring). Every run goes through ``pdpfl run`` (secure summation).

``--silo-cpu R``: instead, the silos' own CPU time per round in-process (the same config and
overrides through :func:`pdpfl.runtime.simulation.run_simulation`, each mode R times,
interleaved, the order reversed every other repetition): process CPU seconds inside the
simulation transport's ``fit`` and ``exchange`` (every asked silo's training, rounding, share
and gate, and its secure-summation stages; the server and evaluation excluded), per round, the
first round dropped (set-up); the best of the R runs' median round per mode, and their ratio.

Usage (the numbers of ``benchmarks/RESULTS.md``)::

    nice -n 10 .venv/bin/python benchmarks/discrete_shares.py examples/uldp_heart.yaml \\
        --seeds 5 --epsilon 5 --set rounds=10 --set algorithm.local_epochs=10
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


DATA_DIR = ROOT.parent / "shared" / "data"


def _run(config: str, out: Path, seed: int, mode: str, eps: float, extra: list[str]) -> dict:
    sets = [
        f"seed={seed}",
        "aggregation=secure",
        "privacy.noise_multiplier=null",
        f"privacy.epsilon_max={eps}",
        f"privacy.noise_shares={mode}",
        f"lifetime.store={out.parent / (out.name + '-store')}",  # parallel runs: one store each
        *extra,
    ]
    cmd = [sys.executable, "-c", "from pdpfl.cli import main; main()", "run", config]
    cmd += ["--out", str(out), "--force", "--quiet", "--data-dir", str(DATA_DIR)]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    summary = json.loads((out / "summary.json").read_text())
    shares = summary["aggregation"].get("discrete_shares")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    cumulative = [float(json.loads(line)["seconds"]) for line in lines if line.strip()]
    rounds = np.diff([0.0, *cumulative])  # metrics.jsonl's seconds are cumulative
    return {
        "accuracy": float(summary["last3_mean_accuracy"]),
        "epsilon": float(summary["eps_spent_max"]["third_party"]),
        "seconds_per_round": float(summary["seconds"]) / max(1, summary["rounds_completed"]),
        # the rounds alone (set-up and calibration left out), the first round excluded
        "round_seconds_median": float(np.median(rounds[1:] if len(rounds) > 1 else rounds)),
        "bits_per_coordinate": 64 if shares is None else int(shares["bits_per_coordinate"]),
        "noise_multiplier": summary.get("noise_multiplier"),
    }


def _silo_cpu(config: str, mode: str, eps: float, extra: list[str]) -> list[float]:
    """CPU seconds per round spent in the simulation transport's ``fit`` and ``exchange`` (the
    silos' training and release, and their stages of secure summation; one in-process run)."""
    import time

    from pdpfl.config.loading import load_config
    from pdpfl.runtime import simulation

    sets = [
        "aggregation=secure",
        "privacy.noise_multiplier=null",
        f"privacy.epsilon_max={eps}",
        f"privacy.noise_shares={mode.split('-')[0]}",
        *extra,
    ]
    cfg = load_config(config, sets, data_dir=str(DATA_DIR))
    per_round: dict[int, float] = {}
    real = simulation.InProcessTransport.fit
    real_exchange = simulation.InProcessTransport.exchange

    def timed(self, selected, params, round_index, config):  # type: ignore[no-untyped-def]
        c0 = time.process_time()
        try:
            return real(self, selected, params, round_index, config)
        finally:
            t = int(round_index)
            per_round[t] = per_round.get(t, 0.0) + time.process_time() - c0

    def timed_exchange(self, protocol, stage, requests, round_index):  # type: ignore[no-untyped-def]
        c0 = time.process_time()
        try:
            return real_exchange(self, protocol, stage, requests, round_index)
        finally:
            t = int(round_index)
            per_round[t] = per_round.get(t, 0.0) + time.process_time() - c0

    from pdpfl import discrete_table

    limit = discrete_table.MAX_TABLE_VARIANCE
    if mode == "discrete-cks":  # the CKS sampler of before the alias table, for comparison
        discrete_table.MAX_TABLE_VARIANCE = 0
    simulation.InProcessTransport.fit = timed  # type: ignore[method-assign]
    simulation.InProcessTransport.exchange = timed_exchange  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            simulation.run_simulation(cfg, Path(tmp) / "run", progress=False)
    finally:
        simulation.InProcessTransport.fit = real  # type: ignore[method-assign]
        simulation.InProcessTransport.exchange = real_exchange  # type: ignore[method-assign]
        discrete_table.MAX_TABLE_VARIANCE = limit
    return [per_round[t] for t in sorted(per_round)]


def silo_cpu(args: argparse.Namespace) -> dict:
    """The ``--silo-cpu`` measurement (module docstring)."""
    import torch

    torch.set_num_threads(1)
    per: dict[str, list[float]] = {"discrete": [], "continuous": []}
    if args.cks:
        per["discrete-cks"] = []
    for rep in range(args.silo_cpu):
        order = list(per) if rep % 2 == 0 else list(per)[::-1]  # alternate: load drifts
        for mode in order:
            rounds = _silo_cpu(args.config, mode, args.epsilon, args.extra)
            per[mode].append(float(np.median(rounds[1:] if len(rounds) > 1 else rounds)))
    best = {mode: min(v) for mode, v in per.items()}
    ratios = {m: best[m] / best["continuous"] for m in per if m != "continuous"}
    return {
        "config": args.config,
        "overrides": args.extra,
        "machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
        "silo_cpu_s_per_round": per,
        "best": best,
        "ratio_over_continuous": ratios,
    }


def main() -> None:
    global DATA_DIR
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epsilon", type=float, default=5.0)
    ap.add_argument("--set", action="append", default=[], dest="extra")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--data-dir", type=Path, default=None, help="default: ../shared/data")
    ap.add_argument(
        "--jobs", type=int, default=1, help="runs at once (each its own process; add threads=1)"
    )
    ap.add_argument("--silo-cpu", type=int, default=0, metavar="R")
    ap.add_argument(
        "--cks", action="store_true", help="--silo-cpu: also discrete shares from the CKS sampler"
    )
    args = ap.parse_args()
    if args.data_dir is not None:
        DATA_DIR = args.data_dir.resolve()
    if args.silo_cpu:
        sys.path.insert(0, str(ROOT / "src"))
        print(json.dumps(silo_cpu(args), indent=1))
        return
    runs: dict[str, list[dict]] = {"discrete": [], "continuous": []}
    jobs = [(seed, mode) for seed in range(1, args.seeds + 1) for mode in runs]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = [
            pool.submit(_run, args.config, Path(tmp) / f"{m}-{s}", s, m, args.epsilon, args.extra)
            for s, m in jobs
        ]
        for (_, mode), fut in zip(jobs, futures, strict=True):
            runs[mode].append(fut.result())
    table = {}
    for mode, rs in runs.items():
        acc = np.array([r["accuracy"] for r in rs])
        sec = np.array([r["seconds_per_round"] for r in rs])
        table[mode] = {
            "accuracy_mean": float(acc.mean()),
            "accuracy_se": float(acc.std(ddof=1) / math.sqrt(len(acc))) if len(acc) > 1 else 0.0,
            "epsilon_max": max(r["epsilon"] for r in rs),
            "seconds_per_round_median": float(np.median(sec)),
            "round_seconds_median": float(np.median([r["round_seconds_median"] for r in rs])),
            "bits_per_coordinate": rs[0]["bits_per_coordinate"],
            "noise_multiplier": rs[0]["noise_multiplier"],
            "runs": rs,
        }
    d, c = table["discrete"], table["continuous"]
    result = {
        "config": args.config,
        "overrides": args.extra,
        "seeds": args.seeds,
        "epsilon": args.epsilon,
        "machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
        "modes": table,
        "accuracy_difference": d["accuracy_mean"] - c["accuracy_mean"],
        "within_one_se": abs(d["accuracy_mean"] - c["accuracy_mean"])
        <= max(d["accuracy_se"], c["accuracy_se"]),
        "time_ratio": d["seconds_per_round_median"] / c["seconds_per_round_median"],
        "round_time_ratio": d["round_seconds_median"] / c["round_seconds_median"],
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{args.config} {' '.join(args.extra)}, {args.seeds} seeds, ε = {args.epsilon}")
    print("| shares | accuracy (mean ± SE) | ε spent | σ | s / round | bits / coordinate |")
    print("|---|---|---|---|---|---|")
    for mode, row in table.items():
        print(
            f"| {mode} | {row['accuracy_mean']:.4f} ± {row['accuracy_se']:.4f} | "
            f"{row['epsilon_max']:.4f} | {row['noise_multiplier']:.4f} | "
            f"{row['seconds_per_round_median']:.2f} | {row['bits_per_coordinate']} |"
        )
    print(
        f"difference {result['accuracy_difference']:+.4f} (within one SE: "
        f"{result['within_one_se']}); time ratio {result['time_ratio']:.3f}"
    )


if __name__ == "__main__":
    main()
