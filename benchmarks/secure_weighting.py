"""ULDP-FL private weighting (Protocol 1): pdpfl's implementation vs a straightforward one.

For every (d parameters, |U| users, |S| silos) of the grid, with Paillier keys of ``--bits``
bits (3072 by default), it measures in the same run:

* **pdpfl** (``pdpfl.fl.aggregation.private_weighting``: gmpy2, per-setup work done once,
  shared X_u, Straus multi-exponentiation with short signed exponents, CRT, ``--workers``
  processes);
* **straightforward**: the same protocol steps written directly on python-paillier (``phe``,
  which itself uses gmpy2 when installed, as here): finite-field DH (RFC 3526 group 15,
  256-bit exponents, as the reference's pyDH), per round ⟦β_u⟧·n_{s,u}·r_u·DIV for every user
  and ⟦w⟧·v for every (user, parameter) with phe's ``max_int = n - 1`` (as the reference), the
  noise and masks added as plaintexts, phe's CRT decryption.

Phases (seconds): ``key_exchange`` (Paillier keygen + DH between silos), ``blinded_histogram``
(r_u, masked blinded histograms, the server's inverses), ``weights_setup`` (pdpfl only, once per
run without user sub-sampling: encrypt ⟦β_u⟧, X_u = ⟦β_u⟧^{r_u·DIV} shared among silos, tables,
verification), ``silo_weighting`` (one silo, one round: everything from the clipped deltas to
its masked ciphertexts; averaged over silos), ``aggregation`` (server: ⊕, decryption, Decode).
The straightforward version recomputes the weights every round, as the reference does (its
``weights_setup`` is the server's encryption of ⟦β_u⟧ only).

Where a run would take too long, the straightforward version is *measured on a sample* and
scaled: per-user weight preparation on ``--ref-users`` users, (user, parameter) products on
``--ref-products`` pairs, decryptions on ``--ref-coords`` coordinates; pdpfl runs at most
``--max-coords`` coordinates per silo and scales the per-coordinate phases linearly. Both are
reported (``scaled``: which phases were extrapolated, and from what sample).

``heart_round``: a full private-weights round (setup + one round) for the Heart model
(d = 14), 100 users, 4 silos, wall time on ``--workers`` cores -- the goal is < 10 s -- and its
CPU seconds (this process and its workers; on a quiet 2-core machine the wall time is at most
the CPU time and at least about half of it).

``--subsampling``: only the extra cost of private user-level sub-sampling (Sec. 4.1,
``algorithm.subsampling: private``: P Paillier ciphertexts per user and a 1-out-of-P oblivious
transfer per user) against the server drawing the sample (Algorithm 4: one ciphertext per user),
both re-encrypting the weights every round, in the same run: a steady round's wall time in each
mode for every |U| of ``--users`` (d = 14, |S| = ``--silos``[0], q = 1/2, P = ``--ot-items``),
the extra seconds per round and per user, and the server's time in the transfers.

    .venv/bin/python benchmarks/secure_weighting.py --json [--quick] [--workers 2]
    .venv/bin/python benchmarks/secure_weighting.py --subsampling --users 10 50 100
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from pdpfl.fl.aggregation.private_weighting import (  # noqa: E402
    PrivateWeightedSum,
    UserUpdates,
    cpu_seconds,
    divisor,
    plain_weighted_sum,
)
from pdpfl.runtime.simulation import InProcessTransport  # noqa: E402

# RFC 3526 group 15 (3072-bit MODP), the group the reference implementation uses via pyDH.
MODP_3072 = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD"
    "EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED"
    "EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA48361C55D39A69163FA8FD24CF5F"
    "83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804F1746C08CA18217C32905E462E36CE3B"
    "E39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6955817183995497CEA956AE515D2261898FA0510"
    "15728E5A8AAAC42DAD33170D04507A33A85521ABDF1CBA64ECFB850458DBEF0A8AEA71575D060C7DB3970F85A6E1E4C7"
    "ABF5AE8CDB0933D71E8C94E04A25619DCEE3D2261AD2EE6BF12FFA06D98A0864D87602733EC86A64521F2B18177B200C"
    "BBE117577A615D6C770988C0BAD946E208E24FA074E5AB3143DB5BFCE0FD108E4B82D120A93AD2CAFFFFFFFFFFFFFFFF",
    16,
)
PRECISION = 1e-10


# ----------------------------------------------------------------------------- workload


class BenchClient:
    def __init__(self, cid: int, histogram: np.ndarray, d: int) -> None:
        self.client_id = cid
        self.histogram = histogram
        self.d = d
        self.updates: dict[int, UserUpdates] = {}

    def user_histogram(self) -> np.ndarray:
        return self.histogram

    def user_updates(self, params, round_index, config) -> UserUpdates:
        rng = np.random.default_rng(1000 * round_index + self.client_id)
        users = np.flatnonzero(self.histogram > 0)
        deltas = rng.normal(0, 0.05, size=(users.size, self.d))
        deltas /= np.maximum(1.0, np.linalg.norm(deltas, axis=1, keepdims=True))
        up = UserUpdates(users, deltas, rng.normal(0, 5.0 / math.sqrt(3), self.d))
        self.updates[round_index] = up
        return up

    def evaluate(self, *args):
        return {"loss": 0.0, "accuracy": 0.0, "n": 0}


class BenchServer:
    public_metrics: frozenset[str] = frozenset()
    needs_individual_updates = False

    def __init__(self, num_users: int) -> None:
        self.num_users = num_users

    def sampled_users(self, round_index: int):
        return None


class SamplingBenchServer(BenchServer):
    """ULDP-AVG-ws's server: the sample drawn by the server (a Bernoulli(q) mask) or privately
    (``private_sampling`` = (k, P): no mask, oblivious transfer)."""

    def __init__(self, num_users: int, mode: str, k: int, p: int) -> None:
        super().__init__(num_users)
        self.private_sampling = (k, p) if mode == "private" else None
        self.q = k / p

    def sampled_users(self, round_index: int):
        if self.private_sampling is not None:
            return None
        return np.random.default_rng(round_index).random(self.num_users) < self.q


def run_subsampling(users: int, silos: int, bits: int, workers: int, p: int) -> dict:
    """A steady round (weights re-encrypted) with the sample drawn by the server vs privately."""
    d, k = 14, p // 2
    hist = histograms(users, silos)
    out: dict = {"users": users, "silos": silos, "d": d, "ot_items": p, "q": k / p}
    for mode in ("server", "private"):
        clients: dict[int, Any] = {s: BenchClient(s, hist[s], d) for s in range(silos)}
        transport = InProcessTransport(clients)
        proto = PrivateWeightedSum(
            paillier_bits=bits,
            workers=workers,
            allow_weak_keys=bits < 3072,  # (smoke runs only)
            n_max=2000 if bits >= 3072 else 200,
        )
        server: Any = SamplingBenchServer(users, mode, k, p)
        params = [np.zeros(d, dtype=np.float32)]
        proto.collect(transport, list(range(silos)), params, 0, {}, server)
        t0, c0 = time.perf_counter(), cpu_seconds()
        proto.collect(transport, list(range(silos)), params, 1, {}, server)
        out[mode] = {
            "round_s": time.perf_counter() - t0,
            "round_cpu_s": cpu_seconds() - c0,
            "encrypt_weights_s": proto.timings.get("encrypt_weights", 0.0),
            "server_ot_s": proto.timings.get("ot_transfer", 0.0),
            "weights_stages_s": proto.timings.get("weights-ot", 0.0)
            + proto.timings.get("weights", 0.0),
        }
    extra = out["private"]["round_s"] - out["server"]["round_s"]
    extra_cpu = out["private"]["round_cpu_s"] - out["server"]["round_cpu_s"]
    out["extra_round_s"] = extra
    out["extra_per_user_s"] = extra / users
    out["extra_round_cpu_s"] = extra_cpu  # robust to other load on the machine
    out["extra_per_user_cpu_s"] = extra_cpu / users
    out["ratio_round"] = out["private"]["round_s"] / out["server"]["round_s"]
    return out


def histograms(num_users: int, silos: int, seed: int = 0) -> np.ndarray:
    """Zipf-like records per user, spread over silos; every user has >= 1 record."""
    rng = np.random.default_rng(seed)
    totals = np.minimum(200, 1 + rng.zipf(1.6, size=num_users))
    out = np.zeros((silos, num_users), dtype=np.int64)
    for u, n in enumerate(totals):
        out[:, u] = rng.multinomial(int(n), rng.dirichlet(np.ones(silos)))
    return out


# ----------------------------------------------------------------------------- pdpfl


def run_ours(d: int, users: int, silos: int, bits: int, workers: int, max_coords: int) -> dict:
    coords = min(d, max_coords)
    hist = histograms(users, silos)
    clients: dict[int, Any] = {s: BenchClient(s, hist[s], coords) for s in range(silos)}
    transport = InProcessTransport(clients)
    proto = PrivateWeightedSum(paillier_bits=bits, workers=workers, expected_rounds=10)
    server: Any = BenchServer(users)
    params = [np.zeros(coords, dtype=np.float32)]
    t0, c0 = time.perf_counter(), cpu_seconds()
    proto.collect(transport, list(range(silos)), params, 0, {}, server)
    first, first_cpu = time.perf_counter() - t0, cpu_seconds() - c0
    setup = dict(proto.timings)
    t0, c0 = time.perf_counter(), cpu_seconds()
    agg = proto.collect(transport, list(range(silos)), params, 1, {}, server)
    steady, steady_cpu = time.perf_counter() - t0, cpu_seconds() - c0
    ref = plain_weighted_sum(
        {s: hist[s] for s in range(silos)}, {s: clients[s].updates[1] for s in range(silos)}
    )
    err = float(np.max(np.abs(agg.total[0] - ref)))
    silo_round = [
        transport._silo_memory[s]["private-weighting"].timings["round"] for s in range(silos)
    ]
    silo_cpu = [
        transport._silo_memory[s]["private-weighting"].timings["round_cpu"] for s in range(silos)
    ]
    scale = d / coords
    out: dict[str, Any] = {
        "key_exchange": setup["keygen"] + setup["setup-keys"] + setup["setup-seed"],
        "blinded_histogram": setup["setup-histogram"] + setup["inverses"],
        "weights_setup": sum(
            setup.get(k, 0.0) for k in ("encrypt_weights", "weights", "install", "verify")
        ),
        "silo_weighting": float(np.mean(silo_round)) * scale,
        "silo_weighting_cpu": float(np.mean(silo_cpu)) * scale,
        "aggregation": proto.timings["aggregate"] * scale,
        "aggregation_cpu": proto.timings["aggregate_cpu"] * scale,
        "first_round_total": first + (scale - 1) * (steady - 0.0) if scale > 1 else first,
        "steady_round_total": steady * scale,
        "first_round_cpu": first_cpu + (scale - 1) * steady_cpu,
        "steady_round_cpu": steady_cpu * scale,
        "max_abs_error": err,
        "error_bound": PRECISION / 2 * (users + silos),
    }
    if scale > 1:
        out["scaled"] = f"per-coordinate phases measured on {coords} of {d} coordinates"
    return out


# ----------------------------------------------------------------------------- straightforward


def run_reference(d: int, users: int, silos: int, bits: int, sample: dict) -> dict:
    from phe import paillier

    rng = np.random.default_rng(0)
    hist = histograms(users, silos)
    out: dict = {}
    scaled = []
    # key exchange: Paillier keygen + DH between silos (relayed by the server)
    t0 = time.perf_counter()
    pk, sk = paillier.generate_paillier_keypair(n_length=bits)
    pk.max_int = pk.n - 1  # as the reference: the whole Z_n is usable
    n = pk.n
    dh_priv = [int.from_bytes(os.urandom(32), "big") for _ in range(silos)]
    dh_pub = [pow(2, a, MODP_3072) for a in dh_priv]
    shared = {
        (s, o): int(
            hashlib.sha256(str(pow(dh_pub[o], dh_priv[s], MODP_3072)).encode()).hexdigest(), 16
        )
        for s in range(silos)
        for o in range(silos)
        if s != o
    }
    out["key_exchange"] = time.perf_counter() - t0
    # blinded histograms: r_u, pairwise masks mod n, server sums and inverts
    t0 = time.perf_counter()
    r = [secrets.randbelow(n - 1) + 1 for _ in range(users)]
    totals = [0] * users
    for s in range(silos):
        blinded = [r[u] * int(hist[s, u]) % n for u in range(users)]
        for o in range(silos):
            if o != s:
                prg = random.Random(shared[(min(s, o), max(s, o))])
                for u in range(users):
                    m = prg.randrange(n)
                    blinded[u] = (blinded[u] + (m if s < o else -m)) % n
        totals = [(a + b) % n for a, b in zip(totals, blinded, strict=True)]
    inverses = [pow(b, -1, n) for b in totals]
    out["blinded_histogram"] = time.perf_counter() - t0
    # server encrypts the inverse weights (every round in the reference)
    k_enc = min(users, sample["users"])
    t0 = time.perf_counter()
    enc = [pk.encrypt(inverses[u]) for u in range(k_enc)]
    out["weights_setup"] = (time.perf_counter() - t0) * users / k_enc
    if k_enc < users:
        scaled.append(f"encryption of ⟦β_u⟧ on {k_enc} of {users} users")
    enc = [enc[u % k_enc] for u in range(users)]
    DIV = divisor(2000)
    # silo weighting for silo 0: weight preparation per user, products per (user, parameter)
    s = 0
    present = [u for u in range(users) if hist[s, u] > 0]
    k_prep = min(len(present), sample["users"])
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    weights = []
    for u in present[:k_prep]:
        w = enc[u] * int(hist[s, u])
        w = w * r[u]
        w = w * DIV
        weights.append(w)
    prep = (time.perf_counter() - t0) / max(k_prep, 1)
    prep_cpu = (time.process_time() - cpu0) / max(k_prep, 1)
    pairs = min(len(present) * d, sample["products"])
    deltas = rng.normal(0, 0.05, size=pairs)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    acc = None
    for i in range(pairs):
        v = int(deltas[i] / PRECISION) % n  # Encode (as the reference: truncation, mod n)
        term = weights[i % len(weights)] * v
        acc = term if acc is None else acc + term
    product = (time.perf_counter() - t0) / max(pairs, 1)
    product_cpu = (time.process_time() - cpu0) / max(pairs, 1)
    k_coords = min(d, sample["coords"])
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    cts = [acc for _ in range(k_coords)]
    noise = rng.normal(0, 5.0, size=k_coords)
    masked = []
    for j in range(k_coords):
        c = cts[j] + (int(noise[j] / PRECISION) % n) * DIV % n
        for o in range(silos):
            if o != s:
                c = c + random.Random(shared[(min(s, o), max(s, o))] + j).randrange(n)
        masked.append(c)
    finish = (time.perf_counter() - t0) / k_coords
    finish_cpu = (time.process_time() - cpu0) / k_coords
    out["silo_weighting"] = len(present) * prep + len(present) * d * product + d * finish
    out["silo_weighting_cpu"] = (
        len(present) * prep_cpu + len(present) * d * product_cpu + d * finish_cpu
    )
    if k_prep < len(present) or pairs < len(present) * d or k_coords < d:
        scaled.append(
            f"silo weighting from {k_prep} user preparations, {pairs} (user, parameter) "
            f"products and {k_coords} noise/mask additions"
        )
    # aggregation: ⊕ over silos and decryption per coordinate
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for j in range(k_coords):
        total = masked[j]
        for _ in range(silos - 1):
            total = total + masked[j]
        y = sk.raw_decrypt(total.ciphertext(be_secure=False))
        y = y - n if y > n // 2 else y
        _ = y / DIV * PRECISION
    out["aggregation"] = (time.perf_counter() - t0) * d / k_coords
    out["aggregation_cpu"] = (time.process_time() - cpu0) * d / k_coords
    if k_coords < d:
        scaled.append(f"aggregation from {k_coords} of {d} coordinates")
    out["steady_round_total"] = (
        silos * out["silo_weighting"] + out["aggregation"] + out["weights_setup"]
    )
    out["first_round_total"] = (
        out["key_exchange"] + out["blinded_histogram"] + out["steady_round_total"]
    )
    if scaled:
        out["scaled"] = "; ".join(scaled)
    return out


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object (default)")
    ap.add_argument("--quick", action="store_true", help="d in {16, 107}, |U| = 10, |S| = 3")
    ap.add_argument("--d", nargs="+", type=int, default=[16, 107, 1000, 21840])
    ap.add_argument("--users", nargs="+", type=int, default=[10, 100])
    ap.add_argument("--silos", nargs="+", type=int, default=[3, 5])
    ap.add_argument("--bits", type=int, default=3072)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-coords", type=int, default=1000)
    ap.add_argument("--ref-users", type=int, default=3)
    ap.add_argument("--ref-products", type=int, default=40)
    ap.add_argument("--ref-coords", type=int, default=16)
    ap.add_argument("--heart-only", action="store_true", help="only the Heart round")
    ap.add_argument(
        "--subsampling",
        action="store_true",
        help="only the extra cost of private user-level sub-sampling",
    )
    ap.add_argument("--ot-items", type=int, default=10, help="P of --subsampling")
    args = ap.parse_args()
    if args.subsampling:
        rows = [
            run_subsampling(u, args.silos[0], args.bits, args.workers, args.ot_items)
            for u in args.users
        ]
        per_user = [r["extra_per_user_s"] for r in rows]
        per_user_cpu = [r["extra_per_user_cpu_s"] for r in rows]
        print(
            json.dumps(
                {
                    "benchmark": "secure_weighting/private_subsampling",
                    "machine": {
                        "platform": platform.platform(),
                        "python": platform.python_version(),
                        "cpus": os.cpu_count(),
                        "load_average": os.getloadavg(),
                    },
                    "workers": args.workers,
                    "bits": args.bits,
                    "rows": rows,
                    "extra_per_user_s": {"min": min(per_user), "max": max(per_user)},
                    "extra_per_user_cpu_s": {"min": min(per_user_cpu), "max": max(per_user_cpu)},
                },
                indent=1,
            )
        )
        return
    if args.heart_only:
        args.d = []
    if args.quick:
        args.d, args.users, args.silos = [16, 107], [10], [3]
    sample = {"users": args.ref_users, "products": args.ref_products, "coords": args.ref_coords}
    rows = []
    for users in args.users:
        for silos in args.silos:
            for d in args.d:
                ours = run_ours(d, users, silos, args.bits, args.workers, args.max_coords)
                ref = run_reference(d, users, silos, args.bits, sample)
                rows.append(
                    {
                        "d": d,
                        "users": users,
                        "silos": silos,
                        "bits": args.bits,
                        "pdpfl": ours,
                        "straightforward": ref,
                        "speedup_silo_weighting": ref["silo_weighting"] / ours["silo_weighting"],
                        "speedup_silo_weighting_cpu": ref["silo_weighting_cpu"]
                        / ours["silo_weighting_cpu"],
                        "speedup_steady_round": ref["steady_round_total"]
                        / ours["steady_round_total"],
                        "speedup_first_round": ref["first_round_total"] / ours["first_round_total"],
                    }
                )
                print(
                    f"d={d} U={users} S={silos}: silo weighting "
                    f"{ours['silo_weighting']:.3f}s vs {ref['silo_weighting']:.2f}s "
                    f"({rows[-1]['speedup_silo_weighting']:.0f}x wall, "
                    f"{rows[-1]['speedup_silo_weighting_cpu']:.0f}x CPU)",
                    file=sys.stderr,
                )
    t0 = time.perf_counter()
    heart = run_ours(14, 100, 4, args.bits, args.workers, 14)
    heart["wall"] = time.perf_counter() - t0
    result = {
        "benchmark": "secure_weighting",
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "workers": args.workers,
        "rows": rows,
        "heart_round": {
            "d": 14,
            "users": 100,
            "silos": 4,
            "setup_plus_first_round_s": heart["first_round_total"],
            "setup_plus_first_round_cpu_s": heart["first_round_cpu"],
            "steady_round_s": heart["steady_round_total"],
            "steady_round_cpu_s": heart["steady_round_cpu"],
            "phases": heart,
        },
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
