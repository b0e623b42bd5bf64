"""Cryptographic building blocks of pdpfl's secure aggregation protocols.

Nothing here is new cryptography: the primitives come from vetted libraries and are combined as
in the secure-aggregation literature (Bonawitz et al. 2017, pairwise masking) and ULDP-FL
(Kato et al., PVLDB 2024, Protocol 1: Paillier + multiplicative blinding).

* :mod:`pdpfl.crypto.keys` -- X25519 key agreement, HKDF-SHA256 key derivation, ChaCha20 mask
  streams and ChaCha20-Poly1305 sealing (all from ``cryptography``, i.e. OpenSSL). Private keys
  and seeds come from the operating system's CSPRNG (``secrets`` / ``os.urandom``), never from a
  configured seed or a numpy/torch generator.
* :mod:`pdpfl.crypto.fixedpoint` -- the fixed-point ring Z_{2^64} used by pairwise-masked
  summation, with its overflow and integrity checks.
* :mod:`pdpfl.crypto.paillier` -- the Paillier cryptosystem on gmpy2 (CRT decryption and
  encryption for the key holder, fixed-width serialisation with validation).
* :mod:`pdpfl.crypto.multiexp` -- simultaneous multi-exponentiation (Straus, signed fixed
  windows) and fixed-base exponentiation, the arithmetic that makes Protocol 1 fast.
* :mod:`pdpfl.crypto.parallel` -- run independent chunks of that arithmetic on several cores.
* :mod:`pdpfl.crypto.ot` -- 1-out-of-P oblivious transfer (Chou-Orlandi on P-256: pycryptodome's
  point arithmetic, ``cryptography``'s HKDF and ChaCha20-Poly1305), for ULDP-FL's private
  user-level sub-sampling.

Errors: :class:`IntegrityError` (a message that fails authentication or a decrypted aggregate
outside its valid range: wrong keys, tampering, a dropped party) and :class:`RingOverflowError`
(a value outside the fixed-point range), both ``ValueError`` s with a message naming the cause.
"""

from __future__ import annotations

__all__ = ["IntegrityError", "RingOverflowError"]


class IntegrityError(ValueError):
    """A protocol message or result failed a cryptographic or range check (never ignored)."""


class RingOverflowError(ValueError):
    """A value does not fit the protocol's fixed-point range (the sum could wrap around)."""
