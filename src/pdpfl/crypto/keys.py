"""Key agreement, key derivation, mask streams and sealing (``cryptography`` / OpenSSL).

* **X25519** (RFC 7748) key pairs: :func:`new_private_key` draws the private key from the
  operating system's CSPRNG; only the 32-byte public key ever leaves its owner.
* **HKDF-SHA256** (RFC 5869): :func:`agree` turns an X25519 shared secret into a 256-bit key for
  one purpose, bound by ``info`` to the protocol, session, round, attempt and the two parties, so
  that every (pair, round, attempt) gets an independent key.
* **ChaCha20** (RFC 7539) keystreams: :func:`mask_words` (uniform 64-bit words, the pairwise
  masks of the summation ring) and :func:`mask_integers` (integers uniform modulo a big modulus,
  by wide reduction: 128 extra bits, statistical distance below 2^-128). A key is used for one
  stream only, so the all-zero nonce is safe.
* **ChaCha20-Poly1305** (RFC 8439): :func:`seal` / :func:`open_sealed` -- authenticated
  encryption of a secret relayed through the server (e.g. ULDP-FL's shared seed R); a modified
  message or a wrong key raises :class:`~pdpfl.crypto.IntegrityError`.

Never derive any of these from a configured seed: the reference ULDP-FL implementation seeds
``np.random.RandomState`` with 32-bit hashes (spec D9), which can be brute-forced.
"""

from __future__ import annotations

import hashlib
import os
import struct

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from pdpfl.crypto import IntegrityError

__all__ = [
    "PUBLIC_KEY_BYTES",
    "agree",
    "context",
    "derive",
    "mask_integers",
    "mask_words",
    "new_private_key",
    "open_sealed",
    "private_key_from_seed",
    "public_bytes",
    "seal",
]

PUBLIC_KEY_BYTES = 32
_NONCE_BYTES = 12


def new_private_key() -> X25519PrivateKey:
    """A fresh X25519 private key from the operating system's CSPRNG."""
    return X25519PrivateKey.generate()


def private_key_from_seed(seed: bytes, info: bytes) -> X25519PrivateKey:
    """The X25519 private key HKDF-SHA256(``seed``, ``info``) (RFC 7748 clamps it).

    Secure aggregation secret-shares a 16-byte *seed* rather than the 32-byte key, so that the
    seed fits one Shamir share (:mod:`pdpfl.crypto.shamir`): a 128-bit seed, as the 128-bit
    security of X25519 itself.
    """
    if not isinstance(seed, bytes | bytearray) or len(seed) < 16:
        raise ValueError("seed: expected at least 16 bytes")
    return X25519PrivateKey.from_private_bytes(derive(bytes(seed), info))


def public_bytes(private_key: X25519PrivateKey) -> bytes:
    """The 32-byte raw public key of ``private_key`` (what is sent)."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def context(*parts: bytes | str | int) -> bytes:
    """An unambiguous byte string from labelled parts (length-prefixed; ints as int64)."""
    out = bytearray()
    for part in parts:
        if isinstance(part, bool):
            part = int(part)
        if isinstance(part, int):
            out += b"i" + struct.pack("<q", part)
            continue
        data = part.encode("utf-8") if isinstance(part, str) else bytes(part)
        out += b"b" + struct.pack("<I", len(data)) + data
    return bytes(out)


def derive(secret: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 of ``secret`` for the purpose ``info``."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


def agree(private_key: X25519PrivateKey, peer_public: bytes, info: bytes) -> bytes:
    """X25519 with ``peer_public`` then HKDF-SHA256(info): a 256-bit key shared with the peer.

    Raises :class:`~pdpfl.crypto.IntegrityError` for a malformed or low-order public key.
    """
    if not isinstance(peer_public, bytes | bytearray) or len(peer_public) != PUBLIC_KEY_BYTES:
        got = (
            len(peer_public)
            if isinstance(peer_public, bytes | bytearray)
            else type(peer_public).__name__
        )
        raise IntegrityError(f"X25519 public key: expected {PUBLIC_KEY_BYTES} bytes, got {got}")
    try:
        shared = private_key.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
    except ValueError as exc:  # all-zero shared secret: a low-order point
        raise IntegrityError(f"X25519 public key rejected ({exc})") from None
    return derive(shared, info)


def _keystream(key: bytes, nbytes: int) -> bytes:
    if len(key) != 32:
        raise ValueError("key: expected 32 bytes")
    enc = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    return enc.update(bytes(nbytes))


def mask_words(key: bytes, count: int) -> np.ndarray:
    """``count`` uniform uint64 words: the ChaCha20 keystream of ``key`` (one use per key)."""
    count = int(count)
    if count < 0:
        raise ValueError(f"count: must be >= 0, got {count}")
    return np.frombuffer(_keystream(key, 8 * count), dtype=np.uint64, count=count)


def mask_integers(key: bytes, count: int, modulus: int) -> list[int]:
    """``count`` integers uniform in [0, modulus) up to 2^-128 (ChaCha20, wide reduction)."""
    modulus = int(modulus)
    if modulus < 2:
        raise ValueError("modulus: must be >= 2")
    width = (modulus.bit_length() + 128 + 7) // 8
    stream = _keystream(key, width * int(count))
    return [
        int.from_bytes(stream[i * width : (i + 1) * width], "little") % modulus
        for i in range(int(count))
    ]


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """ChaCha20-Poly1305 encryption of ``plaintext`` bound to ``aad`` (random nonce prefixed)."""
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, bytes(plaintext), aad)


def open_sealed(key: bytes, blob: bytes, aad: bytes, *, what: str = "sealed message") -> bytes:
    """Decrypt and authenticate a :func:`seal` output; a wrong key or any change raises."""
    if not isinstance(blob, bytes | bytearray) or len(blob) < _NONCE_BYTES + 16:
        raise IntegrityError(f"{what}: truncated or not bytes")
    try:
        nonce, body = bytes(blob[:_NONCE_BYTES]), bytes(blob[_NONCE_BYTES:])
        return ChaCha20Poly1305(key).decrypt(nonce, body, aad)
    except InvalidTag:
        raise IntegrityError(
            f"{what}: authentication failed (wrong pairwise key or the message was modified)"
        ) from None


def digest(*parts: bytes | str | int) -> bytes:
    """SHA-256 of :func:`context` ``(*parts)`` (public fingerprints, e.g. of a participant list)."""
    return hashlib.sha256(context(*parts)).digest()
