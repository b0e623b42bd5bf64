"""Compact clipping for chunks of small Linear layers on 2-D inputs (logistic regression, MLPs).

For a Linear layer on a 2-D input the per-sample gradient is ``g_i a_iᵀ`` (weight) and ``g_i``
(bias), so ``‖G_i‖² = ‖g_i‖²(‖a_i‖² + 1)`` and the clipped sum is ``(c·g)ᵀ a`` and ``Σ c_i g_i``:
nothing is materialised. When the recorded inputs and backprops are small the whole chunk runs
in float64 in a handful of operations (the per-layer book-keeping of
:mod:`pdpfl.dp.bookkeeping` costs more in fixed overhead than in arithmetic here). On the CPU
these run in numpy on views of the same memory: for a logistic regression every operation is a
few microseconds of dispatch in torch and a fraction of that in numpy (issue #26).

Rigour (Higham, §3.1): the squares of float32 (or float64) values and their sums over ``n``
terms are computed in float64 with relative error at most ``γ⁶⁴_{n+2}``; the norm, the products
of norms, the sum over layers and the square root add a few ``u``; what a record adds passes
through float64 products and a sum over the ``B`` records (``γ⁶⁴_{B+2}``). The norm used is
inflated by all of these, so it bounds both the exact gradient of the recorded values and what
the record adds. The recorded values are float32 (or narrower): their squares and products are
exact in float64 and can neither underflow nor overflow there.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import Tensor, nn

from pdpfl.dp.bounds import U64, gamma

__all__ = ["clip_linear"]

_F64 = torch.float64
#: Added to the norm before dividing (as Opacus does) so that ‖clip_C(g)‖ < C always holds.
_NORM_EPS = 1e-6


def clip_linear(
    layers: list[tuple[nn.Module, Tensor, Tensor]],
    bound: Tensor | float,
    sums: list[Tensor],
    index: dict[int, int],
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Add Σ_i c_i G_i of one chunk to ``sums``; returns (norms, factors, the mask of dropped
    records or None when every record counts).

    ``layers``: (Linear module, float64 input ``(B, d_in)``, float64 backprop ``(B, d_out)``)
    per recorded call, converted from float32 (or narrower) values, on one device with
    ``sums``. ``bound``: C for every record or per-record bounds ``(B,)``. A record whose norm
    is not finite adds nothing (c_i = 0, norm ``inf``). On the CPU the arithmetic runs in numpy
    (the same float64 operations with a fraction of torch's per-operation overhead: these
    arrays are tiny).
    """
    if layers[0][1].device.type == "cpu":
        return _clip_linear_np(layers, bound, sums, index)
    return _clip_linear_torch(layers, bound, sums, index)


def _flags(m: nn.Module) -> tuple[bool, bool]:
    """(weight trainable, bias present and trainable) of a Linear layer."""
    return bool(m.weight.requires_grad), m.bias is not None and bool(m.bias.requires_grad)


def _norm_factor(layers: list[tuple[nn.Module, Tensor, Tensor]], b: int) -> float:
    """The inflation of the computed norm that makes it an upper bound (module docstring):
    squares and sums (γ_{terms}), products and the layer sum (a few u), the square root and
    the float64 weighted sums over the ``b`` records (γ_{b+2})."""
    terms = sum(a.shape[1] + g.shape[1] + 2 for _, a, g in layers)
    return _factor(terms + 2 * len(layers) + 8, b)


@functools.lru_cache(maxsize=256)
def _factor(n: int, b: int) -> float:
    return (1.0 + gamma(n, U64)) * (1.0 + gamma(b + 2, U64))


#: Shrinks a clipping factor by 4 ulps (float64) so that rounding cannot push c·N above C.
_SHRINK = 1.0 - 4 * U64


def _clip_linear_np(
    layers: list[tuple[nn.Module, Tensor, Tensor]],
    bound: Tensor | float,
    sums: list[Tensor],
    index: dict[int, int],
) -> tuple[Tensor, Tensor, Tensor | None]:
    """:func:`clip_linear` in numpy (CPU tensors; ``sums`` are updated through their numpy
    views). Same formulas and rounding analysis as :func:`_clip_linear_torch`, in place where
    possible; for one bound C the factor is ``fl(C·(1 − 4u)) / (N + 1e-6)``, at most
    ``C/(N + 1e-6)·(1 − 4u)(1 + u)² < C/(N + 1e-6)``."""
    arrays = [(m, _flags(m), a.numpy(), g.numpy()) for m, a, g in layers]
    b = arrays[0][2].shape[0]
    with np.errstate(all="ignore"):  # inf·0 of a non-finite record: it is dropped below
        sq: np.ndarray | None = None
        for _, (w_grad, has_bias), a, g in arrays:
            part = np.einsum("ij,ij->i", g, g)
            if w_grad:
                a2 = np.einsum("ij,ij->i", a, a)
                if has_bias:
                    a2 += 1.0
                part *= a2
            if sq is None:
                sq = part
            else:
                sq += part
        assert sq is not None
        norm = np.sqrt(sq, out=sq)
        norm *= _norm_factor(layers, b)
        c = norm + _NORM_EPS
        if isinstance(bound, Tensor):
            np.divide(bound.numpy(), c, out=c)
            c *= _SHRINK
        else:
            np.divide(float(bound) * _SHRINK, c, out=c)
        np.minimum(c, 1.0, out=c)
        bad: np.ndarray | None = None
        if not norm.max(initial=0.0) < math.inf:  # NaN compares false as well
            bad = ~np.isfinite(norm)
            c[bad] = 0.0
            norm[bad] = math.inf
        for m, (w_grad, has_bias), a, g in arrays:
            if bad is not None:  # rows holding inf/NaN must not reach the sums (0·inf = NaN)
                a = np.where(bad[:, None], 0.0, a)
                g = np.where(bad[:, None], 0.0, g)
            gc = g * c[:, None]
            if w_grad:
                w = sums[index[id(m.weight)]].numpy()
                w += gc.T @ a
            if has_bias:
                assert m.bias is not None
                bias = sums[index[id(m.bias)]].numpy()
                bias += gc.sum(0)
    return (
        torch.from_numpy(norm),
        torch.from_numpy(c),
        None if bad is None else torch.from_numpy(bad),
    )


def _clip_linear_torch(
    layers: list[tuple[nn.Module, Tensor, Tensor]],
    bound: Tensor | float,
    sums: list[Tensor],
    index: dict[int, int],
) -> tuple[Tensor, Tensor, Tensor | None]:
    """:func:`clip_linear` in torch (accelerators)."""
    sq: Tensor | None = None
    for m, a, g in layers:
        w_grad, has_bias = _flags(m)
        g2 = g.square().sum(1)
        part = (a.square().sum(1) + 1.0) * g2 if w_grad and has_bias else None
        if part is None:
            part = a.square().sum(1) * g2 if w_grad else g2
        sq = part if sq is None else sq + part
    assert sq is not None
    b = sq.shape[0]
    norm = sq.sqrt_().mul_(_norm_factor(layers, b))
    if not isinstance(bound, Tensor):
        bound = torch.full((b,), float(bound), dtype=_F64, device=norm.device)
    bad = ~torch.isfinite(norm)
    c = torch.div(bound, norm + _NORM_EPS).mul_(_SHRINK).clamp_(max=1.0)
    any_bad = bool(bad.any())
    if any_bad:
        c = torch.where(bad, torch.zeros_like(c), c)
        norm = torch.where(bad, torch.full_like(norm, math.inf), norm)
    for m, a, g in layers:
        if any_bad:  # rows holding inf/NaN must not reach the sums (0·inf = NaN)
            keep = ~bad[:, None]
            a = torch.where(keep, a, torch.zeros((), dtype=_F64))
            g = torch.where(keep, g, torch.zeros((), dtype=_F64))
        gc = g * c[:, None]
        if m.weight.requires_grad:
            sums[index[id(m.weight)]].addmm_(gc.T, a)
        if m.bias is not None and m.bias.requires_grad:
            sums[index[id(m.bias)]].add_(gc.sum(0))
    return norm, c, bad if any_bad else None
