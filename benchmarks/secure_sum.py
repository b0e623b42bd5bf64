"""Cost of secure summation (``aggregation: secure``) against a plain rPDP-FL round.

Three summation protocols, timed in the same run on the same machine:

* ``plain`` -- :class:`~pdpfl.fl.aggregation.PlainSum`;
* ``pairwise`` -- the protocol before issue #22 (pairwise masks only, abort-and-retry on a
  dropout), loaded from git commit ``LEGACY_COMMIT`` and registered under another name: "today's
  protocol" of the issue;
* ``secagg`` -- :class:`~pdpfl.fl.aggregation.secure.SecureSum`: double masking with
  Shamir-shared seeds (four stages), without dropouts and with one silo lost after its upload
  (``secagg_one_lost``: the server reconstructs that silo's mask seed and removes its pairwise
  masks).

``protocol``: the summation alone for 10 and 100 silos with synthetic updates of the MNIST CNN's
size (26,010 parameters, ``fit`` returns a cached vector), median of ``--repeats`` calls: wall
and CPU seconds of the whole in-process round (every silo's and the server's work, one after the
other), split into the silos' share (mean per silo) and the server's -- in a deployment the
silos work in parallel, so a round's added latency is about server + one silo.

``rounds``: full rPDP-FL rounds at 10 silos (MNIST-10k IID, local DP-SGD, summation,
evaluation; ``client_rate=1`` so that every silo takes part), plain and secure, median seconds
per round; the goal of issue #22 is secagg's extra cost ≤ 25 % of a plain round at 10 silos.

    .venv/bin/python benchmarks/secure_sum.py --json [--data-dir ../shared/data] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

#: The last commit with the pairwise-only protocol (issue #13's ``fl/aggregation/secure.py``).
LEGACY_COMMIT = "d80a4f6"
MNIST_CNN_PARAMS = 26_010


class CachedClient:
    """A silo whose ``fit`` returns one fixed contribution (training out of the picture)."""

    def __init__(self, cid: int, update: list[np.ndarray]) -> None:
        self.client_id = cid
        self.update = update

    def fit(self, params, round_index, config):
        from pdpfl.fl.api import Contribution

        return Contribution(update=self.update, weight=1.0)


class Server:
    public_metrics: frozenset[str] = frozenset()
    needs_individual_updates = False


@functools.lru_cache(maxsize=1)
def legacy_protocol() -> Any:
    """The pre-#22 SecureSum class, from git, registered as ``secure-v1`` (None without git)."""
    try:
        source = subprocess.run(
            ["git", "show", f"{LEGACY_COMMIT}:src/pdpfl/fl/aggregation/secure.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    source = source.replace('PROTOCOL = "secure"', 'PROTOCOL = "secure-v1"')
    module = types.ModuleType("pdpfl_legacy_secure")
    exec(compile(source, f"{LEGACY_COMMIT}:secure.py", "exec"), module.__dict__)  # noqa: S102
    return module.SecureSum


class TimedTransport:
    """In-process transport that times each silo's stage handler (silo share of the work)."""

    def __init__(self, clients: dict[int, Any], lose: int | None = None) -> None:
        from pdpfl.runtime.simulation import InProcessTransport

        self.inner = InProcessTransport(clients)
        self.client_ids = self.inner.client_ids
        self.lose = lose
        self.silo_s = 0.0

    def fit(self, selected, params, round_index, config):
        t0 = time.process_time()
        out = self.inner.fit(selected, params, round_index, config)
        self.silo_s += time.process_time() - t0
        return out

    def exchange(self, protocol, stage, requests, round_index):
        t0 = time.process_time()
        replies = self.inner.exchange(protocol, stage, requests, round_index)
        self.silo_s += time.process_time() - t0
        if self.lose is not None and stage == "upload":
            replies.pop(self.lose, None)
        return replies


def time_protocols(n: int, repeats: int, d: int) -> dict[str, Any]:
    from pdpfl.fl.aggregation import PlainSum
    from pdpfl.fl.aggregation.secure import SecureSum

    rng = np.random.default_rng(0)
    params = [np.zeros(d, dtype=np.float32)]
    updates = {c: [rng.normal(0, 0.01, d).astype(np.float32)] for c in range(n)}
    legacy = legacy_protocol()
    variants: dict[str, tuple[Any, int | None]] = {
        "plain": (PlainSum, None),
        "secagg": (SecureSum, None),
        "secagg_one_lost": (SecureSum, n - 1),
    }
    if legacy is not None:
        variants["pairwise"] = (legacy, None)
    out: dict[str, Any] = {}
    for name, (factory, lose) in variants.items():
        wall, cpu, silo = [], [], []
        for r in range(repeats):
            clients = {c: CachedClient(c, updates[c]) for c in range(n)}
            transport = TimedTransport(clients, lose)
            t0, c0 = time.perf_counter(), time.process_time()
            agg = factory().collect(transport, list(range(n)), params, r, {}, Server())
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            silo.append(transport.silo_s)
            assert agg.count == (n if lose is None else n - 1), (name, agg.count)
        med_cpu, med_silo = float(np.median(cpu)), float(np.median(silo))
        out[name] = {
            "wall_s": float(np.median(wall)),
            "cpu_s": med_cpu,
            "silos_cpu_s": med_silo,
            "per_silo_cpu_s": med_silo / n,
            "server_cpu_s": med_cpu - med_silo,
            "critical_path_cpu_s": med_cpu - med_silo + med_silo / n,
        }
    return out


def time_rounds(args: argparse.Namespace) -> dict[str, Any]:
    from pdpfl.config import load_config
    from pdpfl.fl.algorithm import build_federation_algorithms
    from pdpfl.runtime.loop import run_federation
    from pdpfl.runtime.simulation import InProcessTransport, load_federation_for

    base = ["randomness=reproducible", f"rounds={args.rounds}", "client_rate=1", *args.overrides]
    out: dict[str, Any] = {}
    fed = None
    for agg in ("plain", "secure"):
        cfg = load_config(
            ROOT / "examples" / "mnist10k_iid.yaml",
            [*base, f"aggregation={agg}"],
            data_dir=args.data_dir,
        )
        fed = fed or load_federation_for(cfg)
        server, clients = build_federation_algorithms(cfg, fed)
        marks = [(time.perf_counter(), time.process_time())]

        def on_round(t: int, line: dict, marks: list = marks) -> None:
            marks.append((time.perf_counter(), time.process_time()))

        with tempfile.TemporaryDirectory() as tmp:
            run_federation(
                cfg, server, InProcessTransport(clients), tmp, progress=False, on_round=on_round
            )
        out[agg] = {
            "wall_s": [b[0] - a[0] for a, b in zip(marks[:-1], marks[1:], strict=True)],
            "cpu_s": [b[1] - a[1] for a, b in zip(marks[:-1], marks[1:], strict=True)],
        }
        out[agg]["median_wall_s"] = float(np.median(out[agg]["wall_s"]))
        out[agg]["median_cpu_s"] = float(np.median(out[agg]["cpu_s"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object (default)")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--repeats-100", type=int, default=3)
    ap.add_argument("--skip-rounds", action="store_true", help="protocols only")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    result: dict[str, Any] = {
        "benchmark": "secure_sum",
        "parameters": MNIST_CNN_PARAMS,
        "legacy_commit": LEGACY_COMMIT,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_start": os.getloadavg(),
        },
        "protocol": {
            "10": time_protocols(10, args.repeats, MNIST_CNN_PARAMS),
            "100": time_protocols(100, args.repeats_100, MNIST_CNN_PARAMS),
        },
    }
    if not args.skip_rounds:
        rounds = time_rounds(args)
        result["rounds_10_silos"] = rounds
        plain_round = rounds["plain"]["median_wall_s"]
        plain_round_cpu = rounds["plain"]["median_cpu_s"]
        p10 = result["protocol"]["10"]
        extra = p10["secagg"]["wall_s"] - p10["plain"]["wall_s"]
        extra_cpu = p10["secagg"]["cpu_s"] - p10["plain"]["cpu_s"]
        result["goal"] = {
            "secagg_extra_s_10_silos": extra,
            "overhead_vs_plain_round_wall": extra / plain_round,
            "overhead_vs_plain_round_cpu": extra_cpu / plain_round_cpu,
            "target": 0.25,
        }
    result["machine"]["load_average_end"] = os.getloadavg()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
