"""Per-layer book-keeping clipping: per-sample norms and clipped sums from (activation, backprop).

For a parameterised layer the hook back-end of :mod:`pdpfl.dp.grad_sample` records the layer's
input ``a`` and the gradient ``g`` of Σ_i loss_i with respect to its output (Bu et al. 2023,
"book-keeping"). Each function here turns one such pair into :class:`Part` objects, one per
parameter: per-record norm estimates, **guaranteed upper bounds**, and a way to form the
weighted sum Σ_i c_i G_i once the clipping factors ``c`` are known.

Working precision
-----------------
Per-sample products are formed in a *working dtype* ``wd``: float32 (fast) for float32 models
whose matrix products are IEEE float32 (:func:`pdpfl.dp.bounds.float32_is_ieee`), float64
otherwise -- and float64 again for any record whose float32 bound turns out too loose
(:func:`pdpfl.dp.grad_sample.clipped_grad_sum` recomputes it). For a materialised per-sample
gradient ``Ĝ = fl(gᵀu)`` (dot products of length ``L``; u = a for Linear, the im2col patches for
convolutions) Higham's bound gives ``‖Ĝ − G‖_F ≤ γ_L ‖g‖_F ‖u‖_F`` whatever the BLAS blocking,
so ``up = (‖Ĝ‖_up + γ_L‖g‖_up‖u‖_up)·(1 + γ⁶⁴_{B+2})`` is at least the norm of the exact
gradient of the recorded values *and* of what :meth:`Part.weighted_sum` adds for the record
(float64 products and a float64 sum over the ``B`` records). Linear layers on 2-D inputs never
materialise anything: ``‖g aᵀ‖ = ‖g‖‖a‖``.

Large layers whose per-sample gradients would not fit in ``_MATERIALISE_LIMIT`` elements use
float64 Gram-matrix "ghost norms" ``‖Σ_t g_t a_tᵀ‖² = Σ_{t,s}(a_t·a_s)(g_t·g_s)`` with the error
term ``4u(d_in + d_out + T² + 3BT + 4)·M²``, M = ‖g‖_F‖a‖_F; GroupNorm/LayerNorm run in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pdpfl.dp.bounds import SMALL, U64, block_norm_bounds, gamma, norm_bounds, unit_roundoff
from pdpfl.dp.im2col import (
    Geometry,
    max_coverage,
    memory_rows,
    nhwc_patches,
    nhwc_patches_into,
    patches_into,
    row_patches,
    row_patches_into,
    row_products,
    unfold_rows,
)
from pdpfl.dp.workspace import Workspace
from pdpfl.dp.workspace import empty as _empty

__all__ = ["Part", "Workspace", "layer_parts"]

_F64 = torch.float64
_F32 = torch.float32
#: A layer's per-sample gradients are materialised (fewer flops than the Gram path) unless a
#: chunk's would exceed this many elements.
_MATERIALISE_LIMIT = 2**24
#: Elements per block of im2col patches (formed in a reused buffer, consumed while in cache).
_BLOCK_ELEMENTS = 2**20
#: Elements per block when converting float32 per-sample gradients to float64 for the sum: a
#: cache-sized buffer on the CPU; on an accelerator a larger one (512 MiB of float64), since each
#: block is one kernel launch (measured on an H200, ResNet-18-GN at B = 1024: one launch per
#: record and parameter made the float64 sum 2/3 of the step, benchmarks/RESULTS.md "GPU").
#: The rounding bound (γ_{B+2} per record, :func:`_share`) holds for any blocking.
_SUM_BLOCK = 2**17
_SUM_BLOCK_DEVICE = 2**26


@dataclass
class Part:
    """One parameter's per-sample contribution in one chunk of ``B`` records.

    ``est`` estimates each record's per-sample gradient norm; ``up`` (float64) is at least the
    norm of the exact gradient of the recorded values and of what :meth:`weighted_sum` adds for
    that record; ``err`` bounds the distance between the two (None: exact up to float64
    rounding). Exactly one of ``grads`` (``(B, numel)``, materialised) and ``outer``
    (``(g, a)`` with shapes ``(B, T, d_out)``, ``(B, T, d_in)``: Σ_t g_t a_tᵀ per record) is set.
    ``fast``: computed in float32 (the record may be recomputed in float64). ``layout``: the
    rows of ``grads`` hold ``G.permute(layout)`` flattened (None: the parameter's own order;
    a convolution on channels-last inputs forms ``(Cout, kh, kw, Cin)`` rows).
    """

    param: Tensor
    est: Tensor
    up: Tensor
    grads: Tensor | None = None
    outer: tuple[Tensor, Tensor] | None = None
    fast: bool = False
    err: Tensor | None = None
    layout: tuple[int, ...] | None = None

    def _permuted(self) -> tuple[list[int], list[int]]:
        """The shape of one ``grads`` row under ``layout``, and the permutation undoing it."""
        assert self.layout is not None
        shape = [self.param.shape[d] for d in self.layout]
        return shape, sorted(range(len(self.layout)), key=self.layout.__getitem__)

    def per_sample(self) -> Tensor:
        """The materialised per-sample gradients as ``(B, *param.shape)`` (a view)."""
        assert self.grads is not None
        b = self.grads.shape[0]
        if self.layout is None:
            return self.grads.reshape(b, *self.param.shape)
        shape, inverse = self._permuted()
        return self.grads.reshape(b, *shape).permute(0, *(1 + d for d in inverse))

    def weighted_sum(self, c: Tensor, drop: Tensor | None = None) -> Tensor:
        """Σ_b c_b G_b in float64 (shape of the parameter); records in ``drop`` add nothing
        (their rows may hold inf/NaN)."""
        out = torch.zeros(self.param.shape, dtype=_F64, device=c.device)
        self.accumulate(out, c, drop)
        return out

    def accumulate(self, out: Tensor, c: Tensor, drop: Tensor | None = None) -> None:
        """``out += Σ_b c_b G_b`` in float64 (``out``: a contiguous float64 tensor of the
        parameter's shape); records in ``drop`` add nothing (their rows may hold inf/NaN)."""
        if drop is not None and drop.numel():
            keep = torch.ones(c.shape[0], dtype=torch.bool, device=c.device)
            keep[drop] = False
        else:
            keep = None
        flat = out.view(-1)
        if self.grads is not None:
            grads = self.grads
            if keep is not None:
                zero = torch.zeros((), dtype=grads.dtype, device=grads.device)
                grads = torch.where(keep[:, None], grads, zero)
            if self.layout is None:
                _rows_dot_into(flat, c, grads)
                return
            shape, inverse = self._permuted()
            tmp = torch.zeros(shape, dtype=_F64, device=out.device)
            _rows_dot_into(tmp.view(-1), c, grads)
            # one more float64 addition per entry than summing into ``out`` directly: the
            # chunk's B products and B additions stay within the γ_{B+2} of ``_share``
            out.add_(tmp.permute(*inverse))
            return
        assert self.outer is not None
        g, a = (t.to(_F64) for t in self.outer)
        if keep is not None:
            zero = torch.zeros((), dtype=_F64, device=g.device)
            g = torch.where(keep[:, None, None], g, zero)
            a = torch.where(keep[:, None, None], a, zero)
        dout, din = g.shape[-1], a.shape[-1]
        if g.shape[1] == 1:  # Σ_b c_b g_b a_bᵀ = gᵀ (c·a)
            out.view(dout, din).addmm_(g[:, 0].T, a[:, 0] * c[:, None])
        else:
            gc = (g * c[:, None, None]).reshape(-1, dout)
            out.view(dout, din).addmm_(gc.T, a.reshape(-1, din))


def _rows_dot_into(out: Tensor, c: Tensor, rows: Tensor) -> None:
    """``out += c @ rows`` accumulated in float64; float32 rows are converted block by block."""
    if rows.dtype == _F64:
        out.addmv_(rows.T, c)
        return
    b, n = rows.shape
    block = _SUM_BLOCK if rows.device.type == "cpu" else _SUM_BLOCK_DEVICE
    step = max(1, min(b, block // max(n, 1)))
    buf = torch.empty(step, n, dtype=_F64, device=rows.device)
    acc = out.view(1, n)
    for i in range(0, b, step):
        blk = buf[: min(step, b - i)]
        blk.copy_(rows[i : i + step])
        acc.addmm_(c[None, i : i + step], blk)


def _share(b: int) -> float:
    """Rounding of the float64 weighted sum over ``b`` records, as a factor on each norm."""
    return 1.0 + gamma(b + 2, U64)


def _use_gram(batch: int, positions: int, k_in: int, k_out: int, materialise: bool) -> bool:
    """Gram ("ghost norm") path for a per-sample gradient Σ_{l<positions} g_l u_lᵀ (k_out×k_in)?"""
    if materialise or positions == 1:
        return False
    smaller = 2 * positions * positions < k_in * k_out  # two L×L Gram matrices per record
    return smaller and batch * k_in * k_out > _MATERIALISE_LIMIT


def _materialised(param: Tensor, grads: Tensor, err: Tensor | None, b: int, fast: bool) -> Part:
    """A part from per-sample gradients ``grads`` (B, ...) whose distance to the exact gradient
    of the recorded values is at most ``err`` (None: ``grads`` are exact)."""
    flat = grads.reshape(grads.shape[0], -1)
    est, up = norm_bounds(flat)
    if err is not None:
        up = up + err
    return Part(param, est, up * _share(b), grads=flat, fast=fast, err=err)


def _gram_part(param: Tensor, g: Tensor, u: Tensor) -> Part:
    """Float64 Gram-matrix norm of Σ_t g_t u_tᵀ per record; ``g``: (B, T, d_out), ``u``:
    (B, T, d_in)."""
    g, u = g.to(_F64), u.to(_F64)
    B, T, d_in = u.shape
    d_out = g.shape[2]
    gram = (torch.bmm(u, u.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))
    m = norm_bounds(u)[1] * norm_bounds(g)[1]
    err2 = (4 * U64 * (d_in + d_out + T * T + 3 * B * T + 4)) * m.square()
    norm2 = gram.clamp_min(0.0)
    return Part(param, norm2.sqrt(), (norm2 + err2).sqrt(), outer=(g, u))


def _linear_parts(
    m: nn.Linear, a: Tensor, g: Tensor, wd: torch.dtype, materialise: bool, ws: Workspace | None
) -> list[Part]:
    B = a.shape[0]
    T = a.numel() // max(1, B * a.shape[-1])
    if T == 1 and not materialise and B * (a.shape[-1] + g.shape[-1]) <= SMALL:
        wd = _F64  # small: float64 copies are cheaper than float32 bounds and checks
    fast = wd == _F32
    a3 = a.reshape(B, -1, a.shape[-1]).to(wd)
    g3 = g.reshape(B, -1, g.shape[-1]).to(wd)
    T, din, dout = a3.shape[1], a3.shape[2], g3.shape[2]
    u = unit_roundoff(wd)
    g_est, g_up = norm_bounds(g3)
    parts: list[Part] = []
    if m.weight.requires_grad:
        if T == 1 and not materialise:
            a_est, a_up = norm_bounds(a3)  # ‖g aᵀ‖ = ‖g‖‖a‖: nothing to materialise
            parts.append(
                Part(m.weight, a_est * g_est, a_up * g_up * _share(B), outer=(g3, a3), fast=fast)
            )
        elif _use_gram(B, T, din, dout, materialise):
            parts.append(_gram_part(m.weight, g3, a3))
        else:
            grads = _empty(ws, (id(m), "weight"), (B, dout, din), wd, a.device)
            torch.bmm(g3.transpose(1, 2), a3, out=grads)
            err = gamma(T, u) * norm_bounds(a3)[1] * g_up  # ‖Ĝ − G‖ ≤ γ_T ‖g‖‖a‖
            parts.append(_materialised(m.weight, grads, err, B, fast))
    if m.bias is not None and m.bias.requires_grad:
        if T == 1:
            parts.append(Part(m.bias, g_est, g_up * _share(B), grads=g3[:, 0], fast=fast))
        else:  # Σ_t |g_t| ≤ √T ‖g‖_F
            err = gamma(T, u) * math.sqrt(T) * g_up
            parts.append(_materialised(m.bias, g3.sum(1), err, B, fast))
    return parts


def _patch_norm_bounds(a: Tensor, geometry: Geometry, row_norms: Tensor | None = None) -> Tensor:
    """An upper bound on ‖u_b‖_F, u_b the im2col matrix of record b, without forming it:
    ‖u‖_F² = Σ n_h(h) n_w(w) a_{c,h,w}² ≤ max(n_h n_w)·‖a‖_F² (tight up to border effects;
    it only scales the float32 error term). ``row_norms``: the norms of the rows of
    :func:`memory_rows` ``(a)``, already computed in ``a``'s dtype."""
    cover = max_coverage(tuple(a.shape[-2:]), geometry)
    if row_norms is None:
        a_up = norm_bounds(a)[1]
    else:
        a_up = block_norm_bounds(row_norms, memory_rows(a[:1]).shape[2], a.dtype)[1]
    return a_up * (math.sqrt(cover) * (1.0 + 4 * U64))


def _conv_geometry(
    m: nn.Conv1d | nn.Conv2d, a: Tensor, g: Tensor
) -> tuple[Tensor, Tensor, Geometry]:
    """2-D views of the recorded tensors and (kernel, dilation, padding, stride)."""
    pad = tuple(int(p) for p in m.padding) if not isinstance(m.padding, str) else (0,)
    if m.padding == "valid":
        pad = (0,) * len(m.kernel_size)
    if isinstance(m, nn.Conv1d):
        a, g = a.unsqueeze(-2), g.unsqueeze(-2)
        return a, g, ((1, *m.kernel_size), (1, *m.dilation), (0, *pad), (1, *m.stride))
    return a, g, (tuple(m.kernel_size), tuple(m.dilation), pad, tuple(m.stride))


def _conv_pass(
    m: nn.Conv1d | nn.Conv2d,
    a: Tensor,
    g: Tensor,
    geometry: Geometry,
    ws: Workspace | None,
    weight: bool,
    bias: bool,
    patches: str = "gather",
) -> dict[str, Tensor]:
    """One pass over blocks of records, each block handled while it is in cache: norms of the
    rows of :func:`memory_rows` of the input and of the backprop (``g``: ``(B, Cout, Ho,
    Wo)``), the bias sums, and (``weight``) the per-sample weight gradients ``(B, Cout, K)``
    (patches formed into a reused buffer, then ``bmm``) and their per-output-channel norms.
    Everything in ``a``'s dtype (the working dtype). NCHW and channels-last tensors are both
    read in their memory order: the norms reduce contiguous rows (a strided reduction is
    ~10× slower on the CPU) and ``bmm`` takes the transposed backprop as it is.

    ``patches`` (:mod:`pdpfl.dp.im2col`): ``"gather"`` (:func:`patches_into`), ``"nhwc"``
    (:func:`nhwc_patches_into`: the weight rows come in ``(Cout, kh, kw, Cin)`` order) or
    ``"rows"`` (:func:`row_patches_into` and :func:`row_products`)."""
    B, cout = g.shape[:2]
    g3 = g.reshape(B, cout, -1)  # (B, Cout, L): a view in both layouts
    L = g3.shape[2]
    a_rows, g_rows = memory_rows(a), memory_rows(g)
    groups = int(m.groups)
    cin = a.shape[1]
    (kh, kw), _, _, (sh, _) = geometry
    ckk = cin * kh * kw
    K = ckk // groups
    dev, wd = a.device, a.dtype
    out: dict[str, Tensor] = {
        "a": torch.empty(B, a_rows.shape[1], dtype=wd, device=dev),
        "g": torch.empty(B, g_rows.shape[1], dtype=wd, device=dev),
    }
    if bias:
        out["bias"] = torch.empty(B, cout, dtype=wd, device=dev)
    if weight:
        out["grads"] = _empty(ws, (id(m), "weight"), (B, cout, K), wd, dev)
        out["grad_norms"] = torch.empty(B, cout, dtype=wd, device=dev)
        if patches == "rows":
            ho = g.shape[2]
            q = kh // sh
            width = cin * sh * kw
            per_record = (ho + q - 1) * g.shape[3] * width
            step = max(1, min(B, _BLOCK_ELEMENTS // max(1, per_record)))
            buf = _empty(ws, "im2col", (step, per_record // width, width), wd, dev)
            products = _empty(ws, "row-products", (q, step, cout, width), wd, dev)
        else:
            step = max(1, min(B, _BLOCK_ELEMENTS // max(1, ckk * L)))
            buf = _empty(ws, "im2col", (step, L, ckk), wd, dev)
    else:
        step = B
    for i in range(0, B, step):
        b = min(step, B - i)
        ab, gb = a[i : i + b], g3[i : i + b]
        torch.linalg.vector_norm(a_rows[i : i + b], dim=2, out=out["a"][i : i + b])
        torch.linalg.vector_norm(g_rows[i : i + b], dim=2, out=out["g"][i : i + b])
        if bias:
            torch.sum(gb, dim=2, out=out["bias"][i : i + b])
        if not weight:
            continue
        blk = out["grads"][i : i + b]
        if patches == "rows":
            u = row_patches_into(ab, geometry, buf[:b], ws)
            scratch = products.view(-1)[: q * b * cout * width].view(q, b, cout, width)
            row_products(gb, u, geometry, ho, scratch, blk)
        else:
            if patches == "nhwc":
                u = nhwc_patches_into(ab, geometry, buf[:b])
            else:
                u = patches_into(ab, geometry, buf[:b], ws)
            if groups > 1:
                u = u.reshape(b, L, groups, K).transpose(1, 2)
            torch.bmm(
                gb.reshape(b * groups, cout // groups, L),
                u.reshape(b * groups, L, K),
                out=blk.view(b * groups, cout // groups, K),
            )
        torch.linalg.vector_norm(blk, dim=2, out=out["grad_norms"][i : i + b])
    return out


def _patch_strategy(a: Tensor, cout: int, geometry: Geometry, groups: int) -> str:
    """How :func:`_conv_pass` forms patches: the strided channels-last copy, else row-wise
    patches when they apply, else the gather."""
    if nhwc_patches(a, geometry, groups):
        return "nhwc"
    c, h, w = a.shape[1:]
    if row_patches((c, h, w), cout, geometry, groups):
        return "rows"
    return "gather"


def _conv_parts(
    m: nn.Conv1d | nn.Conv2d,
    a: Tensor,
    g: Tensor,
    wd: torch.dtype,
    materialise: bool,
    ws: Workspace | None,
) -> list[Part]:
    B = a.shape[0]
    fast = wd == _F32
    u = unit_roundoff(wd)
    a, g, geometry = _conv_geometry(m, a, g)
    a, g = a.to(wd), g.to(wd)
    cout, L = g.shape[1], g.shape[2] * g.shape[3]
    K = m.weight[0].numel()  # (Cin/G)·kh·kw
    gram = m.weight.requires_grad and m.groups == 1 and _use_gram(B, L, K, cout, materialise)
    want_bias = m.bias is not None and m.bias.requires_grad
    weight = m.weight.requires_grad and not gram
    strategy = _patch_strategy(a, cout, geometry, int(m.groups)) if weight else "gather"
    res = _conv_pass(m, a, g, geometry, ws, weight, want_bias, strategy)
    g_up = block_norm_bounds(res["g"], memory_rows(g[:1]).shape[2], wd)[1]
    parts: list[Part] = []
    if gram:
        patches = unfold_rows(a.to(_F64), *geometry)  # (B, L, K)
        parts.append(_gram_part(m.weight, g.reshape(B, cout, L).transpose(1, 2), patches))
    elif m.weight.requires_grad:
        u_up = _patch_norm_bounds(a, geometry, res["a"])
        err = gamma(L, u) * (1.0 + 4 * U64) * u_up * g_up  # ‖Ĝ − G‖ ≤ γ_L ‖g‖‖u‖
        est, up = block_norm_bounds(res["grad_norms"], K, wd)
        grads = res["grads"].reshape(B, -1)
        layout = (0, 2, 3, 1) if strategy == "nhwc" else None
        parts.append(Part(m.weight, est, (up + err) * _share(B), grads=grads, fast=fast,
                          err=err, layout=layout))  # fmt: skip
    if want_bias:  # Σ_l |g_l| ≤ √L ‖g‖_F
        assert m.bias is not None
        err = gamma(L, u) * math.sqrt(L) * g_up
        parts.append(_materialised(m.bias, res["bias"], err, B, fast))
    return parts


def _norm_parts(m: nn.GroupNorm | nn.LayerNorm, a: Tensor, g: Tensor) -> list[Part]:
    """Float64 per-sample gradients of GroupNorm/LayerNorm affine parameters.

    Per channel ``|Σ̂ − Σ| ≤ γ_L Σ|terms|`` (the normalised input is recomputed in float64 from
    the recorded input): the error is ``γ_L (Σ_channels (Σ|terms|)²)^{1/2}``.
    """
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
        length = math.prod(a.shape[d] for d in dims)
    parts = []
    eps = gamma(length + 4, U64) * (1.0 + gamma(length + 4, U64))  # Σ|terms| is rounded too
    if m.weight is not None and m.weight.requires_grad:
        err = eps * norm_bounds(sw.reshape(B, -1))[1]
        parts.append(_materialised(m.weight, gw, err, B, False))
    if m.bias is not None and m.bias.requires_grad:
        err = eps * norm_bounds(sb.reshape(B, -1))[1]
        parts.append(_materialised(m.bias, gb, err, B, False))
    return parts


def layer_parts(
    module: nn.Module,
    a: Tensor,
    g: Tensor,
    wd: torch.dtype,
    materialise: bool,
    ws: Workspace | None = None,
) -> list[Part]:
    """The parts of one recorded layer call: input ``a``, output gradient ``g``.

    ``wd``: working dtype (float32 or float64); ``materialise``: always form per-sample
    gradients (``grads``); ``ws``: buffers to reuse (None: fresh tensors).
    """
    if isinstance(module, nn.Linear):
        return _linear_parts(module, a, g, wd, materialise, ws)
    if isinstance(module, nn.Conv1d | nn.Conv2d):
        return _conv_parts(module, a, g, wd, materialise, ws)
    if isinstance(module, nn.GroupNorm | nn.LayerNorm):
        return _norm_parts(module, a, g)
    raise TypeError(f"unsupported layer {type(module).__name__}")
