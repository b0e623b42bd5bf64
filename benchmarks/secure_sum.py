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

``consistency`` (issue #34, in the ``secagg`` rows): what the active-server defences add to a
secure round -- the ``consistency`` stage at the silos, the server's routing of the
confirmations, and the silos' authentication tags and checks in the other stages (pairwise
HMAC tags, :mod:`pdpfl.fl.aggregation.secure_identity`) -- as CPU seconds and as a share of the
rest of the round (``added_share_of_round``; goal ≤ 10 %). The silos' long-term identities and
their pairwise keys are made once per run (``identities_setup_cpu_s``, with one warm-up round),
not per round.

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
    """The pre-#22 SecureSum class, from git, registered as ``secure-v1`` (None without git, and
    since the gate of issue #33: its stages declare no messages, so it no longer loads)."""
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
    try:
        exec(compile(source, f"{LEGACY_COMMIT}:secure.py", "exec"), module.__dict__)  # noqa: S102
    except TypeError:  # since the gate (issue #33) every silo stage declares its messages
        return None
    return module.SecureSum


class TimedTransport:
    """In-process transport that times each silo's stage handler (silo share of the work), per
    stage, and the server's work between the masked uploads and the unmask stage (what the
    consistency round adds on the server: routing every survivor's confirmations)."""

    def __init__(
        self, clients: dict[int, Any], lose: int | None = None, security: Any = None
    ) -> None:
        from pdpfl.runtime.simulation import InProcessTransport

        self.inner = InProcessTransport(clients, security)
        self.client_ids = self.inner.client_ids
        self.lose = lose
        self.silo_s = 0.0
        self.stage_s: dict[str, float] = {}
        self._upload_done: float | None = None
        self.server_consistency_s = 0.0
        #: The :class:`AuthTimer` running (its seconds in the consistency stage are subtracted).
        self.timer: AuthTimer | None = None
        self.auth_in_consistency_s = 0.0

    def fit(self, selected, params, round_index, config):
        t0 = time.process_time()
        out = self.inner.fit(selected, params, round_index, config)
        self.silo_s += time.process_time() - t0
        return out

    def exchange(self, protocol, stage, requests, round_index):
        t0 = time.process_time()
        if stage == "unmask" and self._upload_done is not None:
            between = t0 - self._upload_done - self.stage_s.get("consistency", 0.0)
            self.server_consistency_s += between
        auth0 = self.timer.seconds if self.timer is not None else 0.0
        replies = self.inner.exchange(protocol, stage, requests, round_index)
        spent = time.process_time() - t0
        if stage == "consistency" and self.timer is not None:
            self.auth_in_consistency_s += self.timer.seconds - auth0
        self.silo_s += spent
        self.stage_s[stage] = self.stage_s.get(stage, 0.0) + spent
        if stage == "upload":
            self._upload_done = time.process_time()
        if self.lose is not None and stage == "upload":
            replies.pop(self.lose, None)
        return replies


class AuthTimer:
    """CPU seconds the silos spend authenticating (their tags and tag checks, every stage)."""

    def __init__(self) -> None:
        from pdpfl.fl.aggregation.secure_identity import SiloSecurity

        self.cls = SiloSecurity
        self.tags, self.check = SiloSecurity.tags, SiloSecurity.check
        self.seconds = 0.0

    def __enter__(self) -> AuthTimer:
        def timed(method: Any) -> Any:
            def wrapper(*args: Any, **kw: Any) -> Any:
                t0 = time.process_time()
                try:
                    return method(*args, **kw)
                finally:
                    self.seconds += time.process_time() - t0

            return wrapper

        self.cls.tags = timed(self.tags)  # type: ignore[method-assign]
        self.cls.check = timed(self.check)  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self.cls.tags, self.cls.check = self.tags, self.check  # type: ignore[method-assign]


def time_protocols(n: int, repeats: int, d: int) -> dict[str, Any]:
    from pdpfl.fl.aggregation import PlainSum
    from pdpfl.fl.aggregation.secure import SecureSum
    from pdpfl.fl.aggregation.secure_identity import ephemeral_security

    rng = np.random.default_rng(0)
    params = [np.zeros(d, dtype=np.float32)]
    updates = {c: [rng.normal(0, 0.01, d).astype(np.float32)] for c in range(n)}
    # The silos' long-term identities and their pairwise keys: made once per run (a deployment:
    # once per silo pair for good), timed apart from the rounds.
    t0 = time.process_time()
    security = ephemeral_security(list(range(n)))
    warm = TimedTransport({c: CachedClient(c, updates[c]) for c in range(n)}, None, security)
    SecureSum().collect(warm, list(range(n)), params, -1, {}, Server())
    setup_s = time.process_time() - t0
    legacy = legacy_protocol()
    variants: dict[str, tuple[Any, int | None]] = {
        "plain": (PlainSum, None),
        "secagg": (SecureSum, None),
        "secagg_one_lost": (SecureSum, n - 1),
    }
    if legacy is not None:
        variants["pairwise"] = (legacy, None)
    out: dict[str, Any] = {"identities_setup_cpu_s": setup_s}
    for name, (factory, lose) in variants.items():
        wall, cpu, silo, consistency, auth, server_cons = [], [], [], [], [], []
        for r in range(repeats):
            clients = {c: CachedClient(c, updates[c]) for c in range(n)}
            transport = TimedTransport(clients, lose, security)
            with AuthTimer() as timer:
                transport.timer = timer
                t0, c0 = time.perf_counter(), time.process_time()
                agg = factory().collect(transport, list(range(n)), params, r, {}, Server())
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            silo.append(transport.silo_s)
            consistency.append(transport.stage_s.get("consistency", 0.0))
            # the tags of the consistency stage are in its stage time already
            auth.append(timer.seconds - transport.auth_in_consistency_s)
            server_cons.append(transport.server_consistency_s)
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
        if name.startswith("secagg"):
            # What issue #34 added to a round: the consistency stage (silos), the server's
            # routing of confirmations, and every tag / tag check of the other stages.
            cons = np.asarray(consistency)
            added = cons + np.asarray(server_cons) + np.asarray(auth)
            out[name]["consistency_stage_silos_cpu_s"] = float(np.median(cons))
            out[name]["consistency_server_cpu_s"] = float(np.median(server_cons))
            out[name]["auth_other_stages_cpu_s"] = float(np.median(auth))
            out[name]["added_cpu_s"] = float(np.median(added))
            out[name]["added_share_of_round"] = float(np.median(added / (np.asarray(cpu) - added)))
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
    result["goal_consistency"] = {
        # issue #34: what the consistency round and the authentication add to a secure round
        n: result["protocol"][n]["secagg"]["added_share_of_round"]
        for n in ("10", "100")
    }
    result["goal_consistency"]["target"] = 0.10
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
