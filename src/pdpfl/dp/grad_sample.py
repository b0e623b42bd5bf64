"""Per-sample gradients, their L2 norms and the clipped sum Σ_i clip_C(g_i).

Two interchangeable back-ends compute the same quantity:

``"hooks"`` (fast path)
    One forward pass records the input of every parameterised layer; one ``autograd.grad`` call
    returns the gradient of Σ_i loss_i with respect to each layer's *output* (no weight gradients
    are formed). From (activation, backprop) pairs each layer yields its per-sample gradient
    norms and the clipped weighted sum directly ("book-keeping" clipping, Bu et al. 2023; see
    :mod:`pdpfl.dp.bookkeeping`): Linear layers on 2-D inputs never materialise per-sample
    gradients (‖g_i a_iᵀ‖ = ‖g_i‖‖a_i‖); sequence Linear layers and convolutions (im2col)
    materialise them, or use Gram-matrix "ghost norms" when they would not fit in memory.
    Supported layers: Linear, Conv1d, Conv2d, GroupNorm, LayerNorm, each called once per forward
    and owning its parameters alone (no weight tying).
``"func"`` (generic)
    ``torch.func.vmap(grad(...))`` over single records; works for any per-record model.

``"auto"`` picks ``"hooks"`` when every trainable parameter lives in a supported layer and no
parameter is shared between modules; a model that calls a layer twice per forward falls back
to ``"func"`` at run time. All computations run in chunks of at most ``physical_batch_size``
records (memory bound).

Clipping that holds for any input
---------------------------------
The bound ‖what record i adds‖ ≤ C_i must hold for adversarial records too (issue #10 §3): a
Gram-matrix norm computed naively in float32 cancels catastrophically (a record with inputs of
magnitude 1e3 was measured at 12.6 while its gradient norm was 223: it added 17.7·C). Here

* every per-layer norm comes with a rigorous a-priori upper bound ``up_i`` (Higham's γ_n
  bounds, :mod:`pdpfl.dp.bounds`) that is at least the norm of the exact gradient of the
  recorded values *and* of what the record adds; the norm used for clipping is
  ``N_i = (Σ_layers up_i²)^{1/2}`` rounded up, and the factor ``min(1, C_i / (N_i + 1e-6))``;
* float32 models compute per-sample products in **float32** when the BLAS is IEEE float32, and
  a record is **recomputed in float64** when its float32 bound cannot decide: unless the bound
  inflates its squared norm by at most ``_F32_TOLERANCE`` (5e-4: an over-clipping of at most
  2.5e-4 relative) *and* proves its float32 gradient within ``F32_ACCURACY`` (2.5e-4) of the
  exact one relative to its norm -- e.g. a crafted record whose terms cancel -- or when a
  float32 value overflowed. Ordinary records keep the float32 result;
* the clipped sums are accumulated in **float64** over the records (the engine adds the noise
  in float64 and rounds once), so the rounding of the sum is ~1e-16 relative per record;
* a record whose norm is not finite (overflow, NaN input) adds nothing (its rows are dropped
  from the sums; no second forward pass).

For ordinary records the float32 bound exceeds the computed norm by ~1e-5 relative; a crafted
record adds at most ``C·(1 + 1e-12)`` after its float64 recomputation.

The ``"func"`` back-end computes per-sample gradients in the model's dtype; their norms are
bounded from the stored values and the weighted sum is taken in float64, so what is added is
bounded by C (its per-sample gradients are the function of the record the mechanism applies).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from pdpfl.dp.bookkeeping import Part, Workspace
from pdpfl.dp.bounds import U64, gamma
from pdpfl.dp.chunks import (
    HOOK_LAYERS,
    _Chunk,
    _func_chunk,
    _hook_chunk,
    _Unsupported,
    hooked_modules,
)
from pdpfl.dp.device import math_device
from pdpfl.dp.linear import clip_linear

__all__ = [
    "F32_ACCURACY",
    "ClippedSum",
    "hooked_modules",
    "clipped_grad_sum",
    "hooks_supported",
    "per_sample_gradients",
    "shared_parameters",
]

LossFn = Callable[[Tensor, Tensor], Tensor]

#: Added to the norm before dividing (as Opacus does) so that ‖clip_C(g)‖ < C always holds.
_NORM_EPS = 1e-6
_F64 = torch.float64
_F32 = torch.float32
#: A record keeps its float32 result while the rigorous bound inflates its squared norm by at
#: most this fraction (an over-clipping of ≤ 2.5e-4 relative) ...
_F32_TOLERANCE = 5e-4
#: ... and proves its float32 per-sample gradient within this fraction of the exact one
#: (relative to the record's norm); otherwise it is recomputed in float64.
F32_ACCURACY = 2.5e-4


def shared_parameters(model: nn.Module) -> list[str]:
    """Names of trainable parameters owned by more than one module (weight tying)."""
    owners: dict[int, list[str]] = {}
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if p.requires_grad:
                owners.setdefault(id(p), []).append(f"{mname}.{pname}" if mname else pname)
    return sorted(names[0] for names in owners.values() if len(names) > 1)


def hooks_supported(model: nn.Module) -> bool:
    """Whether the fast ``"hooks"`` back-end covers every trainable parameter of ``model``.

    False when some trainable parameter lives outside Linear/Conv1d/Conv2d/GroupNorm/LayerNorm,
    or is shared by several modules (the per-module norms would not add up to the norm of the
    summed gradient).
    """
    return _hooks_problem(model) is None


def _hooks_problem(model: nn.Module) -> str | None:
    for name, module in model.named_modules():
        direct = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        if not direct:
            continue
        if type(module) not in HOOK_LAYERS or not set(direct) <= {"weight", "bias"}:
            return f"module {name or '<root>'!r} ({type(module).__name__}) is not supported"
        if isinstance(module, nn.Conv1d | nn.Conv2d):
            if module.padding_mode != "zeros" or module.padding == "same":
                return f"module {name!r}: only zero padding given as numbers is supported"
    shared = shared_parameters(model)
    if shared:
        return f"parameter {shared[0]!r} is shared by several modules (weight tying)"
    return None


def _chunk(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    loss: LossFn,
    method: str,
    materialise: bool,
    modules: list[nn.Module] | None = None,
    ws: Workspace | None = None,
) -> _Chunk:
    if method == "hooks":
        return _hook_chunk(model, x, y, loss, materialise, modules, ws)
    if method == "func":
        return _func_chunk(model, x, y, loss)
    raise ValueError(f"method must be 'auto', 'hooks' or 'func', got {method!r}")


def resolve_method(model: nn.Module, method: str) -> str:
    """``"auto"`` → ``"hooks"`` if :func:`hooks_supported` else ``"func"``; validates names."""
    if method == "auto":
        return "hooks" if hooks_supported(model) else "func"
    if method not in ("hooks", "func"):
        raise ValueError(f"grad_sampler must be 'auto', 'hooks' or 'func', got {method!r}")
    if method == "hooks":
        problem = _hooks_problem(model)
        if problem is not None:
            raise ValueError(
                f"grad_sampler='hooks': {problem}; the hooks back-end supports Linear, Conv1d, "
                "Conv2d, GroupNorm and LayerNorm parameters owned by one module each; use "
                "'func' or 'auto'"
            )
    return method


def per_sample_gradients(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    loss: LossFn,
    method: str = "auto",
    physical_batch_size: int = 512,
) -> dict[str, Tensor]:
    """Per-sample gradients ``{param name: (B, *param.shape)}`` of ``loss`` (trainable params).

    Returned in each parameter's dtype (the hooks back-end forms them in float32 for float32
    models, in float64 otherwise).
    """
    method = resolve_method(model, method)
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    names = {id(p): n for n, p in named.items()}
    chunks: dict[str, list[Tensor]] = {n: [] for n in named}
    for start in range(0, x.shape[0], physical_batch_size):
        xs, ys = x[start : start + physical_batch_size], y[start : start + physical_batch_size]
        try:
            parts = _chunk(model, xs, ys, loss, method, materialise=True).parts
        except _Unsupported:
            parts = _chunk(model, xs, ys, loss, "func", materialise=True).parts
        seen = set()
        for part in parts:
            g = part.per_sample()
            chunks[names[id(part.param)]].append(g.to(part.param.dtype))
            seen.add(id(part.param))
        for n, p in named.items():  # parameters the loss does not depend on
            if id(p) not in seen:
                chunks[n].append(torch.zeros(xs.shape[0], *p.shape, device=p.device, dtype=p.dtype))
    return {n: torch.cat(v) for n, v in chunks.items()}


@dataclass
class ClippedSum:
    """Σ_i clip_C(g_i) over a batch, per trainable parameter, plus diagnostics."""

    sums: list[Tensor]
    """One float64 tensor per trainable parameter, in ``model.parameters()`` order."""
    loss_sum: float
    norms: Tensor
    """Per-sample gradient norms used for clipping (B,), float64: an upper bound on the norm of
    each record's gradient and of what it adds (within ~1e-5 relative for ordinary records);
    ``inf`` for a record whose gradient is not finite."""
    factors: Tensor
    """Clipping factors c_i = min(1, C_i / (‖g_i‖ + 1e-6)) (B,), float64 (0: record dropped)."""
    method: str = "func"
    """The back-end that computed the last chunk ("func" after a fallback from "hooks")."""
    flat: Tensor | None = field(default=None, repr=False)
    """The float64 vector of all trainable parameters (in order) that ``sums`` are views of."""


def clipped_grad_sum(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    loss: LossFn,
    max_grad_norm: float | Tensor,
    method: str = "auto",
    physical_batch_size: int = 512,
) -> ClippedSum:
    """Σ_i g_i · min(1, C_i / (‖g_i‖ + 1e-6)) with ‖·‖ the L2 norm over all trainable parameters.

    ``max_grad_norm`` is one bound C for every record or a tensor of per-record bounds ``(B,)``
    (used by the individual filter). What each record adds has norm ``< C_i`` for every input,
    adversarial ones included (see the module docstring); the sums are float64.
    """
    return _clipped_grad_sum(
        model, x, y, loss, max_grad_norm, resolve_method(model, method), physical_batch_size
    )


def _param_views(params: list[nn.Parameter], flat: Tensor) -> list[Tensor]:
    pieces = torch.split(flat, [p.numel() for p in params])
    return [t.view(p.shape) for t, p in zip(pieces, params, strict=True)]


def _clipped_grad_sum(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    loss: LossFn,
    max_grad_norm: float | Tensor,
    method: str,
    physical_batch_size: int,
    *,
    out: Tensor | None = None,
    modules: list[nn.Module] | None = None,
    ws: Workspace | None = None,
    params: list[nn.Parameter] | None = None,
    index: dict[int, int] | None = None,
    sums: list[Tensor] | None = None,
) -> ClippedSum:
    """:func:`clipped_grad_sum` with an already resolved ``method`` ("hooks" or "func").

    ``out``: a zeroed float64 vector of all trainable parameters (in order) that receives the
    sums (the returned ``sums`` are views of it); ``modules``: :func:`hooked_modules` of the
    model, precomputed; ``ws``: buffers reused between calls; ``params``: the trainable
    parameters, precomputed, ``index`` their positions by ``id`` and ``sums`` the views of
    ``out`` per parameter.
    """
    per_record = max_grad_norm if isinstance(max_grad_norm, Tensor) else None
    if per_record is not None and per_record.shape != (x.shape[0],):
        raise ValueError(f"max_grad_norm must be a float or have shape ({x.shape[0]},)")
    if params is None:
        params = [p for p in model.parameters() if p.requires_grad]
    device = math_device(params[0].device if params else x.device)
    if out is None:
        out = torch.zeros(sum(p.numel() for p in params), dtype=_F64, device=device)
    if sums is None:
        sums = _param_views(params, out)
    if index is None:
        index = {id(p): k for k, p in enumerate(params)}
    loss_sum = 0.0
    norms: list[Tensor] = []
    factors: list[Tensor] = []
    whole = x.shape[0] <= physical_batch_size
    for start in range(0, x.shape[0], physical_batch_size):
        if whole:  # one chunk: no slicing
            xs, ys = x, y
        else:
            xs = x[start : start + physical_batch_size]
            ys = y[start : start + physical_batch_size]
        bound: Tensor | float
        if per_record is not None:
            bound = per_record[start : start + physical_batch_size].to(device, _F64)
        else:
            bound = float(max_grad_norm)
        try:
            chunk = _chunk(model, xs, ys, loss, method, False, modules, ws)
        except _Unsupported:
            method = "func"
            chunk = _chunk(model, xs, ys, loss, method, False)
        norm, c, chunk_loss = _clip_chunk(chunk, bound, sums, index, xs.shape[0], device)
        loss_sum += chunk_loss
        norms.append(norm)
        factors.append(c)
    return ClippedSum(
        sums=sums,
        loss_sum=loss_sum,
        norms=_cat(norms),
        factors=_cat(factors),
        method=method,
        flat=out,
    )


def _cat(ts: list[Tensor]) -> Tensor:
    if len(ts) == 1:
        return ts[0]
    return torch.cat(ts) if ts else torch.zeros(0, dtype=_F64)


def _total_norm(
    parts: list[Part], b: int, device: torch.device, estimate: bool = True
) -> tuple[Tensor | None, Tensor]:
    """(Σ est² or None, N) with N ≥ (Σ up²)^{1/2}: float64 squares, sum and square root
    rounded up."""
    if not parts:
        zero = torch.zeros(b, dtype=_F64, device=device)
        return zero, zero
    n = len(parts)
    if not estimate:
        up = torch.stack([p.up for p in parts]).square_().sum(0)
        return None, up.sqrt_().mul_(1.0 + gamma(n + 4, U64))
    both = torch.stack([p.est for p in parts] + [p.up for p in parts]).square_()
    sq = both.view(2, n, b).sum(1)
    return sq[0], sq[1].sqrt_().mul_(1.0 + gamma(n + 4, U64))


def _undecided(parts: list[Part], est2: Tensor, norm: Tensor) -> Tensor:
    """Records whose float32 bound cannot decide (mask): not finite, an over-clipping above
    ``_F32_TOLERANCE``, or a possible distance to the exact gradient above ``F32_ACCURACY``."""
    err2 = torch.zeros_like(est2)
    for part in parts:
        if part.err is not None:
            err2 = err2 + part.err.square()
    tight = (norm.square() - est2 <= _F32_TOLERANCE * est2) & (err2 <= F32_ACCURACY**2 * est2)
    return ~(tight & torch.isfinite(norm))


def _clip_chunk(
    chunk: _Chunk,
    bound: Tensor | float,
    sums: list[Tensor],
    index: dict[int, int],
    b: int = 0,
    device: torch.device | None = None,
) -> tuple[Tensor, Tensor, float]:
    """Add Σ_i c_i g_i of one chunk to ``sums``; returns (norms, factors, Σ loss over kept).
    ``bound``: the records' bounds ``(b,)`` (float64, on the math device), or one C for the
    ``b`` records of the chunk (then ``b`` and ``device`` are required).

    Records whose float32 bound is ambiguous are recomputed in float64 (module docstring); a
    record whose norm is not finite adds nothing (c_i = 0, its rows dropped).
    """
    if chunk.linear is not None:
        norm, c, dropped = clip_linear(chunk.linear, bound, sums, index)
        return norm, c, chunk.losses(None if dropped is None else ~dropped)
    if not isinstance(bound, Tensor):
        bound = torch.full((b,), bound, dtype=_F64, device=device)
    b, device = bound.shape[0], bound.device
    check = chunk.redo is not None and any(p.fast for p in chunk.parts)
    est2, norm = _total_norm(chunk.parts, b, device, estimate=check)
    redo = None
    extra: list[Part] = []
    if check and chunk.redo is not None and est2 is not None:
        ambiguous = _undecided(chunk.parts, est2, norm)
        if bool(ambiguous.any()):
            redo = torch.nonzero(ambiguous).flatten()
            extra = chunk.redo(redo)
            norm = norm.clone()
            norm[redo] = _total_norm(extra, redo.numel(), device)[1]
    bad = ~torch.isfinite(norm)
    any_bad = bool(bad.any())
    c = torch.div(bound, norm + _NORM_EPS).mul_(1.0 - 4 * U64).clamp_(max=1.0)
    drop = redo
    if any_bad:
        c = torch.where(bad, torch.zeros_like(c), c)
        bad_idx = torch.nonzero(bad).flatten()
        drop = bad_idx if drop is None else torch.unique(torch.cat([drop, bad_idx]))
    for part in chunk.parts:
        part.accumulate(sums[index[id(part.param)]], c, drop)
    if extra:
        assert redo is not None
        c_redo = c[redo]
        drop_redo = torch.nonzero(bad[redo]).flatten() if any_bad else None
        for part in extra:
            part.accumulate(sums[index[id(part.param)]], c_redo, drop_redo)
    if any_bad:
        norm = torch.where(bad, torch.full_like(norm, float("inf")), norm)
        return norm, c, chunk.losses(~bad)
    return norm, c, chunk.losses(None)
