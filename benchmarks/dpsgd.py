"""Median step time: non-private SGD vs pdpfl personalized DP-SGD vs Opacus 1.6 (2 CPU threads).

Every variant performs one full training step on a Poisson batch drawn from the same synthetic
data set (n records, q = B/n so that the expected batch is B): sampling, forward, backward and
optimizer step. Variants, timed interleaved step by step in the same run:

``nonprivate``        plain minibatch SGD on the Poisson batch (torch RNG for the coins);
``pdpfl_secure``      pdpfl DP-SGD with :class:`pdpfl.randomness.SecureRandomness` (the default:
                      ChaCha20 keystream, Box–Muller, sum of 4 normals / 2, float64 noise);
``pdpfl_reproducible`` the same step with a seeded ``torch.Generator`` (research mode);
``opacus``            ``PrivacyEngine.make_private`` with Poisson sampling (its ``DPDataLoader``),
                      i.e. its per-sample-gradient hooks, clipping and noise (``secure_mode`` off).

Cases: the rPDP-FL MNIST CNN (26,010 parameters) and the Fed-Heart-Disease logistic regression
(14 parameters), each at expected batch 64 and 400. The public normaliser of the DP variants is
the expected batch size B (issue #10). The JSON records the load average before and after (the
development machine is shared): ratios are only comparable within one run.

Usage::

    .venv/bin/python benchmarks/dpsgd.py --json          # one JSON object on stdout
    .venv/bin/python benchmarks/dpsgd.py --steps 10      # quicker, human-readable
    .venv/bin/python benchmarks/dpsgd.py --json --repeats 3   # 3 interleaved rounds, pooled
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings

import numpy as np
import torch

from pdpfl.dp.engine import PersonalizedDPSGD, make_optimizer
from pdpfl.models import create_model, loss_fn
from pdpfl.randomness import SecureRandomness

CASES = [
    ("mnist_cnn", "mnist-cnn", (1, 28, 28), 10, 400),
    ("mnist_cnn", "mnist-cnn", (1, 28, 28), 10, 64),
    ("logreg", "logreg", (13,), 2, 400),
    ("logreg", "logreg", (13,), 2, 64),
]


_CLOCK = time.perf_counter


def _interleaved_medians(fns: dict, steps: int, warmup: int, repeats: int = 1) -> dict[str, float]:
    """Median ms per variant; variants alternate step by step so machine load hits all alike
    (``repeats`` rounds of ``steps`` steps, pooled)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(steps * repeats):
        for k, fn in fns.items():
            t0 = _CLOCK()
            fn()
            times[k].append(_CLOCK() - t0)
    return {k: 1000 * statistics.median(v) for k, v in times.items()}


def _data(shape, k, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *shape, generator=g)
    y = torch.randint(0, k, (n,), generator=g)
    return x, y


def nonprivate_step(model_name, shape, k, batch):
    torch.manual_seed(0)
    n = 10 * batch
    x, y = _data(shape, k, n)
    model = create_model(model_name, shape, k)
    opt = make_optimizer("sgd", model.parameters(), lr=0.05)
    q = torch.full((n,), batch / n, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)

    def step():
        idx = torch.nonzero(torch.rand(n, generator=gen, dtype=torch.float64) < q).flatten()
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()

    return step


def pdpfl_step(model_name, shape, k, batch, secure: bool):
    torch.manual_seed(0)
    n = 10 * batch
    x, y = _data(shape, k, n)
    model = create_model(model_name, shape, k)
    opt = make_optimizer("sgd", model.parameters(), lr=0.05)
    rates = np.full(n, batch / n)
    engine = PersonalizedDPSGD(model, opt, noise_multiplier=1.0, max_grad_norm=1.0)
    if secure:
        stream = SecureRandomness().stream("local-training", 0, 0)
    else:
        stream = torch.Generator().manual_seed(1)
    return lambda: engine.step(x, y, rates, stream, normalizer=float(batch))


def opacus_step(model_name, shape, k, batch):
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    n = 10 * batch
    x, y = _data(shape, k, n)
    model = create_model(model_name, shape, k)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="rdp")
        model, opt, loader = engine.make_private(
            module=model,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            poisson_sampling=True,
        )
    it = iter(loader)

    def step():
        nonlocal it
        try:
            xb, yb = next(it)
        except StopIteration:
            it = iter(loader)
            xb, yb = next(it)
        opt.zero_grad(set_to_none=True)
        loss_fn(model(xb), yb).backward()
        opt.step()

    return step


def noise_draw_ms(n: int = 26_010, repeats: int = 20) -> dict[str, float]:
    """Median ms to draw ``n`` float64 normals: secure stream vs seeded torch generator."""
    stream = SecureRandomness().stream("bench")
    gen = torch.Generator().manual_seed(0)
    out = {}
    for key, fn in {
        "secure_ms": lambda: stream.normal((n,)),
        "torch_ms": lambda: torch.randn(n, generator=gen, dtype=torch.float64),
    }.items():
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[key] = round(1000 * statistics.median(times), 3)
    return out


def main() -> None:
    warnings.filterwarnings("ignore", module="opacus")
    warnings.filterwarnings("ignore", message=".*Full backward hook.*")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-opacus", action="store_true")
    ap.add_argument("--repeats", type=int, default=1, help="rounds of --steps steps, pooled")
    ap.add_argument(
        "--cases",
        default="",
        help="comma list of case names to run, e.g. mnist_cnn/400,logreg/64 (default: all)",
    )
    ap.add_argument(
        "--timer",
        choices=["wall", "cpu"],
        default="wall",
        help="wall: perf_counter (default); cpu: process CPU time of all threads (robust to "
        "other processes competing for the cores)",
    )
    args = ap.parse_args()
    global _CLOCK
    _CLOCK = time.perf_counter if args.timer == "wall" else time.process_time
    torch.set_num_threads(args.threads)
    wanted = {c for c in args.cases.split(",") if c}
    out: dict = {
        "threads": args.threads,
        "timer": args.timer,
        "load_before": [round(v, 2) for v in os.getloadavg()],
    }
    for key, model_name, shape, k, batch in CASES:
        if wanted and f"{key}/{batch}" not in wanted:
            continue
        fns = {
            "nonprivate_ms": nonprivate_step(model_name, shape, k, batch),
            "pdpfl_secure_ms": pdpfl_step(model_name, shape, k, batch, secure=True),
            "pdpfl_reproducible_ms": pdpfl_step(model_name, shape, k, batch, secure=False),
        }
        if not args.no_opacus:
            fns["opacus_ms"] = opacus_step(model_name, shape, k, batch)
        medians = _interleaved_medians(fns, args.steps, args.warmup, args.repeats)
        res = {m: round(v, 3) for m, v in medians.items()}
        res["secure_over_nonprivate"] = round(res["pdpfl_secure_ms"] / res["nonprivate_ms"], 3)
        res["reproducible_over_nonprivate"] = round(
            res["pdpfl_reproducible_ms"] / res["nonprivate_ms"], 3
        )
        if "opacus_ms" in res:
            res["opacus_over_secure"] = round(res["opacus_ms"] / res["pdpfl_secure_ms"], 3)
            res["opacus_over_nonprivate"] = round(res["opacus_ms"] / res["nonprivate_ms"], 3)
        out.setdefault(key, {})[str(batch)] = res
        if not args.json:
            print(key, batch, res, flush=True)
    out["noise_26010"] = noise_draw_ms()
    out["load_after"] = [round(v, 2) for v in os.getloadavg()]
    if not args.json:
        print("noise_26010", out["noise_26010"], flush=True)
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
