"""Compact clipping for chunks of small Linear layers on 2-D inputs (logistic regression, MLPs).

For a Linear layer on a 2-D input the per-sample gradient is ``g_i a_iᵀ`` (weight) and ``g_i``
(bias), so ``‖G_i‖² = ‖g_i‖²(‖a_i‖² + 1)`` and the clipped sum is ``(c·g)ᵀ a`` and ``Σ c_i g_i``:
nothing is materialised. When the recorded inputs and backprops are small the whole chunk runs
in float64 in a handful of tensor operations (the per-layer book-keeping of
:mod:`pdpfl.dp.bookkeeping` costs more in fixed overhead than in arithmetic here).

Rigour (Higham, §3.1): the squares of float32 (or float64) values and their sums over ``n``
terms are computed in float64 with relative error at most ``γ⁶⁴_{n+2}``; the norm, the products
of norms, the sum over layers and the square root add a few ``u``; what a record adds passes
through float64 products and a sum over the ``B`` records (``γ⁶⁴_{B+2}``). The norm used is
inflated by all of these, so it bounds both the exact gradient of the recorded values and what
the record adds. The recorded values are float32 (or narrower): their squares and products are
exact in float64 and can neither underflow nor overflow there.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pdpfl.dp.bounds import U64, gamma

__all__ = ["clip_linear"]

_F64 = torch.float64
#: Added to the norm before dividing (as Opacus does) so that ‖clip_C(g)‖ < C always holds.
_NORM_EPS = 1e-6


def clip_linear(
    layers: list[tuple[nn.Module, Tensor, Tensor]],
    bound: Tensor,
    sums: list[Tensor],
    index: dict[int, int],
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Add Σ_i c_i G_i of one chunk to ``sums``; returns (norms, factors, the mask of dropped
    records or None when every record counts).

    ``layers``: (Linear module, float64 input ``(B, d_in)``, float64 backprop ``(B, d_out)``)
    per recorded call, converted from float32 (or narrower) values. A record whose norm is not
    finite adds nothing (c_i = 0, norm ``inf``).
    """
    sq: Tensor | None = None
    terms = 0
    for m, a, g in layers:
        w_grad = m.weight.requires_grad
        has_bias = m.bias is not None and m.bias.requires_grad
        g2 = g.square().sum(1)
        part = (a.square().sum(1) + 1.0) * g2 if w_grad and has_bias else None
        if part is None:
            part = a.square().sum(1) * g2 if w_grad else g2
        sq = part if sq is None else sq + part
        terms += a.shape[1] + g.shape[1] + 2
    assert sq is not None
    b = bound.shape[0]
    # squares and sums (γ_{terms}), products and the layer sum (a few u), the square root and
    # the float64 weighted sums over the b records (γ_{b+2})
    factor = (1.0 + gamma(terms + 2 * len(layers) + 8, U64)) * (1.0 + gamma(b + 2, U64))
    norm = sq.sqrt_().mul_(factor)
    bad = ~torch.isfinite(norm)
    c = torch.div(bound, norm + _NORM_EPS).mul_(1.0 - 4 * U64).clamp_(max=1.0)
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
