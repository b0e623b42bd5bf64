"""Shamir secret sharing of 16-byte seeds, on pycryptodome's vetted GF(2^128) implementation.

Secure aggregation (Bonawitz et al., CCS 2017, §4 "SecAgg"; Bell et al., CCS 2020, "SecAgg+")
secret-shares each party's mask seeds among the round's participants with a threshold t, so that
the server can remove the masks of a party that dropped out -- with the help of any t others --
while any t - 1 shares reveal nothing about a seed.

* :func:`split` -- pycryptodome's ``Shamir.split(t, n, secret)``: a random polynomial of degree
  t - 1 over GF(2^128) with the secret as constant term, evaluated at x = 1..n. Holder ``h`` of a
  participant list gets the share at x = (position of h) + 1. Coefficients come from
  pycryptodome's ``get_random_bytes`` (the operating system's CSPRNG).
* :func:`combine` -- pycryptodome's ``Shamir.combine`` on exactly t shares (Lagrange
  interpolation at 0).
* :func:`combine_many` -- many secrets whose shares come from the *same* holders (the unmasking
  step of secure aggregation: every responder sends a share of every seed). The Lagrange
  coefficients depend only on the holders, so they are computed once and each secret costs t
  field multiplications instead of t². The field arithmetic is pycryptodome's own
  (``Crypto.Protocol.SecretSharing._Element``); the result equals ``Shamir.combine`` bit for bit
  (property-tested in ``tests/test_shamir.py``), and a pycryptodome without that class falls back
  to ``Shamir.combine``.

Nothing here checks that a share is genuine: in the semi-honest model the shares are authentic
(they travel sealed with ChaCha20-Poly1305, :func:`pdpfl.crypto.keys.seal`); a wrong share yields
a wrong seed, hence masks that do not cancel, which the fixed-point ring's range check refuses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from Crypto.Protocol.SecretSharing import Shamir

__all__ = ["SECRET_BYTES", "SHARE_BYTES", "combine", "combine_many", "split"]

#: Size of a secret and of a share (one element of GF(2^128)).
SECRET_BYTES = 16
SHARE_BYTES = 16


def _positions(holders: Sequence[int]) -> dict[int, int]:
    ids = [int(h) for h in holders]
    if len(set(ids)) != len(ids):
        raise ValueError("shamir: holders must be distinct")
    return {h: i + 1 for i, h in enumerate(ids)}


def _check_threshold(threshold: int, holders: int) -> int:
    t = int(threshold)
    if not 1 <= t <= holders:
        raise ValueError(f"shamir: threshold must be in [1, {holders}] (the holders), got {t}")
    return t


def split(secret: bytes, threshold: int, holders: Sequence[int]) -> dict[int, bytes]:
    """Shares of the 16-byte ``secret`` for each of ``holders``; any ``threshold`` of them
    reconstruct it, fewer reveal nothing."""
    if not isinstance(secret, bytes | bytearray) or len(secret) != SECRET_BYTES:
        raise ValueError(f"shamir: the secret must be {SECRET_BYTES} bytes")
    index = _positions(holders)
    t = _check_threshold(threshold, len(index))
    shares = Shamir.split(t, len(index), bytes(secret), ssss=False)
    by_x = {int(x): bytes(s) for x, s in shares}
    return {h: by_x[x] for h, x in index.items()}


def _chosen(shares: Mapping[int, bytes], threshold: int, holders: Sequence[int]) -> list[int]:
    index = _positions(holders)
    t = _check_threshold(threshold, len(index))
    unknown = [h for h in shares if h not in index]
    if unknown:
        raise ValueError(f"shamir: shares from non-holders {sorted(unknown)}")
    if len(shares) < t:
        raise ValueError(f"shamir: {len(shares)} share(s), the threshold is {t}")
    for h, s in shares.items():
        if not isinstance(s, bytes | bytearray) or len(s) != SHARE_BYTES:
            raise ValueError(f"shamir: the share of holder {h} is not {SHARE_BYTES} bytes")
    return sorted(shares, key=lambda h: index[h])[:t]


def combine(shares: Mapping[int, bytes], threshold: int, holders: Sequence[int]) -> bytes:
    """The secret from at least ``threshold`` of its shares (``holder -> share``)."""
    index = _positions(holders)
    chosen = _chosen(shares, threshold, holders)
    return bytes(Shamir.combine([(index[h], bytes(shares[h])) for h in chosen], ssss=False))


def combine_many(
    shares: Sequence[Mapping[int, bytes]], threshold: int, holders: Sequence[int]
) -> list[bytes]:
    """:func:`combine` of several secrets whose shares come from the same holders."""
    if not shares:
        return []
    first = set(shares[0])
    if any(set(s) != first for s in shares[1:]):
        raise ValueError("shamir: combine_many needs shares from the same holders for every secret")
    index = _positions(holders)
    chosen = _chosen(shares[0], threshold, holders)
    try:
        from Crypto.Protocol.SecretSharing import _Element as _E
    except ImportError:  # pragma: no cover - depends on the pycryptodome release
        return [combine(s, threshold, holders) for s in shares]
    _Element: Any = _E
    xs = [_Element(index[h]) for h in chosen]
    # Lagrange basis at 0 in characteristic 2: l_j = Π_{m≠j} x_m / (x_j + x_m).
    coefficients = []
    for j, xj in enumerate(xs):
        num, den = _Element(1), _Element(1)
        for m, xm in enumerate(xs):
            if m != j:
                num = num * xm
                den = den * (xj + xm)
        coefficients.append(num * den.inverse())
    out = []
    for secret_shares in shares:
        acc = _Element(0)
        for h, coef in zip(chosen, coefficients, strict=True):
            acc = acc + _Element(bytes(secret_shares[h])) * coef
        out.append(bytes(acc.encode()))
    return out
