"""Multi-exponentiation modulo a big modulus (gmpy2), the core arithmetic of Protocol 1.

:class:`MultiExp` -- many products Π_u b_u^{e_{u,j}}, j = 1..d, over the *same* bases b_u with
short signed exponents (Straus' simultaneous exponentiation with fixed windows of ``w`` bits):

* per base, once: the table b_u^i for i < 2^w, and b_u^{-i} too for "signed" tables
  (2^w multiplications per table and one inversion per base);
* per product: ⌈k/w⌉·w squarings shared by all bases plus at most one table multiplication per
  base and window (k = bit length of the largest |exponent|); zero exponents cost nothing.
  Without the b^{-i} tables, negative exponents go to a second accumulator (its own squarings)
  that is inverted once per product.

Compared with one exponentiation per base and coordinate this shares every squaring, and a
negative exponent costs no more than a positive one (no full-size "n - |e|" exponent, spec D28).
:func:`plan_multiexp` picks ``w`` and the table kind from the number of bases, products and
rounds the tables serve, under a memory cap.

:class:`FixedBaseExp` -- g^k for many exponents k with a fixed base g (Brickell-Gordon-McCurley-
Wilson comb): tables g^{i·2^{w·t}}; each power then costs ⌈k/w⌉ multiplications and no squaring.
Used for the short-exponent re-randomisers h^k of Paillier ciphertexts.
"""

from __future__ import annotations

import math

import gmpy2
import numpy as np
from gmpy2 import mpz

__all__ = ["FixedBaseExp", "MultiExp", "choose_window", "plan_multiexp"]

#: Default cap on the memory of one set of tables (bytes).
TABLE_MEMORY_CAP = 256 * 2**20


def plan_multiexp(
    bases: int,
    products: int,
    exponent_bits: int,
    modulus_bits: int,
    *,
    reuse: int = 1,
    memory_cap: int = TABLE_MEMORY_CAP,
) -> tuple[int, bool]:
    """``(window, signed)`` minimising table cost / ``reuse`` + ``products`` × per-product cost.

    ``signed`` tables hold b^i and b^-i (twice the tables, one squaring chain); unsigned ones
    hold b^i only and keep two accumulators (positive and negative exponents) that are divided
    once per product (twice the squarings, one inversion ≈ 6 multiplications).
    """
    best, best_cost = (1, False), math.inf
    entry = (modulus_bits + 7) // 8 + 32
    for signed in (False, True):
        tables = 2 if signed else 1
        for w in range(1, 17):
            memory = bases * tables * (1 << w) * entry
            if w > 1 and memory > memory_cap:
                break
            windows = math.ceil(max(exponent_bits, 1) / w)
            table = bases * tables * (1 << w) / max(reuse, 1)
            chains = 1 if signed else 2
            per_product = chains * windows * w + bases * windows + (0 if signed else 6)
            cost = table + products * per_product
            if cost < best_cost:
                best, best_cost = (w, signed), cost
    return best


def choose_window(
    bases: int,
    products: int,
    exponent_bits: int,
    modulus_bits: int,
    *,
    reuse: int = 1,
    memory_cap: int = TABLE_MEMORY_CAP,
) -> int:
    """The window of :func:`plan_multiexp`."""
    return plan_multiexp(
        bases, products, exponent_bits, modulus_bits, reuse=reuse, memory_cap=memory_cap
    )[0]


class MultiExp:
    """Π_u base_u^{e_u} modulo ``modulus`` for many exponent vectors (Straus, fixed windows).

    ``signed``: tables of b^-i as well (negative exponents use them); otherwise negative
    exponents go to a second accumulator divided out at the end.
    """

    def __init__(self, bases: list[mpz], modulus: mpz, window: int, signed: bool = True) -> None:
        if not 1 <= int(window) <= 16:
            raise ValueError(f"window: expected 1..16, got {window}")
        self.modulus = mpz(modulus)
        self.window = int(window)
        self.signed = bool(signed)
        self.count = len(bases)
        size = 1 << self.window
        mod = self.modulus
        self.positive: list[list[mpz]] = []
        self.negative: list[list[mpz]] = []
        for b in bases:
            b = mpz(b) % mod
            pos = [mpz(1), b]
            for _ in range(2, size):
                pos.append(pos[-1] * b % mod)
            self.positive.append(pos)
            if self.signed:
                inv = gmpy2.invert(b, mod)
                neg = [mpz(1), inv]
                for _ in range(2, size):
                    neg.append(neg[-1] * inv % mod)
                self.negative.append(neg)

    def products(self, exponents: np.ndarray) -> list[mpz]:
        """Π_u base_u^{exponents[u, j]} for each column j (exponents: int64, shape (U, d),
        |exponent| < 2^62)."""
        e = np.asarray(exponents)
        if e.ndim != 2 or e.shape[0] != self.count:
            raise ValueError(f"exponents: expected shape ({self.count}, d), got {e.shape}")
        if e.dtype.kind not in "iu":
            raise ValueError("exponents: expected integers")
        e = e.astype(np.int64)
        if e.size and int(np.max(np.abs(e))) >= 1 << 62:
            raise ValueError("exponents: |exponent| must be below 2^62")
        mag = np.abs(e)
        bits = int(mag.max()).bit_length() if mag.size else 0
        w = self.window
        windows = max(1, math.ceil(bits / w))
        mask = (1 << w) - 1
        # digits[t, u, j]: window t (most significant first) of |e[u, j]|
        digits = np.stack([(mag >> (w * (windows - 1 - t))) & mask for t in range(windows)]).astype(
            np.int64
        )
        sign = e < 0
        mod = self.modulus
        pos = self.positive
        out: list[mpz] = []
        for j in range(e.shape[1]):
            dj = digits[:, :, j].tolist()
            negs = sign[:, j].tolist()
            if self.signed:
                tables = [self.negative[u] if s else pos[u] for u, s in enumerate(negs)]
                acc = mpz(1)
                started = False
                for t in range(windows):
                    if started:
                        for _ in range(w):
                            acc = acc * acc % mod
                    for u, dgt in enumerate(dj[t]):
                        if dgt:
                            acc = acc * tables[u][dgt] % mod
                            started = True
                out.append(acc)
                continue
            acc_p, acc_n = mpz(1), mpz(1)
            p_started = n_started = False
            for t in range(windows):
                if p_started:
                    for _ in range(w):
                        acc_p = acc_p * acc_p % mod
                if n_started:
                    for _ in range(w):
                        acc_n = acc_n * acc_n % mod
                for u, dgt in enumerate(dj[t]):
                    if dgt:
                        if negs[u]:
                            acc_n = acc_n * pos[u][dgt] % mod
                            n_started = True
                        else:
                            acc_p = acc_p * pos[u][dgt] % mod
                            p_started = True
            out.append(acc_p * gmpy2.invert(acc_n, mod) % mod if n_started else acc_p)
        return out


class FixedBaseExp:
    """base^k modulo ``modulus`` for many non-negative k < 2^exponent_bits (comb tables)."""

    def __init__(self, base: mpz, modulus: mpz, exponent_bits: int, window: int) -> None:
        if not 1 <= int(window) <= 16:
            raise ValueError(f"window: expected 1..16, got {window}")
        self.modulus = mpz(modulus)
        self.window = int(window)
        self.exponent_bits = int(exponent_bits)
        self.positions = math.ceil(self.exponent_bits / self.window)
        size = 1 << self.window
        mod = self.modulus
        self.tables: list[list[mpz]] = []
        g = mpz(base) % mod
        for _ in range(self.positions):
            row = [mpz(1), g]
            for _ in range(2, size):
                row.append(row[-1] * g % mod)
            self.tables.append(row)
            g = row[-1] * g % mod  # g^(2^w): the next position's base

    @staticmethod
    def best_window(exponent_bits: int, uses: int) -> int:
        """Window minimising table size + ``uses`` powers (at most 12 bits)."""
        best, best_cost = 1, math.inf
        for w in range(1, 13):
            positions = math.ceil(exponent_bits / w)
            cost = positions * (1 << w) + uses * positions
            if cost < best_cost:
                best, best_cost = w, cost
        return best

    def pow(self, k: int) -> mpz:
        """base^k (0 <= k < 2^exponent_bits)."""
        k = int(k)
        if k < 0 or k.bit_length() > self.exponent_bits:
            raise ValueError(f"k: expected 0 <= k < 2^{self.exponent_bits}")
        mod = self.modulus
        mask = (1 << self.window) - 1
        acc = mpz(1)
        for t in range(self.positions):
            dgt = (k >> (self.window * t)) & mask
            if dgt:
                acc = acc * self.tables[t][dgt] % mod
        return acc
