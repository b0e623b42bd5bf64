"""Reused step buffers (``pdpfl.dp.workspace``, issue #26): a padded input written into a
reused buffer must equal ``F.pad`` whatever the sequence of block sizes and dtypes (the zero
border is written once; stale interiors of larger earlier blocks must never show)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.dp import im2col
from pdpfl.dp.workspace import Workspace, padded


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    ph=st.integers(0, 3),
    pw=st.integers(0, 3),
    dtypes=st.lists(st.sampled_from([torch.float32, torch.float64]), min_size=5, max_size=5),
)
def test_padded_buffer_equals_f_pad_for_any_sequence_of_blocks(sizes, ph, pw, dtypes):
    ws = Workspace()
    for b, dtype in zip(sizes, dtypes, strict=False):
        a = torch.randn(b, 2, 5, 4) * 1e3 + 7.0  # non-zero everywhere: a stale value shows
        want = F.pad(a, (pw, pw, ph, ph)).to(dtype)
        got = padded(a, ph, pw, dtype, ws)
        assert got.dtype == dtype and got.shape == want.shape
        assert torch.equal(got, want)
        assert torch.equal(padded(a, ph, pw, dtype, None), want)


def test_patch_gather_with_a_workspace_matches_the_unfolded_matrix():
    ws = Workspace()
    geometry = ((3, 2), (1, 1), (2, 1), (2, 1))
    for b in (4, 2, 5, 1):
        a = torch.randn(b, 3, 7, 6) + 1.0
        u = im2col.unfold_rows(a, *geometry)
        out = torch.empty(u.shape, dtype=torch.float32)
        im2col.patches_into(a, geometry, out, ws)
        torch.testing.assert_close(out, u, rtol=0, atol=0)
