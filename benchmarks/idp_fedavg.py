"""IDP-FedAvg round time: the sampled clients' local training, batched vs the per-client loop.

One IDP-FedAvg round is dominated by the local training of the sampled clients (c = 30 in the
paper, E local epochs of Adam at batch 128) plus one clip-and-noise aggregation. This script
times, in one run and on the same data:

* ``batched`` -- all sampled clients as one computation (:func:`pdpfl.dp.batched.train_copies`,
  ``torch.func.vmap`` over the stacked client models), what the in-process transport runs for
  the silos' two-phase API (:class:`pdpfl.fl.template.BatchedSilo`);
* ``loop`` -- one client after the other (:func:`pdpfl.dp.batched.train_copies_loop`);

for the paper's CNN (21,578 parameters on 28×28×1) and for small models (MLP, logistic
regression). Seconds per round = local training + the central aggregation (clip, sum, noise,
adaptive clip update). The updates of both paths are compared: in float32 (the run's dtype) and
in float64 on a subset of clients (Adam divides by √v̂, which turns last-bit differences of
near-zero gradients into visible ones in float32).

With ``--simulate R`` it also times R whole simulated rounds (``run_simulation`` of
``examples/idp_digits.yaml`` on 300 clients, c = 60, after the published setup is memoized):
local training through the in-process transport plus every silo's template duties (pre-check,
charge, catch-up, privacy summary, checkpoint), once with ``local_training: batched`` and once
with ``loop``. That part uses only the configuration API, so the same command measures any
version of pdpfl (``--simulate-only``).

    python benchmarks/idp_fedavg.py --json                   # 30 clients × 200 records, E = 1
    python benchmarks/idp_fedavg.py --json --epochs 15       # the paper's E
    python benchmarks/idp_fedavg.py --json --simulate 10     # + 10 simulated rounds
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from pdpfl.fl import idp_fedavg as idp
from pdpfl.models import create_model, get_params, num_parameters

SHAPES = {"idp-cnn": (1, 28, 28), "mlp": (1, 28, 28), "logreg": (1, 28, 28)}


def _datasets(k: int, n: int, shape, seed: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.rand(n, *shape, generator=g, dtype=dtype), torch.randint(0, 10, (n,), generator=g))
        for _ in range(k)
    ]


def _repeat(datasets, epochs: int, seed: int):
    from pdpfl.randomness import SeededRandomness

    r = SeededRandomness(seed)
    return [
        idp.repeated_epochs(x, y, epochs, r.stream("shuffle", i))
        for i, (x, y) in enumerate(datasets)
    ]


def _model(name: str, dtype=torch.float32):
    torch.manual_seed(0)
    opts = {"dropout": 0.0} if name == "idp-cnn" else {}  # dropout draws differ between paths
    return create_model(name, SHAPES[name], 10, **opts).to(dtype)


def _aggregate_seconds(updates: list[list[np.ndarray]], params) -> float:
    pub = idp.IdpSetup(
        method="individual",
        variant="central",
        delta=1e-4,
        rounds=420,
        num_clients=len(updates),
        clients_per_round=float(len(updates)),
        budgets=(1.0,),
        sizes=(float(len(updates)),),
        assigned=(1.0,),
        rates=(1.0,),
        clip_factors=(1.0,),
        noise_multiplier=0.9,
        value_noise_multiplier=0.95,
        count_noise_std=0.05 * len(updates),
        denominator=float(len(updates)),
        clipping="adaptive",
        initial_clip=0.1,
        target_quantile=0.5,
        clip_lr=0.2,
        server_lr=1.0,
        asked_per_round=0,
        survivors=0,
        local=idp.LocalTraining(epochs=1, batch_size=128),
        rate_fractions="realized",
        observers=("third-party",),
    )
    from pdpfl.fl.api import Aggregate, Contribution
    from pdpfl.randomness import SecureRandomness

    server = idp.CentralIdpServer(
        params, pub, client_groups=np.zeros(len(updates), np.int64), randomness=SecureRandomness()
    )
    server.select_clients(0, list(range(len(updates))))
    contribs = [Contribution(update=[u.astype(np.float32) for u in upd]) for upd in updates]
    agg = Aggregate(
        total=[np.zeros_like(p) for p in params],
        weight=len(updates),
        metrics={},
        count=len(updates),
        contributions=contribs,
    )
    t = time.perf_counter()
    server.aggregate(0, params, agg)
    return time.perf_counter() - t


def measure(
    name: str, clients: int, records: int, epochs: int, check_clients: int, repeats: int = 1
) -> dict:
    local = idp.LocalTraining(epochs=epochs, batch_size=128, optimizer="adam", lr=5e-4)
    model = _model(name)
    params = get_params(model)
    data = _repeat(_datasets(clients, records, SHAPES[name], 1), epochs, 2)
    out: dict = {
        "parameters": num_parameters(model),
        "clients": clients,
        "records": records,
        "epochs": epochs,
        "batch_size": 128,
        "optimizer": "adam 5e-4",
    }
    results = {}
    warm = [(x[:130], y[:130]) for x, y in data[:2]]  # first-call costs (vmap tracing, caches)
    for strategy in ("batched", "loop"):
        idp.train_clients(model, params, warm, replace(local, strategy=strategy))
    for strategy in ("batched", "loop"):
        best = math.inf
        for _ in range(repeats):
            t = time.perf_counter()
            results[strategy] = idp.train_clients(
                model, params, data, replace(local, strategy=strategy)
            )
            best = min(best, time.perf_counter() - t)
        out[f"{strategy}_train_s"] = round(best, 3)
    agg = _aggregate_seconds(results["loop"], params)
    out["aggregate_s"] = round(agg, 4)
    for strategy in ("batched", "loop"):
        out[f"{strategy}_s_per_round"] = round(out[f"{strategy}_train_s"] + agg, 3)
    out["speedup_batched_over_loop"] = round(
        out["loop_s_per_round"] / out["batched_s_per_round"], 3
    )
    out["max_abs_diff_float32"] = float(
        max(
            np.abs(a - b).max()
            for ra, rb in zip(results["batched"], results["loop"], strict=True)
            for a, b in zip(ra, rb, strict=True)
        )
    )
    # float64 on a subset: the same schedules, no float32 rounding for Adam to amplify
    m64 = _model(name, torch.float64)
    p64 = [p.detach().numpy().copy() for p in m64.parameters()]
    d64 = _repeat(_datasets(check_clients, records, SHAPES[name], 1, torch.float64), epochs, 2)
    a64 = idp.train_clients(m64, p64, d64, replace(local, strategy="batched"))
    b64 = idp.train_clients(m64, p64, d64, replace(local, strategy="loop"))
    out["max_abs_diff_float64"] = float(
        max(
            np.abs(a - b).max()
            for ra, rb in zip(a64, b64, strict=True)
            for a, b in zip(ra, rb, strict=True)
        )
    )
    out["float64_clients_checked"] = check_clients
    out["update_norm_mean"] = float(
        np.mean([math.sqrt(sum(float((u**2).sum()) for u in upd)) for upd in results["loop"]])
    )
    return out


def simulate(rounds: int, repeats: int) -> dict:
    """Seconds per simulated round (training loop only; best of ``repeats``), batched vs loop."""
    import warnings

    from pdpfl.config import load_config
    from pdpfl.fl.algorithm import as_algorithm
    from pdpfl.runtime.simulation import load_federation_for, run_simulation

    example = Path(__file__).resolve().parents[1] / "examples" / "idp_digits.yaml"
    out: dict = {
        "config": "examples/idp_digits.yaml",
        "clients": 300,
        "clients_per_round": 60,
        "rounds": rounds,
    }
    for strategy in ("batched", "loop"):
        config = load_config(
            example,
            [
                "data.num_clients=300",
                "algorithm.clients_per_round=60",
                f"rounds={rounds}",
                "randomness=reproducible",
                f"algorithm.local_training={strategy}",
                "threads=1",
            ],
        )
        federation = load_federation_for(config)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            as_algorithm(config.algorithm).build(config, federation)  # memoize the setup
            best = math.inf
            for _ in range(repeats):
                folder = Path(tempfile.mkdtemp(prefix="idp-bench-"))
                try:
                    summary = run_simulation(
                        config, folder / "run", progress=False, federation=federation
                    )
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
                best = min(best, float(summary["seconds"]))
        out[f"{strategy}_s_per_round"] = round(best / rounds, 4)
        out[f"{strategy}_final_accuracy"] = summary["final_accuracy"]
    out["speedup_batched_over_loop"] = round(
        out["loop_s_per_round"] / out["batched_s_per_round"], 3
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--clients", type=int, default=30)
    ap.add_argument("--records", type=int, default=200)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--models", default="idp-cnn,mlp,logreg")
    ap.add_argument("--check-clients", type=int, default=3, help="clients compared in float64")
    ap.add_argument("--repeats", type=int, default=1, help="best of this many timings")
    ap.add_argument(
        "--simulate",
        type=int,
        default=0,
        metavar="R",
        help="also time R simulated rounds through the in-process transport",
    )
    ap.add_argument(
        "--simulate-only",
        action="store_true",
        help="only the simulated rounds (works with any pdpfl version)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result: dict = {"threads": args.threads, "torch": torch.__version__}
    if not args.simulate_only:
        for name in args.models.split(","):
            result[name] = measure(
                name, args.clients, args.records, args.epochs, args.check_clients, args.repeats
            )
    if args.simulate or args.simulate_only:
        result["simulation"] = simulate(args.simulate or 10, args.repeats)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(k, v)


if __name__ == "__main__":
    main()
