"""1-out-of-P oblivious transfer (Chou-Orlandi "simplest OT", 2015) on P-256.

Used by ULDP-FL's private user-level sub-sampling (Kato et al., PVLDB 2024, Sec. 4.1; spec
A.4.5): the server (sender) holds P messages per user, the silo (receiver) obtains exactly the
one it chose, the server does not learn which. The construction, with G the P-256 base point,
ℓ its prime order and H = HKDF-SHA256 bound to the transfer's context:

1. sender: a ← Z_ℓ^* (CSPRNG), A = a·G                                        (:func:`new_sender`)
2. receiver with choice c ∈ [P]: b ← Z_ℓ^*, B = c·A + b·G                  (:func:`choose`)
3. sender: k_i = H(ctx, A, B, a·(B − i·A)) and e_i = AEAD_{k_i}(m_i), i ∈ [P]     (:func:`transfer`)
4. receiver: k_c = H(ctx, A, B, b·A) opens e_c                                  (:func:`receive`)

Correctness: a·(B − c·A) = a·b·G = b·A. **Receiver privacy** (perfect): B = c·A + b·G with b
uniform is a uniform point whatever c, so the sender's view -- A, B and its own coins -- is
identically distributed for every choice. **Sender privacy** (at most one message opened, also
against a receiver that picks B arbitrarily): holding k_i and k_j (i ≠ j) means knowing
a·(B − i·A) and a·(B − j·A), whose difference is (j − i)·a²·G; computing a²·G from A = a·G is
the square Diffie-Hellman problem, equivalent to CDH on P-256 (H a random oracle; the messages
under the other keys are then hidden by the AEAD's IND-CPA security, and any modification is
detected by its authenticity). Each (A, B) is bound into its keys together with the caller's
context (protocol, session, round, user), so keys never repeat across transfers.

The group arithmetic is pycryptodome's (``Crypto.PublicKey.ECC`` points: addition, negation,
scalar multiplication, on-curve validation on import); the key derivation and ChaCha20-Poly1305
are ``cryptography``'s (:mod:`pdpfl.crypto.keys`). X25519 alone cannot carry this OT: its API
offers only x-coordinate scalar multiplication (no point addition for B = c·A + b·G) and its
public keys are not uniform strings (an oblivious public key would need Elligator). Points travel
as 65-byte uncompressed SEC1 encodings; every received point is checked to lie on the curve and
not to be the identity.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from Crypto.PublicKey.ECC import EccPoint

from pdpfl.crypto import IntegrityError
from pdpfl.crypto.keys import context, derive, open_sealed, seal

__all__ = [
    "POINT_BYTES",
    "OtReceiver",
    "OtSender",
    "choose",
    "new_sender",
    "point_from_bytes",
    "receive",
    "transfer",
]

CURVE = "P-256"
POINT_BYTES = 65
# FIPS 186-4 D.1.2.3: the order ℓ and base point G of P-256.
_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
_G = EccPoint(
    0x6B17D1F2E12C4247F8BCE6E563A440F277037D812DEB33A0F4A13945D898C296,
    0x4FE342E2FE1A7F9B8EE7EB4A7C0F9E162BCE33576B315ECECBB6406837BF51F5,
    CURVE,
)


def _scalar() -> int:
    return 1 + secrets.randbelow(_ORDER - 1)


def point_bytes(p: EccPoint) -> bytes:
    """The uncompressed SEC1 encoding 04‖x‖y (65 bytes; identity refused)."""
    if p.is_point_at_infinity():
        raise IntegrityError("oblivious transfer: the identity point is not a valid message")
    x, y = (int(v) for v in p.xy)
    return b"\x04" + x.to_bytes(32, "big") + y.to_bytes(32, "big")


def point_from_bytes(blob: object, *, what: str = "point") -> EccPoint:
    """A P-256 point from its 65-byte encoding, refused unless on the curve and not identity."""
    if not isinstance(blob, bytes) or len(blob) != POINT_BYTES or blob[0] != 4:
        raise IntegrityError(f"oblivious transfer: malformed {what} (65-byte SEC1 expected)")
    x, y = int.from_bytes(blob[1:33], "big"), int.from_bytes(blob[33:], "big")
    try:
        point = EccPoint(x, y, CURVE)  # raises ValueError off the curve
    except ValueError as err:
        raise IntegrityError(f"oblivious transfer: {what} is not on {CURVE}") from err
    if point.is_point_at_infinity():
        raise IntegrityError(f"oblivious transfer: {what} is the identity")
    return point


@dataclass(frozen=True)
class OtSender:
    """The sender's secret a and public A = a·G (one per round; reusable over its transfers)."""

    a: int = field(repr=False)
    public: bytes


@dataclass(frozen=True)
class OtReceiver:
    """The receiver's secret state for one transfer: its choice and b (never sent)."""

    choice: int
    b: int = field(repr=False)
    message: bytes  # B, sent to the sender


def new_sender() -> OtSender:
    """Step 1: a fresh a (CSPRNG) and A = a·G."""
    a = _scalar()
    return OtSender(a=a, public=point_bytes(_G * a))


def choose(sender_public: bytes, choice: int, count: int) -> OtReceiver:
    """Step 2: B = c·A + b·G for ``choice`` c ∈ [0, count)."""
    c, n = int(choice), int(count)
    if not 0 <= c < n:
        raise ValueError(f"oblivious transfer: choice must be in [0, {n}), got {c}")
    A = point_from_bytes(sender_public, what="sender's point A")
    b = _scalar()
    B = _G * b + A * c if c else _G * b
    return OtReceiver(choice=c, b=b, message=point_bytes(B))


def _key(ctx: bytes, A: bytes, B: bytes, shared: EccPoint, index: int) -> bytes:
    return derive(point_bytes(shared), context(b"pdpfl-ot-v1", ctx, A, B, index))


def transfer(
    sender: OtSender, receiver_message: bytes, messages: list[bytes], ctx: bytes
) -> list[bytes]:
    """Step 3: e_i = AEAD_{k_i}(m_i) for every i, k_i = H(ctx, A, B, a·(B − i·A))."""
    B = point_from_bytes(receiver_message, what="receiver's point B")
    A = point_from_bytes(sender.public, what="sender's point A")
    neg_a = -A
    out, shifted = [], B  # B − i·A, stepping i
    for i, m in enumerate(messages):
        if i:
            shifted = shifted + neg_a
        aad = context(b"pdpfl-ot-item", ctx, i)
        if shifted.is_point_at_infinity():  # B = i·A: a receiver that knows a; key is random
            out.append(seal(secrets.token_bytes(32), m, aad))
            continue
        key = _key(ctx, sender.public, receiver_message, shifted * sender.a, i)
        out.append(seal(key, m, aad))
    return out


def receive(receiver: OtReceiver, sender_public: bytes, sealed: list[bytes], ctx: bytes) -> bytes:
    """Step 4: open e_c with k_c = H(ctx, A, B, b·A) (IntegrityError if it was modified)."""
    c = receiver.choice
    if not 0 <= c < len(sealed):
        raise IntegrityError("oblivious transfer: fewer items than the choice")
    A = point_from_bytes(sender_public, what="sender's point A")
    key = _key(ctx, sender_public, receiver.message, A * receiver.b, c)
    return open_sealed(
        key, sealed[c], context(b"pdpfl-ot-item", ctx, c), what="oblivious-transfer item"
    )
