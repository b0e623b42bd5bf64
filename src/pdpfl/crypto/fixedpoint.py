"""The fixed-point ring of pairwise-masked summation: Z_{2^64} with ``f`` fractional bits.

Encoding (:meth:`FixedPointRing.encode`)
    x ↦ round(x · 2^f) as a signed 64-bit integer, stored as its two's complement in Z_{2^64}
    (uint64; NumPy's uint64 addition wraps, which *is* the ring addition). Rounding is to the
    nearest integer, so one party's encoding errs by at most 2^-(f+1) per coordinate and a sum
    of ``m`` parties by at most m · 2^-(f+1).

Overflow check
    Each party refuses (:class:`~pdpfl.crypto.RingOverflowError`) to encode a value with
    |round(x·2^f)| > L = ⌊2^(63-g) / m⌋, where ``m`` is the number of parties summed and ``g``
    the guard bits. The true sum then satisfies |Σ| ≤ 2^(63-g) < 2^63: it never wraps, and the
    centred lift of the ring sum is the exact integer sum.

Integrity check (:meth:`FixedPointRing.decode`)
    A ring sum whose masks did not cancel (a party that used other keys or another participant
    list, a modified message) is uniform in Z_{2^64}; each coordinate then falls inside the
    valid range |Σ| ≤ m·L with probability ≤ 2^-g. Decoding refuses such a sum
    (:class:`~pdpfl.crypto.IntegrityError`); over d coordinates garbage passes with probability
    ≤ 2^(-g·d) (2^-128 for the defaults g = 8 and d ≥ 16).

With the defaults (f = 32, g = 8) a party may contribute values up to 2^23 / m in magnitude
(8.4e5 for 10 parties) with resolution 2^-32 ≈ 2.3e-10.
"""

from __future__ import annotations

import numpy as np

from pdpfl.crypto import IntegrityError, RingOverflowError

__all__ = ["FixedPointRing"]


class FixedPointRing:
    """Z_{2^64} with ``fractional_bits`` fractional bits and ``guard_bits`` integrity bits."""

    ring_bits = 64

    def __init__(self, fractional_bits: int = 32, guard_bits: int = 8) -> None:
        if not (isinstance(fractional_bits, int) and 0 <= fractional_bits <= 52):
            raise ValueError(
                f"secure.fractional_bits: expected an integer in [0, 52], got {fractional_bits!r}"
            )
        if not (isinstance(guard_bits, int) and 0 <= guard_bits <= 32):
            raise ValueError(f"guard_bits: expected an integer in [0, 32], got {guard_bits!r}")
        if fractional_bits + guard_bits > 62:
            raise ValueError(
                "secure.fractional_bits: fractional_bits + guard_bits must leave integer bits "
                f"(got {fractional_bits} + {guard_bits} > 62)"
            )
        self.fractional_bits = int(fractional_bits)
        self.guard_bits = int(guard_bits)
        self.scale = float(2.0**self.fractional_bits)

    # ------------------------------------------------------------------ ranges

    def limit(self, parties: int) -> int:
        """L: the largest |encoded integer| one of ``parties`` parties may contribute."""
        parties = int(parties)
        if parties < 1:
            raise ValueError(f"parties: must be >= 1, got {parties}")
        return (1 << (63 - self.guard_bits)) // parties

    def max_abs(self, parties: int) -> float:
        """The largest |value| one party may contribute when ``parties`` are summed."""
        return self.limit(parties) / self.scale

    def precision(self, parties: int) -> float:
        """Worst-case absolute error of the decoded sum of ``parties`` encodings."""
        return int(parties) * 2.0 ** -(self.fractional_bits + 1)

    # ------------------------------------------------------------------ encode / decode

    def encode(self, values: np.ndarray, parties: int, *, what: str = "value") -> np.ndarray:
        """round(values · 2^f) in Z_{2^64} (uint64), refusing anything that could wrap."""
        x = np.asarray(values, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise RingOverflowError(f"{what}: contains NaN or infinity, which cannot be summed")
        scaled = np.rint(x * self.scale)
        limit = self.limit(parties)
        worst = float(np.max(np.abs(scaled))) if scaled.size else 0.0
        if worst > limit:
            raise RingOverflowError(
                f"{what}: |value| up to {worst / self.scale:.6g} exceeds the secure-summation "
                f"range ±{limit / self.scale:.6g} (Z_2^64 with secure.fractional_bits = "
                f"{self.fractional_bits} and {self.guard_bits} guard bits, {parties} parties); "
                "lower secure.fractional_bits to widen the range"
            )
        return scaled.astype(np.int64).view(np.uint64)

    def decode(
        self, total: np.ndarray, parties: int, *, encoded_for: int | None = None
    ) -> np.ndarray:
        """The float64 value of a ring sum of ``parties`` encodings (checked: no garbage).

        ``encoded_for``: the party count each encoding was checked against (default
        ``parties``); secure aggregation encodes for every silo that may be summed and then
        sums the survivors, ``parties`` ≤ ``encoded_for``.
        """
        signed = np.asarray(total, dtype=np.uint64).view(np.int64)
        bound = self.limit(parties if encoded_for is None else encoded_for) * int(parties)
        if signed.size and int(np.max(np.abs(signed.astype(np.float64)))) > bound:
            raise IntegrityError(
                "secure summation: the unmasked sum is outside the range the parties' "
                "encodings allow -- the pairwise masks did not cancel (a party used different "
                "keys or participants, or a message was modified); the result is discarded"
            )
        return signed.astype(np.float64) / self.scale
