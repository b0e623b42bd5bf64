"""The compact clipping of small Linear layers (``pdpfl.dp.linear``): its numpy (CPU) and torch
(accelerator) implementations against an exact reference, on adversarial magnitudes.

Exact reference: the per-sample gradient of a Linear layer is ``g_i a_iᵀ`` (and ``g_i``); the
recorded values are float32, so every product is exact in float64 and ``Fraction`` sums them
without rounding. Properties: the norm used is at least the exact norm, within a few float64
ulps of it, what each record adds has norm below its bound ``C_i``, non-finite records add
nothing, and the two implementations agree.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pdpfl.dp.linear import _clip_linear_np, _clip_linear_torch, clip_linear

MAGNITUDES = [1e-38, 1e-20, 1e-3, 1.0, 1e3, 1e18, 1e38]


@st.composite
def _chunk(draw):
    """1–2 Linear layers on float32 records (stored as float64 as the chunk path does)."""
    b = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(draw(st.integers(1, 2))):
        d_in, d_out = draw(st.integers(1, 9)), draw(st.integers(1, 3))
        m = nn.Linear(d_in, d_out, bias=draw(st.booleans()))
        m.weight.requires_grad_(draw(st.booleans()) or m.bias is None)
        scale = draw(st.lists(st.sampled_from(MAGNITUDES), min_size=b, max_size=b))
        gscale = draw(st.sampled_from(MAGNITUDES))
        a = torch.randn(b, d_in, generator=gen) * torch.tensor(scale)[:, None]
        g = torch.randn(b, d_out, generator=gen) * gscale
        layers.append((m, a.float().double(), g.float().double()))
    if draw(st.booleans()):  # a non-finite record: it must add nothing
        i = draw(st.integers(0, b - 1))
        layers[0][1][i, 0] = draw(st.sampled_from([math.inf, -math.inf, math.nan]))
    per_record = draw(st.booleans())
    c = draw(st.sampled_from([1e-6, 0.3, 1.0, 1e6]))
    bound = torch.rand(b, generator=gen, dtype=torch.float64) * c + c if per_record else c
    return layers, bound


def _params(layers):
    return [p for m, _, _ in layers for p in (m.weight, m.bias)
            if p is not None and p.requires_grad]  # fmt: skip


def _run(fn, layers, bound):
    params = _params(layers)
    flat = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64)
    sums = [t.view(p.shape) for t, p in zip(flat.split([p.numel() for p in params]), params,
                                            strict=True)]  # fmt: skip
    index = {id(p): k for k, p in enumerate(params)}
    norm, c, bad = fn(layers, bound, sums, index)
    return flat, norm, c, bad


def _exact_rows(layers, i):
    """Record i's exact per-sample gradient terms (Fractions), in parameter order."""
    out = []
    for m, a, g in layers:
        gi = [Fraction(float(v)) for v in g[i]]
        if m.weight.requires_grad:
            ai = [Fraction(float(v)) for v in a[i]]
            out += [gk * aj for gk in gi for aj in ai]
        if m.bias is not None and m.bias.requires_grad:
            out += gi
    return out


@settings(max_examples=80, deadline=None)
@given(case=_chunk())
def test_compact_linear_clipping_bounds_the_exact_gradient_and_what_each_record_adds(case):
    layers, bound = case
    b = layers[0][1].shape[0]
    bounds = bound.tolist() if isinstance(bound, torch.Tensor) else [bound] * b
    flat, norm, c, bad = _run(_clip_linear_np, layers, bound)
    expected = [Fraction(0)] * flat.numel()
    scale = [Fraction(0)] * flat.numel()  # Σ_i |c_i t_ik|: the scale of the rounding errors
    for i in range(b):
        finite = all(  # the values that enter the record's gradient
            math.isfinite(float(v))
            for m, a, g in layers
            for v in (torch.cat([a[i], g[i]]) if m.weight.requires_grad else g[i])
        )
        if not finite:
            assert bad is not None and bool(bad[i]) and float(c[i]) == 0.0
            assert math.isinf(float(norm[i]))
            continue
        terms = _exact_rows(layers, i)
        exact2 = sum((t * t for t in terms), Fraction(0))
        used = Fraction(float(norm[i]))
        assert used * used >= exact2  # the norm used bounds the exact one ...
        if exact2 > 0:  # ... tightly (a few float64 ulps plus γ_{b+2})
            assert float(used * used / exact2) <= 1 + 1e-13
        ci = Fraction(float(c[i]))
        assert ci <= 1
        assert ci * used <= Fraction(bounds[i])  # c_i·N_i ≤ C_i: the record adds less than C_i
        expected = [e + ci * t for e, t in zip(expected, terms, strict=True)]
        scale = [s + abs(ci * t) for s, t in zip(scale, terms, strict=True)]
    # the float64 sum is Σ_i c_i G_i up to the rounding of b products and sums per coordinate
    for got, want, s in zip(flat.tolist(), expected, scale, strict=True):
        assert math.isfinite(got)
        assert abs(Fraction(got) - want) <= s * Fraction(1e-14) + Fraction(1e-300)


@settings(max_examples=60, deadline=None)
@given(case=_chunk())
def test_numpy_and_torch_compact_paths_agree(case):
    layers, bound = case
    flat_np, norm_np, c_np, bad_np = _run(_clip_linear_np, layers, bound)
    flat_t, norm_t, c_t, bad_t = _run(_clip_linear_torch, layers, bound)
    assert (bad_np is None) == (bad_t is None)
    if bad_np is not None and bad_t is not None:
        assert torch.equal(bad_np, bad_t)
    assert norm_np.dtype == norm_t.dtype == c_np.dtype == torch.float64
    torch.testing.assert_close(norm_np, norm_t, rtol=1e-14, atol=0)
    torch.testing.assert_close(c_np, c_t, rtol=1e-14, atol=0)
    # the sums agree to the rounding of Σ_i c_i |G_i| (records may cancel each other)
    scale = _run(_clip_linear_torch, [(m, a.abs(), g.abs()) for m, a, g in layers], bound)[0]
    assert bool(((flat_np - flat_t).abs() <= 1e-14 * scale + 1e-300).all())


def test_cpu_tensors_take_the_numpy_path(monkeypatch):
    import pdpfl.dp.linear as lin

    m = nn.Linear(3, 1)
    layers = [(m, torch.randn(4, 3).double(), torch.randn(4, 1).double())]
    seen = []
    monkeypatch.setattr(lin, "_clip_linear_np", lambda *a: seen.append("np") or
                        _clip_linear_np(*a))  # fmt: skip
    flat, norm, c, bad = _run(clip_linear, layers, 1.0)
    assert seen == ["np"] and bad is None and norm.shape == (4,)
    # what the sum holds: Σ_i c_i·(g_i a_iᵀ, g_i)
    a, g = layers[0][1], layers[0][2]
    want = torch.cat([(c[:, None] * g).T @ a, (c[:, None] * g).sum(0, keepdim=True).T], 1)
    torch.testing.assert_close(flat, want.flatten(), rtol=1e-14, atol=0)
    assert np.all(c.numpy() <= 1.0)


def test_per_record_bounds_through_clipped_grad_sum_match_the_func_back_end():
    """The individual filter's per-record bounds reach the compact path as a tensor: the same
    clipped sum as the generic torch.func back-end (float32 per-sample gradients)."""
    from pdpfl.dp import clipped_grad_sum
    from pdpfl.models import create_model, loss_fn

    torch.manual_seed(1)
    model = create_model("mlp", (5,), 3, hidden=(4,))
    x, y = torch.randn(9, 5) * 3, torch.randint(0, 3, (9,))
    bounds = torch.linspace(0.01, 2.0, 9, dtype=torch.float64)
    fast = clipped_grad_sum(model, x, y, loss_fn, bounds, method="hooks", physical_batch_size=4)
    ref = clipped_grad_sum(model, x, y, loss_fn, bounds, method="func", physical_batch_size=4)
    assert bool((fast.factors * fast.norms <= bounds).all())
    torch.testing.assert_close(fast.norms, ref.norms, rtol=1e-5, atol=0)
    got = torch.cat([s.flatten() for s in fast.sums])
    want = torch.cat([s.flatten() for s in ref.sums])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
