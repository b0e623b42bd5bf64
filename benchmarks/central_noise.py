"""DP-SGD step time with exact central discrete noise against the secure continuous sampler
(issue #33 item 4, ``privacy.central_noise``), in the same run.

Each case builds two engines on the same model and data -- ``continuous`` (the default
:class:`~pdpfl.privacy.noise.GaussianNoise`, secure float64 normals) and ``discrete``
(:class:`~pdpfl.privacy.noise.CentralDiscreteGaussianNoise`: scale, round, exact N_Z on the grid,
rescale) -- and times full steps (Poisson sampling, per-sample gradients, clipping, noise,
optimizer) interleaved step by step; it also times the noise alone (one draw of d coordinates
from each). Reported: median step seconds (wall clock), the ratio discrete/continuous, and the
noise-only milliseconds. The machine is shared: compare ratios within one run only.

    nice -n 10 .venv/bin/python benchmarks/central_noise.py --json [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Any

import numpy as np
import torch

from pdpfl.dp.engine import PersonalizedDPSGD, make_optimizer
from pdpfl.dp.noise import PreparedNoise
from pdpfl.models import create_model
from pdpfl.privacy.noise import CentralDiscreteGaussianNoise, GaussianNoise
from pdpfl.randomness import SecureRandomness

#: (label, model, input shape, classes, records, expected batch)
CASES = [
    ("logreg (14 params), B = 64", "logreg", (13,), 2, 2000, 64),
    ("mnist-cnn (26,010 params), B = 64", "mnist-cnn", (1, 28, 28), 10, 2000, 64),
    ("mnist-cnn (26,010 params), B = 400", "mnist-cnn", (1, 28, 28), 10, 4000, 400),
]


def _case(
    label: str,
    model_name: str,
    shape: tuple[int, ...],
    classes: int,
    n: int,
    batch: int,
    steps: int,
) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((n, *shape), generator=gen)
    y = torch.randint(0, classes, (n,), generator=gen)
    rates = np.full(n, batch / n)
    engines = {}
    dimension = 0
    for kind in ("continuous", "discrete"):
        torch.manual_seed(0)
        model = create_model(model_name, input_shape=shape, num_classes=classes)
        dimension = sum(p.numel() for p in model.parameters() if p.requires_grad)
        noise: Any = (
            GaussianNoise(1.0, 1.0)
            if kind == "continuous"
            else CentralDiscreteGaussianNoise(1.0, 1.0, dimension)
        )
        opt = make_optimizer("sgd", model.parameters(), lr=0.01)
        engines[kind] = PersonalizedDPSGD(model, opt, noise=noise)
    rand = SecureRandomness()
    times: dict[str, list[float]] = {k: [] for k in engines}
    for i in range(steps + 2):
        for kind, engine in engines.items():
            stream = rand.stream("bench", i, int(kind == "discrete"))
            t0 = time.perf_counter()
            engine.step(x, y, rates, stream, normalizer=float(batch))
            if i >= 2:  # warm-up
                times[kind].append(time.perf_counter() - t0)
    # the noise alone: one draw of all d coordinates
    noise_ms: dict[str, float] = {}
    for kind, engine in engines.items():
        prepared = PreparedNoise(engine.noise, [(dimension,)])  # type: ignore[arg-type]
        flat = torch.zeros(dimension, dtype=torch.float64)
        best = float("inf")
        for r in range(max(5, steps // 2)):
            stream = rand.stream("bench-noise", r, int(kind == "discrete"))
            t0 = time.perf_counter()
            prepared(flat, stream)
            best = min(best, time.perf_counter() - t0)
        noise_ms[kind] = best * 1e3
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "case": label,
        "dimension": dimension,
        "step_s": med,
        "ratio": med["discrete"] / med["continuous"],
        "noise_ms": noise_ms,
        "noise_ratio": noise_ms["discrete"] / noise_ms["continuous"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load0 = os.getloadavg()
    rows = [_case(*case, steps=args.steps) for case in CASES]
    out = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}",
        "loadavg_before": load0,
        "loadavg_after": os.getloadavg(),
        "steps": args.steps,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for r in rows:
        print(
            f"{r['case']:40s} step {r['step_s']['continuous'] * 1e3:8.2f} ms vs "
            f"{r['step_s']['discrete'] * 1e3:8.2f} ms (x{r['ratio']:.2f}); noise "
            f"{r['noise_ms']['continuous']:.2f} vs {r['noise_ms']['discrete']:.2f} ms"
        )


if __name__ == "__main__":
    main()
