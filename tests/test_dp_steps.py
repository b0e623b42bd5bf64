"""The DP step in parts (pdpfl.dp.steps): clipping of whole vectors, noise, normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.dp.steps import clip_vectors, noisy_normalised_sum, poisson_sample
from pdpfl.privacy.noise import GaussianNoise
from pdpfl.randomness import SecureRandomness, stream_from_generator


@settings(max_examples=40)
@given(
    scales=st.lists(st.sampled_from([0.0, 1e-30, 1e-6, 1.0, 1e6, 1e30]), min_size=1, max_size=6),
    C=st.sampled_from([1e-3, 1.0, 1e3]),
    seed=st.integers(0, 2**16),
)
def test_clip_vectors_bounds_every_unit(scales, C, seed):
    g = torch.Generator().manual_seed(seed)
    U = len(scales)
    s = torch.tensor(scales)
    a = torch.randn(U, 7, 3, generator=g) * s[:, None, None]
    b = torch.randn(U, 5, generator=g) * s[:, None]
    (ca, cb), factors = clip_vectors([a, b], C)
    assert ca.dtype == torch.float32
    norms = torch.cat([ca.double().flatten(1), cb.double().flatten(1)], 1).norm(dim=1)
    assert bool((norms <= C).all())
    orig = torch.cat([a.double().flatten(1), b.double().flatten(1)], 1).norm(dim=1)
    small = orig <= C
    torch.testing.assert_close(norms[small], orig[small], rtol=1e-6, atol=0)
    assert bool((factors <= 1).all())


def test_clip_vectors_non_finite_units_add_nothing():
    v = torch.ones(3, 4)
    v[1, 2] = float("inf")
    v[2, 0] = float("nan")
    (out,), factors = clip_vectors([v], 1.0)
    assert torch.equal(out[1:], torch.zeros(2, 4)) and factors[1:].tolist() == [0.0, 0.0]
    assert float(out[0].norm()) <= 1.0
    with pytest.raises(ValueError, match="max_norm"):
        clip_vectors([v], 0.0)


def test_noisy_normalised_sum_float64_and_dtypes():
    sums = [torch.zeros(3, 2, dtype=torch.float64), torch.ones(4, dtype=torch.float64)]
    out = noisy_normalised_sum(sums, None, 2.0, None, dtypes=[torch.float32, torch.float16])
    assert [o.dtype for o in out] == [torch.float32, torch.float16]
    assert torch.equal(out[1], torch.full((4,), 0.5, dtype=torch.float16))
    assert torch.equal(sums[1], torch.ones(4, dtype=torch.float64))  # the inputs are not touched
    stream = SecureRandomness().stream("t")
    noisy = noisy_normalised_sum([torch.zeros(20000)], GaussianNoise(3.0), 2.0, stream)[0]
    assert noisy.dtype == torch.float32
    assert float(noisy.std()) == pytest.approx(1.5, rel=0.03)
    share = noisy_normalised_sum([torch.zeros(20000)], GaussianNoise(3.0, 2.0, 4), 1.0, stream)[0]
    assert float(share.std()) == pytest.approx(3.0, rel=0.03)  # σC/√t
    with pytest.raises(ValueError, match="stream: .*required"):
        noisy_normalised_sum(sums, GaussianNoise(1.0), 1.0, None)
    with pytest.raises(ValueError, match="normalizer: must be"):
        noisy_normalised_sum(sums, GaussianNoise(1.0), -1.0, stream)
    with pytest.raises(ValueError, match="dtypes"):
        noisy_normalised_sum(sums, None, 1.0, None, dtypes=[torch.float32])


def test_poisson_sample_uses_the_stream():
    rates = np.array([0.0, 1.0, 0.5, 0.5])
    a = poisson_sample(rates, stream_from_generator(torch.Generator().manual_seed(4)))
    b = poisson_sample(rates, stream_from_generator(torch.Generator().manual_seed(4)))
    assert torch.equal(a, b) and 1 in a.tolist() and 0 not in a.tolist()
