"""What both sides of ``aggregation: secure`` compute the same way: message fields and masks.

See :mod:`pdpfl.fl.aggregation.secure` for the protocol. Masks (Bonawitz et al. 2017, §4):

* the **self mask** of silo i: ChaCha20 keystream of HKDF(b_i, session ‖ round ‖ "self" ‖ i),
  b_i a fresh 16-byte seed;
* the **pairwise mask** of silos i < j: ChaCha20 keystream of HKDF(X25519(s_i, S_j), session ‖
  round ‖ "pair" ‖ i ‖ j) -- the same at both ends; i adds it, j subtracts it. The private key
  s_i = HKDF(seed_i) comes from a fresh 16-byte seed, so that one Shamir share carries it.

Every key is bound to the session, the round and the parties, so no mask is ever used twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from pdpfl.crypto import IntegrityError
from pdpfl.crypto.keys import (
    PUBLIC_KEY_BYTES,
    agree,
    context,
    derive,
    mask_words,
    private_key_from_seed,
)

__all__ = [
    "PROTOCOL",
    "SEALED_SHARE_BYTES",
    "VERSION",
    "field_bytes",
    "ids",
    "key_table",
    "mask_key",
    "pair_mask",
    "self_mask",
    "share_aad",
    "channel_info",
]

PROTOCOL = "secure"
VERSION = "pdpfl/secagg/v2"
#: One sealed pair of shares: 12-byte nonce + 2 × 16-byte shares + 16-byte Poly1305 tag.
SEALED_SHARE_BYTES = 12 + 32 + 16


def ids(payload: dict[str, Any], key: str, *, nonempty: bool = True) -> list[int]:
    """A sorted, distinct list of silo ids from an int array field (else IntegrityError)."""
    arr = np.asarray(payload.get(key))
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or (nonempty and arr.size == 0):
        raise IntegrityError(f"secure summation: {key!r} must be a non-empty int array")
    out = [int(c) for c in arr.tolist()]
    if out != sorted(set(out)):
        raise IntegrityError(f"secure summation: {key!r} must be sorted and distinct")
    return out


def field_bytes(payload: dict[str, Any], key: str, size: int | None = None) -> bytes:
    value = payload.get(key)
    if not isinstance(value, bytes | bytearray) or (size is not None and len(value) != size):
        raise IntegrityError(f"secure summation: field {key!r} is missing or malformed")
    return bytes(value)


def key_table(blob: bytes, members: list[int], what: str) -> dict[int, bytes]:
    """Split a concatenation of 32-byte public keys, one per member in order."""
    if len(blob) != PUBLIC_KEY_BYTES * len(members):
        raise IntegrityError(f"secure summation: malformed list of {what} keys")
    return {
        c: blob[i * PUBLIC_KEY_BYTES : (i + 1) * PUBLIC_KEY_BYTES] for i, c in enumerate(members)
    }


def mask_key(seed: bytes, session: bytes, round_index: int) -> X25519PrivateKey:
    """The X25519 private key s_i of a round, from its 16-byte seed."""
    return private_key_from_seed(seed, context(VERSION, session, round_index, "mask-key"))


def self_mask(seed: bytes, session: bytes, round_index: int, silo: int, size: int) -> np.ndarray:
    """PRG(b_i): ``size`` uniform uint64 words."""
    key = derive(seed, context(VERSION, session, round_index, "self", silo))
    return mask_words(key, size)


def pair_mask(
    own: X25519PrivateKey,
    own_id: int,
    peer_public: bytes,
    peer_id: int,
    session: bytes,
    round_index: int,
    size: int,
) -> np.ndarray:
    """The pairwise mask of ``own_id`` and ``peer_id`` (identical at both ends)."""
    lo, hi = sorted((int(own_id), int(peer_id)))
    info = context(VERSION, session, round_index, "pair", lo, hi)
    return mask_words(agree(own, peer_public, info), size)


def channel_info(session: bytes, round_index: int, a: int, b: int) -> bytes:
    lo, hi = sorted((int(a), int(b)))
    return context(VERSION, session, round_index, "channel", lo, hi)


def share_aad(session: bytes, round_index: int, sender: int, receiver: int) -> bytes:
    """Associated data of the shares ``sender`` seals for ``receiver`` (binds both, the round)."""
    return context(VERSION, session, round_index, "shares", int(sender), int(receiver))
