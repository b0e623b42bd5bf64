"""Benchmark: PriFedSync (issue #14) -- accounting tables, speed ratios, personalization.

``--accounting``
    PriFedSync's Tables 1-3 (μ_max by Theorem 2, as printed) and, beside each row at δ = 1e-5:
    the CLT ε (μ → ε, an approximation), a lower bound on the true ε (the Poisson pair contained
    in the WOR mechanism: dp-accounting's optimistic PLD), pdpfl's rigorous ε (RDP of the
    WOR-subsampled Gaussian, Wang et al. Theorem 9) and dp-accounting's RDP ε (their Theorem 27
    for the same event). Then a few-step grid where the CLT falls below the lower bound
    (under-reports) -- pdpfl's own explicit-pair lower bound there.
``--speed``
    ``wor_gaussian_rdp`` vs dp-accounting's ``_compute_rdp_sample_wor_gaussian`` (orders 2…64),
    and ``wor_sample`` vs the obvious ``torch.randperm(n)[:B]`` loop, timed in the same run.
``--train``
    ``examples/prifedsync_mnist10k.yaml`` (randomness: reproducible) for ``--seeds``: the paper's
    metric (mean over clients of the local model's accuracy on the client's own test split) and
    the global model beside it, with the rigorous ε (the clients' ledgers) and the CLT μ.

Usage: ``python benchmarks/prifedsync.py --accounting --speed --train --seeds 1 2 3
--rounds 30 --data-dir ../shared/data [--json]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from pdpfl.privacy.gdp import gdp_epsilon, prifedsync_mu
from pdpfl.privacy.wor import (
    wor_gaussian_epsilon,
    wor_gaussian_epsilon_lower_bound,
    wor_gaussian_rdp,
)

DELTA = 1e-5
#: (table, σ_j, B, n, K, R, μ_max as printed in the paper)
ROWS = [
    ("T1", 1.0, 16, 600, 38, 93, 2.71),
    ("T1", 0.9, 16, 600, 38, 83, 3.10),
    ("T1", 0.75, 16, 600, 38, 64, 3.96),
    ("T1", 1.0, 16, 600, 38, 194, 3.92),
    ("T1", 0.9, 16, 600, 38, 176, 4.51),
    ("T1", 0.75, 16, 600, 38, 127, 5.58),
    ("T1", 1.0, 16, 600, 38, 386, 5.52),
    ("T1", 0.9, 16, 600, 38, 325, 6.13),
    ("T1", 0.75, 16, 600, 38, 245, 7.75),
    ("T2", 1.0, 8, 600, 76, 266, 3.24),
    ("T2", 0.9, 8, 600, 76, 229, 3.64),
    ("T2", 0.75, 8, 600, 76, 191, 4.84),
    ("T3", 1.0, 16, 500, 32, 468, 6.70),
    ("T3", 0.75, 16, 500, 32, 321, 9.77),
    ("T3", 0.5, 16, 500, 32, 207, 26.81),
]
FEW_STEPS = [
    (16 / 600, 1.0, 1),
    (16 / 600, 1.0, 10),
    (16 / 600, 0.75, 10),
    (0.1, 1.0, 10),
    (0.1, 2.0, 10),
    (0.25, 1.0, 20),
    (0.5, 1.0, 10),
]


def _pld_lower(gamma: float, sigma: float, steps: int) -> float:
    from dp_accounting.pld import privacy_loss_distribution as pldm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging_off()
        pld = pldm.from_gaussian_mechanism(
            sigma,
            sensitivity=1.0,
            sampling_prob=gamma,
            pessimistic_estimate=False,
            value_discretization_interval=2e-5,
            use_connect_dots=False,
        )
        return float(pld.self_compose(steps).get_epsilon_for_delta(DELTA))


def logging_off() -> None:
    import logging

    logging.getLogger().setLevel(logging.ERROR)


def _dpa_rdp_epsilon(n: int, b: int, sigma: float, steps: int) -> float:
    import dp_accounting as dpa
    from dp_accounting.rdp import rdp_privacy_accountant as r

    acc = r.RdpAccountant(list(range(2, 65)), dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.SampledWithoutReplacementDpEvent(n, b, dpa.GaussianDpEvent(sigma)), steps)
    return float(acc.get_epsilon(DELTA))


def accounting() -> dict:
    rows = []
    for table, sigma, b, n, k, r, printed in ROWS:
        steps = k * r
        mu = float(prifedsync_mu(sigma, b, n, k, r))
        rows.append(
            {
                "table": table,
                "sigma": sigma,
                "B": b,
                "n": n,
                "K": k,
                "R": r,
                "mu_printed": printed,
                "mu": mu,
                "eps_clt": float(gdp_epsilon(mu, DELTA)),
                "eps_lower_poisson_pair": _pld_lower(b / n, sigma, steps),
                "eps_rigorous": wor_gaussian_epsilon(b / n, sigma, steps, DELTA)[0],
                "eps_dp_accounting_rdp": _dpa_rdp_epsilon(n, b, sigma, steps),
            }
        )
    few = []
    for gamma, sigma, steps in FEW_STEPS:
        mu = float(prifedsync_mu(sigma, gamma * 600, 600, steps, 1))
        few.append(
            {
                "gamma": gamma,
                "sigma": sigma,
                "steps": steps,
                "mu": mu,
                "eps_clt": float(gdp_epsilon(mu, DELTA)),
                "eps_lower": wor_gaussian_epsilon_lower_bound(gamma, sigma, steps, DELTA),
                "eps_rigorous": wor_gaussian_epsilon(gamma, sigma, steps, DELTA)[0],
            }
        )
    return {"delta": DELTA, "tables": rows, "few_steps": few}


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def speed(repeats: int = 3) -> dict:
    import torch
    from dp_accounting.rdp import rdp_privacy_accountant as r

    from pdpfl.dp.steps import wor_sample
    from pdpfl.randomness import SecureRandomness, SeededRandomness

    orders = np.arange(2.0, 65.0)
    ours = _best(lambda: wor_gaussian_rdp(16 / 600, 1.0, orders), repeats)
    ref = _best(lambda: r._compute_rdp_sample_wor_gaussian(16 / 600, 1.0, orders), repeats)
    n, b, draws = 600, 16, 2000
    secure = SecureRandomness().stream("bench")
    seeded = SeededRandomness(0).stream("bench")
    gen = torch.Generator().manual_seed(0)
    t_secure = _best(lambda: [wor_sample(n, b, secure) for _ in range(draws)], repeats)
    t_seeded = _best(lambda: [wor_sample(n, b, seeded) for _ in range(draws)], repeats)
    t_loop = _best(lambda: [torch.randperm(n, generator=gen)[:b] for _ in range(draws)], repeats)
    return {
        "wor_rdp_orders_2_64_s": ours,
        "dp_accounting_wor_rdp_s": ref,
        "rdp_speedup": ref / ours,
        "wor_sample_secure_per_batch_us": 1e6 * t_secure / draws,
        "wor_sample_seeded_per_batch_us": 1e6 * t_seeded / draws,
        "randperm_per_batch_us": 1e6 * t_loop / draws,
        "secure_vs_randperm": t_secure / t_loop,
    }


def train(seeds: list[int], rounds: int, data_dir: str | None, config_path: str) -> dict:
    from pdpfl.config import load_config
    from pdpfl.fl.algorithm import build_federation_algorithms
    from pdpfl.fl.prifedsync import evaluate_models, federation_report
    from pdpfl.runtime.loop import run_federation
    from pdpfl.runtime.simulation import InProcessTransport, load_federation_for, torch_threads

    out = []
    for seed in seeds:
        config = load_config(
            config_path,
            [f"seed={seed}", "randomness=reproducible", f"training.rounds={rounds}"],
            data_dir=data_dir,
        )
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            federation = load_federation_for(config)
            with torch_threads(config.threads):
                server, clients = build_federation_algorithms(config, federation)
                result = run_federation(
                    config,
                    server,
                    InProcessTransport(clients),
                    Path("runs") / "bench_prifedsync" / f"seed{seed}",
                    progress=False,
                )
        both = evaluate_models(clients, result["params"])
        report = federation_report(clients)
        out.append(
            {
                "seed": seed,
                **both,
                "seconds": time.perf_counter() - t0,
                "eps_rigorous_max": report["eps_rigorous_max"],
                "clt_mu_weak": report["clt_mu_weak"],
                "clt_mu_strong": report["clt_mu_strong"],
                "clt_eps_weak": report["clt_eps_weak"],
                "curve_local": [m["mean_client_accuracy"] for m in result["metrics"]],
            }
        )
        print(
            json.dumps({k: v for k, v in out[-1].items() if k != "curve_local"}),
            file=sys.stderr,
            flush=True,
        )
    keys = (
        "local_mean_client_accuracy",
        "global_mean_client_accuracy",
        "local_pooled_accuracy",
        "global_pooled_accuracy",
    )
    return {
        "config": config_path,
        "rounds": rounds,
        "runs": out,
        "mean": {k: float(np.mean([r[k] for r in out])) for k in keys},
    }


def _markdown(result: dict) -> str:
    lines = []
    if "accounting" in result:
        acc = result["accounting"]
        lines += [
            f"δ = {acc['delta']:g}. ε columns: CLT (Theorem 2's μ → ε; approximation) | lower "
            "bound (Poisson pair inside the WOR mechanism, optimistic PLD) | pdpfl rigorous "
            "(Theorem 9 RDP) | dp-accounting RDP (Theorem 27, orders 2-64)",
            "",
            "| table | σ_j | B | n | K | R | μ printed | μ (Thm 2) | ε CLT | ε lower | "
            "ε rigorous | ε dp-acc |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in acc["tables"]:
            lines.append(
                f"| {r['table']} | {r['sigma']} | {r['B']} | {r['n']} | {r['K']} | {r['R']} | "
                f"{r['mu_printed']:.2f} | {r['mu']:.3f} | {r['eps_clt']:.2f} | "
                f"{r['eps_lower_poisson_pair']:.2f} | {r['eps_rigorous']:.2f} | "
                f"{r['eps_dp_accounting_rdp']:.2f} |"
            )
        lines += [
            "",
            "| γ = B/n | σ_j | steps | μ (Thm 2) | ε CLT | ε lower (explicit pair) | "
            "ε rigorous | CLT under-reports? |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in acc["few_steps"]:
            flag = "**yes**" if r["eps_clt"] < r["eps_lower"] else "no"
            lines.append(
                f"| {r['gamma']:.4f} | {r['sigma']} | {r['steps']} | {r['mu']:.3f} | "
                f"{r['eps_clt']:.3f} | {r['eps_lower']:.3f} | {r['eps_rigorous']:.3f} | {flag} |"
            )
    if "speed" in result:
        s = result["speed"]
        lines += [
            "",
            f"wor_gaussian_rdp (orders 2-64): {s['wor_rdp_orders_2_64_s'] * 1e3:.2f} ms "
            f"vs dp-accounting {s['dp_accounting_wor_rdp_s'] * 1e3:.1f} ms "
            f"(×{s['rdp_speedup']:.0f}); wor_sample: "
            f"{s['wor_sample_secure_per_batch_us']:.0f}"
            f" µs/batch (secure), {s['wor_sample_seeded_per_batch_us']:.0f} µs (seeded) vs "
            f"torch.randperm {s['randperm_per_batch_us']:.0f} µs",
        ]
    if "train" in result:
        t = result["train"]
        lines += [
            "",
            "| seed | local (mean over clients) | global (mean over clients) | local "
            "pooled | global pooled | ε rigorous max | CLT μ weak | CLT μ strong | s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in t["runs"]:
            lines.append(
                f"| {r['seed']} | {r['local_mean_client_accuracy']:.4f} | "
                f"{r['global_mean_client_accuracy']:.4f} | {r['local_pooled_accuracy']:.4f} | "
                f"{r['global_pooled_accuracy']:.4f} | {r['eps_rigorous_max']:.2f} | "
                f"{r['clt_mu_weak']:.3f} | {r['clt_mu_strong']:.2f} | {r['seconds']:.0f} |"
            )
        m = t["mean"]
        lines.append(
            f"| mean | {m['local_mean_client_accuracy']:.4f} | "
            f"{m['global_mean_client_accuracy']:.4f} | {m['local_pooled_accuracy']:.4f} | "
            f"{m['global_pooled_accuracy']:.4f} | | | | |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--accounting", action="store_true")
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--config", default="examples/prifedsync_mnist10k.yaml")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result: dict = {}
    if args.accounting:
        result["accounting"] = accounting()
    if args.speed:
        result["speed"] = speed()
    if args.train:
        result["train"] = train(args.seeds, args.rounds, args.data_dir, args.config)
    print(json.dumps(result, indent=1) if args.json else _markdown(result))


if __name__ == "__main__":
    main()
