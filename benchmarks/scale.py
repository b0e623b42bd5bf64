"""Scale: time per round and peak memory as the number of clients grows (issue #37 item 4).

Each case runs in its own Python process (so that its peak memory is its own) through the
public API -- :func:`pdpfl.runtime.simulation.run_simulation` (in-process simulator) or
:func:`pdpfl.runtime.flower.simulation_engine.run_flower_simulation` (Flower's Simulation Engine,
Ray) -- and reports:

* ``s_per_round``: median time of the rounds after the first and before the last (from the
  cumulative ``seconds`` of ``metrics.jsonl``; the first round includes one-off work: calibration
  memo, model set-up; on the Simulation Engine the last round is evaluated by every silo, their
  catch-up charges included), and ``first_round_s``, ``last_round_s``; ``setup_s``: the call's
  time before round 1 and after the last round (building the parties, writing the outputs);
  ``cpu_s_per_round`` (in-process only): the median CPU time of this process per round after
  the first -- unlike wall time, not inflated by other processes on a loaded machine;
* ``rss_data_mb``: the process's resident memory after the federation is loaded (before any
  silo is built) -- "the data";
* ``rss_peak_mb``: the peak of the resident memory of the process *and all its descendants*
  (Ray's raylet, object store and actors for the engine), sampled every 0.1 s, summed over the
  processes at each sample; ``rss_above_data_mb`` = peak - data, and that per 1,000 clients;
* ``total_s``: the whole call (data loading, Ray's start-up and shutdown included).

Each case charges a fresh budget store of its own (``lifetime.store`` in a temporary folder).

Cases (``--cases``): ``idp:N`` -- IDP-FedAvg (``examples/idp_fedavg_mnist10k.yaml``: logistic
regression, c = 100 clients sampled per round whatever N, one local epoch) on MNIST-10k split over
N clients; ``rpdp:N`` -- rPDP-FL (``examples/mnist10k_iid.yaml``: the MNIST CNN, λ = 0.5, τ = 5)
over N silos. Growth: for each algorithm and runtime, the ratios of ``s_per_round`` and of
``rss_above_data_mb`` between the largest and the smallest N are printed beside N's ratio -- cost
per round linear in the *sampled* clients means ``s_per_round`` stays flat as N grows.

    nice -n 10 .venv/bin/python benchmarks/scale.py --json --data-dir ../shared/data \\
        --cases idp:1000 idp:10000 rpdp:100 --runtimes simulation flower-simulation --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "idp": (
        "examples/idp_fedavg_mnist10k.yaml",
        ["algorithm.clients_per_round=100", "algorithm.local_epochs=1"],
    ),
    "rpdp": ("examples/mnist10k_iid.yaml", ["training.local_steps=5"]),
}


def _tree_rss_mb(root: int) -> float:
    """Resident memory (MB) of ``root`` and every descendant, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        pid, ppid = int(entry), int(fields.get("PPid", "0").strip() or 0)
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0] or 0)
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total / 1024.0


class PeakSampler:
    """Peak of :func:`_tree_rss_mb` of this process, sampled in a thread."""

    def __init__(self, every_s: float = 0.1) -> None:
        self.peak, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def _run(self, every_s: float) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_rss_mb(os.getpid()))
            self._stop.wait(every_s)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _tree_rss_mb(os.getpid()))


def run_case(
    case: str, runtime: str, rounds: int, data_dir: str | None, work_dir: str | None = None
) -> dict[str, Any]:
    """One case in this process (the child of :func:`main`), its files under ``work_dir``."""
    from pdpfl.config import load_config
    from pdpfl.runtime.simulation import load_federation_for, run_simulation

    algorithm, n = case.split(":")
    path, overrides = CONFIGS[algorithm]
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="pdpfl-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    config = load_config(
        ROOT / path,
        [
            *overrides,
            f"data.num_clients={int(n)}",
            f"rounds={rounds}",
            "threads=1",
            # a fresh budget store: no earlier run on this data to compose with (the
            # lifetime composition grows with the runs a machine's store holds)
            f"lifetime.store={work / 'budgets'}",
        ],
        data_dir=data_dir,
    )
    out = work / "run"
    import pdpfl.runtime.run_state as run_state

    cpu: list[float] = []  # this process's CPU time at the end of each round (in-process)
    save_round = run_state.save_round  # the round loop's checkpoint (RunState.checkpoint)

    def timed(*args: Any, **kwargs: Any) -> None:
        save_round(*args, **kwargs)
        cpu.append(time.process_time())

    run_state.save_round = timed
    t0 = time.perf_counter()
    with PeakSampler() as peak:
        if runtime == "simulation":
            federation = load_federation_for(config)
            rss_data = _tree_rss_mb(os.getpid())
            run_simulation(config, out, progress=False, federation=federation)
        else:
            from pdpfl.runtime.flower.simulation_engine import run_flower_simulation

            load_federation_for(config)  # the same data in this process (the ServerApp's)
            rss_data = _tree_rss_mb(os.getpid())
            run_flower_simulation(config, out, client_resources={"num_cpus": 1.0})
    total = time.perf_counter() - t0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    cumulative = [float(m["seconds"]) for m in lines]  # metrics.jsonl: seconds since start
    seconds = [b - a for a, b in zip([0.0, *cumulative], cumulative, strict=False)]
    return {
        "case": case,
        "runtime": runtime,
        "clients": int(n),
        "sampled_per_round": [len(m["selected"]) for m in lines],
        "rounds": len(lines),
        "first_round_s": round(seconds[0], 3),
        # after the first and before the last round: on the Simulation Engine the last round is
        # evaluated by every silo (all their catch-up charges), a one-off O(N) like the start-up
        "s_per_round": round(statistics.median(seconds[1:-1] or seconds[1:] or seconds), 3),
        "last_round_s": round(seconds[-1], 3),
        # CPU seconds of this process per round after the first (the in-process simulator runs
        # in it; not inflated by other processes' load, unlike wall time)
        "cpu_s_per_round": round(statistics.median(np.diff(cpu)), 3)
        if runtime == "simulation" and len(cpu) > 1
        else None,
        "rss_data_mb": round(rss_data, 1),
        "rss_peak_mb": round(peak.peak, 1),
        "rss_above_data_mb": round(peak.peak - rss_data, 1),
        "rss_above_data_mb_per_1000_clients": round((peak.peak - rss_data) * 1000 / int(n), 1),
        "setup_s": round(total - cumulative[-1], 1),
        # the engine's end-of-run catch-up of the silos' ledgers (part of setup_s)
        "catch_up_s": _catch_up_s(out),
        "total_s": round(total, 1),
    }


def _catch_up_s(out: Path) -> float | None:
    """Seconds of the Simulation Engine's end-of-run catch-up (None in-process)."""
    path = out / "flower" / "catch_up.json"
    return round(float(json.loads(path.read_text())["seconds"]), 2) if path.exists() else None


def _partial(work: Path, started: float) -> dict[str, Any]:
    """What a case stopped at ``--timeout`` had done: the rounds in its ``metrics.jsonl``
    (cumulative seconds since the run's start) and the seconds from the case's start to the
    run's first round line (set-up + first round)."""
    path = work / "run" / "metrics.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines() if x] if path.exists() else []
    cumulative = [float(m["seconds"]) for m in lines]
    seconds = [b - a for a, b in zip([0.0, *cumulative], cumulative, strict=False)]
    return {
        "rounds_done": len(lines),
        "round_s": [round(x, 1) for x in seconds],
        "sampled_per_round": [len(m["selected"]) for m in lines],
        "stopped_after_s": round(time.perf_counter() - started, 1),
    }


def _growth(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    results = [r for r in results if "error" not in r]
    keys = sorted({(r["case"].split(":")[0], r["runtime"]) for r in results})
    for algorithm, runtime in keys:
        rows = sorted(
            (r for r in results if r["case"].startswith(algorithm) and r["runtime"] == runtime),
            key=lambda r: r["clients"],
        )
        rows = [r for r in rows if "error" not in r]
        if len(rows) < 2:
            continue
        lo, hi = rows[0], rows[-1]
        out.append(
            {
                "algorithm": algorithm,
                "runtime": runtime,
                "clients_ratio": hi["clients"] / lo["clients"],
                "s_per_round_ratio": round(hi["s_per_round"] / lo["s_per_round"], 2),
                "cpu_s_per_round_ratio": round(hi["cpu_s_per_round"] / lo["cpu_s_per_round"], 2)
                if hi.get("cpu_s_per_round") and lo.get("cpu_s_per_round")
                else None,
                "rss_above_data_ratio": round(
                    hi["rss_above_data_mb"] / max(lo["rss_above_data_mb"], 1e-9), 2
                ),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["idp:1000", "idp:10000", "rpdp:100"])
    parser.add_argument("--runtimes", nargs="+", default=["simulation"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per case")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "RUNTIME"), help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        row = run_case(args.child[0], args.child[1], args.rounds, args.data_dir, args.work)
        print(json.dumps(row))
        return
    load = [os.getloadavg()[0]]
    results = []
    for runtime in args.runtimes:
        for case in args.cases:
            work = Path(tempfile.mkdtemp(prefix="pdpfl-scale-"))
            cmd = [sys.executable, __file__, "--child", case, runtime, "--rounds", str(args.rounds)]
            cmd += ["--work", str(work)]
            if args.data_dir:
                cmd += ["--data-dir", args.data_dir]
            started = time.perf_counter()
            # its own process group: a case stopped at --timeout takes Ray's processes with it
            child = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            try:
                stdout, stderr = child.communicate(timeout=args.timeout)
                last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
                row = json.loads(last) if child.returncode == 0 else None
                if row is None:
                    row = {"case": case, "runtime": runtime, "error": stderr[-800:]}
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.communicate()
                row = {
                    "case": case,
                    "runtime": runtime,
                    "error": f"over {args.timeout:g} s",
                    **_partial(work, started),
                }
            results.append(row)
            if not args.json:
                print(json.dumps(row), flush=True)
    load.append(os.getloadavg()[0])
    report = {
        "results": results,
        "growth": _growth(results),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_1min_before_after": load,
        },
    }
    print(json.dumps(report, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
