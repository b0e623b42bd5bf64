"""The Filter baseline: private gradient descent with an individual Rényi filter.

Feldman & Zrnic (NeurIPS 2021), "Individual privacy accounting via a Rényi filter", Alg. 3, as
rPDP-FL §7.1 uses it (Table 2, Fig. 7). Full-batch GD on ``n`` records; at step *t*:

1. per-record gradient ``g_i`` for every *active* record;
2. record *i* may still spend ``r_i = max(B_i − spent_i, 0)`` of its **squared-norm budget**
   ``B_i`` (never √ of a negative number); its gradient is clipped to
   ``b_i = min(C, √r_i)``: ``ḡ_i = g_i · min(1, b_i / ‖g_i‖)`` and ``spent_i += ‖ḡ_i‖²``,
   so Σ_t ‖ḡ_{i,t}‖² ≤ B_i always holds;
3. a record whose budget binds (``√r_i < C`` and ``‖g_i‖ ≥ b_i``) has used it up and leaves;
4. ``θ ← θ − η · (Σ_active ḡ_i + N(0, σ²C² I)) / n`` (``n`` is public).

The individual Rényi divergence of order α is ``α Σ_t ‖ḡ_{i,t}‖² / (2σ²C²)``, so a budget
``B_i`` guarantees RDP ρ_i = α B_i / (2σ²C²) and (ε_i, δ)-DP with
ε_i = ρ_i + log(1/δ)/(α − 1); :func:`squared_norm_budgets` inverts this. There is no
amplification by sampling (every active record is used every step).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from pdpfl.dp.centralized import CentralizedResult, group_accuracy
from pdpfl.dp.engine import LossFn, evaluate, make_optimizer
from pdpfl.dp.grad_sample import clipped_grad_sum, resolve_method
from pdpfl.dp.validate import validate_model
from pdpfl.models import loss_fn

__all__ = ["FilterResult", "filter_step", "squared_norm_budgets", "train_filter_gd"]

#: √r_i is shrunk by this relative margin so float rounding can never overspend B_i.
_SAFETY = 1e-5


def squared_norm_budgets(
    epsilons: np.ndarray | Sequence[float],
    *,
    delta: float,
    noise_multiplier: float,
    max_grad_norm: float,
    alpha: float,
) -> np.ndarray:
    """Squared-norm budgets ``B_i = 2σ²C² (ε_i − log(1/δ)/(α−1)) / α`` (Rényi filter at order α).

    Raises ``ValueError`` when some ε_i is not larger than ``log(1/δ)/(α−1)`` (no budget left).
    """
    eps = np.asarray(epsilons, dtype=np.float64)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not alpha > 1:
        raise ValueError(f"alpha must be > 1, got {alpha}")
    if not (noise_multiplier > 0 and max_grad_norm > 0):
        raise ValueError("noise_multiplier and max_grad_norm must be > 0")
    rho = eps - math.log(1 / delta) / (alpha - 1)
    if np.any(~np.isfinite(rho)) or np.any(rho <= 0):
        raise ValueError(
            f"epsilons: every budget must exceed log(1/δ)/(α−1) = {math.log(1 / delta) / (alpha - 1):.4g}"
            " at this alpha; increase alpha or the budgets"
        )
    return 2 * noise_multiplier**2 * max_grad_norm**2 * rho / alpha


@dataclass
class FilterStep:
    """What one :func:`filter_step` did (per-record arrays cover all ``n`` records)."""

    grads: list[Tensor]
    """The privatized gradient ``(Σ_active ḡ_i + noise) / n`` per trainable parameter."""
    sq_norms: np.ndarray
    """‖ḡ_i‖² spent by each record at this step (0 for inactive records), float64."""
    exhausted: np.ndarray
    """Records whose budget bound at this step (they leave after it)."""
    active: int
    loss_sum: float


def filter_step(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    budgets: np.ndarray,
    spent: np.ndarray,
    active: np.ndarray,
    noise_multiplier: float,
    max_grad_norm: float,
    generator: torch.Generator,
    loss: LossFn = loss_fn,
    physical_batch_size: int = 512,
    grad_sampler: str = "auto",
) -> FilterStep:
    """One step of private GD with the individual filter (see module docstring)."""
    n = x.shape[0]
    params = [p for p in model.parameters() if p.requires_grad]
    idx = np.flatnonzero(active)
    remaining = np.maximum(budgets[idx] - spent[idx], 0.0)
    bound = np.minimum(max_grad_norm, np.sqrt(remaining) * (1 - _SAFETY))
    sq = np.zeros(n)
    exhausted = np.zeros(n, dtype=bool)
    loss_sum = 0.0
    sums = [torch.zeros_like(p) for p in params]
    if idx.size:
        device = params[0].device
        ti = torch.as_tensor(idx)
        res = clipped_grad_sum(
            model,
            x[ti.to(x.device)].to(device),
            y[ti.to(y.device)].to(device),
            loss,
            torch.as_tensor(bound, dtype=torch.float64),
            resolve_method(model, grad_sampler),
            physical_batch_size,
        )
        sums, loss_sum = res.sums, res.loss_sum
        norms = res.norms.double().cpu().numpy()
        scaled = norms * res.factors.double().cpu().numpy()
        sq[idx] = scaled**2
        exhausted[idx] = (bound < max_grad_norm) & (norms >= bound)
    std = noise_multiplier * max_grad_norm
    grads = []
    for p, s in zip(params, sums, strict=True):
        if std > 0:
            noise = torch.randn(
                p.shape, generator=generator, device=generator.device, dtype=p.dtype
            )
            s = s + std * noise.to(p.device)
        grads.append(s / n)
    return FilterStep(grads, sq, exhausted, int(idx.size), loss_sum)


@dataclass
class FilterResult(CentralizedResult):
    """:class:`CentralizedResult` plus the filter's per-step active counts (paper Fig. 7)."""

    active_counts: list[int] = field(default_factory=list)
    """Active records used at each step (before that step's exhaustion)."""
    spent: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Σ_t ‖ḡ_{i,t}‖² per record (≤ B_i)."""
    exit_step: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Step (1-based) after which each record left; −1 if it stayed to the end."""

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["active_counts"] = self.active_counts
        return d


def train_filter_gd(
    model: nn.Module,
    train: tuple[Tensor, Tensor],
    test: tuple[Tensor, Tensor],
    *,
    squared_norm_budgets: np.ndarray | Sequence[float],
    noise_multiplier: float,
    max_grad_norm: float,
    steps: int,
    lr: float = 0.1,
    optimizer: str = "sgd",
    weight_decay: float = 0.0,
    momentum: float = 0.0,
    generator: torch.Generator | None = None,
    seed: int = 0,
    train_groups: Sequence[Any] | np.ndarray | None = None,
    test_groups: Sequence[Any] | np.ndarray | None = None,
    eval_every: int = 0,
    physical_batch_size: int = 512,
    loss: LossFn = loss_fn,
) -> FilterResult:
    """Private full-batch GD with Feldman–Zrnic individual filtering (rPDP-FL's *Filter*).

    ``squared_norm_budgets`` are the B_i (see :func:`squared_norm_budgets` to derive them from
    ε_i). ``train_groups`` (default: the budgets) groups the per-group exit statistics.
    """
    x, y = train
    xt, yt = test
    n = x.shape[0]
    validate_model(model)
    B = np.asarray(squared_norm_budgets, dtype=np.float64)
    if B.shape != (n,) or np.any(~np.isfinite(B)) or np.any(B < 0):
        raise ValueError(f"squared_norm_budgets must be {n} finite values >= 0")
    if not (max_grad_norm > 0 and noise_multiplier >= 0):
        raise ValueError("max_grad_norm must be > 0 and noise_multiplier >= 0")
    if int(steps) < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    gen = generator if generator is not None else torch.Generator().manual_seed(int(seed))
    opt = make_optimizer(optimizer, model.parameters(), lr, weight_decay, momentum)
    params = [p for p in model.parameters() if p.requires_grad]
    spent = np.zeros(n)
    active = B > 0
    exit_step = np.where(active, -1, 0).astype(np.int64)
    active_counts: list[int] = []
    history: list[dict] = []
    elapsed = 0.0
    model.train()
    for t in range(1, int(steps) + 1):
        t0 = time.perf_counter()
        st = filter_step(
            model,
            x,
            y,
            budgets=B,
            spent=spent,
            active=active,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            generator=gen,
            loss=loss,
            physical_batch_size=physical_batch_size,
        )
        opt.zero_grad(set_to_none=True)
        for p, g in zip(params, st.grads, strict=True):
            p.grad = g
        opt.step()
        elapsed += time.perf_counter() - t0
        spent += st.sq_norms
        active_counts.append(st.active)
        exit_step[st.exhausted] = t
        active &= ~st.exhausted
        if eval_every and (t % eval_every == 0 or t == steps):
            ev = evaluate(model, xt, yt)
            history.append({"step": t, "loss": ev["loss"], "accuracy": ev["accuracy"]})
    groups = np.asarray(train_groups) if train_groups is not None else B
    train_stats = {}
    for k in np.unique(groups):
        m = groups == k
        exits = exit_step[m]
        train_stats[str(k)] = {
            "n": int(m.sum()),
            "mean_budget": float(B[m].mean()),
            "mean_spent": float(spent[m].mean()),
            "active_at_end": int((exits < 0).sum()),
            "first_exit_step": int(exits[exits >= 0].min()) if np.any(exits >= 0) else -1,
        }
    return FilterResult(
        steps=int(steps),
        test=evaluate(model, xt, yt),
        per_group_accuracy=(
            group_accuracy(model, xt, yt, test_groups) if test_groups is not None else {}
        ),
        train_groups=train_stats,
        history=history,
        mean_step_seconds=elapsed / steps if steps else float("nan"),
        realized_batch_sizes=active_counts.copy(),
        expected_batch_size=float("nan"),
        active_counts=active_counts,
        spent=spent,
        exit_step=exit_step,
    )
