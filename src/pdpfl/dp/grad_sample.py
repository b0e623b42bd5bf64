"""Per-sample gradients, their L2 norms and the clipped sum Σ_i clip_C(g_i).

Two interchangeable back-ends compute the same quantity:

``"hooks"`` (fast path)
    One forward pass records the input of every parameterised layer; one ``autograd.grad`` call
    returns the gradient of Σ_i loss_i with respect to each layer's *output* (no weight gradients
    are formed). From (activation, backprop) pairs each layer yields its per-sample gradient
    norms and the clipped weighted sum directly ("book-keeping" clipping, Bu et al. 2023):
    Linear layers on 2-D inputs never materialise per-sample gradients
    (‖g_i a_iᵀ‖ = ‖g_i‖‖a_i‖); convolutions use im2col and either materialise the per-sample
    weight gradients or use Gram-matrix "ghost norms", whichever is cheaper. Supported layers:
    Linear, Conv1d, Conv2d, GroupNorm, LayerNorm, each called once per forward.
``"func"`` (generic)
    ``torch.func.vmap(grad(...))`` over single records; works for any per-record model.

``"auto"`` picks ``"hooks"`` when every trainable parameter lives in a supported layer.
All computations run in chunks of at most ``physical_batch_size`` records (memory bound).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

__all__ = [
    "ClippedSum",
    "clipped_grad_sum",
    "hooks_supported",
    "per_sample_gradients",
]

LossFn = Callable[[Tensor, Tensor], Tensor]

_HOOK_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.GroupNorm, nn.LayerNorm)
#: Added to the norm before dividing (as Opacus does) so that ‖clip_C(g)‖ ≤ C always holds.
_NORM_EPS = 1e-6


def hooks_supported(model: nn.Module) -> bool:
    """Whether the fast ``"hooks"`` back-end covers every trainable parameter of ``model``."""
    for module in model.modules():
        direct = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        if not direct:
            continue
        if type(module) not in _HOOK_LAYERS or not set(direct) <= {"weight", "bias"}:
            return False
        if isinstance(module, nn.Conv1d | nn.Conv2d):
            if module.padding_mode != "zeros" or module.padding == "same":
                return False
    return True


@dataclass
class _Part:
    """One parameter's contribution in one chunk: per-sample norms² and the weighted sum."""

    param: nn.Parameter
    norm2: Tensor  # (B,)
    grads: Tensor | None = None  # (B, *param.shape) when materialised
    weighted: Callable[[Tensor], Tensor] | None = None  # c ↦ Σ_b c_b g_b

    def weighted_sum(self, c: Tensor) -> Tensor:
        if self.grads is not None:
            return torch.tensordot(c, self.grads, dims=1)
        assert self.weighted is not None
        return self.weighted(c).reshape(self.param.shape)


def _materialised(param: nn.Parameter, grads: Tensor) -> _Part:
    grads = grads.reshape(grads.shape[0], *param.shape)
    return _Part(param, grads.flatten(1).pow(2).sum(1), grads=grads)


def _linear_parts(m: nn.Linear, a: Tensor, g: Tensor, materialise: bool) -> list[_Part]:
    parts: list[_Part] = []
    B = a.shape[0]
    a3 = a.reshape(B, -1, a.shape[-1])
    g3 = g.reshape(B, -1, g.shape[-1])
    T, din, dout = a3.shape[1], a3.shape[2], g3.shape[2]
    if m.weight.requires_grad:
        if materialise or (T > 1 and T * T * (din + dout) >= din * dout):
            parts.append(_materialised(m.weight, torch.einsum("bto,bti->boi", g3, a3)))
        elif T == 1:
            a2, g2 = a3[:, 0], g3[:, 0]
            norm2 = a2.pow(2).sum(1) * g2.pow(2).sum(1)
            parts.append(_Part(m.weight, norm2, weighted=lambda c: (g2 * c[:, None]).T @ a2))
        else:
            norm2 = (torch.bmm(a3, a3.transpose(1, 2)) * torch.bmm(g3, g3.transpose(1, 2))).sum(
                (1, 2)
            )
            parts.append(
                _Part(
                    m.weight,
                    norm2,
                    weighted=lambda c: (
                        (g3 * c[:, None, None]).reshape(-1, dout).T @ a3.reshape(-1, din)
                    ),
                )
            )
    if m.bias is not None and m.bias.requires_grad:
        parts.append(_materialised(m.bias, g3.sum(1)))
    return parts


def _unfold2d(
    a: Tensor,
    kernel: tuple[int, ...],
    dilation: tuple[int, ...],
    padding: tuple[int, ...],
    stride: tuple[int, ...],
) -> Tensor:
    """``F.unfold`` (im2col, same layout) via strided views: one fast copy instead of CPU im2col."""
    B, C = a.shape[:2]
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel, dilation, padding, stride
    if ph or pw:
        a = F.pad(a, (pw, pw, ph, ph))
    v = a.unfold(2, (kh - 1) * dh + 1, sh).unfold(3, (kw - 1) * dw + 1, sw)
    if dh > 1 or dw > 1:
        v = v[..., ::dh, ::dw]
    L = v.shape[2] * v.shape[3]
    return v.permute(0, 1, 4, 5, 2, 3).reshape(B, C * kh * kw, L)


def _conv_parts(m: nn.Conv1d | nn.Conv2d, a: Tensor, g: Tensor, materialise: bool) -> list[_Part]:
    parts: list[_Part] = []
    B = a.shape[0]
    if isinstance(m, nn.Conv1d):
        a, g = a.unsqueeze(-2), g.unsqueeze(-2)
        kernel, dilation, stride = (1, *m.kernel_size), (1, *m.dilation), (1, *m.stride)
        padding = (0, 0) if m.padding == "valid" else (0, *m.padding)
    else:
        kernel, dilation, stride = m.kernel_size, m.dilation, m.stride
        padding = (0, 0) if m.padding == "valid" else m.padding
    g = g.reshape(B, g.shape[1], -1)  # (B, Cout, L)
    if m.weight.requires_grad:
        u = _unfold2d(a, kernel, dilation, padding, stride)  # (B, K·G, L)
        G = m.groups
        L = u.shape[-1]
        cout = g.shape[1]
        K = u.shape[1] // G
        if G == 1 and not materialise and L * (K + cout) < cout * K:
            norm2 = (torch.bmm(u.transpose(1, 2), u) * torch.bmm(g.transpose(1, 2), g)).sum((1, 2))
            parts.append(
                _Part(
                    m.weight,
                    norm2,
                    weighted=lambda c: torch.einsum("bol,bkl->ok", g * c[:, None, None], u),
                )
            )
        else:
            gs = torch.einsum(
                "bgol,bgkl->bgok", g.reshape(B, G, cout // G, L), u.reshape(B, G, K, L)
            )
            parts.append(_materialised(m.weight, gs))
    if m.bias is not None and m.bias.requires_grad:
        parts.append(_materialised(m.bias, g.sum(2)))
    return parts


def _norm_parts(m: nn.GroupNorm | nn.LayerNorm, a: Tensor, g: Tensor) -> list[_Part]:
    B = a.shape[0]
    if isinstance(m, nn.GroupNorm):
        xh = F.group_norm(a, m.num_groups, eps=m.eps)
        gw = (g * xh).reshape(B, a.shape[1], -1).sum(2)
        gb = g.reshape(B, a.shape[1], -1).sum(2)
    else:
        xh = F.layer_norm(a, m.normalized_shape, eps=m.eps)
        k = len(m.normalized_shape)
        dims = tuple(range(1, a.ndim - k))
        gw = (g * xh).sum(dims) if dims else g * xh
        gb = g.sum(dims) if dims else g
    parts = []
    if m.weight is not None and m.weight.requires_grad:
        parts.append(_materialised(m.weight, gw))
    if m.bias is not None and m.bias.requires_grad:
        parts.append(_materialised(m.bias, gb))
    return parts


class _Recorder:
    """Forward hooks recording (module, input, output) of the supported layers."""

    def __init__(self, model: nn.Module):
        self.records: list[tuple[nn.Module, Tensor, Tensor]] = []
        self.handles = [
            m.register_forward_hook(self._hook)
            for m in model.modules()
            if isinstance(m, _HOOK_LAYERS)
            and any(p.requires_grad for p in m.parameters(recurse=False))
        ]

    def _hook(self, module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> Tensor:
        self.records.append((module, inputs[0].detach(), output))
        # Later in-place ops (ReLU(inplace=True), `out += x`) must not touch the recorded output.
        return output.clone()

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _hook_parts(
    model: nn.Module, x: Tensor, y: Tensor, loss: LossFn, materialise: bool
) -> tuple[list[_Part], float]:
    recorder = _Recorder(model)
    try:
        out = model(x)
    finally:
        recorder.close()
    records = recorder.records
    if len({id(m) for m, _, _ in records}) != len(records):
        raise _Unsupported("a parameterised layer is called more than once per forward")
    if out.shape[0] != x.shape[0]:
        raise _Unsupported("model output does not have one row per record")
    B = x.shape[0]
    total = loss(out, y) * B  # the loss is a mean over records: this is Σ_i loss_i
    backprops = torch.autograd.grad(total, [o for _, _, o in records], allow_unused=True)
    parts: list[_Part] = []
    for (module, a, o), g in zip(records, backprops, strict=True):
        g = torch.zeros_like(o) if g is None else g.detach()
        if isinstance(module, nn.Linear):
            parts += _linear_parts(module, a, g, materialise)
        elif isinstance(module, nn.Conv1d | nn.Conv2d):
            parts += _conv_parts(module, a, g, materialise)
        else:
            parts += _norm_parts(module, a, g)
    return parts, float(total.detach())


class _Unsupported(Exception):
    pass


def _func_parts(model: nn.Module, x: Tensor, y: Tensor, loss: LossFn) -> tuple[list[_Part], float]:
    named = dict(model.named_parameters())
    train = {k: p.detach() for k, p in named.items() if p.requires_grad}
    frozen = {k: p.detach() for k, p in named.items() if not p.requires_grad}
    buffers = dict(model.named_buffers())

    def one(params: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        out = functional_call(model, ({**params, **frozen}, buffers), (xi.unsqueeze(0),))
        return loss(out, yi.unsqueeze(0))

    grads, losses = vmap(grad_and_value(one), in_dims=(None, 0, 0), randomness="different")(
        train, x, y
    )
    parts = [_materialised(named[k], grads[k]) for k in train]
    return parts, float(losses.sum())


def _parts(
    model: nn.Module, x: Tensor, y: Tensor, loss: LossFn, method: str, materialise: bool
) -> tuple[list[_Part], float]:
    if method == "hooks":
        return _hook_parts(model, x, y, loss, materialise)
    if method == "func":
        return _func_parts(model, x, y, loss)
    raise ValueError(f"method must be 'auto', 'hooks' or 'func', got {method!r}")


def resolve_method(model: nn.Module, method: str) -> str:
    """``"auto"`` → ``"hooks"`` if :func:`hooks_supported` else ``"func"``; validates names."""
    if method == "auto":
        return "hooks" if hooks_supported(model) else "func"
    if method not in ("hooks", "func"):
        raise ValueError(f"grad_sampler must be 'auto', 'hooks' or 'func', got {method!r}")
    if method == "hooks" and not hooks_supported(model):
        raise ValueError(
            "grad_sampler='hooks' supports only Linear, Conv1d, Conv2d, GroupNorm and LayerNorm "
            "parameters; use 'func' or 'auto'"
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
    """Per-sample gradients ``{param name: (B, *param.shape)}`` of ``loss`` (trainable params)."""
    method = resolve_method(model, method)
    names = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
    chunks: dict[str, list[Tensor]] = {n: [] for n in names.values()}
    for start in range(0, x.shape[0], physical_batch_size):
        xs, ys = x[start : start + physical_batch_size], y[start : start + physical_batch_size]
        parts, _ = _parts(model, xs, ys, loss, method, materialise=True)
        seen = set()
        for part in parts:
            assert part.grads is not None
            chunks[names[id(part.param)]].append(part.grads)
            seen.add(id(part.param))
        for pid, n in names.items():  # parameters the loss does not depend on
            if pid not in seen:
                p = dict(model.named_parameters())[n]
                chunks[n].append(torch.zeros(xs.shape[0], *p.shape, device=p.device))
    return {n: torch.cat(v) for n, v in chunks.items()}


@dataclass
class ClippedSum:
    """Σ_i clip_C(g_i) over a batch, per trainable parameter, plus diagnostics."""

    sums: list[Tensor]
    """One tensor per trainable parameter, in ``model.parameters()`` order."""
    loss_sum: float
    norms: Tensor
    """Unclipped per-sample gradient norms (B,)."""
    factors: Tensor
    """Clipping factors c_i = min(1, C_i / (‖g_i‖ + 1e-6)) (B,)."""
    method: str = "func"
    """The back-end that computed the last chunk ("func" after a fallback from "hooks")."""


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
    (used by the individual filter). ``‖clipped g_i‖ < C_i`` always holds.
    """
    return _clipped_grad_sum(
        model, x, y, loss, max_grad_norm, resolve_method(model, method), physical_batch_size
    )


def _clipped_grad_sum(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    loss: LossFn,
    max_grad_norm: float | Tensor,
    method: str,
    physical_batch_size: int,
) -> ClippedSum:
    """:func:`clipped_grad_sum` with an already resolved ``method`` ("hooks" or "func")."""
    per_record = isinstance(max_grad_norm, Tensor)
    if per_record and max_grad_norm.shape != (x.shape[0],):
        raise ValueError(f"max_grad_norm must be a float or have shape ({x.shape[0]},)")
    params = [p for p in model.parameters() if p.requires_grad]
    sums = [torch.zeros_like(p) for p in params]
    index = {id(p): k for k, p in enumerate(params)}
    loss_sum = 0.0
    norms: list[Tensor] = []
    factors: list[Tensor] = []
    for start in range(0, x.shape[0], physical_batch_size):
        xs, ys = x[start : start + physical_batch_size], y[start : start + physical_batch_size]
        try:
            parts, chunk_loss = _parts(model, xs, ys, loss, method, materialise=False)
        except _Unsupported:
            method = "func"
            parts, chunk_loss = _parts(model, xs, ys, loss, method, materialise=False)
        norm2 = torch.zeros(xs.shape[0], device=xs.device if not parts else parts[0].norm2.device)
        for part in parts:
            norm2 = norm2 + part.norm2
        norm = norm2.sqrt()
        bound = (
            max_grad_norm[start : start + physical_batch_size].to(norm.device, norm.dtype)
            if per_record
            else max_grad_norm
        )
        c = (bound / (norm + _NORM_EPS)).clamp(max=1.0)
        for part in parts:
            k = index[id(part.param)]
            sums[k] += part.weighted_sum(c)
        loss_sum += chunk_loss
        norms.append(norm.detach())
        factors.append(c.detach())
    return ClippedSum(
        sums=sums,
        loss_sum=loss_sum,
        norms=torch.cat(norms) if norms else torch.zeros(0),
        factors=torch.cat(factors) if factors else torch.zeros(0),
        method=method,
    )
