"""Random streams after the fused noise draw (issue #26): same distribution, same semantics.

* secure: N(0, 1) normals (sum of four Box–Muller normals / 2) from a per-party ChaCha20 key
  that is never derived from the seed; the numpy path (few normals) and the torch path (many)
  draw the same distribution; the tail refinement keeps it exact;
* reproducible: ``normals(shapes)`` is exactly the concatenation of ``normal(shape)`` draws, so
  the simulator and Flower (and the attack tests) regenerate the same numbers from the seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from pdpfl import randomness
from pdpfl.randomness import (
    SecureRandomness,
    SeededRandomness,
    draw_normals,
    make_randomness,
    stream_from_generator,
)


@pytest.mark.parametrize("n", [700, 20_000])  # numpy path, torch path
def test_secure_normals_are_standard_normal(n):
    z = SecureRandomness().stream("t").normal((n,))
    assert z.dtype == torch.float64 and z.shape == (n,)
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-3
    # independent coordinates
    assert abs(float(np.corrcoef(z[:-1].numpy(), z[1:].numpy())[0, 1])) < 5 / math.sqrt(n)


def test_numpy_and_torch_paths_share_the_keystream_layout():
    """Same key, same stream: the few-normals numpy path and the torch path give the same
    numbers up to the last bits of log/cos/sin."""
    key = bytes(range(32))
    a = SecureRandomness(key=key).stream("p", 1)._standard_normals_np(500)  # type: ignore[attr-defined]
    s = SecureRandomness(key=key).stream("p", 1)
    old = randomness._NUMPY_NORMALS
    randomness._NUMPY_NORMALS = 0
    try:
        b = s.normal((500,)).numpy()
    finally:
        randomness._NUMPY_NORMALS = old
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_words_are_the_chacha20_keystream_read_in_order(monkeypatch):
    """The reused-buffer reads (blocks of ``_ZERO_WORDS``) give exactly the ChaCha20
    keystream of the stream's subkey, read sequentially across calls and block boundaries."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    monkeypatch.setattr(randomness, "_ZERO_WORDS", 1000)
    key, sizes = bytes(range(32)), [3, 2500, 1000, 7]
    s = SecureRandomness(key=key).stream("w", 4)
    got = np.concatenate([s._words_np(n) for n in sizes])  # type: ignore[attr-defined]
    subkey = randomness.hashlib.blake2b(
        randomness._stream_message("w", (4,)), key=key, digest_size=32, person=b"pdpfl-rng-v1"
    ).digest()
    enc = Cipher(algorithms.ChaCha20(subkey, bytes(16)), mode=None).encryptor()
    ref = np.frombuffer(enc.update(bytes(8 * sum(sizes))), dtype=np.uint64) >> np.uint64(11)
    np.testing.assert_array_equal(got, ref.astype(np.int64))


def test_scratch_buffers_never_leak_into_returned_normals():
    """Draws reuse this thread's scratch buffer: earlier results must stay untouched."""
    s = SecureRandomness().stream("scratch")
    a = s.normal((5000,))
    kept = a.clone()
    b = s.normal((5000,))
    u = s.uniform(5000)
    assert torch.equal(a, kept) and not torch.equal(a, b)
    assert a.data_ptr() != b.data_ptr() and u.min() > 0 and u.max() < 1


@pytest.mark.parametrize("path", ["numpy", "torch"])
def test_tail_refinement_keeps_the_distribution(monkeypatch, path):
    """Refine every radius uniform below 1/2 (instead of 2⁻³⁰): by the memoryless property the
    normals stay N(0, 1) -- the rare tail branch exercised on every other draw."""
    monkeypatch.setattr(randomness, "_TAIL_CUT", 0.5)
    monkeypatch.setattr(randomness, "_TAIL_SHIFT", math.log(2.0))
    if path == "torch":
        monkeypatch.setattr(randomness, "_NUMPY_NORMALS", 0)
    z = SecureRandomness().stream("tail").normal((1500,)).numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(float(z.var()) - 1.0) < 0.15


def test_secure_normals_on_a_device_argument():
    s = SecureRandomness().stream("d")
    z = s.normal((3, 4), device="cpu")
    assert z.shape == (3, 4) and z.device.type == "cpu"
    flat = s.normals([(2, 3), (5,), ()], device=torch.device("cpu"))  # type: ignore[attr-defined]
    assert flat.shape == (12,) and bool(torch.isfinite(flat).all())
    assert s.normal((0, 3)).shape == (0, 3)


def test_reproducible_normals_equal_per_shape_draws():
    shapes = [(16, 1, 8, 8), (16,), (32, 512), (10,)]
    a = SeededRandomness(7).stream("local-training", 2, 1)
    b = SeededRandomness(7).stream("local-training", 2, 1)
    flat = a.normals(shapes, device="cpu")  # type: ignore[attr-defined]
    ref = torch.cat([b.normal(s).reshape(-1) for s in shapes])
    assert torch.equal(flat, ref)
    # a stream without `normals`: draw_normals falls back to one `normal` per shape
    fallback = draw_normals(_PlainStream(torch.Generator().manual_seed(3)), shapes)
    plain = _PlainStream(torch.Generator().manual_seed(3))
    assert torch.equal(fallback, torch.cat([plain.normal(s).reshape(-1) for s in shapes]))
    seeded = draw_normals(stream_from_generator(torch.Generator().manual_seed(3)), shapes)
    assert torch.equal(seeded, fallback)  # the seeded stream draws per shape too


class _PlainStream:
    """A RandomStream with only the protocol's two methods."""

    def __init__(self, gen: torch.Generator) -> None:
        self.gen = gen

    def uniform(self, n: int) -> np.ndarray:
        return torch.rand(n, generator=self.gen, dtype=torch.float64).numpy()

    def normal(self, shape) -> torch.Tensor:
        return torch.randn(tuple(shape), generator=self.gen, dtype=torch.float64)


def test_secure_key_is_fresh_per_party_and_never_from_the_seed():
    """Two parties built with the same configuration (seed included) draw different noise;
    the reproducible mode with that seed draws neither."""
    a = make_randomness("secure", seed=5).stream("local-training", 0, 0).normal((64,))
    b = make_randomness("secure", seed=5).stream("local-training", 0, 0).normal((64,))
    c = make_randomness("reproducible", seed=5).stream("local-training", 0, 0).normal((64,))
    assert not torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(b, c)
    # same key, same purpose and indices: the same stream (derivation is deterministic)
    key = bytes(32)
    s1 = SecureRandomness(key=key).stream("x", 1, 2).normal((8,))
    s2 = SecureRandomness(key=key).stream("x", 1, 2).normal((8,))
    s3 = SecureRandomness(key=key).stream("x", 2, 1).normal((8,))
    assert torch.equal(s1, s2) and not torch.equal(s1, s3)
