"""Per-sample gradients, their L2 norms and the clipped sum Σ_i clip_C(g_i).

Two interchangeable back-ends compute the same quantity:

``"hooks"`` (fast path)
    One forward pass records the input of every parameterised layer; one ``autograd.grad`` call
    returns the gradient of Σ_i loss_i with respect to each layer's *output* (no weight gradients
    are formed). From (activation, backprop) pairs each layer yields its per-sample gradient
    norms and the clipped weighted sum directly ("book-keeping" clipping, Bu et al. 2023):
    Linear layers on 2-D inputs never materialise per-sample gradients
    (‖g_i a_iᵀ‖ = ‖g_i‖‖a_i‖); sequence Linear layers and convolutions (im2col) materialise the
    per-sample weight gradients (fewest flops) unless a chunk's would not fit in
    ``_MATERIALISE_LIMIT`` float64 elements, in which case they use Gram-matrix "ghost norms"
    ‖Σ_t g_t a_tᵀ‖² = Σ_{t,s} (a_t·a_s)(g_t·g_s) when those are smaller. Supported layers:
    Linear, Conv1d, Conv2d, GroupNorm, LayerNorm, each called once per forward and owning its
    parameters alone (no weight tying).
``"func"`` (generic)
    ``torch.func.vmap(grad(...))`` over single records; works for any per-record model.

``"auto"`` picks ``"hooks"`` when every trainable parameter lives in a supported layer and no
parameter is shared between modules; a model that calls a layer twice per forward falls back
to ``"func"`` at run time. All computations run in chunks of at most ``physical_batch_size``
records (memory bound).

Clipping that holds for any input
---------------------------------
The bound ``‖what record i adds‖ ≤ C_i`` must hold for adversarial records too (issue #10 §3):
a Gram-matrix norm computed in float32 cancels catastrophically (a record with inputs of
magnitude 1e3 was measured at 12.6 while its gradient norm was 223: it added 17.7·C). Here

* the forward and the backward to layer outputs run in the model's dtype; every per-layer
  computation *from* the recorded activations ``a`` and backprops ``g`` -- Gram matrices,
  materialised per-sample gradients, norm-layer statistics and the clipped weighted sums --
  runs in **float64** (a product of two float32 numbers is exact in float64);
* each per-layer squared norm carries a rigorous a-priori error bound (Higham, *Accuracy and
  Stability of Numerical Algorithms*, §3.1: a float64 dot product of length n has absolute error
  at most γ_n Σ|x_k y_k|, γ_n = n·u/(1 − n·u), u = 2⁻⁵³). For a gradient
  ``G = Σ_t g_t a_tᵀ`` with ``M = Σ_t ‖g_t‖‖a_t‖ ≤ ‖g‖_F‖a‖_F`` the Gram estimate is within
  ``γ·(d_in + d_out + T²)·M²`` of ‖G‖², a materialised ``Ĝ`` within ``γ_T·M`` of ``G``, and
  the weighted sum adds at most ``γ_{BT}·c·M`` for record *i*. The norm used for clipping is
  ``sqrt(estimate + 4u·κ·M²)`` with κ the sum of those lengths: never below the norm of the
  exact gradient of the recorded values *nor* of what is actually added. For ordinary records
  the inflation is ~1e-11 relative or less; a crafted record adds at most ``C·(1 + 1e-12)``;
* per-sample gradients that sum few terms (at most ``_F32_MAX_LENGTH`` positions, float32
  model) are first formed with a float32 ``bmm``; their float32 error bound
  (``4·u32·(T + 4)·M²``) is kept only for records where it is below ``_F32_TOLERANCE`` of the
  squared norm (over-clipping ordinary records by at most 2.5e-4 relative), and any other
  record -- a crafted one whose terms cancel -- is recomputed in float64;
* a record whose norm is not finite (overflow, NaN input) adds nothing;
* the sums are returned in float64 (the engine adds the noise in float64 and rounds once).

The ``"func"`` back-end computes per-sample gradients in the model's dtype; their norms and the
weighted sum are taken in float64, so what is added is bounded by C (its per-sample gradients
are the function of the record that the mechanism applies).
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
    "shared_parameters",
]

LossFn = Callable[[Tensor, Tensor], Tensor]

_HOOK_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.GroupNorm, nn.LayerNorm)
#: Added to the norm before dividing (as Opacus does) so that ‖clip_C(g)‖ < C always holds.
_NORM_EPS = 1e-6
#: float64 unit roundoff.
_U = 2.0**-53
_F64 = torch.float64
#: float32 unit roundoff.
_U32 = 2.0**-24
#: Float32 fast path for materialised per-sample gradients summed over at most this many
#: positions: their float32 error bound is then small for ordinary records.
_F32_MAX_LENGTH = 32
#: A record keeps its float32 per-sample gradient only while the rigorous float32 error term
#: inflates its squared norm by at most this fraction (an over-clipping of ≤ 2.5e-4 relative);
#: otherwise (e.g. a crafted record whose terms cancel) it is recomputed in float64.
_F32_TOLERANCE = 5e-4
#: Per-sample gradients of a layer are materialised (fewer flops than the Gram path, whose
#: weighted sum alone costs as much) unless a chunk's would exceed this many float64 elements.
_MATERIALISE_LIMIT = 2**24


def _use_gram(batch: int, positions: int, k_in: int, k_out: int, materialise: bool) -> bool:
    """Gram ("ghost norm") path for a per-sample gradient Σ_{l<positions} g_l u_lᵀ (k_out×k_in)?"""
    if materialise or positions == 1:
        return False
    smaller = 2 * positions * positions < k_in * k_out  # two L×L Gram matrices per record
    return smaller and batch * k_in * k_out > _MATERIALISE_LIMIT


def _frobenius(t: Tensor) -> Tensor:
    """Per-sample Frobenius norm (leading axis) in float64, slightly rounded up."""
    sq = torch.linalg.vector_norm(t.reshape(t.shape[0], -1), dim=1, dtype=_F64).square()
    return (sq * (1.0 + 4 * _U * (t[0].numel() + 4))).sqrt()


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
        if type(module) not in _HOOK_LAYERS or not set(direct) <= {"weight", "bias"}:
            return f"module {name or '<root>'!r} ({type(module).__name__}) is not supported"
        if isinstance(module, nn.Conv1d | nn.Conv2d):
            if module.padding_mode != "zeros" or module.padding == "same":
                return f"module {name!r}: only zero padding given as numbers is supported"
    shared = shared_parameters(model)
    if shared:
        return f"parameter {shared[0]!r} is shared by several modules (weight tying)"
    return None


@dataclass
class _Part:
    """One parameter's per-sample contribution in one chunk (all float64).

    ``norm2`` estimates the per-sample squared norms; ``err2`` bounds their error so that
    ``norm2 + err2`` is at least the squared norm of the exact gradient of the recorded values
    and of what :meth:`weighted_sum` adds for that record (see the module docstring).
    """

    param: nn.Parameter
    norm2: Tensor  # (B,)
    err2: Tensor  # (B,)
    grads: Tensor | None = None  # (B, *param.shape) when materialised
    weighted: Callable[[Tensor], Tensor] | None = None  # c ↦ Σ_b c_b g_b

    def weighted_sum(self, c: Tensor) -> Tensor:
        if self.grads is not None:
            return torch.tensordot(c, self.grads, dims=1)
        assert self.weighted is not None
        return self.weighted(c).reshape(self.param.shape)


def _materialised(
    param: nn.Parameter,
    grads: Tensor,
    m2: Tensor | None = None,
    length: int = 0,
    *,
    extra: Tensor | None = None,
    norm2: Tensor | None = None,
) -> _Part:
    """A part from per-sample gradients ``grads`` (converted to float64).

    ``m2`` = M² with ``‖grads_b − exact_b‖ ≤ γ_length · M_b`` for float64 sums of ``length``
    terms; ``extra`` is an already computed per-record error term (float32 fast path). With
    neither, ``grads`` *are* what the mechanism applies (torch.func gradients) and only their own
    norm matters.
    """
    grads = grads.to(_F64).reshape(grads.shape[0], *param.shape)
    b = grads.shape[0]
    if norm2 is None:
        norm2 = torch.linalg.vector_norm(grads.reshape(b, -1), dim=1).square()
    # sum of squares (numel terms) and the tensordot over the batch (b terms)
    err2 = (4 * _U * (param.numel() + b + 4)) * norm2
    if m2 is not None:
        err2 = err2 + (4 * _U * (length + 4)) * m2
    if extra is not None:
        err2 = err2 + extra
    return _Part(param, norm2, err2, grads=grads)


def _float32_first(
    grads32: Tensor, m2: Tensor, length: int, exact: Callable[[Tensor], Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample gradients computed in float32 (sums of ``length`` terms), made rigorous.

    The float32 result differs from the exact one by at most γ32_length·M per record, which adds
    ``4·u32·(length + 4)·M²`` to the error of the squared norm. Records for which that term
    exceeds ``_F32_TOLERANCE`` of the squared norm (cancellation, non-finite values) are
    recomputed in float64 by ``exact(indices)``. Returns float64 gradients, their squared norms
    and the error terms.
    """
    grads = grads32.to(_F64)
    b = grads.shape[0]
    err2 = (4 * _U32 * (length + 4)) * m2
    norm2 = torch.linalg.vector_norm(grads.reshape(b, -1), dim=1).square()
    redo = torch.nonzero(~(err2 <= _F32_TOLERANCE * norm2)).flatten()
    if redo.numel():
        grads[redo] = exact(redo).to(_F64).reshape(redo.numel(), *grads.shape[1:])
        err2[redo] = (4 * _U * (length + 4)) * m2[redo]
        norm2[redo] = torch.linalg.vector_norm(grads[redo].reshape(redo.numel(), -1), dim=1) ** 2
    return grads, norm2, err2


def _linear_parts(m: nn.Linear, a: Tensor, g: Tensor, materialise: bool) -> list[_Part]:
    parts: list[_Part] = []
    B = a.shape[0]
    a3 = a.reshape(B, -1, a.shape[-1]).to(_F64)
    g3 = g.reshape(B, -1, g.shape[-1]).to(_F64)
    T, din, dout = a3.shape[1], a3.shape[2], g3.shape[2]
    # M = Σ_t ‖a_t‖‖g_t‖ ≤ ‖a‖_F‖g‖_F (Cauchy–Schwarz): the bound below uses the latter
    g_f = _frobenius(g3)
    if m.weight.requires_grad:
        m_w = _frobenius(a3) * g_f
        if T > 1 and not _use_gram(B, T, din, dout, materialise):
            if a.dtype == g.dtype == torch.float32 and T <= _F32_MAX_LENGTH:
                a32, g32 = a.reshape(B, T, din), g.reshape(B, T, dout)
                grads, norm2, extra = _float32_first(
                    torch.bmm(g32.transpose(1, 2), a32),
                    m_w.square(),
                    T,
                    lambda idx: torch.bmm(g3[idx].transpose(1, 2), a3[idx]),
                )
                parts.append(_materialised(m.weight, grads, extra=extra, norm2=norm2))
            else:
                grads = torch.bmm(g3.transpose(1, 2), a3)
                parts.append(_materialised(m.weight, grads, m_w.square(), T))
        elif T == 1 and not materialise:
            a2, g2 = a3[:, 0], g3[:, 0]
            norm2 = a2.pow(2).sum(1) * g2.pow(2).sum(1)  # G = g aᵀ: ‖G‖ = ‖g‖‖a‖
            err2 = (4 * _U * (din + dout + 3 * B + 4)) * norm2
            parts.append(_Part(m.weight, norm2, err2, weighted=lambda c: (g2 * c[:, None]).T @ a2))
        elif T == 1:
            grads = g3[:, 0, :, None] * a3[:, 0, None, :]  # exact products of float32 values
            parts.append(_materialised(m.weight, grads, m_w.square(), 1))
        else:
            gram = (torch.bmm(a3, a3.transpose(1, 2)) * torch.bmm(g3, g3.transpose(1, 2))).sum(
                (1, 2)
            )
            err2 = (4 * _U * (din + dout + T * T + 3 * B * T + 4)) * m_w.square()
            parts.append(
                _Part(
                    m.weight,
                    gram.clamp_min(0.0),
                    err2,
                    weighted=lambda c: (
                        (g3 * c[:, None, None]).reshape(-1, dout).T @ a3.reshape(-1, din)
                    ),
                )
            )
    if m.bias is not None and m.bias.requires_grad:
        # Σ_t ‖g_t‖ ≤ √T ‖g‖_F
        parts.append(_materialised(m.bias, g3.sum(1), T * g_f.square(), T))
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


def _unfold_rows(
    a: Tensor,
    kernel: tuple[int, ...],
    dilation: tuple[int, ...],
    padding: tuple[int, ...],
    stride: tuple[int, ...],
) -> Tensor:
    """``_unfold2d(...).transpose(1, 2)``: patches as rows ``(B, L, C·kh·kw)``.

    This layout copies several times faster (contiguous kernel rows) and feeds ``bmm`` directly.
    """
    B, C = a.shape[:2]
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel, dilation, padding, stride
    if ph or pw:
        a = F.pad(a, (pw, pw, ph, ph))
    v = a.unfold(2, (kh - 1) * dh + 1, sh).unfold(3, (kw - 1) * dw + 1, sw)
    if dh > 1 or dw > 1:
        v = v[..., ::dh, ::dw]
    L = v.shape[2] * v.shape[3]
    return v.permute(0, 2, 3, 1, 4, 5).reshape(B, L, C * kh * kw)


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
    g_low = g.reshape(B, g.shape[1], -1)  # (B, Cout, L) in the model's dtype
    g = g_low.to(_F64)
    g_f = _frobenius(g)
    if m.weight.requires_grad:
        G, cout, L = m.groups, g.shape[1], g.shape[2]
        K = m.weight[0].numel()  # (Cin/G)·kh·kw
        geometry = (kernel, dilation, padding, stride)
        if G == 1 and _use_gram(B, L, K, cout, materialise):
            u = _unfold2d(a.to(_F64), *geometry)  # (B, K, L)
            # M = Σ_l ‖u_l‖‖g_l‖ ≤ ‖u‖_F‖g‖_F
            m_w = _frobenius(u) * g_f
            gram = (torch.bmm(u.transpose(1, 2), u) * torch.bmm(g.transpose(1, 2), g)).sum((1, 2))
            err2 = (4 * _U * (K + cout + L * L + 3 * B * L + 4)) * m_w.square()
            parts.append(
                _Part(
                    m.weight,
                    gram.clamp_min(0.0),
                    err2,
                    weighted=lambda c: torch.einsum("bol,bkl->ok", g * c[:, None, None], u),
                )
            )
        elif a.dtype == g_low.dtype == torch.float32 and L <= _F32_MAX_LENGTH:
            grads32, u_f = _conv_grads(a, g_low, G, geometry)
            grads, norm2, extra = _float32_first(
                grads32,
                (u_f * g_f).square(),
                L,
                lambda idx: _conv_grads(a[idx], g[idx], G, geometry)[0],
            )
            parts.append(_materialised(m.weight, grads, extra=extra, norm2=norm2))
        else:
            grads, u_f = _conv_grads(a, g, G, geometry)
            parts.append(_materialised(m.weight, grads, (u_f * g_f).square(), L))
    if m.bias is not None and m.bias.requires_grad:
        parts.append(_materialised(m.bias, g.sum(2), g.shape[2] * g_f.square(), g.shape[2]))
    return parts


#: Records per block when materialising convolution gradients: the float64 im2col of a block
#: holds about this many elements (few, large operations; memory stays bounded).
_BLOCK_ELEMENTS = 2**19


def _conv_grads(a: Tensor, g: Tensor, groups: int, geometry: tuple) -> tuple[Tensor, Tensor]:
    """Per-sample weight gradients ``(B, Cout, K)`` in ``g``'s dtype and ‖u‖_F per record.

    ``g`` is the backprop ``(B, Cout, L)``; im2col and the batched matrix product run on blocks
    of records. ``‖u‖_F`` (u: the record's im2col matrix) is an upper bound, in float64.
    """
    B, cout, L = g.shape
    cin = a.shape[1]
    kh, kw = geometry[0]
    K = cin // groups * kh * kw
    dtype = g.dtype
    grads = torch.empty(B, groups, cout // groups, K, dtype=dtype, device=g.device)
    step = max(1, _BLOCK_ELEMENTS // max(1, cin * kh * kw * L))
    gg = g.reshape(B, groups, cout // groups, L)
    for i in range(0, B, step):
        u = _unfold_rows(a[i : i + step].to(dtype), *geometry)  # (b, L, G·K)
        b = u.shape[0]
        if groups > 1:
            u = u.reshape(b, L, groups, K).transpose(1, 2)
        out = grads[i : i + b].reshape(b * groups, cout // groups, K)
        torch.bmm(
            gg[i : i + b].reshape(b * groups, cout // groups, L),
            u.reshape(b * groups, L, K),
            out=out,
        )
    return grads.reshape(B, cout, K), _im2col_frobenius(a, geometry)


def _coverage(size: int, out: int, k: int, d: int, pad: int, stride: int) -> list[int]:
    """How many (output position, kernel offset) pairs read each input position along an axis."""
    count = [0] * size
    for o in range(out):
        for i in range(k):
            h = o * stride + i * d - pad
            if 0 <= h < size:
                count[h] += 1
    return count


def _im2col_frobenius(a: Tensor, geometry: tuple) -> Tensor:
    """‖u_b‖_F of each record's im2col matrix, without forming it (float64, rounded up).

    Input element (c, h, w) appears in ``n_h(h)·n_w(w)`` columns of u (the coverage along each
    axis is separable), so ‖u‖_F² = Σ n_h(h) n_w(w) a_{c,h,w}².
    """
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = geometry
    H, W = a.shape[-2:]
    ho = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    nh = torch.tensor(_coverage(H, ho, kh, dh, ph, sh), dtype=_F64, device=a.device)
    nw = torch.tensor(_coverage(W, wo, kw, dw, pw, sw), dtype=_F64, device=a.device)
    sq = (a.to(_F64).square() * (nh[:, None] * nw[None, :])).sum((1, 2, 3))
    return (sq * (1.0 + 4 * _U * (a[0].numel() + 4))).sqrt()


def _norm_parts(m: nn.GroupNorm | nn.LayerNorm, a: Tensor, g: Tensor) -> list[_Part]:
    B = a.shape[0]
    a, g = a.to(_F64), g.to(_F64)
    if isinstance(m, nn.GroupNorm):
        xh = F.group_norm(a, m.num_groups, eps=m.eps)
        prod = (g * xh).reshape(B, a.shape[1], -1)
        gw, sw = prod.sum(2), prod.abs().sum(2)
        gr = g.reshape(B, a.shape[1], -1)
        gb, sb = gr.sum(2), gr.abs().sum(2)
        length = gr.shape[2]
    else:
        xh = F.layer_norm(a, m.normalized_shape, eps=m.eps)
        k = len(m.normalized_shape)
        dims = tuple(range(1, a.ndim - k))
        prod = g * xh
        gw = prod.sum(dims) if dims else prod
        sw = prod.abs().sum(dims) if dims else prod.abs()
        gb = g.sum(dims) if dims else g
        sb = g.abs().sum(dims) if dims else g.abs()
        length = 1
        for d in dims:
            length *= a.shape[d]
    # Per channel |Σ̂ − Σ| ≤ γ_L Σ|terms|: M² = Σ_channels (Σ|terms|)².
    parts = []
    if m.weight is not None and m.weight.requires_grad:
        parts.append(_materialised(m.weight, gw, sw.reshape(B, -1).pow(2).sum(1), length))
    if m.bias is not None and m.bias.requires_grad:
        parts.append(_materialised(m.bias, gb, sb.reshape(B, -1).pow(2).sum(1), length))
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
    owners: set[int] = set()
    for module, _, _ in records:
        for p in module.parameters(recurse=False):
            if id(p) in owners:
                # a layer called twice, or a parameter shared by two called layers: the norm of
                # the summed gradient is not the sum of per-call norms -> exact path
                raise _Unsupported("a parameter is used by more than one layer call per forward")
            owners.add(id(p))
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

    # functional_call does not restore the parameters of a module registered under two names
    # (torch 2.13 leaves plain tensors behind): put the original objects back ourselves.
    saved = [
        (module, dict(module._parameters), dict(module._buffers)) for module in model.modules()
    ]
    try:
        grads, losses = vmap(grad_and_value(one), in_dims=(None, 0, 0), randomness="different")(
            train, x, y
        )
    finally:
        for module, params, bufs in saved:
            module._parameters.update(params)
            module._buffers.update(bufs)
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

    Returned in each parameter's dtype (the hooks back-end computes them in float64).
    """
    method = resolve_method(model, method)
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    names = {id(p): n for n, p in named.items()}
    chunks: dict[str, list[Tensor]] = {n: [] for n in named}
    for start in range(0, x.shape[0], physical_batch_size):
        xs, ys = x[start : start + physical_batch_size], y[start : start + physical_batch_size]
        try:
            parts, _ = _parts(model, xs, ys, loss, method, materialise=True)
        except _Unsupported:
            parts, _ = _parts(model, xs, ys, loss, "func", materialise=True)
        seen = set()
        for part in parts:
            assert part.grads is not None
            chunks[names[id(part.param)]].append(part.grads.to(part.param.dtype))
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
    each record's gradient and of what it adds (tight to ~1e-12 for ordinary records)."""
    factors: Tensor
    """Clipping factors c_i = min(1, C_i / (‖g_i‖ + 1e-6)) (B,), float64."""
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
    (used by the individual filter). What each record adds has norm ``< C_i`` for every input,
    adversarial ones included (see the module docstring); the sums are float64.
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
    sums = [torch.zeros_like(p, dtype=_F64) for p in params]
    index = {id(p): k for k, p in enumerate(params)}
    device = params[0].device if params else x.device
    loss_sum = 0.0
    norms: list[Tensor] = []
    factors: list[Tensor] = []
    for start in range(0, x.shape[0], physical_batch_size):
        xs, ys = x[start : start + physical_batch_size], y[start : start + physical_batch_size]
        bound = (
            max_grad_norm[start : start + physical_batch_size].to(device, _F64)
            if per_record
            else torch.full((xs.shape[0],), float(max_grad_norm), dtype=_F64, device=device)
        )
        norm, c, chunk_loss, method = _clip_chunk(
            model, xs, ys, loss, bound, method, sums, index, device
        )
        loss_sum += chunk_loss
        norms.append(norm)
        factors.append(c)
    return ClippedSum(
        sums=sums,
        loss_sum=loss_sum,
        norms=torch.cat(norms) if norms else torch.zeros(0, dtype=_F64),
        factors=torch.cat(factors) if factors else torch.zeros(0, dtype=_F64),
        method=method,
    )


def _clip_chunk(
    model: nn.Module,
    xs: Tensor,
    ys: Tensor,
    loss: LossFn,
    bound: Tensor,
    method: str,
    sums: list[Tensor],
    index: dict[int, int],
    device: torch.device,
) -> tuple[Tensor, Tensor, float, str]:
    """Add Σ_i c_i g_i of one chunk to ``sums``; returns (norms, factors, Σ loss, method).

    A record whose gradient norm is not finite (overflow, NaN) adds nothing (c_i = 0); the chunk
    is recomputed without it so that it cannot turn the sum into NaN.
    """
    try:
        parts, chunk_loss = _parts(model, xs, ys, loss, method, materialise=False)
    except _Unsupported:
        method = "func"
        parts, chunk_loss = _parts(model, xs, ys, loss, method, materialise=False)
    total = torch.zeros(xs.shape[0], device=device, dtype=_F64)
    for part in parts:
        total = total + part.norm2 + part.err2
    # summing len(parts) terms and the square root: a few more ulps
    norm = (total * (1.0 + 4 * _U * (len(parts) + 4))).sqrt()
    bad = ~torch.isfinite(norm)
    if bool(bad.any()):
        keep = torch.nonzero(~bad).flatten()
        c = torch.zeros_like(norm)
        norm = torch.where(bad, torch.full_like(norm, float("inf")), norm)
        if keep.numel():
            k = keep.to(xs.device)
            sub_norm, sub_c, chunk_loss, method = _clip_chunk(
                model, xs[k], ys[k], loss, bound[keep], method, sums, index, device
            )
            norm[keep], c[keep] = sub_norm, sub_c
        else:
            chunk_loss = 0.0
        return norm, c, chunk_loss, method
    c = (bound / (norm + _NORM_EPS) * (1.0 - 4 * _U)).clamp(max=1.0)
    for part in parts:
        sums[index[id(part.param)]] += part.weighted_sum(c)
    return norm, c, chunk_loss, method
