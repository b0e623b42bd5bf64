"""What a silo brings to secure summation from its own side: its identity, its peers' public
keys and its own protocol settings (issue #34, the active server).

A server that deviates from the protocol must not be able to

* substitute a silo's round keys (and read the shares sealed for it, or learn a pairwise mask):
  each silo authenticates its advertised X25519 keys, the session, the round, the participant
  list, t and the participation mode to every other participant;
* tell different silos different survivor sets (Bonawitz et al., CCS 2017, §4 "active
  adversary", the consistency round): each silo confirms the survivor set it was shown to every
  other survivor, and reveals shares only once :func:`consistency_quorum` silos confirmed that
  very set;
* change t or the participation mode: a silo computes t from its own rule
  (:func:`~pdpfl.fl.aggregation.threshold.survivor_threshold`) and takes ``visible``/``hidden``
  from its own configuration, and refuses a request that disagrees.

Authentication: HMAC-SHA256 (16-byte tags) under the pairwise key K_ij of the two silos'
long-term identities (:meth:`pdpfl.crypto.signing.PartyIdentity.pairwise_key`, X25519 keys
certified by each silo's Ed25519 key). Only silos i and j can compute a tag from i to j: the
server relays tags it can neither forge nor move to another statement. A tag costs ~2 µs, an
Ed25519 verification ~100 µs; a round needs about 2n per silo (benchmarks/RESULTS.md).

Trust: every silo knows every other silo's public key out of band (the simulator: the operator's
keys, ``keys/silo-<i>.pub`` in the run folder; Flower: the ``peer-keys`` file each SuperNode is
given); a key the server relays is never used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pdpfl.crypto import IntegrityError
from pdpfl.crypto.signing import PartyIdentity, PartyPublicKey
from pdpfl.fl.aggregation.threshold import (
    DEFAULT_MIN_SURVIVORS,
    DEFAULT_THRESHOLD,
    check_threshold,
    survivor_threshold,
)

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig

__all__ = [
    "AUTH_BYTES",
    "PURPOSE",
    "SiloSecurity",
    "consistency_quorum",
    "ephemeral_security",
    "security_from_config",
    "silo_party",
    "tag_for",
]

#: Bytes of one authentication tag (HMAC-SHA256 truncated to 128 bits).
AUTH_BYTES = 16
#: The purpose the pairwise authentication keys of secure summation are derived for.
PURPOSE = "pdpfl/secagg/auth/v1"


def silo_party(silo: int) -> str:
    """The party name of silo ``silo`` (its keys: ``silo-<i>.pub``)."""
    return f"silo-{int(silo)}"


def consistency_quorum(n: int, t: int) -> int:
    """q = ⌈(n + t)/2⌉: silos that must confirm one survivor set before any share is revealed.

    Two survivor sets each confirmed by q of the n participants share at least 2q − n ≥ t
    confirmers, and an honest silo confirms one set per round: a server that equivocates needs
    t colluding silos -- the collusion bound of the semi-honest protocol -- where the threshold
    alone (q = t, the literal rule of Bonawitz et al.) lets 2t − n colluders suffice (with n = 3,
    t = 2: one). The price: a round needs q of its n silos alive until the consistency round
    (dropout tolerance n − q instead of n − t).
    """
    n, t = int(n), int(t)
    if not 1 <= t <= n:
        raise ValueError(f"consistency quorum: need 1 <= t <= n, got t = {t}, n = {n}")
    return (n + t + 1) // 2


@dataclass
class SiloSecurity:
    """One silo's side of secure summation (module docstring)."""

    silo: int
    identity: PartyIdentity = field(repr=False)
    #: Every silo's public key, by silo index (learned out of band).
    peers: dict[int, PartyPublicKey] = field(repr=False)
    participation: str = "visible"
    threshold: float = DEFAULT_THRESHOLD
    min_survivors: int = DEFAULT_MIN_SURVIVORS

    def __post_init__(self) -> None:
        if self.participation not in ("visible", "hidden"):
            raise ValueError(
                f"participation: expected visible or hidden, got {self.participation!r}"
            )
        check_threshold(self.threshold, self.min_survivors)
        own = self.peers.get(int(self.silo))
        if own is None or own.sign != self.identity.public().sign:
            raise IntegrityError(
                f"silo {self.silo}: its identity is not the key its peers know for it "
                f"({silo_party(self.silo)}.pub)"
            )

    @property
    def hidden(self) -> bool:
        return self.participation == "hidden"

    def survivors_needed(self, n: int) -> int:
        """t(n) by this silo's own rule."""
        return survivor_threshold(n, self.threshold, self.min_survivors)

    def _peer(self, silo: int) -> PartyPublicKey:
        key = self.peers.get(int(silo))
        if key is None:
            raise IntegrityError(
                f"secure summation: silo {self.silo} has no public key for silo {silo} (its "
                "peer keys are given out of band; a key relayed by the server is never used)"
            )
        return key

    def check_peers(self, members: list[int]) -> None:
        """Every member has a key this silo knows."""
        for m in members:
            self._peer(m)

    def tags(self, statement: bytes, recipients: list[int]) -> bytes:
        """One tag of ``statement`` for each recipient (other than this silo), in order."""
        return b"".join(
            self.identity.mac(self._peer(r), PURPOSE, statement, AUTH_BYTES)
            for r in recipients
            if r != self.silo
        )

    def check(self, sender: int, statement: bytes, tag: bytes) -> bool:
        """True iff ``tag`` is ``sender``'s tag of ``statement`` for this silo."""
        return self.identity.check_mac(self._peer(sender), PURPOSE, statement, tag)


def tag_for(blob: bytes, sender: int, recipient: int, members: list[int]) -> bytes:
    """The tag ``sender`` addressed to ``recipient`` in its vector of tags over ``members``
    (every member but the sender, in order)."""
    order = [m for m in members if m != sender]
    k = order.index(recipient)
    return bytes(blob[k * AUTH_BYTES : (k + 1) * AUTH_BYTES])


def ephemeral_security(
    silos: list[int],
    *,
    participation: str = "visible",
    threshold: float = DEFAULT_THRESHOLD,
    min_survivors: int = DEFAULT_MIN_SURVIVORS,
) -> dict[int, SiloSecurity]:
    """Fresh identities for in-process silos that have none (tests, benchmarks): the keys are
    exchanged in memory, which is out of band for one process."""
    ids = {int(c): PartyIdentity.generate(silo_party(c)) for c in silos}
    peers = {c: ident.public() for c, ident in ids.items()}
    return {
        c: SiloSecurity(c, ident, peers, participation, float(threshold), int(min_survivors))
        for c, ident in ids.items()
    }


def security_from_config(
    config: ExperimentConfig, silo: int, identity: PartyIdentity, peers: dict[int, PartyPublicKey]
) -> SiloSecurity:
    """Silo ``silo``'s side under an experiment config (its ``participation`` and ``secure``
    section)."""
    secure = getattr(config, "secure", None)
    return SiloSecurity(
        int(silo),
        identity,
        dict(peers),
        str(getattr(config, "participation", "visible")),
        float(getattr(secure, "threshold", DEFAULT_THRESHOLD)),
        int(getattr(secure, "min_survivors", DEFAULT_MIN_SURVIVORS)),
    )
