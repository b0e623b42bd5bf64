"""The cryptographic building blocks: key agreement, masks, the fixed-point ring, Paillier,
multi-exponentiation and the parallel runner.

Paillier properties that do not depend on the key size are tested with 1024-bit keys (fast);
test_private_weighting.py runs the protocol once with a 3072-bit key.
"""

from __future__ import annotations

import pickle

import gmpy2
import numpy as np
import pytest
from gmpy2 import mpz
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.crypto import IntegrityError, RingOverflowError
from pdpfl.crypto import parallel as par
from pdpfl.crypto.fixedpoint import FixedPointRing
from pdpfl.crypto.keys import (
    agree,
    context,
    mask_integers,
    mask_words,
    new_private_key,
    open_sealed,
    public_bytes,
    seal,
)
from pdpfl.crypto.multiexp import FixedBaseExp, MultiExp, choose_window, plan_multiexp
from pdpfl.crypto.paillier import PaillierPublicKey, generate_keypair


@pytest.fixture(scope="module")
def keypair():
    return generate_keypair(1024, allow_weak=True)


# ------------------------------------------------------------------------------ keys


def test_x25519_agreement_is_symmetric_and_bound_to_its_context() -> None:
    a, b, c = new_private_key(), new_private_key(), new_private_key()
    info = context("test", 3, b"x")
    k_ab = agree(a, public_bytes(b), info)
    assert k_ab == agree(b, public_bytes(a), info) and len(k_ab) == 32
    assert agree(a, public_bytes(b), context("test", 4, b"x")) != k_ab  # another round
    assert agree(a, public_bytes(c), info) != k_ab  # another peer
    with pytest.raises(IntegrityError, match="32 bytes"):
        agree(a, b"short", info)
    with pytest.raises(IntegrityError, match="rejected"):
        agree(a, bytes(32), info)  # a low-order point (all-zero shared secret)


def test_context_is_unambiguous() -> None:
    assert context(b"ab", b"c") != context(b"a", b"bc")
    assert context(1) != context(b"\x01")


def test_masks_are_keyed_streams() -> None:
    k1, k2 = bytes(range(32)), bytes(range(1, 33))
    a = mask_words(k1, 1000)
    assert a.dtype == np.uint64 and np.array_equal(a, mask_words(k1, 1000))
    assert not np.array_equal(a, mask_words(k2, 1000))
    # roughly uniform top bits (a keystream, not zeros): mean of bit 63 near 1/2
    assert 0.4 < float(np.mean(a >> np.uint64(63))) < 0.6
    mod = (1 << 200) + 235
    ints = mask_integers(k1, 500, mod)
    assert all(0 <= v < mod for v in ints) and len(set(ints)) == 500
    assert max(ints) > mod // 2  # covers the range


def test_sealed_messages_detect_tampering_and_wrong_keys() -> None:
    key = bytes(32)
    blob = seal(key, b"shared seed R", b"aad")
    assert open_sealed(key, blob, b"aad") == b"shared seed R"
    bad = bytearray(blob)
    bad[-1] ^= 1
    with pytest.raises(IntegrityError, match="authentication failed"):
        open_sealed(key, bytes(bad), b"aad")
    with pytest.raises(IntegrityError):
        open_sealed(bytes([1] * 32), blob, b"aad")
    with pytest.raises(IntegrityError):
        open_sealed(key, blob, b"other aad")
    assert seal(key, b"x", b"") != seal(key, b"x", b"")  # fresh nonce


# ------------------------------------------------------------------------------ fixed point


@given(
    st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=1, max_size=30),
    st.integers(1, 12),
    st.integers(8, 40),
)
def test_ring_sum_equals_the_real_sum_within_the_stated_precision(
    values: list[float], parties: int, bits: int
) -> None:
    ring = FixedPointRing(bits)
    rng = np.random.default_rng(len(values) + parties)
    xs = [np.asarray(values) * rng.uniform(-1, 1) for _ in range(parties)]
    if max(float(np.max(np.abs(x))) for x in xs) > ring.max_abs(parties):
        with pytest.raises(RingOverflowError):
            for x in xs:
                ring.encode(x, parties)
        return
    total = np.zeros(len(values), dtype=np.uint64)
    for x in xs:
        total += ring.encode(x, parties)
    exact = np.sum(xs, axis=0)
    assert np.all(np.abs(ring.decode(total, parties) - exact) <= ring.precision(parties) + 1e-9)


def test_ring_overflow_and_garbage_are_clear_errors() -> None:
    ring = FixedPointRing(32)
    limit = ring.max_abs(10)
    assert limit == pytest.approx(2.0**23 / 10, rel=1e-6)
    ring.encode(np.array([limit * 0.999]), 10)
    with pytest.raises(RingOverflowError, match="secure.fractional_bits = 32"):
        ring.encode(np.array([limit * 1.01]), 10, what="silo 3: update")
    with pytest.raises(RingOverflowError, match="NaN"):
        ring.encode(np.array([np.nan]), 2)
    garbage = np.random.default_rng(0).integers(0, 2**63, size=32, dtype=np.uint64) * np.uint64(2)
    with pytest.raises(IntegrityError, match="did not cancel"):
        ring.decode(garbage, 3)
    with pytest.raises(ValueError, match="secure.fractional_bits"):
        FixedPointRing(60)


# ------------------------------------------------------------------------------ Paillier


def test_key_generation_gives_an_exact_size_and_refuses_weak_keys(keypair) -> None:
    pk, sk = keypair
    assert pk.bits == 1024
    with pytest.raises(ValueError, match="3072"):
        generate_keypair(1024)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(sk)
    assert PaillierPublicKey.from_bytes(pk.to_bytes()) == pk
    assert pk.fingerprint() != generate_keypair(1024, allow_weak=True)[0].fingerprint()


@settings(max_examples=30)
@given(st.integers(-(2**200), 2**200), st.integers(-(2**200), 2**200), st.integers(-(2**40), 2**40))
def test_paillier_is_additively_homomorphic(keypair, a: int, b: int, k: int) -> None:
    pk, sk = keypair
    n = int(pk.n)
    ca, cb = pk.encrypt(a), sk.encrypt(b)  # both encryption paths
    assert sk.decrypt(ca) == a % n and sk.decrypt(cb) == b % n
    assert sk.decrypt(pk.add(ca, cb)) == (a + b) % n
    assert sk.decrypt(pk.add_plain(ca, b)) == (a + b) % n
    assert sk.decrypt(pk.mul_plain(ca, k)) == (a * k) % n


def test_paillier_matches_python_paillier(keypair) -> None:
    """Ciphertexts made by python-paillier (an independent implementation, g = n + 1 too)
    under our public key decrypt correctly with our CRT decryption."""
    phe = pytest.importorskip("phe")
    pk, sk = keypair
    ppk = phe.PaillierPublicKey(int(pk.n))
    for m in (0, 1, 12345, int(pk.n) - 7):
        c = ppk.raw_encrypt(m)
        assert sk.decrypt(mpz(c)) == m


def test_ciphertexts_are_fixed_width_and_validated(keypair) -> None:
    pk, sk = keypair
    cts = [pk.encrypt(i) for i in range(3)]
    blob = pk.ciphertexts_to_bytes(cts)
    assert len(blob) == 3 * pk.ciphertext_bytes
    assert pk.ciphertexts_from_bytes(blob, 3) == cts
    with pytest.raises(IntegrityError, match="expected 4"):
        pk.ciphertexts_from_bytes(blob, 4)
    too_big = int(pk.n2 + 5).to_bytes(pk.ciphertext_bytes, "little")
    with pytest.raises(IntegrityError, match="not a valid ciphertext"):
        pk.ciphertexts_from_bytes(too_big)
    non_unit = int(pk.n).to_bytes(pk.ciphertext_bytes, "little")
    with pytest.raises(IntegrityError):
        pk.ciphertexts_from_bytes(non_unit, check_units=True)


# ------------------------------------------------------------------------------ arithmetic


@given(
    st.integers(1, 6), st.integers(1, 5), st.integers(1, 9), st.booleans(), st.integers(0, 2**40)
)
def test_multiexp_equals_the_naive_products(
    u: int, d: int, window: int, signed: bool, seed: int
) -> None:
    mod = mpz((1 << 127) - 1) * mpz((1 << 89) - 1)
    rng = np.random.default_rng(seed)
    bases = [mpz(int(x)) for x in rng.integers(2, 2**62, size=u)]
    exps = rng.integers(-(2**36), 2**36, size=(u, d))
    exps[rng.uniform(size=(u, d)) < 0.2] = 0
    got = MultiExp(bases, mod, window, signed).products(exps)
    for j in range(d):
        want = mpz(1)
        for i in range(u):
            e = int(exps[i, j])
            b = bases[i] if e >= 0 else gmpy2.invert(bases[i], mod)
            want = want * gmpy2.powmod(b, abs(e), mod) % mod
        assert got[j] == want


def test_fixed_base_exponentiation_and_window_choice() -> None:
    mod = mpz((1 << 521) - 1)
    fb = FixedBaseExp(mpz(3), mod, 256, FixedBaseExp.best_window(256, 100))
    rng = np.random.default_rng(1)
    for _ in range(20):
        k = int.from_bytes(rng.bytes(32), "little")
        assert fb.pow(k) == gmpy2.powmod(3, k, mod)
    with pytest.raises(ValueError):
        fb.pow(1 << 256)
    # bigger jobs get bigger windows (and signed tables); memory is capped
    assert plan_multiexp(100, 14, 37, 6144)[1] is False
    assert plan_multiexp(10, 10**5, 37, 6144, reuse=100)[1] is True
    assert choose_window(10, 16, 35, 6144) <= choose_window(10, 20000, 35, 6144, reuse=10)
    w, signed = plan_multiexp(100, 10**6, 35, 6144, memory_cap=2**20)
    assert 100 * (2 if signed else 1) * (1 << w) * (6144 // 8 + 32) <= 2**20


def _square_chunk(shared: int, chunk: range) -> list[int]:
    return [shared * i * i for i in chunk]


def test_parallel_runner_equals_the_sequential_one() -> None:
    chunks = par.split(10, 2)
    assert [list(c) for c in chunks] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert par.split(1, 4) == [range(0, 1)]
    seq = par.run_chunks(_square_chunk, 3, chunks, 1)
    assert par.run_chunks(_square_chunk, 3, chunks, 2) == seq
    assert par.worth_parallel(10, 2) == 1 and par.worth_parallel(1e9, 2) == 2
    with pytest.raises(ValueError, match="secure.workers"):
        par.resolve_workers(0)
