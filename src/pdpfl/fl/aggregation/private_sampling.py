"""Private user-level sub-sampling hidden from the server (ULDP-FL Sec. 4.1; spec A.4.5).

Algorithm 4 lets the server draw each user's Bernoulli(q) coin and set the weight of a user it
did not sample to 0 (Remark 1), so the server knows who was sampled and no sub-sampling
amplification holds against it. Here, inside the private weighting protocol
(:mod:`pdpfl.fl.aggregation.private_weighting`), the coin is drawn obliviously:

1. for every user u the server prepares P Paillier ciphertexts: k = q·P of them encrypt the
   blinded inverse weight β_u = (r_u N_u)^{-1} mod n, the other P − k encrypt 0, in an order
   drawn uniformly by the server's CSPRNG (:func:`ot_plaintexts`; q must be a multiple of 1/P);
2. the silo that computes X_u (one silo per user, so every silo uses the same coin for u) picks
   c_u uniform in [0, P) with its CSPRNG and obtains item c_u by 1-out-of-P oblivious transfer
   (:mod:`pdpfl.crypto.ot`: :func:`choose_items`, :func:`transfer_items`, :func:`open_items`);
3. it proceeds with that ciphertext exactly as Protocol 1 does with ⟦β_u⟧: the plaintext is
   β_u with probability k/P = q (whatever the silo's choice, since the server's order is
   uniform; and whatever the server's order, since the silo's choice is uniform), else 0.

Who learns what: the server sees A, the silos' OT messages B_u (uniform points whatever c_u:
the transfer's receiver privacy) and later only re-randomised ciphertexts and the noisy sum, so
its view is independent of the sample -- it is accounted like a third party (Poisson(q)-
subsampled Gaussian every round). A silo sees one Paillier ciphertext per user (IND-CPA under the
server's key: 0 and β_u look alike) and the other P − 1 items stay sealed under keys it cannot
derive (the transfer's sender privacy), so it cannot pick β_u on purpose nor learn whether u
was sampled. Extra cost per round: P·|U| Paillier encryptions and |U| transfers of P items at
the server, one transfer per assigned user at a silo -- linear in |U| (benchmarks/
secure_weighting.py). Threat model as Protocol 1's: semi-honest parties, no server-silo
collusion (a colluding silo would tell the server its choices).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from gmpy2 import mpz

from pdpfl.crypto import IntegrityError, ot
from pdpfl.crypto.keys import context
from pdpfl.fl.aggregation.private_weighting_core import _VERSION

__all__ = ["choose_items", "item_context", "open_items", "ot_plaintexts", "transfer_items"]

#: Bytes of one sealed item around a Paillier ciphertext (nonce 12 + Poly1305 tag 16).
SEAL_OVERHEAD = 28


def item_context(session: bytes, epoch: int, user: int) -> bytes:
    """The context every key of user ``user``'s transfer in ``epoch`` is bound to."""
    return context(_VERSION, session, "ot", int(epoch), int(user))


def ot_plaintexts(inverse: Sequence[mpz], k: int, p: int) -> list[mpz]:
    """P plaintexts per user, user-major: k copies of β_u and P − k zeros, each user's in a
    uniformly random order (the server's CSPRNG)."""
    k, p = int(k), int(p)
    if not 1 <= k <= p or p < 2:
        raise ValueError(f"subsampling: need 1 <= k <= P and P >= 2, got k = {k}, P = {p}")
    shuffle = secrets.SystemRandom().shuffle
    out: list[mpz] = []
    for b in inverse:
        row = [mpz(b)] * k + [mpz(0)] * (p - k)
        shuffle(row)
        out += row
    return out


def choose_items(
    sender_public: bytes, users: Sequence[int], p: int
) -> tuple[dict[int, ot.OtReceiver], bytes]:
    """The silo's choices c_u (uniform in [0, P), CSPRNG) and its OT messages B_u, in order."""
    receivers = {int(u): ot.choose(sender_public, secrets.randbelow(int(p)), int(p)) for u in users}
    return receivers, b"".join(receivers[int(u)].message for u in users)


def transfer_items(
    sender: ot.OtSender,
    choices: object,
    items: Sequence[Sequence[bytes]],
    users: Sequence[int],
    session: bytes,
    epoch: int,
    *,
    what: str,
) -> bytes:
    """The server's side: every user's P items sealed by :func:`pdpfl.crypto.ot.transfer`,
    concatenated (fixed widths, so sizes never depend on the items)."""
    if not isinstance(choices, bytes) or len(choices) != ot.POINT_BYTES * len(users):
        raise IntegrityError(f"private sub-sampling: malformed OT messages from {what}")
    out = bytearray()
    for j, (u, row) in enumerate(zip(users, items, strict=True)):
        b = choices[j * ot.POINT_BYTES : (j + 1) * ot.POINT_BYTES]
        out += b"".join(ot.transfer(sender, b, list(row), item_context(session, epoch, u)))
    return bytes(out)


def open_items(
    receivers: dict[int, ot.OtReceiver],
    sender_public: bytes,
    sealed: object,
    users: Sequence[int],
    p: int,
    item_bytes: int,
    session: bytes,
    epoch: int,
) -> list[bytes]:
    """The silo's side: the one item per user its choice opens (IntegrityError otherwise)."""
    width = int(item_bytes) + SEAL_OVERHEAD
    if not isinstance(sealed, bytes) or len(sealed) != width * int(p) * len(users):
        raise IntegrityError("private sub-sampling: malformed sealed OT items")
    out = []
    for j, u in enumerate(users):
        base = j * width * int(p)
        row = [sealed[base + i * width : base + (i + 1) * width] for i in range(int(p))]
        out.append(
            ot.receive(receivers[int(u)], sender_public, row, item_context(session, epoch, u))
        )
    return out
