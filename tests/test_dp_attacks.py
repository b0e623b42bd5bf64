"""Predictable noise (issue #10 §1), at the engine level.

A silo runs one DP-SGD step on its data and releases the new parameters. An attacker who knows
the starting parameters, the public hyper-parameters and -- in the reproducible mode -- the seed
regenerates the stream (coins, then noise in parameter order), subtracts the noise and recovers
the clipped gradient of a training record, hence the record itself (for logistic regression
``g = (p − y)·[x, 1]``, so ``x = g_w / g_b``). With :class:`~pdpfl.randomness.SecureRandomness`
(a fresh secret key) the same attack is off by the noise.
"""

from __future__ import annotations

import numpy as np
import torch

from pdpfl.dp import make_optimizer, train_steps
from pdpfl.models import create_model
from pdpfl.randomness import SecureRandomness, stream_from_generator

torch.set_num_threads(2)

SIGMA, C, B, LR = 1.0, 10.0, 1.0, 1.0


def _silo_step(stream) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """One step on a one-record silo: returns (params before, params after, the record)."""
    torch.manual_seed(0)
    model = create_model("logreg", (13,), 2)
    x = torch.randn(1, 13, generator=torch.Generator().manual_seed(123))
    y = torch.tensor([1])
    before = [p.detach().clone() for p in model.parameters()]
    train_steps(
        model, x, y, rates=np.ones(1), steps=1, noise_multiplier=SIGMA, max_grad_norm=C,
        optimizer=make_optimizer("sgd", model.parameters(), lr=LR), stream=stream, normalizer=B,
    )  # fmt: skip
    return before, [p.detach().clone() for p in model.parameters()], x[0]


def _attack(before, after, guessed_stream) -> tuple[torch.Tensor, torch.Tensor]:
    """Regenerate the noise from ``guessed_stream``; return (recovered g, recovered record)."""
    guessed_stream.uniform(1)  # the Poisson coins come first
    grads = []
    for b, a in zip(before, after, strict=True):
        noise = SIGMA * C * guessed_stream.normal(tuple(b.shape))
        grads.append((b.double() - a.double()) / LR * B - noise)
    g_w, g_b = grads[0].flatten(), grads[1].flatten()
    return torch.cat([g_w, g_b]), g_w / g_b


def _true_gradient(before, record) -> torch.Tensor:
    w, b = before[0].double(), before[1].double()
    p = torch.sigmoid(record.double() @ w.flatten() + b)
    return torch.cat([(p - 1) * record.double(), p - 1])  # ‖g‖ < C: not clipped


def test_seeded_noise_lets_an_attacker_recover_a_record():
    seed = 2024
    before, after, record = _silo_step(torch.Generator().manual_seed(seed))
    g, x_hat = _attack(before, after, stream_from_generator(torch.Generator().manual_seed(seed)))
    truth = _true_gradient(before, record)
    assert float(truth.norm()) < C
    assert float((g - truth).norm()) < 1e-5  # float32 rounding of the released parameters
    assert float((x_hat - record.double()).abs().max()) < 1e-4


def test_secure_randomness_defeats_the_same_attack():
    before, after, record = _silo_step(SecureRandomness().stream("local-training", 0, 0))
    truth = _true_gradient(before, record)
    # the attacker knows everything public, but not the silo's key: any guess is off by ~σC√d
    for guess in (
        stream_from_generator(torch.Generator().manual_seed(2024)),
        SecureRandomness(key=bytes(32)).stream("local-training", 0, 0),
    ):
        g, _ = _attack(before, after, guess)
        err = float((g - truth).norm())
        d = truth.numel()
        assert 0.5 * SIGMA * C * np.sqrt(d) < err < 3 * SIGMA * C * np.sqrt(2 * d)
