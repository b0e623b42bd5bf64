"""On an accelerator: the DP-SGD step against non-private and Opacus, and IDP-FedAvg's batched
cohort against its per-client loop (issue #37, item 5).

Run it only where a GPU is present (``--device cuda``); on a CPU it runs too (``--device cpu``,
small ``--batch``) so that the script itself is tested, but its numbers are the CPU's.

**DP step** (one full step on a Poisson batch of expected size B, q = B/n, n = 4B: sampling,
forward, backward, clipping, noise, optimizer step; medians of interleaved steps, each timed
with ``torch.cuda.synchronize`` before and after):

``nonprivate``          minibatch SGD on the Poisson batch (plain autograd);
``pdpfl_secure``        :class:`pdpfl.dp.engine.PersonalizedDPSGD` with the default secure
                        randomness (ChaCha20 keystream on the CPU, copied to the device);
``pdpfl_reproducible``  the same with a seeded ``torch.Generator`` (research mode);
``opacus_hooks``        Opacus ``make_private`` (per-sample gradients by hooks, Poisson loader);
``opacus_ghost``        Opacus ``grad_sample_mode="ghost"`` (ghost clipping: two backward passes,
                        no per-sample gradient materialized).

Models: the rPDP-FL MNIST CNN (1×28×28, 26,010 parameters) and ResNet-18 with GroupNorm at
CIFAR-10 size (3×32×32, 11,181,642 parameters), both at B = 1024 by default.

**IDP-FedAvg cohort**: ``train_clients`` on K clients (E epochs of batch 128, Adam) with the
stacked ``batched`` strategy (vmap over the clients) against the per-client ``loop``, model and
data on the device; the float32 difference between the two paths is reported.

Usage::

    python benchmarks/gpu.py --device cuda --json > gpu.json
    python benchmarks/gpu.py --device cpu --batch 32 --steps 2 --warmup 1 --clients 4 \
        --models mnist-cnn --idp-models mlp          # a smoke run of the script on a CPU
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pdpfl.dp.engine import PersonalizedDPSGD, make_optimizer
from pdpfl.models import create_model, loss_fn
from pdpfl.randomness import SecureRandomness

SHAPES = {"mnist-cnn": ((1, 28, 28), 10), "resnet18-gn": ((3, 32, 32), 10)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _medians(
    fns: dict[str, Callable[[], None]], device: torch.device, steps: int, warmup: int
) -> dict[str, float]:
    """Median ms per variant; variants alternate step by step."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    _sync(device)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(steps):
        for k, fn in fns.items():
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[k].append(time.perf_counter() - t0)
    return {k: 1000 * statistics.median(v) for k, v in times.items()}


def _data(shape: tuple[int, ...], k: int, n: int, device: torch.device) -> tuple:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, *shape, generator=g).to(device)
    y = torch.randint(0, k, (n,), generator=g).to(device)
    return x, y


def _model(name: str, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    shape, k = SHAPES[name]
    return create_model(name, shape, k).to(device)


def nonprivate(name: str, batch: int, device: torch.device) -> Callable[[], None]:
    shape, k = SHAPES[name]
    n = 4 * batch
    x, y = _data(shape, k, n, device)
    model = _model(name, device)
    opt = make_optimizer("sgd", model.parameters(), lr=0.05)
    gen = torch.Generator(device=device).manual_seed(1)

    def step() -> None:
        coins = torch.rand(n, generator=gen, device=device) < batch / n
        idx = torch.nonzero(coins).flatten()
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()

    return step


def pdpfl(name: str, batch: int, device: torch.device, secure: bool) -> Callable[[], None]:
    shape, k = SHAPES[name]
    n = 4 * batch
    x, y = _data(shape, k, n, device)
    model = _model(name, device)
    opt = make_optimizer("sgd", model.parameters(), lr=0.05)
    engine = PersonalizedDPSGD(model, opt, noise_multiplier=1.0, max_grad_norm=1.0, device=device)
    rates = np.full(n, batch / n)
    stream = (
        SecureRandomness().stream("local-training", 0, 0)
        if secure
        else torch.Generator().manual_seed(1)
    )
    return lambda: engine.step(x, y, rates, stream, normalizer=float(batch))


def opacus(name: str, batch: int, device: torch.device, mode: str) -> Callable[[], None]:
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    shape, k = SHAPES[name]
    n = 4 * batch
    x, y = _data(shape, k, n, device)
    model = _model(name, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="rdp")
        made = engine.make_private(
            module=model,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            poisson_sampling=True,
            grad_sample_mode=mode,
            criterion=nn.CrossEntropyLoss(),
        )
    if mode == "ghost":
        model, opt, criterion, loader = made
    else:
        (model, opt, loader), criterion = made, nn.CrossEntropyLoss()
    it = iter(loader)

    def step() -> None:
        nonlocal it
        try:
            xb, yb = next(it)
        except StopIteration:
            it = iter(loader)
            xb, yb = next(it)
        opt.zero_grad(set_to_none=True)
        criterion(model(xb), yb).backward()
        opt.step()

    return step


def dp_step(name: str, batch: int, device: torch.device, args: argparse.Namespace) -> dict:
    fns: dict[str, Callable[[], None]] = {
        "nonprivate_ms": nonprivate(name, batch, device),
        "pdpfl_secure_ms": pdpfl(name, batch, device, secure=True),
        "pdpfl_reproducible_ms": pdpfl(name, batch, device, secure=False),
    }
    out: dict = {}
    for mode in ("hooks", "ghost"):
        try:
            fns[f"opacus_{mode}_ms"] = opacus(name, batch, device, mode)
        except Exception as exc:  # noqa: BLE001 -- recorded, the other variants still run
            out[f"opacus_{mode}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    res = {k: round(v, 3) for k, v in _medians(fns, device, args.steps, args.warmup).items()}
    out.update(res)
    base = res["pdpfl_secure_ms"]
    for key, value in res.items():
        if key != "nonprivate_ms":
            out[key.replace("_ms", "_over_nonprivate")] = round(value / res["nonprivate_ms"], 3)
        if key.startswith("opacus"):
            out[key.replace("_ms", "_over_pdpfl_secure")] = round(value / base, 3)
    if device.type == "cuda":
        out["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20)
        torch.cuda.reset_peak_memory_stats(device)
    return out


def idp_cohort(name: str, device: torch.device, args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    import idp_fedavg as bench  # the CPU benchmark's data and model builders

    from pdpfl.fl import idp_fedavg as idp
    from pdpfl.models import get_params

    local = idp.LocalTraining(epochs=args.epochs, batch_size=128, optimizer="adam", lr=5e-4)
    model = bench._model(name).to(device)
    params = get_params(model)
    data = bench._repeat(
        bench._datasets(args.clients, args.records, bench.SHAPES[name], 1), args.epochs, 2
    )
    data = [(x.to(device), y.to(device)) for x, y in data]
    warm = [(x[:130], y[:130]) for x, y in data[:2]]
    results: dict[str, list] = {}
    out: dict = {"clients": args.clients, "records": args.records, "epochs": args.epochs}
    for strategy in ("batched", "loop"):
        idp.train_clients(model, params, warm, replace(local, strategy=strategy))
    for strategy in ("batched", "loop"):
        best = math.inf
        for _ in range(args.repeats):
            _sync(device)
            t = time.perf_counter()
            results[strategy] = idp.train_clients(
                model, params, data, replace(local, strategy=strategy)
            )
            _sync(device)
            best = min(best, time.perf_counter() - t)
        out[f"{strategy}_s"] = round(best, 4)
    out["loop_over_batched"] = round(out["loop_s"] / out["batched_s"], 3)
    out["max_abs_diff_float32"] = float(
        max(
            float(np.abs(np.asarray(a) - np.asarray(b)).max())
            for ra, rb in zip(results["batched"], results["loop"], strict=True)
            for a, b in zip(ra, rb, strict=True)
        )
    )
    return out


def main() -> None:
    warnings.filterwarnings("ignore", module="opacus")
    warnings.filterwarnings("ignore", message=".*Full backward hook.*")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=1024, help="expected Poisson batch B")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--models", default="mnist-cnn,resnet18-gn")
    ap.add_argument("--idp-models", default="idp-cnn,mlp")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--records", type=int, default=600)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    out: dict = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "batch": args.batch,
        "steps": args.steps,
    }
    for name in [m for m in args.models.split(",") if m]:
        out[f"dp_step/{name}"] = dp_step(name, args.batch, device, args)
        if not args.json:
            print(name, out[f"dp_step/{name}"], flush=True)
    for name in [m for m in args.idp_models.split(",") if m]:
        out[f"idp_cohort/{name}"] = idp_cohort(name, device, args)
        if not args.json:
            print("idp", name, out[f"idp_cohort/{name}"], flush=True)
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
