"""Benchmark: time to build the benchmark federations and user allocations.

Run: ``.venv/bin/python benchmarks/data.py --json`` (prints one JSON object). Datasets whose
files are absent are reported as ``null``. ``--data-dir`` defaults to ``../shared/data``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from pdpfl.data import DataFileNotFoundError, assign_users, load_federation


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data")
    )
    args = ap.parse_args()
    cases = {
        "digits_iid_10": ("digits", {}),
        "digits_nway2_10": (
            "digits",
            {"partition": "n-way-k-shot", "partition_params": {"n_way": 2}},
        ),
        "breast_cancer_iid_4": ("breast-cancer", {}),
        "heart_disease_4": ("heart-disease", {"data_dir": args.data_dir}),
        "heart_disease_4_zipf_users_100": (
            "heart-disease",
            {"data_dir": args.data_dir, "num_users": 100, "user_distribution": "zipf"},
        ),
        "mnist_10k_iid_10": ("mnist-10k", {"data_dir": args.data_dir}),
        "mnist_10k_nway2_10": (
            "mnist-10k",
            {
                "data_dir": args.data_dir,
                "partition": "n-way-k-shot",
                "partition_params": {"n_way": 2},
            },
        ),
        "mnist_10k_shards_10": ("mnist-10k", {"data_dir": args.data_dir, "partition": "shards"}),
        "mnist_10k_dirichlet_0.5_10": (
            "mnist-10k",
            {"data_dir": args.data_dir, "partition": "dirichlet"},
        ),
    }
    out: dict[str, object] = {"unit": "seconds (best of repeats)", "repeats": args.repeats}
    for key, (name, kw) in cases.items():
        try:
            out[key] = round(
                _best_of(
                    lambda n=name, k=kw: (
                        load_federation(n, download=False, **k)
                        if n in ("heart-disease", "mnist-10k")
                        else load_federation(n, **k)
                    ),
                    args.repeats,
                ),
                4,
            )
        except DataFileNotFoundError:
            out[key] = None
    for dist in ("uniform", "zipf"):
        out[f"assign_users_{dist}_60k_records_1k_users_5_silos"] = round(
            _best_of(
                lambda d=dist: assign_users(
                    60_000, 1_000, 5, distribution=d, rng=np.random.default_rng(0)
                ),
                args.repeats,
            ),
            4,
        )
    silos = np.repeat(np.arange(4), [199, 172, 30, 85])
    out["assign_users_zipf_fixed_silos_486_records_100_users"] = round(
        _best_of(
            lambda: assign_users(
                486, 100, silo_ids=silos, distribution="zipf", rng=np.random.default_rng(0)
            ),
            args.repeats,
        ),
        4,
    )
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:55s} {v}")


if __name__ == "__main__":
    main()
