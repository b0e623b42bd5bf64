"""im2col for the convolution book-keeping of :mod:`pdpfl.dp.bookkeeping`: each record's patches
``u`` (``(L, C·kh·kw)``, one row per output position) so that its per-sample weight gradient is
``gᵀu`` (a batched matrix product), formed in one of three ways:

* :func:`patches_into` -- one gather with a cached index (any geometry, NCHW or channels-last);
* :func:`nhwc_patches_into` -- one strided copy in ``(kh, kw, C)`` order, for unpadded
  ungrouped convolutions on channels-last inputs (runs of ``kw·C`` contiguous elements);
* :func:`row_patches_into` -- *row-wise* patches for ungrouped, undilated convolutions whose
  kernel height is a multiple ``q·s_h`` (q ≥ 2) of the vertical stride: each record keeps
  only ``(H_o + q − 1)·W_o`` rows of ``(C, s_h, kw)`` entries, and the ``L`` patch rows of
  kernel rows ``j·s_h … j·s_h + s_h − 1`` are the *contiguous* rows ``j·W_o … j·W_o + L − 1``
  of it; ``q`` products ``gᵀ u_j`` give the gradient (:func:`row_products`). The MNIST CNN's
  conv1 (8×8, stride 2, one channel) stores 3.3× fewer elements than full im2col;
  :func:`row_patches` decides when it pays.

The patch entries, and hence every per-sample gradient entry (a dot product of length ``L``
of the same numbers), are the same whichever way is taken: the float32 error bounds of the
book-keeping hold unchanged.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from pdpfl.dp.workspace import Workspace, padded

__all__ = [
    "Geometry",
    "channels_last",
    "max_coverage",
    "memory_rows",
    "nhwc_patches",
    "nhwc_patches_into",
    "patches_into",
    "row_patches",
    "row_patches_into",
    "row_products",
    "unfold2d",
    "unfold_rows",
]

Geometry = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]
"""(kernel, dilation, padding, stride) of a 2-D convolution."""


def _windows(
    a: Tensor,
    kernel: tuple[int, ...],
    dilation: tuple[int, ...],
    padding: tuple[int, ...],
    stride: tuple[int, ...],
) -> Tensor:
    """The ``(B, C, H_o, W_o, kh, kw)`` view of every kernel window of ``a`` (zero-padded)."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel, dilation, padding, stride
    if ph or pw:
        a = F.pad(a, (pw, pw, ph, ph))
    v = a.unfold(2, (kh - 1) * dh + 1, sh).unfold(3, (kw - 1) * dw + 1, sw)
    return v[..., ::dh, ::dw] if dh > 1 or dw > 1 else v


def unfold2d(
    a: Tensor,
    kernel: tuple[int, ...],
    dilation: tuple[int, ...],
    padding: tuple[int, ...],
    stride: tuple[int, ...],
) -> Tensor:
    """``F.unfold`` (im2col, same layout ``(B, C·kh·kw, L)``) via strided views: one copy."""
    v = _windows(a, kernel, dilation, padding, stride)
    B, C, ho, wo, kh, kw = v.shape
    return v.permute(0, 1, 4, 5, 2, 3).reshape(B, C * kh * kw, ho * wo)


def unfold_rows(
    a: Tensor,
    kernel: tuple[int, ...],
    dilation: tuple[int, ...],
    padding: tuple[int, ...],
    stride: tuple[int, ...],
    out: Tensor | None = None,
) -> Tensor:
    """``unfold2d(...).transpose(1, 2)``: patches as rows ``(B, L, C·kh·kw)`` (into ``out``).

    This layout copies several times faster (contiguous kernel rows) and feeds ``bmm`` directly.
    """
    v = _windows(a, kernel, dilation, padding, stride)
    B, C, ho, wo, kh, kw = v.shape
    if out is None:
        return v.permute(0, 2, 3, 1, 4, 5).reshape(B, ho * wo, C * kh * kw)
    out.view(B, ho, wo, C, kh, kw).copy_(v.permute(0, 2, 3, 1, 4, 5))
    return out


def channels_last(t: Tensor) -> bool:
    """A 4-D tensor stored channels-last (NHWC) that is not also NCHW-contiguous."""
    return (
        t.dim() == 4
        and not t.is_contiguous()
        and t.is_contiguous(memory_format=torch.channels_last)
    )


def memory_rows(t: Tensor) -> Tensor:
    """``(B, rows, n)`` view of a 4-D tensor in its memory order, one row per contiguous run:
    ``(B, C, H·W)`` for NCHW, ``(B, H, W·C)`` for channels-last (a copy for other layouts).
    Per-row norms of either cover each record's elements exactly once."""
    if channels_last(t):
        return t.permute(0, 2, 3, 1).reshape(t.shape[0], t.shape[2], -1)
    return t.reshape(t.shape[0], t.shape[1], -1)


@functools.lru_cache(maxsize=64)
def _im2col_index(
    shape: tuple[int, int, int],
    geometry: Geometry,
    device: torch.device,
    channels_last: bool = False,
) -> Tensor:
    """Flat positions in a (padded) ``(C, H, W)`` input of :func:`unfold_rows`' entries;
    ``channels_last``: positions in the input's ``(H, W, C)`` memory order."""
    kernel, dilation, _, stride = geometry
    c, h, w = shape
    pos = torch.arange(math.prod(shape), dtype=torch.int64)
    if channels_last:
        pos = pos.reshape(1, h, w, c).permute(0, 3, 1, 2)
    else:
        pos = pos.reshape(1, c, h, w)
    idx = unfold_rows(pos, kernel, dilation, (0, 0), stride).reshape(-1)
    # int32 positions gather ~12% faster than int64 (index_select takes either)
    return idx.to(device, torch.int32 if pos.numel() < 2**31 else torch.int64)


def _gather_into(
    a: Tensor,
    geometry: Geometry,
    out: Tensor,
    ws: Workspace | None,
    index: Callable[[tuple[int, ...], Geometry, torch.device, bool], Tensor],
) -> Tensor:
    """Pad ``a`` (through ``ws``), convert it to ``out``'s dtype and gather the positions
    ``index(shape, geometry, device, channels_last)`` of each record into ``out``'s rows."""
    ph, pw = geometry[2]
    if ph or pw:
        a = padded(a, ph, pw, out.dtype, ws)
    a = a.to(out.dtype)
    cl = channels_last(a)
    idx = index(tuple(a.shape[1:]), geometry, a.device, cl)
    src = a.permute(0, 2, 3, 1) if cl else a
    torch.index_select(src.reshape(a.shape[0], -1), 1, idx, out=out.view(a.shape[0], -1))
    return out


def patches_into(a: Tensor, geometry: Geometry, out: Tensor, ws: Workspace | None = None) -> Tensor:
    """``unfold_rows(a, *geometry)`` written into ``out`` (``(b, L, C·kh·kw)``, any float
    dtype) with one gather: several times faster than a permuted copy on the CPU. Padding
    goes through a reused buffer of ``ws`` when given; a channels-last ``a`` is read in its
    own memory order (no copy)."""
    return _gather_into(a, geometry, out, ws, _im2col_index)


def _coverage(size: int, out: int, k: int, d: int, pad: int, stride: int) -> list[int]:
    """How many (output position, kernel offset) pairs read each input position along an axis."""
    count = [0] * size
    for o in range(out):
        for i in range(k):
            h = o * stride + i * d - pad
            if 0 <= h < size:
                count[h] += 1
    return count


@functools.lru_cache(maxsize=64)
def max_coverage(hw: tuple[int, int], geometry: Geometry) -> int:
    """max over (h, w) of n_h(h)·n_w(w): how often one input element appears in im2col."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = geometry
    H, W = hw
    ho = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return max(_coverage(H, ho, kh, dh, ph, sh)) * max(_coverage(W, wo, kw, dw, pw, sw))


def nhwc_patches(a: Tensor, geometry: Geometry, groups: int) -> bool:
    """Form im2col rows in ``(kh, kw, C)`` order by one strided copy: a channels-last input
    without padding or groups, whose patch rows are runs of ``kw·C`` contiguous elements
    (3–4× faster than the gather for the MNIST CNN's conv2)."""
    return groups == 1 and channels_last(a) and not any(geometry[2])


def nhwc_patches_into(a: Tensor, geometry: Geometry, out: Tensor) -> Tensor:
    """Patches of a channels-last ``a`` as ``(b, L, kh·kw·C)`` rows in ``(kh, kw, C)`` order."""
    (kh, kw), (dh, dw), _, (sh, sw) = geometry
    v = a.permute(0, 2, 3, 1).unfold(1, (kh - 1) * dh + 1, sh).unfold(2, (kw - 1) * dw + 1, sw)
    if dh > 1 or dw > 1:
        v = v[..., ::dh, ::dw]
    b, ho, wo, c = v.shape[:4]  # (b, Ho, Wo, C, kh, kw)
    out.view(b, ho, wo, kh, kw, c).copy_(v.permute(0, 1, 2, 4, 5, 3))
    return out


def row_patches(shape: tuple[int, int, int], cout: int, geometry: Geometry, groups: int) -> bool:
    """Whether :func:`row_patches_into` applies to an input of ``shape`` ``(C, H, W)`` and pays.

    It applies to ungrouped, undilated convolutions with a kernel height ``q·s_h``, ``q ≥ 2``.
    It pays (measured on the CPU: the MNIST CNN's conv1, 1.6× faster than the gather) when it
    stores at most half the elements of full im2col, counting the permuted copy of the
    ``Cout·K`` gradient entries per record, and each of the ``q`` products has at least 16
    columns (narrower products run far below peak: 3×3 stride-1 convolutions lose).
    """
    (kh, kw), dilation, (ph, pw), (sh, _) = geometry
    if groups != 1 or any(d != 1 for d in dilation) or kh % sh or kh < 2 * sh:
        return False
    c, h, w = shape
    ho, wo, _, rows = _row_shape((h + 2 * ph, w + 2 * pw), geometry)
    width = c * sh * kw
    full = ho * wo * c * kh * kw
    return width >= 16 and 2 * (rows * wo * width + cout * c * kh * kw) <= full


def _row_shape(hw: tuple[int, int], geometry: Geometry) -> tuple[int, int, int, int]:
    """``(H_o, W_o, q, R)`` of a padded ``(H, W)`` input: output size, kernel row groups
    ``q = kh / s_h`` and rows ``R = H_o + q − 1`` of :func:`row_patches_into`."""
    (kh, kw), _, _, (sh, sw) = geometry
    ho, wo = (hw[0] - kh) // sh + 1, (hw[1] - kw) // sw + 1
    q = kh // sh
    return ho, wo, q, ho + q - 1


@functools.lru_cache(maxsize=64)
def _row_index(
    shape: tuple[int, int, int], geometry: Geometry, device: torch.device, cl: bool
) -> Tensor:
    """Flat positions in a padded ``(C, H, W)`` input (``cl``: in ``(H, W, C)`` memory order)
    of the entries ``[r, w_o, c, i, k] = a[c, r·s_h + i, w_o·s_w + k]`` of
    :func:`row_patches_into` (r < R, i < s_h, k < kw)."""
    c, h, w = shape
    (_, kw), _, _, (sh, sw) = geometry
    _, wo, _, rows = _row_shape((h, w), geometry)
    pos = torch.arange(c * h * w, dtype=torch.int64)
    pos = pos.reshape(h, w, c).permute(2, 0, 1) if cl else pos.reshape(c, h, w)
    hh = torch.arange(rows)[:, None, None, None, None] * sh
    hh = hh + torch.arange(sh)[None, None, None, :, None]
    ww = torch.arange(wo)[None, :, None, None, None] * sw
    ww = ww + torch.arange(kw)[None, None, None, None, :]
    cc = torch.arange(c)[None, None, :, None, None]
    idx = pos[cc, hh, ww].reshape(-1)
    return idx.to(device, torch.int32 if pos.numel() < 2**31 else torch.int64)


def row_patches_into(
    a: Tensor, geometry: Geometry, out: Tensor, ws: Workspace | None = None
) -> Tensor:
    """Row-wise patches of ``a`` (``(b, C, H, W)``, NCHW or channels-last) gathered into
    ``out`` (``(b, R·W_o, C·s_h·kw)``, any float dtype); see the module docstring."""
    return _gather_into(a, geometry, out, ws, _row_index)


def row_products(g: Tensor, rows: Tensor, geometry: Geometry, ho: int, scratch: Tensor,
                 out: Tensor) -> Tensor:  # fmt: skip
    """Per-sample weight gradients ``(b, Cout, C·kh·kw)`` (the parameter's own order) into
    ``out`` from the backprop ``g`` ``(b, Cout, L)`` and :func:`row_patches_into`'s ``rows``:
    ``q`` batched products into ``scratch`` ``(q, b, Cout, C·s_h·kw)``, then one permuted copy."""
    (kh, kw), _, _, (sh, _) = geometry
    b, cout, L = g.shape
    wo = L // ho
    q = kh // sh
    for j in range(q):
        torch.bmm(g, rows[:, j * wo : j * wo + L], out=scratch[j])
    c = rows.shape[2] // (sh * kw)
    src = scratch.view(q, b, cout, c, sh, kw).permute(1, 2, 3, 0, 4, 5)
    out.view(b, cout, c, q, sh, kw).copy_(src)
    return out
