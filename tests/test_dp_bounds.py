"""Rigorous float32 bounds of the fast clipping path (issue #26): properties, adversarial inputs.

Every bound is checked against an exact reference: squares of float32 numbers are exact in
float64 and ``math.fsum`` sums them with one rounding, so ``sqrt(fsum(x²))`` is the exact norm to
1 ulp of float64; per-sample gradients are compared with float64 products of the same stored
float32 values (exact to ~1e-16 relative of Σ|terms|).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from pdpfl.dp import bookkeeping, clipped_grad_sum, im2col
from pdpfl.dp.bounds import U32, float32_is_ieee, gamma, norm_bounds
from pdpfl.dp.grad_sample import F32_ACCURACY, _hook_chunk

torch.set_num_threads(2)

MAGNITUDES = [1e-42, 1e-30, 1e-12, 1e-3, 1.0, 1e3, 1e12, 1e18]


def _exact_norms(x: torch.Tensor) -> np.ndarray:
    rows = x.detach().double().reshape(x.shape[0], -1).numpy()
    return np.array([math.sqrt(math.fsum(float(v) * float(v) for v in r)) for r in rows])


@st.composite
def _rows(draw):
    b = draw(st.integers(1, 4))
    n = draw(st.sampled_from([1, 3, 127, 128, 129, 300, 4096]))
    scales = draw(st.lists(st.sampled_from(MAGNITUDES), min_size=b, max_size=b))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n, generator=g, dtype=torch.float64)
    x = x * torch.tensor(scales, dtype=torch.float64)[:, None]
    if draw(st.booleans()):  # one huge element next to tiny ones
        x[:, 0] = x[:, 0].sign() * 1e18
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    return x.to(dtype)


@settings(max_examples=60, deadline=None)
@given(x=_rows(), tile=st.integers(1, 3))
def test_norm_bounds_never_below_the_exact_norm(x, tile):
    x = x.repeat(1, tile)  # longer rows: the two-level path
    est, up = norm_bounds(x)
    exact = _exact_norms(x)
    assert up.dtype == torch.float64 and est.dtype == torch.float64
    assert bool((up.numpy() >= exact * (1 - 2**-50)).all())
    # tight when the squares are normal float32 numbers (else only an absolute ~1e-22 slack)
    peak = x.detach().abs().reshape(x.shape[0], -1).amax(1).double().numpy()
    normal = (peak > 1e-15) & (peak < 1e15)
    rel = (up.numpy()[normal] - exact[normal]) / exact[normal]
    assert bool((rel <= 5e-5).all())
    assert np.allclose(est.numpy()[normal], exact[normal], rtol=1e-5)


def test_norm_bounds_non_finite_rows_and_overflowing_squares():
    x = torch.ones(4, 300)
    x[1, 5] = float("inf")
    x[2, 7] = float("nan")
    x[3] = 3e38  # finite, but its squares overflow in float32
    _, up = norm_bounds(x)
    assert bool(torch.isfinite(up[0])) and not bool(torch.isfinite(up[1:3]).any())
    assert not bool(torch.isfinite(up[3])) or float(up[3]) >= 3e38 * math.sqrt(300)


def test_gamma_refuses_meaningless_lengths():
    assert gamma(10, U32) == pytest.approx(10 * U32, rel=1e-6)
    with pytest.raises(ValueError, match="too large"):
        gamma(2**23, U32)


def test_float32_is_ieee_follows_the_global_switches():
    assert float32_is_ieee("cpu")
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")  # would allow bfloat16 products
        assert not float32_is_ieee("cpu")
    finally:
        torch.set_float32_matmul_precision(old)
    assert float32_is_ieee("cpu")


# -- float32 per-sample gradients: the bound covers the exact gradient and what is added -------


def _layer(kind: str) -> tuple[nn.Module, tuple[int, ...]]:
    if kind == "conv-L196":  # the MNIST CNN's first layer: 196 positions per product
        return nn.Conv2d(1, 4, 8, stride=2, padding=3), (1, 28, 28)
    if kind == "conv-L25":
        return nn.Conv2d(3, 5, 4, stride=2), (3, 13, 13)
    if kind == "conv-even":  # no padding, 64 positions: constant patches cancel exactly
        return nn.Conv2d(2, 4, 3), (2, 10, 10)
    if kind == "conv1d":
        return nn.Conv1d(2, 3, 3, padding=1), (2, 40)
    return nn.Linear(6, 5), (30, 6)  # a sequence Linear: 30 positions


def _cancelling(shape, out_shape, scale, gscale, gen):
    """Inputs equal at every position and backprops alternating in sign: Σ_t g_t u_tᵀ ≈ 0."""
    x = torch.randn(shape[:1], generator=gen).reshape(-1, *([1] * (len(shape) - 1)))
    x = x.expand(shape).clone() * scale
    v = torch.randn(out_shape[:1], generator=gen).reshape(-1, *([1] * (len(out_shape) - 1)))
    sign = (torch.arange(math.prod(out_shape[1:])) % 2 * 2 - 1).reshape(out_shape[1:])
    y = (v * sign).expand(out_shape).clone() * gscale
    return x, y + 1e-4 * gscale * torch.randn(out_shape, generator=gen)


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(["conv-L196", "conv-L25", "conv-even", "conv1d", "seq-linear"]),
    scale=st.sampled_from([1e-20, 1e-3, 1.0, 1e4, 1e12]),
    gscale=st.sampled_from([1e-6, 1.0, 1e3]),
    pattern=st.sampled_from(["random", "cancel"]),
    seed=st.integers(0, 2**16),
    channels_last=st.booleans(),
)
@example(kind="conv-L196", scale=1e4, gscale=1e3, pattern="cancel", seed=0, channels_last=False)
@example(kind="conv-L25", scale=1e4, gscale=1e3, pattern="cancel", seed=0, channels_last=True)
def test_float32_parts_bound_the_exact_gradient_and_what_is_added(
    kind, scale, gscale, pattern, seed, channels_last
):
    """For every float32 part: up ≥ ‖exact G‖, up ≥ ‖Ĝ‖ (what is added) and ‖Ĝ − G‖ ≤ err;
    ``channels_last``: the recorded 2-D convolution tensors are stored NHWC (the MNIST CNN's
    conv2), read by the norms and the im2col gather in that memory order."""
    layer, shape = _layer(kind)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        out_shape = tuple(layer(torch.zeros(1, *shape)).shape[1:])
    if pattern == "random":
        a = torch.randn(3, *shape, generator=gen) * scale
        g = torch.randn(3, *out_shape, generator=gen) * gscale
    else:
        rows = [_cancelling(shape, out_shape, scale, gscale, gen) for _ in range(3)]
        a, g = torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
    a, g = a.float(), g.float()
    if channels_last and a.dim() == 4:
        a = a.contiguous(memory_format=torch.channels_last)
        g = g.contiguous(memory_format=torch.channels_last)
        assert im2col.channels_last(g)
    parts = bookkeeping.layer_parts(layer, a, g, torch.float32, materialise=True)
    exact = bookkeeping.layer_parts(layer, a.double(), g.double(), torch.float64, True)
    for p32, p64 in zip(parts, exact, strict=True):
        assert p32.grads is not None and p64.grads is not None
        ref = p64.grads  # float64 products of the same stored values
        ref_norm = torch.linalg.vector_norm(ref, dim=1)
        # the float64 reference is itself within γ₆₄·Σ|terms|: allow that, nothing more
        slack = 1e-12 * (p64.up + ref_norm)
        finite = torch.isfinite(p32.up)
        assert bool((p32.up[finite] >= ref_norm[finite] - slack[finite]).all())
        added = torch.linalg.vector_norm(p32.grads.double(), dim=1)
        assert bool((p32.up[finite] >= added[finite]).all())
        if p32.err is not None:
            dist = torch.linalg.vector_norm(p32.grads.double() - ref, dim=1)
            assert bool((dist[finite] <= p32.err[finite] + slack[finite]).all())


@settings(max_examples=20, deadline=None)
@given(
    kind=st.sampled_from(["conv-L196", "conv-even"]),
    scale=st.sampled_from([1e-6, 1.0, 1e3, 1e6]),
    gscale=st.sampled_from([1e-3, 1.0, 30.0]),
    C=st.sampled_from([1e-4, 1e-2, 1.0, 1e3]),
    seed=st.integers(0, 2**16),
)
def test_float32_path_never_lets_a_clipped_record_exceed_C(kind, scale, gscale, C, seed):
    """Each record alone (what it adds is then the whole sum) adds at most C, cancelling
    records included; kept float32 records are within F32_ACCURACY of their exact gradient."""
    layer, shape = _layer(kind)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        out_shape = tuple(layer(torch.zeros(1, *shape)).shape[1:])
    rows = [_cancelling(shape, out_shape, scale, gscale, gen) for _ in range(2)]
    rows.append((torch.randn(shape, generator=gen) * scale,
                 torch.randn(out_shape, generator=gen) * gscale))  # fmt: skip
    for x, y in rows:
        res = clipped_grad_sum(layer, x[None].float(), y[None].float(), _linear_loss, C)
        added = float(torch.cat([s.flatten() for s in res.sums]).norm())
        assert added <= C * (1 + 1e-9)


def _linear_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (out * y.to(out.dtype)).flatten(1).sum(1).mean()


def test_ambiguous_records_take_the_float64_path_and_ordinary_ones_do_not():
    """The fallback: a cancelling record's float32 bound cannot decide, so the record is
    recomputed in float64; an ordinary record keeps float32; a float64 model never redoes."""
    layer, shape = _layer("conv-even")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        out_shape = tuple(layer(torch.zeros(1, *shape)).shape[1:])
    crafted = _cancelling(shape, out_shape, 1e3, 1.0, gen)
    x = torch.stack([torch.randn(shape, generator=gen), crafted[0]]).float()
    y = torch.stack([torch.randn(out_shape, generator=gen), crafted[1]]).float()
    chunk = _hook_chunk(layer, x, y, _linear_loss, materialise=False)
    assert chunk.redo is not None and all(p.fast for p in chunk.parts)
    est2 = sum(p.est.square() for p in chunk.parts)
    err2 = sum(p.err.square() for p in chunk.parts if p.err is not None)
    assert float(err2[0]) <= F32_ACCURACY**2 * float(est2[0])  # decided in float32
    assert float(err2[1]) > F32_ACCURACY**2 * float(est2[1])  # ambiguous
    redone: list[int] = []
    inner = chunk.redo

    def spy(idx):
        redone.extend(idx.tolist())
        return inner(idx)

    chunk.redo = spy
    from pdpfl.dp.grad_sample import _clip_chunk

    sums = [torch.zeros(p.shape, dtype=torch.float64) for p in layer.parameters()]
    index = {id(p): k for k, p in enumerate(layer.parameters())}
    norms, factors, _ = _clip_chunk(chunk, torch.full((2,), 0.1, dtype=torch.float64), sums, index)
    assert redone == [1]
    # the float64 bound of the crafted record is used: above its exact gradient norm and tight
    exact = bookkeeping.layer_parts(layer, x[1:].double(), y[1:].double(), torch.float64, True)
    ref = math.sqrt(sum(float(p.est[0]) ** 2 for p in exact))
    assert ref <= float(norms[1]) <= ref * (1 + 1e-7)
    assert float(factors[1]) * ref <= 0.1
    # a float64 model takes the float64 path from the start
    chunk64 = _hook_chunk(layer.double(), x.double(), y.double(), _linear_loss, False)
    assert chunk64.redo is None and not any(p.fast for p in chunk64.parts)


def test_tf32_like_switches_send_everything_to_float64():
    layer, shape = _layer("conv-L25")
    x, y = torch.randn(3, *shape), torch.randn(3, 5, 5, 5)
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        chunk = _hook_chunk(layer, x, y, _linear_loss, materialise=False)
    finally:
        torch.set_float32_matmul_precision(old)
    assert chunk.redo is None and not any(p.fast for p in chunk.parts)


@settings(max_examples=30, deadline=None)
@given(
    k=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    d=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    p=st.tuples(st.integers(0, 2), st.integers(0, 2)),
    s=st.tuples(st.integers(1, 3), st.integers(1, 3)),
)
def test_patch_gather_and_norm_bound_match_the_unfolded_matrix(k, d, p, s):
    a = torch.randn(3, 2, 7, 8, dtype=torch.float64)
    geometry = (k, d, p, s)
    u = im2col.unfold_rows(a, *geometry)
    out = torch.empty(u.shape, dtype=torch.float32)
    im2col.patches_into(a, geometry, out)
    torch.testing.assert_close(out, u.float())
    nhwc = a.contiguous(memory_format=torch.channels_last)  # gathered in its memory order
    out.fill_(float("nan"))
    im2col.patches_into(nhwc, geometry, out)
    torch.testing.assert_close(out, u.float())
    for dtype in (torch.float64, torch.float32):
        ad = a.to(dtype)
        bound = bookkeeping._patch_norm_bounds(ad, geometry)
        for layout in (ad, ad.contiguous(memory_format=torch.channels_last)):
            rows = torch.linalg.vector_norm(im2col.memory_rows(layout), dim=2)
            torch.testing.assert_close(
                bookkeeping._patch_norm_bounds(layout, geometry, rows), bound, rtol=1e-5, atol=0
            )
        exact = torch.tensor(_exact_norms(im2col.unfold_rows(a.to(dtype), *geometry)))
        assert bool((bound >= exact).all())
    # with every input element covered equally often the bound is tight
    flat = torch.ones(2, 3, 8, 8, dtype=torch.float64)
    g2 = ((2, 2), (1, 1), (0, 0), (2, 2))  # non-overlapping 2x2 patches: coverage 1
    exact = torch.tensor(_exact_norms(im2col.unfold_rows(flat, *g2)))
    torch.testing.assert_close(bookkeeping._patch_norm_bounds(flat, g2), exact, rtol=1e-12, atol=0)


@settings(max_examples=40, deadline=None)
@given(
    c=st.integers(1, 3),
    q=st.integers(2, 3),
    sh=st.integers(1, 3),
    kw=st.integers(1, 4),
    sw=st.integers(1, 3),
    p=st.tuples(st.integers(0, 2), st.integers(0, 2)),
    cl=st.booleans(),
)
def test_row_patches_give_the_im2col_per_sample_gradients_within_the_float32_bound(
    c, q, sh, kw, sw, p, cl
):
    """Row-wise patches (kernel height q·s_h) form the per-sample weight gradients of full
    im2col: equal in float64, and in float32 within the γ_L‖g‖‖u‖ error term that the
    book-keeping charges (the exact gradient of the stored float32 values as reference)."""
    gen = torch.Generator().manual_seed(c * 1000 + q * 100 + sh * 10 + kw)
    b, cout, h, w = 3, 2, 9 + sh * q, 8 + kw
    geometry = ((q * sh, kw), (1, 1), p, (sh, sw))
    a = torch.randn(b, c, h, w, generator=gen, dtype=torch.float64)
    if cl:
        a = a.contiguous(memory_format=torch.channels_last)
    u = im2col.unfold_rows(a, *geometry)  # (b, L, C·kh·kw)
    ho = (h + 2 * p[0] - q * sh) // sh + 1
    L = u.shape[1]
    g = torch.randn(b, cout, L, generator=gen, dtype=torch.float64)
    full = torch.bmm(g, u)
    for dtype in (torch.float64, torch.float32):
        rows_n = (ho + q - 1) * (L // ho)
        buf = torch.full((b, rows_n, c * sh * kw), float("nan"), dtype=dtype)
        rows = im2col.row_patches_into(a.to(dtype), geometry, buf)
        scratch = torch.empty(q, b, cout, c * sh * kw, dtype=dtype)
        got = torch.full((b, cout, u.shape[2]), float("nan"), dtype=dtype)
        im2col.row_products(g.to(dtype), rows, geometry, ho, scratch, got)
        if dtype == torch.float64:
            torch.testing.assert_close(got, full, rtol=1e-12, atol=1e-12)
            continue
        exact = torch.bmm(g.float().double(), im2col.unfold_rows(a.float().double(), *geometry))
        dist = (got.double() - exact).flatten(1).norm(dim=1)
        budget = gamma(L, U32) * g.float().double().flatten(1).norm(dim=1)
        budget = budget * im2col.unfold_rows(a.float().double(), *geometry).flatten(1).norm(dim=1)
        assert bool((dist <= budget).all())


def test_row_patches_are_chosen_where_they_pay():
    """Row-wise patches for the MNIST CNN's conv1 (8×8, stride 2, one channel, 28×28), not for
    3×3 stride-1 kernels (narrow products), dilated, grouped or kh ≠ q·s_h convolutions."""
    conv1 = ((8, 8), (1, 1), (3, 3), (2, 2))
    assert im2col.row_patches((1, 28, 28), 16, conv1, 1)
    assert not im2col.row_patches((1, 28, 28), 16, conv1, 2)
    assert not im2col.row_patches((1, 28, 28), 16, ((8, 8), (2, 2), (3, 3), (2, 2)), 1)
    assert not im2col.row_patches((1, 28, 28), 16, ((7, 7), (1, 1), (3, 3), (2, 2)), 1)
    assert not im2col.row_patches((3, 32, 32), 32, ((3, 3), (1, 1), (0, 0), (1, 1)), 1)
    assert not im2col.row_patches((16, 13, 13), 32, ((4, 4), (1, 1), (0, 0), (2, 2)), 1)
    x = torch.zeros(2, 1, 28, 28)
    assert bookkeeping._patch_strategy(x, 16, conv1, 1) == "rows"
    nhwc = torch.zeros(2, 16, 13, 13).contiguous(memory_format=torch.channels_last)
    assert bookkeeping._patch_strategy(nhwc, 32, ((4, 4), (1, 1), (0, 0), (2, 2)), 1) == "nhwc"


def test_channels_last_convolutions_give_the_nchw_clipped_sum_and_per_sample_gradients():
    """A channels-last input takes the strided-copy patches and (Cout, kh, kw, Cin) rows; the
    clipped sum and the per-sample gradients are those of the same records stored NCHW."""
    from pdpfl.dp import per_sample_gradients

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.Tanh(), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 2)).double()  # fmt: skip
    x = torch.randn(6, 3, 9, 9, dtype=torch.float64)
    y = torch.randn(6, 2, dtype=torch.float64)
    nhwc = x.contiguous(memory_format=torch.channels_last)
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(im2col.channels_last(i[0])))
    a = clipped_grad_sum(model, x, y, _linear_loss, 0.05)
    b = clipped_grad_sum(model, nhwc, y, _linear_loss, 0.05)
    assert seen == [False, True]
    for s, t in zip(a.sums, b.sums, strict=True):
        torch.testing.assert_close(s, t, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(a.norms, b.norms, rtol=1e-12, atol=0)
    pa = per_sample_gradients(model, x, y, _linear_loss)
    pb = per_sample_gradients(model, nhwc, y, _linear_loss)
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-12, atol=1e-15)


# -- the compact path for small Linear layers (logistic regression, MLPs) --------------------


def test_small_linear_models_take_the_compact_path_and_match_the_exact_clipped_sum():
    """float32 MLP: the compact float64 path gives Σ_i c_i·(exact gradient of the recorded
    values) with norms that bound the exact ones; huge records are clipped, non-finite ones
    dropped, and each record alone adds at most C."""
    from pdpfl.models import create_model, loss_fn

    torch.manual_seed(0)
    model = create_model("mlp", (7,), 4)
    x = torch.randn(6, 7)
    x[1] *= 1e6  # a huge record: clipped
    x[4, 2] = float("nan")  # dropped
    y = torch.randint(0, 4, (6,))
    chunk = _hook_chunk(model, x, y, loss_fn, materialise=False)
    assert chunk.linear is not None and chunk.parts == []
    # exact per-sample gradients of the recorded float32 values (products exact in float64)
    grads = torch.stack(
        [torch.cat([torch.cat([torch.outer(g[i], a[i]).flatten(), g[i]])
                    for _, a, g in chunk.linear]) for i in range(6)]
    )  # fmt: skip
    C = 0.3
    res = clipped_grad_sum(model, x, y, loss_fn, C)
    keep = [0, 1, 2, 3, 5]
    assert res.factors[4] == 0 and math.isinf(float(res.norms[4]))
    exact = torch.tensor(_exact_norms(grads[keep]))
    assert bool((res.norms[keep] >= exact).all())
    torch.testing.assert_close(res.norms[keep], exact, rtol=1e-12, atol=0)
    assert float(exact[1]) > 1e3 * C and float(res.factors[1]) * float(exact[1]) <= C
    added = torch.cat([t.flatten() for t in res.sums])
    # `grads` lists weight then bias per layer: model.parameters() order
    assert [tuple(p.shape) for p in model.parameters()][:2] == [(64, 7), (64,)]
    expected = (res.factors[keep, None] * grads[keep]).sum(0)
    torch.testing.assert_close(added, expected, rtol=1e-12, atol=1e-15)
    for i in keep:  # each record alone adds at most C
        one = clipped_grad_sum(model, x[i : i + 1], y[i : i + 1], loss_fn, C)
        assert float(torch.cat([s.flatten() for s in one.sums]).norm()) <= C * (1 + 1e-9)


def test_large_or_float64_linear_layers_take_the_general_path():
    from pdpfl.dp.chunks import LINEAR_SMALL
    from pdpfl.models import loss_fn

    wide = nn.Sequential(nn.Flatten(), nn.Linear(LINEAR_SMALL // 8, 2))
    x, y = torch.randn(8, LINEAR_SMALL // 8), torch.randint(0, 2, (8,))
    assert _hook_chunk(wide, x, y, loss_fn, materialise=False).linear is None
    small = nn.Sequential(nn.Linear(5, 3)).double()
    x64, y3 = torch.randn(4, 5, dtype=torch.float64), torch.randint(0, 3, (4,))
    assert _hook_chunk(small, x64, y3, loss_fn, materialise=False).linear is None


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 30),
    n=st.integers(1, 120),
    block=st.sampled_from([1, 7, 2**10, 2**26]),
    seed=st.integers(0, 2**16),
)
def test_the_float64_weighted_sum_is_within_its_bound_for_any_block(b, n, block, seed):
    """Σ_b c_b G_b of float32 rows accumulated in float64 block by block (the CPU's
    cache-sized blocks, an accelerator's large ones) stays within the γ_{B+2} rounding bound of
    the exact (rational) sum, whatever the blocking."""
    from fractions import Fraction

    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(b, n, generator=g) * torch.logspace(-3, 3, b)[:, None]
    c = torch.rand(b, generator=g, dtype=torch.float64)
    out = torch.zeros(n, dtype=torch.float64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bookkeeping, "_SUM_BLOCK", block)
        mp.setattr(bookkeeping, "_SUM_BLOCK_DEVICE", block)
        bookkeeping._rows_dot_into(out, c, rows)
    cs, rs = c.tolist(), rows.double().tolist()
    bound = gamma(b + 2, 2.0**-53)
    for j in range(n):
        terms = [Fraction(cs[i]) * Fraction(rs[i][j]) for i in range(b)]
        err = abs(Fraction(float(out[j])) - sum(terms))
        assert err <= Fraction(bound) * sum(abs(t) for t in terms)
