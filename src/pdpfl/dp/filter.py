"""The Filter baseline: private gradient descent with an individual Rényi filter.

Feldman & Zrnic (NeurIPS 2021), "Individual privacy accounting via a Rényi filter", Alg. 3, as
rPDP-FL §7.1 uses it (Table 2, Fig. 7). Full-batch GD on ``n`` records; at step *t*:

1. per-record gradient ``g_i`` for every *active* record;
2. record *i* may still spend ``r_i = max(B_i − spent_i, 0)`` of its **squared-norm budget**
   ``B_i`` (never √ of a negative number); its gradient is clipped to
   ``b_i = min(C, √r_i)``: ``ḡ_i = g_i · min(1, b_i / ‖g_i‖)`` and ``spent_i += ‖ḡ_i‖²``,
   so Σ_t ‖ḡ_{i,t}‖² ≤ B_i always holds;
3. a record whose budget binds (``√r_i < C`` and ``‖g_i‖ ≥ b_i``) has used it up and leaves;
4. ``θ ← θ − η · (Σ_active ḡ_i + N(0, σ²C² I)) / n``.

Normalisation: the paper's GD divides by the data-set size ``n``, which Feldman & Zrnic's
analysis treats as public (the individual Rényi divergence above counts only ‖ḡ_i‖², so the
divisor must not depend on whether record *i* is present). That is this module's default;
pass ``normalizer=`` to divide by another *declared public* constant, e.g. when the size of
the data set is itself private. Noise and the clipped sum are added in float64
(:func:`pdpfl.dp.steps.noisy_normalised_sum`) and the noise comes from a
:mod:`pdpfl.randomness` stream -- a fresh secret key by default, ``seed=`` only as the labelled
reproducible mode.

The individual Rényi divergence of order α is ``α Σ_t ‖ḡ_{i,t}‖² / (2σ²C²)``, so a budget
``B_i`` guarantees RDP ρ_i = α B_i / (2σ²C²) and (ε_i, δ)-DP with
ε_i = ρ_i + log(1/δ)/(α − 1); :func:`squared_norm_budgets` inverts this. There is no
amplification by sampling (every active record is used every step).

Exact discrete noise (``privacy.central_noise: discrete``,
:class:`~pdpfl.privacy.noise.CentralDiscreteGaussianNoise`): each step's clipped sum S is scaled
by γ = 2^k, rounded deterministically and released with Z ~ N_Z(0, σ²Δ'²)^d (Δ' = γC + √d). With
record i active, round(γS) and round(γ(S − ḡ_i)) differ by at most γ‖ḡ_i‖ + √d, so its
individual Rényi divergence of the step is at most α(‖ḡ_i‖ + p)²/(2σ²C'²) with p = √d/γ and
C' = Δ'/γ = C + p (Canonne, Kamath & Steinke 2020: the discrete Gaussian's RDP for an integer
shift; an inactive record moves nothing). The filter therefore charges (‖ḡ_i‖ + p)² instead of
‖ḡ_i‖², clips to ``min(C, √r_i − p)`` (a record with √r_i ≤ p sits the step out and leaves) and
states budgets and ε in C' (:func:`accounting_clip`); σ from ε_max is unchanged (C' cancels). p
is at most 2^-10·C.
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

from pdpfl.dp.centralized import CentralizedResult, group_accuracy, mechanism_stream
from pdpfl.dp.engine import LossFn, as_stream, evaluate, make_optimizer
from pdpfl.dp.grad_sample import clipped_grad_sum, resolve_method
from pdpfl.dp.noise import CentralNoise, central_step_noise
from pdpfl.dp.steps import check_normalizer, noisy_normalised_sum
from pdpfl.dp.validate import validate_model
from pdpfl.models import loss_fn
from pdpfl.privacy.noise import CentralDiscreteGaussianNoise, GaussianNoise
from pdpfl.randomness import RandomStream

__all__ = [
    "FilterResult",
    "FilterState",
    "accounting_clip",
    "best_filter_orders",
    "filter_epsilons",
    "filter_gd_steps",
    "filter_noise_for_max_budget",
    "filter_step",
    "squared_norm_budgets",
    "train_filter_gd",
]

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
        floor = math.log(1 / delta) / (alpha - 1)
        raise ValueError(
            f"epsilons: every budget must exceed log(1/δ)/(α−1) = {floor:.4g}"
            " at this alpha; increase alpha or the budgets"
        )
    return 2 * noise_multiplier**2 * max_grad_norm**2 * rho / alpha


def best_filter_orders(epsilons: np.ndarray | Sequence[float], *, delta: float) -> np.ndarray:
    """Per record, the order α_i that maximises its squared-norm budget ``B(α) ∝ (ε − L/(α−1))/α``.

    With L = log(1/δ), ``dB/dα = 0`` is ``ε(α−1)² = L(2α−1)``, whose root above 1 is
    ``α* = ((ε + L) + √((ε + L)·L)) / ε``. The filter's guarantee is per record (Feldman & Zrnic,
    Thm. 3.3: record i's RDP at order α_i is bounded by its own filter), so each record may use
    the order of its own budget; α_i is a function of ε_i alone, as q_i is in rPDP-FL.
    """
    eps = np.asarray(epsilons, dtype=np.float64)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if np.any(~np.isfinite(eps)) or np.any(eps <= 0):
        raise ValueError("epsilons: every budget must be a finite number > 0")
    big_l = math.log(1 / delta)
    return ((eps + big_l) + np.sqrt((eps + big_l) * big_l)) / eps


def filter_epsilons(
    spent: np.ndarray | Sequence[float],
    *,
    delta: float,
    noise_multiplier: float,
    max_grad_norm: float,
    alphas: np.ndarray | float,
) -> np.ndarray:
    """ε_i = α_i Σ_t ‖ḡ_{i,t}‖² / (2σ²C²) + log(1/δ)/(α_i − 1): the inverse of
    :func:`squared_norm_budgets` (individual RDP of the filtered Gaussian, converted at δ)."""
    s = np.asarray(spent, dtype=np.float64)
    a = np.broadcast_to(np.asarray(alphas, dtype=np.float64), s.shape)
    if np.any(a <= 1):
        raise ValueError("alphas must be > 1")
    scale = 2 * noise_multiplier**2 * max_grad_norm**2
    return a * s / scale + math.log(1 / delta) / (a - 1)


def accounting_clip(noise: CentralNoise) -> float:
    """The C the filter's budgets and ε are stated in: C for Gaussian noise, C' = Δ'/γ = C + √d/γ
    (rounded up) for the exact discrete noise (module docstring)."""
    if isinstance(noise, CentralDiscreteGaussianNoise):
        return noise.grid_sensitivity / noise.scale  # division by a power of two: exact
    return noise.sensitivity


def _grid_pad(noise: CentralNoise) -> float:
    """p = √d/γ (rounded up) of the discrete noise; 0 for Gaussian noise."""
    if isinstance(noise, CentralDiscreteGaussianNoise):
        return accounting_clip(noise) - noise.sensitivity
    return 0.0


def filter_noise_for_max_budget(epsilon_max: float, *, steps: int, delta: float) -> float:
    """σ at which a record of budget ``epsilon_max`` whose gradient is clipped to C at every one
    of ``steps`` steps spends exactly its budget (its best order): the filter's analogue of
    rPDP-FL's "q = 1 spends ε_max" rule. ``B = 2σ²C²·g`` with ``g = (ε − L/(α*−1))/α*`` and
    ``B = steps·C²``, so ``σ = √(steps / (2g))`` (C cancels)."""
    if not (epsilon_max > 0 and math.isfinite(epsilon_max)):
        raise ValueError(f"epsilon_max must be a finite number > 0, got {epsilon_max}")
    if int(steps) < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    alpha = float(best_filter_orders([epsilon_max], delta=delta)[0])
    g = (epsilon_max - math.log(1 / delta) / (alpha - 1)) / alpha
    return math.sqrt(int(steps) / (2 * g))


@dataclass
class FilterState:
    """The filter's per-record state across steps (kept by the party that owns the records).

    ``budgets`` are the squared-norm budgets B_i (0: never used), ``spent`` Σ_t ‖ḡ_{i,t}‖²,
    ``active`` the records still in, ``exit_step`` the step (1-based, counted over every call of
    :func:`filter_gd_steps`) after which a record left, −1 while it stays, 0 if it never entered.
    """

    budgets: np.ndarray
    spent: np.ndarray
    active: np.ndarray
    exit_step: np.ndarray
    steps_done: int = 0

    @classmethod
    def start(cls, budgets: np.ndarray | Sequence[float]) -> FilterState:
        b = np.asarray(budgets, dtype=np.float64)
        if b.ndim != 1 or np.any(~np.isfinite(b)) or np.any(b < 0):
            raise ValueError("squared_norm_budgets must be finite values >= 0")
        active = b > 0
        return cls(b, np.zeros(b.size), active, np.where(active, -1, 0).astype(np.int64))


def filter_gd_steps(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    state: FilterState,
    *,
    steps: int,
    noise_multiplier: float | None = None,
    max_grad_norm: float | None = None,
    optimizer: torch.optim.Optimizer,
    stream: RandomStream | torch.Generator,
    normalizer: float | None = None,
    loss: LossFn = loss_fn,
    physical_batch_size: int = 512,
    noise: CentralNoise | None = None,
) -> list[int]:
    """``steps`` steps of private GD with the filter, updating ``state`` in place; returns the
    number of active records used at each step (the paper's Fig. 7). ``noise``: the noise
    description (σ, C; or the exact discrete noise, module docstring) instead of
    ``noise_multiplier`` and ``max_grad_norm``."""
    noise = central_step_noise(noise, noise_multiplier, max_grad_norm)
    params = [p for p in model.parameters() if p.requires_grad]
    counts: list[int] = []
    model.train()
    for _ in range(int(steps)):
        st = filter_step(
            model,
            x,
            y,
            budgets=state.budgets,
            spent=state.spent,
            active=state.active,
            stream=stream,
            normalizer=normalizer,
            loss=loss,
            physical_batch_size=physical_batch_size,
            noise=noise,
        )
        optimizer.zero_grad(set_to_none=True)
        for p, g in zip(params, st.grads, strict=True):
            p.grad = g
        optimizer.step()
        state.steps_done += 1
        state.spent += st.sq_norms
        state.exit_step[st.exhausted] = state.steps_done
        state.active &= ~st.exhausted
        counts.append(st.active)
    return counts


@dataclass
class FilterStep:
    """What one :func:`filter_step` did (per-record arrays cover all ``n`` records)."""

    grads: list[Tensor]
    """The privatized gradient ``(Σ_active ḡ_i + noise) / normalizer`` per trainable parameter."""
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
    noise_multiplier: float | None = None,
    max_grad_norm: float | None = None,
    stream: RandomStream | torch.Generator,
    normalizer: float | None = None,
    loss: LossFn = loss_fn,
    physical_batch_size: int = 512,
    grad_sampler: str = "auto",
    noise: CentralNoise | None = None,
) -> FilterStep:
    """One step of private GD with the individual filter (see module docstring).

    ``stream`` supplies the noise; ``normalizer`` defaults to the (public) data-set size ``n``.
    ``noise`` (instead of ``noise_multiplier`` and ``max_grad_norm``): the noise description
    (σ, C) the caller accounts, or the exact discrete noise (``sq_norms`` are then
    (‖ḡ_i‖ + √d/γ)², module docstring).
    """
    noise = central_step_noise(noise, noise_multiplier, max_grad_norm)
    max_grad_norm = noise.sensitivity
    pad = _grid_pad(noise)
    n = x.shape[0]
    normalizer = check_normalizer(float(n) if normalizer is None else normalizer)
    params = [p for p in model.parameters() if p.requires_grad]
    idx = np.flatnonzero(active)
    remaining = np.maximum(budgets[idx] - spent[idx], 0.0)
    bound = np.minimum(max_grad_norm, np.sqrt(remaining) * (1 - _SAFETY) - pad)
    sq = np.zeros(n)
    exhausted = np.zeros(n, dtype=bool)
    if pad > 0.0:  # discrete: a record whose remaining budget cannot pay √d/γ sits out, leaves
        out = bound <= 0.0
        exhausted[idx[out]] = True
        idx, bound = idx[~out], bound[~out]
    loss_sum = 0.0
    sums = [torch.zeros_like(p, dtype=torch.float64) for p in params]
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
        factors = res.factors.double().cpu().numpy()
        # an upper bound on ‖ḡ_i‖ (res.norms bound the norm of what is added); a record whose
        # gradient is not finite added nothing
        scaled = np.where(factors > 0, norms * factors, 0.0)
        sq[idx] = scaled**2 if pad == 0.0 else (scaled + pad) ** 2
        exhausted[idx] = (bound < max_grad_norm) & (norms >= bound)
    grads = noisy_normalised_sum(
        sums,
        noise,
        normalizer,
        as_stream(stream),
        dtypes=[p.dtype for p in params],
    )
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

    def to_dict(self) -> dict[str, Any]:
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
    normalizer: float | None = None,
    stream: RandomStream | torch.Generator | None = None,
    seed: int | None = None,
    train_groups: Sequence[Any] | np.ndarray | None = None,
    test_groups: Sequence[Any] | np.ndarray | None = None,
    eval_every: int = 0,
    physical_batch_size: int = 512,
    loss: LossFn = loss_fn,
) -> FilterResult:
    """Private full-batch GD with Feldman–Zrnic individual filtering (rPDP-FL's *Filter*).

    ``squared_norm_budgets`` are the B_i (see :func:`squared_norm_budgets` to derive them from
    ε_i). ``train_groups`` (default: the budgets) groups the per-group exit statistics.
    ``normalizer`` defaults to the public data-set size ``n`` (see the module docstring);
    ``stream``/``seed`` choose the randomness as in
    :func:`pdpfl.dp.centralized.mechanism_stream` (secure by default).
    """
    x, y = train
    xt, yt = test
    n = x.shape[0]
    validate_model(model)
    B = np.asarray(squared_norm_budgets, dtype=np.float64)
    if B.shape != (n,) or np.any(~np.isfinite(B)) or np.any(B < 0):
        raise ValueError(f"squared_norm_budgets must be {n} finite values >= 0")
    noise = GaussianNoise(noise_multiplier, max_grad_norm)  # the one σ, C check
    if int(steps) < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    normalizer = check_normalizer(float(n) if normalizer is None else normalizer)
    rng, label = mechanism_stream(stream, seed, "filter-training")
    opt = make_optimizer(optimizer, model.parameters(), lr, weight_decay, momentum)
    params = [p for p in model.parameters() if p.requires_grad]
    spent = np.zeros(n)
    active = B > 0
    exit_step = np.where(active, -1, 0).astype(np.int64)
    active_counts: list[int] = []
    history: list[dict[str, float]] = []
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
            stream=rng,
            normalizer=normalizer,
            loss=loss,
            physical_batch_size=physical_batch_size,
            noise=noise,
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
        normalizer=normalizer,
        randomness=label,
        active_counts=active_counts,
        spent=spent,
        exit_step=exit_step,
    )
