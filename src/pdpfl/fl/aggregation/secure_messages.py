"""What each stage of ``aggregation: secure`` sends from a silo (stages ``advertise``,
``share``, ``upload``, ``consistency``, ``unmask``; protocol in
:mod:`pdpfl.fl.aggregation.secure`, handler in :mod:`pdpfl.fl.aggregation.secure_silo`),
declared for the gate of :mod:`pdpfl.fl.messages` and registered with the handler.

Keys, sealed shares and the masked vector are cryptographic material; whether a silo declines
(it already masked the round) and its weight are public. Every length is a rule of the request
(U1, the survivors and dropped silos, the model's coordinates and the declared metric names).
"""

from __future__ import annotations

import numpy as np

from pdpfl.crypto.keys import PUBLIC_KEY_BYTES
from pdpfl.fl.aggregation.discrete_shares import check_words
from pdpfl.fl.aggregation.secure_common import PROTOCOL, SEALED_SHARE_BYTES
from pdpfl.fl.aggregation.secure_identity import AUTH_BYTES
from pdpfl.fl.messages import (
    PUBLIC_WEIGHT,
    Array,
    Bool,
    Bytes,
    Field,
    Float,
    MessageSchema,
    Outgoing,
    Rule,
)

__all__ = ["SCHEMAS"]


def _count(c: Outgoing, key: str) -> int:
    return int(np.asarray(c.request.get(key, ())).size)


def _upload_length(c: Outgoing) -> tuple[int]:
    """d + m: the model's coordinates in the request and its declared metric names; with
    discrete shares d' + ⌈64/b⌉ (the share and its zero check words)."""
    bits = int(c.request.get("share_bits", 0))
    if bits:
        return (int(c.request.get("share_length", 0)) + check_words(bits),)
    n = int(c.request.get("num_params", 0))
    d = sum(int(np.asarray(c.request[f"param.{i}"]).size) for i in range(n))
    return (d + len([m for m in str(c.request.get("metrics", "")).split(",") if m]),)


def _upload_bits(c: Outgoing) -> int:
    return int(c.request.get("share_bits", 0)) or 64


_KEY = Bytes(PUBLIC_KEY_BYTES)
_ACCEPTED = Rule("not declined", lambda c: not bool(c.reply.get("declined", True)))

#: The reply of every stage (:mod:`pdpfl.fl.messages`), registered with the handler.
SCHEMAS = (
    MessageSchema(
        (PROTOCOL, "advertise"),
        (
            Field(
                "declined",
                Bool(),
                "public",
                public_by="the rounds a silo has masked (its public memory; the server asked)",
            ),
            Field("channel_key", _KEY, "crypto", doc="X25519 public key C_i", presence=_ACCEPTED),
            Field("mask_key", _KEY, "crypto", doc="X25519 public key S_i", presence=_ACCEPTED),
            Field(
                "auth",
                Bytes(
                    Rule(
                        f"{AUTH_BYTES} x (|participants| - 1)",
                        lambda c: AUTH_BYTES * (_count(c, "participants") - 1),
                    )
                ),
                "crypto",
                doc="HMAC tags of (session, round, participants, t, mode, C_i, S_i) under the "
                "pairwise keys of the silos' long-term identities",
                presence=_ACCEPTED,
            ),
        ),
        doc="round 0: the silo's public keys, or that it already masked this round",
    ),
    MessageSchema(
        (PROTOCOL, "share"),
        (
            Field(
                "shares",
                Bytes(
                    Rule(
                        f"{SEALED_SHARE_BYTES} x (|u1| - 1)",
                        lambda c: SEALED_SHARE_BYTES * (_count(c, "u1") - 1),
                    )
                ),
                "crypto",
                doc="Shamir shares of b_i and s_i, sealed for each other silo of U1",
            ),
        ),
        doc="round 1: sealed shares of the seeds",
    ),
    MessageSchema(
        (PROTOCOL, "upload"),
        (
            Field(
                "masked",
                Array(
                    ("uint64", "uint32"),
                    shape=Rule(
                        "(d + m,): model coordinates + declared metrics; discrete shares: "
                        "(d' + ceil(64/b),)",
                        _upload_length,
                    ),
                    bits=Rule("64, or b with discrete shares", _upload_bits),
                ),
                "crypto",
                doc="y_i: update and metrics in Z_{2^64} (fixed point) + self and pairwise masks; "
                "discrete shares: the integer share and zero check words + masks, in Z_{2^b}",
            ),
            Field(
                "weight",
                Float(low=0.0),
                "public",
                public_by=PUBLIC_WEIGHT,
            ),
        ),
        doc="round 2: the masked contribution",
    ),
    MessageSchema(
        (PROTOCOL, "consistency"),
        (
            Field(
                "confirm",
                Bytes(
                    Rule(
                        f"{AUTH_BYTES} x (|survivors| - 1)",
                        lambda c: AUTH_BYTES * (_count(c, "survivors") - 1),
                    )
                ),
                "crypto",
                doc="HMAC tags of the survivor set shown, one per other survivor (the "
                "consistency round)",
            ),
        ),
        doc="round 3: the silo confirms the survivor set it was shown",
    ),
    MessageSchema(
        (PROTOCOL, "unmask"),
        (
            Field(
                "self_shares",
                Bytes(Rule("16 x |survivors|", lambda c: 16 * _count(c, "survivors"))),
                "crypto",
                doc="shares of b_j of each survivor j",
            ),
            Field(
                "mask_shares",
                Bytes(Rule("16 x |dropped|", lambda c: 16 * _count(c, "dropped"))),
                "crypto",
                doc="shares of s_j of each dropped j",
            ),
        ),
        doc="round 4: the shares that remove the masks",
    ),
)
