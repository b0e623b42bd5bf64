"""Cost of secure summation (``aggregation: secure``) on a plain rPDP-FL round.

MNIST CNN (26,010 parameters), 10 silos (``examples/mnist10k_iid.yaml``), reproducible mode so
that both runs select the same silos. Two measurements in the same run:

* ``rounds``: full rPDP-FL rounds (local DP-SGD, summation, evaluation) with ``aggregation:
  plain`` and ``aggregation: secure`` -- median wall and CPU seconds per round (CPU time of
  this process, robust on a shared machine) and the relative overhead;
* ``protocol``: the summation alone, with every silo's contribution precomputed (``fit``
  returns a cached update), so training noise does not hide it: median seconds of
  ``PlainSum.collect`` and ``SecureSum.collect`` (key agreement, masking, unmasking) for all
  10 silos, and that difference relative to the plain round.

    .venv/bin/python benchmarks/secure_sum.py --json [--data-dir ../shared/data] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


class CachedClient:
    """Wraps a silo: the first fit trains, later fits return the same contribution."""

    def __init__(self, client) -> None:
        self.inner = client
        self.client_id = client.client_id
        self.cached = None

    def fit(self, params, round_index, config):
        if self.cached is None:
            self.cached = self.inner.fit(params, round_index, config)
        return self.cached

    def __getattr__(self, name):
        return getattr(self.inner, name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object (default)")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    from pdpfl.config import load_config
    from pdpfl.fl.aggregation import PlainSum
    from pdpfl.fl.aggregation.secure import SecureSum
    from pdpfl.fl.algorithm import build_federation_algorithms
    from pdpfl.models import get_params
    from pdpfl.runtime.loop import run_federation
    from pdpfl.runtime.simulation import InProcessTransport, load_federation_for

    base = ["randomness=reproducible", f"rounds={args.rounds}", *args.overrides]
    rounds: dict[str, list[float]] = {}
    fed = None
    for agg in ("plain", "secure"):
        cfg = load_config(ROOT / "examples" / "mnist10k_iid.yaml", [*base, f"aggregation={agg}"],
                          data_dir=args.data_dir)
        fed = fed or load_federation_for(cfg)
        server, clients = build_federation_algorithms(cfg, fed)
        marks = [(time.perf_counter(), time.process_time())]

        def on_round(t, line, marks=marks):
            marks.append((time.perf_counter(), time.process_time()))

        with tempfile.TemporaryDirectory() as out:
            run_federation(cfg, server, InProcessTransport(clients), out, progress=False,
                           on_round=on_round)
        rounds[agg] = [b[0] - a[0] for a, b in zip(marks[:-1], marks[1:], strict=True)]
        rounds[agg + "_cpu"] = [b[1] - a[1] for a, b in zip(marks[:-1], marks[1:], strict=True)]
    n_params = sum(int(p.size) for p in get_params(next(iter(clients.values())).model))

    # The protocol alone, on cached contributions of all silos.
    server, clients = build_federation_algorithms(cfg, fed)
    cached = {c: CachedClient(cl) for c, cl in clients.items()}
    transport = InProcessTransport(cached)
    params = server.initial_params()
    ids = list(cached)
    PlainSum().collect(transport, ids, params, 0, {}, server)  # trains once, fills the caches
    timings: dict[str, list[float]] = {"plain": [], "secure": [], "plain_cpu": [],
                                       "secure_cpu": []}
    for r in range(args.repeats):
        for name, proto in (("plain", PlainSum()), ("secure", SecureSum())):
            t0, c0 = time.perf_counter(), time.process_time()
            proto.collect(transport, ids, params, r + 1, {}, server)
            timings[name].append(time.perf_counter() - t0)
            timings[name + "_cpu"].append(time.process_time() - c0)
    plain_round = float(np.median(rounds["plain"]))
    secure_round = float(np.median(rounds["secure"]))
    plain_cpu = float(np.median(rounds["plain_cpu"]))
    secure_cpu = float(np.median(rounds["secure_cpu"]))
    protocol_extra = float(np.median(timings["secure"]) - np.median(timings["plain"]))
    protocol_extra_cpu = float(np.median(timings["secure_cpu"]) - np.median(timings["plain_cpu"]))
    result = {
        "benchmark": "secure_sum",
        "model": "mnist-cnn",
        "parameters": n_params,
        "silos": len(ids),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "load_average": os.getloadavg()},
        "rounds": {
            "plain_s": rounds["plain"], "secure_s": rounds["secure"],
            "plain_cpu_s": rounds["plain_cpu"], "secure_cpu_s": rounds["secure_cpu"],
            "median_plain_s": plain_round, "median_secure_s": secure_round,
            "overhead_wall": secure_round / plain_round - 1.0,
            "overhead_cpu": secure_cpu / plain_cpu - 1.0,
        },
        "protocol": {
            "plain_collect_s": float(np.median(timings["plain"])),
            "secure_collect_s": float(np.median(timings["secure"])),
            "plain_collect_cpu_s": float(np.median(timings["plain_cpu"])),
            "secure_collect_cpu_s": float(np.median(timings["secure_cpu"])),
            "extra_s": protocol_extra,
            "extra_cpu_s": protocol_extra_cpu,
            "overhead_vs_plain_round_wall": protocol_extra / plain_round,
            "overhead_vs_plain_round_cpu": protocol_extra_cpu / plain_cpu,
        },
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
