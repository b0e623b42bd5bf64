"""The Paillier cryptosystem (Paillier 1999) on gmpy2, with g = n + 1.

* Key generation (:func:`generate_keypair`): two random primes of ``bits/2`` bits each (top two
  bits set, so n has exactly ``bits`` bits), p ≠ q, gcd(n, φ(n)) = 1; the randomness comes from
  :mod:`secrets`. ``bits`` ≥ 3072 for deployments (NIST SP 800-57: 128-bit security); smaller
  keys are accepted for tests only (``allow_weak=True``).
* Encryption ⟦m⟧ = (1 + m·n) · ρ mod n² with ρ = r^n, r uniform in Z_n^*. A party without the
  factorisation computes r^n directly (:meth:`PaillierPublicKey.encrypt`); the key holder uses
  the CRT (:meth:`PaillierPrivateKey.encrypt`): ρ mod p² = y^p mod p² for y uniform in Z_p^*
  (the same distribution, about 3× faster).
* Decryption by the CRT (:meth:`PaillierPrivateKey.decrypt`): m_p = L_p(c^(p-1) mod p²)·h_p mod
  p, likewise mod q, recombined -- two half-size exponentiations instead of one c^λ mod n².
* Homomorphic operations on the public key: ⊕ (:meth:`PaillierPublicKey.add`, product mod n²),
  adding a plaintext (:meth:`PaillierPublicKey.add_plain`, a multiplication by 1 + m·n) and
  scalar multiplication (:meth:`PaillierPublicKey.mul_plain`).
* Serialisation: fixed width (``ciphertext_bytes`` = 2·⌈bits/8⌉ per ciphertext, little endian)
  so that message sizes never depend on values; :meth:`PaillierPublicKey.ciphertexts_from_bytes`
  rejects anything outside [1, n²) (and, with ``check_units``, non-units of Z_{n²}).

The private key lives only in the memory of the party that generated it: it has no
serialisation and refuses to be pickled.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from typing import NoReturn

import gmpy2
from gmpy2 import mpz

from pdpfl.crypto import IntegrityError

__all__ = [
    "MIN_SECURE_BITS",
    "PaillierPrivateKey",
    "PaillierPublicKey",
    "generate_keypair",
]

#: Smallest modulus accepted without ``allow_weak`` (128-bit security, NIST SP 800-57).
MIN_SECURE_BITS = 3072


def _random_below(bound: mpz) -> mpz:
    return mpz(secrets.randbelow(int(bound)))


def _random_unit(modulus: mpz) -> mpz:
    """Uniform element of Z_modulus^* (rejection sampling; from :mod:`secrets`)."""
    while True:
        r = _random_below(modulus)
        if r > 0 and gmpy2.gcd(r, modulus) == 1:
            return r


@dataclass(frozen=True, eq=False)
class PaillierPublicKey:
    """The public key n (g = n + 1)."""

    n: mpz
    n2: mpz = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n = mpz(self.n)
        if n < 3 or n % 2 == 0:
            raise ValueError("paillier: n must be an odd integer > 2")
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "n2", n * n)

    # -- sizes and identity ------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return int(self.n.bit_length())

    @property
    def plaintext_bytes(self) -> int:
        return (self.bits + 7) // 8

    @property
    def ciphertext_bytes(self) -> int:
        return 2 * self.plaintext_bytes

    def to_bytes(self) -> bytes:
        return int(self.n).to_bytes(self.plaintext_bytes, "little")

    @classmethod
    def from_bytes(cls, data: bytes) -> PaillierPublicKey:
        if not isinstance(data, bytes | bytearray) or len(data) < 8:
            raise IntegrityError("paillier public key: expected the modulus as bytes")
        return cls(mpz(int.from_bytes(bytes(data), "little")))

    def fingerprint(self) -> bytes:
        """16 bytes identifying this key (SHA-256 of the modulus)."""
        return hashlib.sha256(b"pdpfl/paillier/v1" + self.to_bytes()).digest()[:16]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PaillierPublicKey) and self.n == other.n

    def __hash__(self) -> int:
        return hash(int(self.n))

    # -- encryption and homomorphic operations -----------------------------------------------
    def encrypt(self, m: int) -> mpz:
        """⟦m⟧ with fresh randomness r^n (r uniform in Z_n^*; one full exponentiation)."""
        r = _random_unit(self.n)
        return (1 + (mpz(m) % self.n) * self.n) * gmpy2.powmod(r, self.n, self.n2) % self.n2

    def add(self, a: mpz, b: mpz) -> mpz:
        """⟦x⟧ ⊕ ⟦y⟧ = ⟦x + y⟧."""
        return a * b % self.n2

    def add_plain(self, c: mpz, m: int) -> mpz:
        """⟦x⟧ ⊕ m = ⟦x + m⟧ (multiplication by (1+n)^m = 1 + m·n mod n²)."""
        return c * (1 + (mpz(m) % self.n) * self.n) % self.n2

    def mul_plain(self, c: mpz, k: int) -> mpz:
        """⟦x⟧^k = ⟦k·x⟧ (a negative k uses the inverse ciphertext and |k|)."""
        k = mpz(k)
        if k < 0:
            return gmpy2.powmod(gmpy2.invert(c, self.n2), -k, self.n2)
        return gmpy2.powmod(c, k, self.n2)

    # -- serialisation ------------------------------------------------------------------------
    def ciphertexts_to_bytes(self, cts: list[mpz]) -> bytes:
        width = self.ciphertext_bytes
        return b"".join(int(c).to_bytes(width, "little") for c in cts)

    def ciphertexts_from_bytes(
        self,
        data: bytes,
        count: int | None = None,
        *,
        check_units: bool = False,
        what: str = "ciphertexts",
    ) -> list[mpz]:
        """Parse fixed-width ciphertexts; anything outside [1, n²) (or a non-unit) raises."""
        width = self.ciphertext_bytes
        if not isinstance(data, bytes | bytearray) or len(data) % width:
            raise IntegrityError(f"{what}: expected a multiple of {width} bytes")
        k = len(data) // width
        if count is not None and k != int(count):
            raise IntegrityError(f"{what}: expected {count} ciphertexts, got {k}")
        out = []
        for i in range(k):
            c = mpz(int.from_bytes(data[i * width : (i + 1) * width], "little"))
            if not 0 < c < self.n2 or (check_units and gmpy2.gcd(c, self.n) != 1):
                raise IntegrityError(
                    f"{what}[{i}]: not a valid ciphertext under this Paillier key (modified "
                    "message or a different key)"
                )
            out.append(c)
        return out

    def integers_to_bytes(self, values: list[int]) -> bytes:
        width = self.plaintext_bytes
        return b"".join(int(v).to_bytes(width, "little") for v in values)

    def integers_from_bytes(self, data: bytes, count: int, *, what: str = "values") -> list[mpz]:
        """Parse ``count`` fixed-width elements of Z_n (each must be < n)."""
        width = self.plaintext_bytes
        if not isinstance(data, bytes | bytearray) or len(data) != width * int(count):
            raise IntegrityError(f"{what}: expected {count} values of {width} bytes")
        out = []
        for i in range(int(count)):
            v = mpz(int.from_bytes(data[i * width : (i + 1) * width], "little"))
            if v >= self.n:
                raise IntegrityError(f"{what}[{i}]: not an element of Z_n")
            out.append(v)
        return out


class PaillierPrivateKey:
    """The factorisation (p, q) with the CRT constants; stays in its owner's memory."""

    def __init__(self, public_key: PaillierPublicKey, p: int, q: int) -> None:
        p, q = mpz(p), mpz(q)
        if p * q != public_key.n:
            raise ValueError("paillier: p·q does not match the public key")
        if p == q:
            raise ValueError("paillier: p and q must differ")
        self.public_key = public_key
        self.__p, self.__q = p, q
        self.__p2, self.__q2 = p * p, q * q
        g = public_key.n + 1
        self.__hp = gmpy2.invert((gmpy2.powmod(g, p - 1, self.__p2) - 1) // p, p)
        self.__hq = gmpy2.invert((gmpy2.powmod(g, q - 1, self.__q2) - 1) // q, q)
        self.__q_inv_p = gmpy2.invert(q, p)
        self.__q2_inv_p2 = gmpy2.invert(self.__q2, self.__p2)

    def __reduce__(self) -> NoReturn:  # never serialise the factorisation
        raise TypeError("a Paillier private key cannot be pickled or copied")

    def __repr__(self) -> str:
        fingerprint = self.public_key.fingerprint().hex()
        return f"PaillierPrivateKey({self.public_key.bits} bits, fingerprint {fingerprint})"

    def decrypt(self, c: mpz) -> mpz:
        """m ∈ [0, n) with ⟦m⟧ = c (CRT: two half-size exponentiations)."""
        p, q = self.__p, self.__q
        mp = (gmpy2.powmod(c, p - 1, self.__p2) - 1) // p * self.__hp % p
        mq = (gmpy2.powmod(c, q - 1, self.__q2) - 1) // q * self.__hq % q
        return mq + q * ((mp - mq) * self.__q_inv_p % p)

    def encrypt(self, m: int) -> mpz:
        """⟦m⟧ with fresh randomness, computed by the CRT (same distribution as r^n)."""
        p, q = self.__p, self.__q
        rp = gmpy2.powmod(_random_unit(p), p, self.__p2)
        rq = gmpy2.powmod(_random_unit(q), q, self.__q2)
        rho = rq + self.__q2 * ((rp - rq) * self.__q2_inv_p2 % self.__p2)
        pk = self.public_key
        return (1 + (mpz(m) % pk.n) * pk.n) * rho % pk.n2


def generate_keypair(
    bits: int = MIN_SECURE_BITS, *, allow_weak: bool = False
) -> tuple[PaillierPublicKey, PaillierPrivateKey]:
    """A fresh Paillier key pair with an exactly ``bits``-bit modulus (randomness: secrets)."""
    if not isinstance(bits, int) or bits % 2 or bits < 256:
        raise ValueError(f"paillier_bits: expected an even integer >= 256, got {bits!r}")
    if bits < MIN_SECURE_BITS and not allow_weak:
        raise ValueError(
            f"paillier_bits: {bits}-bit keys are below the {MIN_SECURE_BITS}-bit minimum "
            "(128-bit security); smaller keys are for tests only"
        )
    half = bits // 2
    top = mpz(3) << (half - 2)
    while True:
        p = gmpy2.next_prime(mpz(secrets.randbits(half)) | top)
        q = gmpy2.next_prime(mpz(secrets.randbits(half)) | top)
        n = p * q
        if p == q or n.bit_length() != bits or p.bit_length() != half or q.bit_length() != half:
            continue
        if gmpy2.gcd(n, (p - 1) * (q - 1)) != 1:
            continue
        pk = PaillierPublicKey(n)
        return pk, PaillierPrivateKey(pk, p, q)
