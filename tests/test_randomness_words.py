"""``RandomStream.words``: the exact random bits integer samplers consume (issue #33).

* secure: the raw ChaCha20 keystream of the stream's subkey, in order, sharing the keystream
  with ``uniform`` (which keeps the top 53 bits of the same words) -- existing draws unchanged;
* reproducible: uniform 64-bit words from the seeded generator, replayable from the seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from pdpfl import randomness
from pdpfl.randomness import RandomStream, SecureRandomness, SeededRandomness


def _keystream(key: bytes, purpose: str, indices: tuple[int, ...], nbytes: int) -> np.ndarray:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    subkey = randomness.hashlib.blake2b(
        randomness._stream_message(purpose, indices),
        key=key,
        digest_size=32,
        person=b"pdpfl-rng-v1",
    ).digest()
    enc = Cipher(algorithms.ChaCha20(subkey, bytes(16)), mode=None).encryptor()
    return np.frombuffer(enc.update(bytes(nbytes)), dtype=np.uint64)


def test_secure_words_are_the_keystream_shared_with_uniform(monkeypatch):
    """words() reads the raw keystream in order across calls and block boundaries, and
    uniform() continues the same keystream with its top-53-bit uniforms (layout unchanged)."""
    monkeypatch.setattr(randomness, "_ZERO_WORDS", 1000)
    key = bytes(range(32))
    s = SecureRandomness(key=key).stream("w", 7)
    a = s.words(3)
    b = s.words(2500)
    u = s.uniform(5)
    ref = _keystream(key, "w", (7,), 8 * 2508)
    assert a.dtype == np.uint64 and b.dtype == np.uint64
    np.testing.assert_array_equal(np.concatenate([a, b]), ref[:2503])
    expected = ((ref[2503:] >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    np.testing.assert_array_equal(u, expected)


def test_existing_secure_draws_keep_their_outputs():
    """uniform() and normal() of a stream are what they were before words() existed: the
    uniforms are the keystream's top 53 bits, and a normal draw after words() starts where
    the words stopped."""
    key = bytes(range(1, 33))
    u = SecureRandomness(key=key).stream("u").uniform(64)
    ref = _keystream(key, "u", (), 8 * 64)
    np.testing.assert_array_equal(u, ((ref >> np.uint64(11)).astype(np.float64) + 0.5) * 2**-53)
    s1 = SecureRandomness(key=key).stream("n")
    s1.words(4)
    s2 = SecureRandomness(key=key).stream("n")
    s2.uniform(4)
    assert torch.equal(s1.normal((10,)), s2.normal((10,)))


@pytest.mark.parametrize("mode", ["secure", "reproducible"])
def test_words_are_uniform_bits(mode):
    """Every bit position is a fair coin and neighbouring words are uncorrelated."""
    s = SecureRandomness().stream("b") if mode == "secure" else SeededRandomness(3).stream("b")
    n = 20_000
    w = s.words(n)
    bits = (w[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    freq = bits.mean(axis=0)
    assert np.all(np.abs(freq - 0.5) < 5 * 0.5 / math.sqrt(n))
    lo = (w & np.uint64(0xFFFF)).astype(np.float64)
    assert abs(float(np.corrcoef(lo[:-1], lo[1:])[0, 1])) < 5 / math.sqrt(n)
    top = (w >> np.uint64(56)).astype(np.int64)  # the top byte: uniform on 0..255
    assert stats.chisquare(np.bincount(top, minlength=256)).pvalue > 1e-4


def test_reproducible_words_replay_from_the_seed():
    a = SeededRandomness(11).stream("r", 2).words(50)
    b = SeededRandomness(11).stream("r", 2).words(50)
    c = SeededRandomness(12).stream("r", 2).words(50)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("mode", ["secure", "reproducible"])
def test_words_argument_checks_and_protocol(mode):
    s = SecureRandomness().stream("c") if mode == "secure" else SeededRandomness(1).stream("c")
    assert isinstance(s, RandomStream)
    assert s.words(0).shape == (0,) and s.words(0).dtype == np.uint64
    with pytest.raises(ValueError, match="n: must be >= 0"):
        s.words(-1)


def test_a_stream_without_words_is_not_a_random_stream():
    class Old:
        def uniform(self, n: int) -> np.ndarray:
            return np.full(n, 0.5)

        def normal(self, shape: tuple[int, ...]) -> torch.Tensor:
            return torch.zeros(shape)

    assert not isinstance(Old(), RandomStream)
