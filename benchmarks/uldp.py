"""ULDP-AVG local training: batched per-user copies vs the per-user loop (seconds per round).

One ULDP-AVG round trains, in every silo, one fresh copy of the global model per user on that
user's records (Q epochs, minibatches of B) and clips each user's delta to C. This benchmark
times that work for all silos of a federation twice in the same run -- with
:func:`pdpfl.dp.batched.train_copies` (``torch.func`` + ``vmap``, users of similar size grouped)
and with the obvious per-user loop :func:`pdpfl.dp.batched.train_copies_loop` -- on identical
inputs and per-user shuffling streams, and checks that both give the same clipped deltas. It also
times the compute floor: the same record passes through one model in minibatches of 256 (what the
round's arithmetic costs at its cheapest on this machine; ``max_speedup_at_floor`` = loop / floor
bounds what any per-user trainer can gain here).

Default setting (issue #12): mnist-10k, 100 users over 5 silos (uniform), CNNMnist (dropout 0,
so that both trainers draw the same computation), Q = 2, B = 64, C = 0.1, 1 torch thread.

Usage::

    .venv/bin/python benchmarks/uldp.py --json                       # the issue's setting
    .venv/bin/python benchmarks/uldp.py --models cnnmnist logreg --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from pdpfl.data import load_federation
from pdpfl.dp.batched import LocalTrainingSpec, train_copies, train_copies_loop
from pdpfl.dp.steps import clip_vectors
from pdpfl.models import create_model
from pdpfl.randomness import SeededRandomness

MODELS = {
    "cnnmnist": dict(dropout=0.0),
    "logreg": {},
    "mlp": {},
    "private-fraud-net": dict(dropout=0.0),
}


def _silo_datasets(fed):
    out = []
    for c in fed.clients:
        x = torch.as_tensor(c.x_train)
        y = torch.as_tensor(c.y_train)
        users = np.unique(c.user_ids)
        out.append([(u, x[c.user_ids == u], y[c.user_ids == u]) for u in users])
    return out


def _silo(trainer, model, users, spec, clip, t, s):
    """One silo's clipped per-user deltas for round ``t`` (one stream per user, as ULDP-AVG)."""
    streams = [SeededRandomness(0).stream("local-training", t, s, int(u)) for u, _, _ in users]
    data = [(x, y) for _, x, y in users]
    kwargs = {"group_size": 256} if trainer is train_copies else {}  # as ULDP-AVG's silos
    deltas = trainer(model, data, spec, stream=streams, **kwargs)
    clipped, _ = clip_vectors(deltas, clip)
    return clipped


def _floor(model, silos, spec, batch: int = 256) -> float:
    """Seconds for the same record passes (every user's records, Q epochs) through *one* model
    copy in large minibatches: the arithmetic of a round at its cheapest on this machine, a
    floor that no per-user trainer (batched or looped) can beat without changing the math."""
    import copy

    m = copy.deepcopy(model)
    m.train()
    x = torch.cat([x for users in silos for _, x, _ in users])
    y = torch.cat([y for users in silos for _, _, y in users])
    opt = torch.optim.SGD(m.parameters(), lr=spec.lr)
    from pdpfl.models import loss_fn

    t0 = time.perf_counter()
    for _ in range(int(spec.epochs)):
        for i in range(0, len(y), batch):
            opt.zero_grad(set_to_none=True)
            loss_fn(m(x[i : i + batch]), y[i : i + batch]).backward()
            opt.step()
    return time.perf_counter() - t0


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fed = load_federation(
            args.dataset,
            num_clients=args.silos,
            num_users=args.users,
            user_distribution=args.distribution,
            data_dir=args.data_dir,
            seed=0,
        )
    silos = _silo_datasets(fed)
    spec = LocalTrainingSpec(epochs=args.epochs, batch_size=args.batch, lr=args.lr)
    rows = []
    for name in args.models:
        torch.manual_seed(0)
        model = create_model(name, fed.input_shape, fed.num_classes, **MODELS.get(name, {}))
        # Warm-up (torch.func's first call imports and builds its machinery: not a round cost).
        train_copies(model, [(silos[0][0][1], silos[0][0][2])], spec)
        times = {"batched": [], "loop": []}
        worst = 0.0
        for t in range(args.rounds):
            spent = {"batched": 0.0, "loop": 0.0}
            # Interleaved silo by silo, so that the (shared) machine's load hits both alike.
            for s, users in enumerate(silos):
                results = {}
                for label, trainer in (("batched", train_copies), ("loop", train_copies_loop)):
                    t0 = time.perf_counter()
                    results[label] = _silo(trainer, model, users, spec, args.clip, t, s)
                    spent[label] += time.perf_counter() - t0
                for x, y in zip(results["batched"], results["loop"], strict=True):
                    worst = max(worst, float((x - y).abs().max()))
            for label in spent:
                times[label].append(spent[label])
        b, loop = float(np.median(times["batched"])), float(np.median(times["loop"]))
        floor = float(np.median([_floor(model, silos, spec) for _ in range(args.rounds)]))
        rows.append(
            {
                "model": name,
                "parameters": sum(p.numel() for p in model.parameters()),
                "seconds_per_round_batched": round(b, 4),
                "seconds_per_round_loop": round(loop, 4),
                "speedup": round(loop / b, 2),
                # One model, minibatches of 256, the same record passes: the compute floor.
                "seconds_per_round_floor": round(floor, 4),
                "max_speedup_at_floor": round(loop / floor, 2),
                "max_abs_diff_clipped_deltas": worst,
                "identical_within_1e-5": worst <= 1e-5,
            }
        )
    users_per_silo = [len(s) for s in silos]
    return {
        "benchmark": "uldp-avg local training, batched vs per-user loop",
        "dataset": args.dataset,
        "silos": args.silos,
        "users": args.users,
        "distribution": args.distribution,
        "users_per_silo": users_per_silo,
        "records_per_user_silo_median": float(np.median([len(y) for s in silos for _, _, y in s])),
        "epochs_Q": args.epochs,
        "batch_B": args.batch,
        "clip_C": args.clip,
        "rounds_timed": args.rounds,
        "threads": args.threads,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
        "rows": rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="mnist-10k")
    p.add_argument(
        "--data-dir",
        default=os.environ.get(
            "PDPFL_DATA_DIR", str(Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist")
        ),
    )
    p.add_argument("--silos", type=int, default=5)
    p.add_argument("--users", type=int, default=100)
    p.add_argument("--distribution", default="uniform", choices=["uniform", "zipf"])
    p.add_argument("--models", nargs="+", default=["cnnmnist"], choices=sorted(MODELS))
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=0.1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()
    out = run(args)
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"{out['benchmark']}: {out['dataset']}, {out['users']} users over {out['silos']} "
        f"silos, Q={out['epochs_Q']}, B={out['batch_B']}, {out['threads']} thread(s)"
    )
    for r in out["rows"]:
        print(
            f"  {r['model']:>9}: batched {r['seconds_per_round_batched']:.3f} s/round, "
            f"loop {r['seconds_per_round_loop']:.3f} s/round, speed-up {r['speedup']}x, "
            f"max |Δ| {r['max_abs_diff_clipped_deltas']:.2e}; floor (one model, batch 256) "
            f"{r['seconds_per_round_floor']:.3f} s/round = at most "
            f"{r['max_speedup_at_floor']}x over the loop"
        )


if __name__ == "__main__":
    main()
