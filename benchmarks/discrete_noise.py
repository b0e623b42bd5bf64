"""Cost of exact discrete noise (issue #33) against today's continuous shares, in the same run.

``sampler``: N_Z(0, σ²) draws (:func:`pdpfl.discrete_noise.sample_discrete_gaussian`: the
exact alias-table sampler of :mod:`pdpfl.discrete_table`, integer arithmetic from the ChaCha20
keystream), the CKS sampler it replaced (``_sample_cks``, same law) and the secure float64
normals (``SecureRandomness().stream(...).normal``), interleaved, for d ∈ {8192, 10^5, 10^6}
draws and σ ∈ {1, 10^3, 10^6, 1.5·10^7 (an IDP-FedAvg share)}: process CPU seconds (best of
``--repeats``), samples/s, the speed-up table / CKS and the ratio table / float.

``encode``: one silo's share and the server's decode for an update of d coordinates: the
discrete path (:func:`pdpfl.dp.discrete_encoding.encode_share`: rotation, scale, conditional
randomized rounding, exact share, mod 2^32; :func:`~pdpfl.dp.discrete_encoding.decode_sum`)
with and without the rotation, against today's continuous share (x + float64 normal share,
``FixedPointRing.encode``; ``FixedPointRing.decode``), and their ratio.

``units``: ULDP-FL's silo step, 100 users' vectors of CNNMnist's size (21,840 parameters) rounded
one by one (:func:`~pdpfl.dp.discrete_encoding.round_units`) plus the share, with and without the
rotation, against the continuous weighted sum, float share and fixed-point encoding.

``accounting``: ε of T rounds of the Poisson-sampled distributed discrete Gaussian (large shares,
σ = 1) against the continuous sub-sampled Gaussian at the same noise multiplier.

``float_attack``: the advantages of the low-order-bit attack of
``tests/test_discrete_float_attack.py`` (x₀ = 0 vs x₁ = 1 over 2·10^4 releases) on the
continuous fixed-point path and the discrete path, beside the same-input baseline.

    nice -n 10 .venv/bin/python benchmarks/discrete_noise.py --json [--repeats 3] \\
        [--sections sampler encode units accounting float_attack]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def _best_cpu(fn: Any, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best


def time_sampler(repeats: int) -> list[dict[str, Any]]:
    from pdpfl.discrete_noise import (
        _sample_cks,
        discrete_gaussian_spec,
        sample_discrete_gaussian,
    )
    from pdpfl.randomness import SecureRandomness

    rand = SecureRandomness()
    rows = []
    for d in (8192, 100_000, 1_000_000):
        for sigma in (1.0, 1e3, 1e6, 1.5e7):
            spec = discrete_gaussian_spec(sigma * sigma)
            sample_discrete_gaussian(16, spec, rand.stream("warm"))  # the table, built once
            # interleaved: normals, alias table, CKS, repeated
            normal = table = cks = math.inf
            for _ in range(repeats):
                normal = min(normal, _best_cpu(lambda d=d: rand.stream("n", d).normal((d,)), 1))
                table = min(
                    table,
                    _best_cpu(
                        lambda d=d, spec=spec: sample_discrete_gaussian(
                            d, spec, rand.stream("dg", d)
                        ),
                        1,
                    ),
                )
                cks = min(
                    cks,
                    _best_cpu(lambda d=d, spec=spec: _sample_cks(d, spec, rand.stream("c", d)), 1),
                )
            rows.append(
                {
                    "d": d,
                    "sigma": sigma,
                    "table_cpu_s": table,
                    "cks_cpu_s": cks,
                    "float_normals_cpu_s": normal,
                    "table_samples_per_s": d / table,
                    "cks_samples_per_s": d / cks,
                    "float_samples_per_s": d / normal,
                    "speedup_table_over_cks": cks / table,
                    "ratio_table_over_float": table / normal,
                }
            )
    return rows


def time_encode(repeats: int) -> list[dict[str, Any]]:
    from pdpfl.crypto.fixedpoint import FixedPointRing
    from pdpfl.dp.discrete_encoding import decode_sum, encode_share
    from pdpfl.dp.discrete_params import discrete_share_params
    from pdpfl.randomness import SecureRandomness

    rand = SecureRandomness()
    ring = FixedPointRing()
    rows = []
    for d in (10_000, 100_000, 1_000_000):
        x = np.random.default_rng(0).normal(size=d)
        x /= np.linalg.norm(x)
        std = 1.0 / math.sqrt(7)  # σ = 1, C = 1, t = 7 of n = 10

        def continuous(x: np.ndarray = x, d: int = d, std: float = std) -> np.ndarray:
            return ring.encode(x + std * rand.stream("share", d).normal((d,)).numpy(), 10)

        enc_c = _best_cpu(continuous, repeats)
        total_c = continuous()
        dec_c = _best_cpu(lambda t=total_c: ring.decode(t, 1, encoded_for=10), repeats)
        row: dict[str, Any] = {
            "d": d,
            "continuous_encode_cpu_s": enc_c,
            "continuous_decode_cpu_s": dec_c,
        }
        for rotation in (True, False):
            p = discrete_share_params(
                clip=1.0,
                noise_multiplier=1.0,
                silos=10,
                survivors=7,
                dimension=d,
                bits=32,
                rotation=rotation,
            )

            def discrete(x=x, p=p, d=d) -> np.ndarray:
                return encode_share(x, p, rand.stream("dshare", d), 42)

            enc_d = _best_cpu(discrete, repeats)
            total_d = discrete()
            dec_d = _best_cpu(lambda t=total_d, p=p: decode_sum(t, p, 42), repeats)
            key = "rotation" if rotation else "no_rotation"
            row[key] = {
                "scale_log2": p.scale_log2,
                "padded_dimension": p.padded_dimension,
                "sensitivity_inflation": p.inflation,
                "encode_cpu_s": enc_d,
                "decode_cpu_s": dec_d,
                "encode_ratio": enc_d / enc_c,
                "decode_ratio": dec_d / dec_c,
            }
        rows.append(row)
    return rows


def time_units(repeats: int) -> list[dict[str, Any]]:
    """ULDP-FL's silo step: 100 users' weighted clipped vectors of the CNNMnist size (21,840),
    rounded separately (:func:`round_units`) plus one share, against the continuous weighted
    sum plus a float share and the fixed-point encoding."""
    from pdpfl.crypto.fixedpoint import FixedPointRing
    from pdpfl.dp.discrete_encoding import add_noise_share, round_units
    from pdpfl.dp.discrete_params import discrete_share_params
    from pdpfl.randomness import SecureRandomness

    rand, ring = SecureRandomness(), FixedPointRing()
    users, d = 100, 21_840
    v = np.random.default_rng(1).normal(size=(users, d))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    w = np.full(users, 0.2)  # 5 silos, uniform weights

    def continuous() -> np.ndarray:
        total = w @ v + 0.5 * rand.stream("uldp", 0).normal((d,)).numpy()
        return ring.encode(total, 5)

    cont = _best_cpu(continuous, repeats)
    rows = []
    for rotation in (False, True):
        p = discrete_share_params(
            clip=1.0,
            noise_multiplier=1.0,
            silos=5,
            survivors=4,
            dimension=d,
            bits=32,
            rotation=rotation,
            contributors=users,
            parts=5,
        )

        def discrete(p: Any = p) -> np.ndarray:
            s = rand.stream("uldp-d", 0)
            return add_noise_share(round_units(v, w, p, s, 7), p, s)

        disc = _best_cpu(discrete, repeats)
        rows.append(
            {
                "users": users,
                "d": d,
                "rotation": rotation,
                "sensitivity_inflation": p.inflation,
                "discrete_cpu_s": disc,
                "continuous_cpu_s": cont,
                "ratio": disc / cont,
            }
        )
    return rows


def accounting() -> list[dict[str, Any]]:
    from pdpfl.privacy import SampledDiscreteGaussianPlan, SampledGaussianPlan, mechanism_epsilon

    rows = []
    for rounds in (10, 100, 1000):
        for q in (0.01, 0.1, 0.3, 1.0):
            plan = SampledDiscreteGaussianPlan.for_multiplier(
                "client", 1.0, 7, 2.0**40, 2**17, 1e-5, rounds
            )
            gauss = SampledGaussianPlan("client", 1.0, 1e-5, rounds, ("third-party", "server"))
            e_d = float(mechanism_epsilon(plan, [q], "server")[0][0])
            e_g = float(mechanism_epsilon(gauss, [q], "server")[0][0])
            rows.append({"rounds": rounds, "q": q, "eps_discrete": e_d, "eps_gaussian": e_g})
    return rows


def float_attack() -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "tests"))
    import test_discrete_float_attack as fa

    x0, x1 = np.zeros(fa.N), np.zeros(fa.N)
    x1[: fa.N // 4] = 2.0 / math.sqrt(fa.N)
    c0, cb, c1 = (fa._continuous_release(x, i) for i, x in enumerate((0.0, 0.0, 1.0)))
    d0, db, d1 = (
        fa._discrete_release(x0, 0),
        fa._discrete_release(x0, 1),
        fa._discrete_release(x1, 2),
    )
    return {
        "continuous_advantage": fa._attack_b(c0, c1, cb),
        "continuous_baseline_tv_1bit": fa._residue_tv(c0, cb, 1),
        "discrete_advantage": fa._attack_b(d0, d1, db),
        "discrete_baseline_tv_1bit": fa._residue_tv(d0, db, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object (default)")
    ap.add_argument("--repeats", type=int, default=3)
    sections = ["sampler", "encode", "units", "accounting", "float_attack"]
    ap.add_argument("--sections", nargs="+", choices=sections, default=sections)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    out: dict[str, Any] = {
        "benchmark": "discrete_noise",
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
        "load_average_before": os.getloadavg()[0],
    }
    run = {
        "sampler": lambda: time_sampler(args.repeats),
        "encode": lambda: time_encode(args.repeats),
        "units": lambda: time_units(args.repeats),
        "accounting": accounting,
        "float_attack": float_attack,
    }
    for name in args.sections:
        out[name] = run[name]()
    out["load_average_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
