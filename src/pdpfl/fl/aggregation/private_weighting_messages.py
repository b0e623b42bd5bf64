"""What each stage of ULDP-FL's private weighting protocol sends from a silo (Protocol 1;
stages in :mod:`pdpfl.fl.aggregation.private_weighting`, handler in
:mod:`pdpfl.fl.aggregation.private_weighting_silo`), declared for the gate of
:mod:`pdpfl.fl.messages` and registered with the handler.

Every field is cryptographic material (an X25519 public key, a sealed seed, Paillier
ciphertexts, oblivious-transfer messages) except the non-leader's fixed acknowledgement; every
length is a rule of the request (the users it assigns, the model's coordinates) and of the
server's public key (its ciphertext width), so no size depends on a silo's data. The rules read
the silo's protocol state only for the server's public key, |U| and the participant list.
"""

from __future__ import annotations

import numpy as np

from pdpfl.crypto.keys import PUBLIC_KEY_BYTES
from pdpfl.crypto.ot import POINT_BYTES
from pdpfl.fl.aggregation.private_sampling import SEAL_OVERHEAD
from pdpfl.fl.aggregation.private_weighting_core import _CHECKS, PROTOCOL
from pdpfl.fl.messages import Bool, Bytes, Field, MessageSchema, Outgoing, Rule

__all__ = ["SCHEMAS"]


# ------------------------------------------------------------ what each stage's reply carries


def _ct_bytes(c: Outgoing) -> int:
    """Width of one Paillier ciphertext under the server's public key (2⌈bits/8⌉)."""
    return int(c.state.pk.ciphertext_bytes)


def _leader(c: Outgoing) -> bool:
    return bool(c.silo_id == c.state.participants[0])


def _round_coordinates(c: Outgoing) -> int:
    n = int(c.request.get("num_params", 0))
    return sum(int(np.asarray(c.request[f"param.{i}"]).size) for i in range(n))


_ASSIGNED = "|assign| (the users the request assigns)"
_FINGERPRINT = Field(
    "pk_fingerprint", Bytes(16), "crypto", doc="SHA-256 fingerprint of the server's Paillier key"
)

#: The reply of every stage (:mod:`pdpfl.fl.messages`), registered with the handler.
SCHEMAS = (
    MessageSchema(
        (PROTOCOL, "setup-keys"),
        (
            Field("dh_public", Bytes(PUBLIC_KEY_BYTES), "crypto", doc="X25519 public key"),
            _FINGERPRINT,
        ),
        doc="setup (a): the silo's key-agreement key",
    ),
    MessageSchema(
        (PROTOCOL, "setup-seed"),
        (
            Field(
                "seed.{j}",
                Bytes(32 + SEAL_OVERHEAD),
                "crypto",
                doc="the shared seed R sealed for silo j (ChaCha20-Poly1305)",
                keys=Rule(
                    "j in participants[1:], sent by participants[0] only",
                    lambda c: c.state.participants[1:] if _leader(c) else [],
                ),
            ),
            Field(
                "ok",
                Bool(True),
                "public",
                public_by="the protocol's fixed acknowledgement",
                presence=Rule("the silo is not participants[0]", lambda c: not _leader(c)),
            ),
        ),
        doc="setup (c): the first silo seals R for the others",
    ),
    MessageSchema(
        (PROTOCOL, "setup-histogram"),
        (
            Field(
                "blinded_histogram",
                Bytes(
                    Rule(
                        "|U| x ⌈bits/8⌉ of the server's key",
                        lambda c: c.state.num_users * int(c.state.pk.plaintext_bytes),
                    )
                ),
                "crypto",
                doc="r_u·n_{s,u} + pairwise masks mod n: uniform in Z_n",
            ),
        ),
        doc="setup (d)-(e): the blinded, masked histogram",
    ),
    MessageSchema(
        (PROTOCOL, "weights-ot"),
        (
            Field(
                "ot_choices",
                Bytes(
                    Rule(
                        f"{POINT_BYTES} x {_ASSIGNED}",
                        lambda c: POINT_BYTES * int(np.asarray(c.request["assign"]).size),
                    )
                ),
                "crypto",
                doc="1-out-of-P OT receiver messages B_u (uniform points whatever c_u)",
            ),
        ),
        doc="private sub-sampling: the silo's oblivious choices",
    ),
    MessageSchema(
        (PROTOCOL, "weights"),
        (
            Field(
                "shares",
                Bytes(
                    Rule(
                        f"{_ASSIGNED} x ciphertext width + {SEAL_OVERHEAD}",
                        lambda c: (
                            int(np.asarray(c.request["assign"]).size) * _ct_bytes(c) + SEAL_OVERHEAD
                        ),
                    )
                ),
                "crypto",
                doc="X_u = ⟦β_u⟧^(r_u·DIV) of the assigned users, sealed under a key from R",
            ),
        ),
        doc="weighting (a): the weight shares",
    ),
    MessageSchema(
        (PROTOCOL, "install"),
        (
            Field(
                "check",
                Bytes(Rule(f"{_CHECKS} x ciphertext width", lambda c: _CHECKS * _ct_bytes(c))),
                "crypto",
                doc="the verification aggregate's ciphertexts (masked, re-randomised)",
            ),
        ),
        doc="weighting (a): the weights are installed and verified",
    ),
    MessageSchema(
        (PROTOCOL, "round"),
        (
            Field(
                "ciphertexts",
                Bytes(
                    Rule(
                        "d x ciphertext width (d: the request's model coordinates)",
                        lambda c: _round_coordinates(c) * _ct_bytes(c),
                    )
                ),
                "crypto",
                doc="⟦Y_s⟧ per coordinate: weighted update + noise share, masked, re-randomised",
            ),
            _FINGERPRINT,
        ),
        doc="weighting (b)-(c): the encrypted, masked contribution",
    ),
)
