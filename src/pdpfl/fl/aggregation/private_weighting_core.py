"""Parameters, algorithm-side API and encodings of ULDP-FL's private weighting protocol.

See :mod:`pdpfl.fl.aggregation.private_weighting` for the protocol. This module holds what both
sides share: the public parameters (:class:`WeightingParams`), the silo algorithm's inputs
(:class:`UserUpdates`), the plain reference computation, and the two encodings whose soundness
issue #22 (item 3) re-derived:

**Noise on the signal's grid** (:func:`noise_plaintext`). The decrypted plaintext of a coordinate
is Y = Σ_s (Σ_u (DIV/N_u)·n_{s,u}·v_{s,u} + η_s) with v = round(Δ/P). The weighted signal lives on
the grid DIV/lcm(N_u); the ULDP-FL paper adds the noise as η_s = DIV·round(z_s/P), a multiple of
DIV, so Y mod DIV is noise-free and reveals residues of the users' updates modulo N_u (measured:
12-15 of 40 coordinates tell two datasets apart at σ = 50, ε = ∞ against the server). pdpfl adds
η_s = DIV·round(z_s/P) + u_s with u_s uniform on [-DIV/2, DIV/2): an integer noise on the unit
grid, finer than the signal's, with standard deviation ≈ DIV·σ/P ≫ DIV/N_u. Y mod DIV is then
uniform whatever the data (one honest silo's u suffices); the released value P·Y/DIV is the
Gaussian mechanism's output P·(S/DIV + Σ_s round(z_s/P)) plus the independent dither P·Σ_s u_s/DIV
(post-processing), and the decoded value moves by at most P/2 per silo.

**No-wrap room** (:func:`no_wrap_bound`). With w_{s,u} ≤ 1 and |u_s| ≤ DIV/2,

    |Y| ≤ DIV · Σ_s (Σ_u |v_{s,u}| + |round(z_s/P)| + 1/2) < DIV · |S| · R = DIV · 2^(vb-1),

when every silo keeps Σ_u |v_{s,u}| + |round(z_s/P)| + 1 below R = 2^(vb-1)/|S|
(:meth:`WeightingParams.silo_room`, vb = key bits - 2 - 64 - bits(DIV); the silo's check runs in
float64, whose relative rounding error 2^-52 the spare factor 2 absorbs). Since DIV < 2^bits(DIV)
and n ≥ 2^(key bits - 1), DIV · 2^vb < 2^(key bits - 66) ≤ n / 2^65: the centred lift of Y is exact
and passes the server's check |Y| < n/2^65, while a uniform residue passes it with probability
2^-64.

**Exact discrete noise** (``privacy.noise_shares: discrete``, issue #33 item 5). A silo draws its
noise as an exact discrete Gaussian Z_s ~ N_Z(0, σ_s²) on the coarser grid P' = 2^m·P
(:func:`grid_bits`: C/P' ≤ 2^20, so σ_s² stays within the sampler's integer fast path) and
adds η_s = DIV·2^m·Z_s + u_s with the dither widened to u_s uniform on [-M/2, M/2),
M = 2^m·DIV (:func:`noise_plaintext` with z = 2^m·Z_s, :func:`dithers` of M). Let
W = Σ_s Σ_u DIV·w_{s,u}·v_{s,u} (an integer), U_o the dithers of every silo but one honest
silo h, and r = Y mod M. Then

* **residue**: Y ≡ W + U_o + u_h (mod M) and u_h is uniform on a full residue system modulo M,
  so r is uniform and independent of the data (and of U_o);
* **rounding**: given r and U_o, u_h is the unique value of its range ≡ r − W − U_o (mod M),
  so (W + U_o + u_h − r)/M = round((W + U_o − r)/M) (ties up), and
  Y = r + M·(round(W/M + c) + Σ_s Z_s) with c = (U_o − r)/M independent of the data. The server
  reads, besides the data-independent r, a deterministic rounding of W/M plus the sum of the
  discrete Gaussians -- the distributed discrete Gaussian mechanism on an integer vector;
* **sensitivity**: W/M = Σ_u Σ_s w_{s,u}·v_{s,u}/2^m; one user moves it by k with
  ‖k‖₂ ≤ Σ_s w_{s,u}·(‖Δ_{s,u}‖/P + √d/2)/2^m ≤ C/P' + √d/2 (Σ_s w_{s,u} ≤ 1), and
  round(x + k) − round(x) ∈ [k − 1, k + 1] per coordinate, so the integer vector moves by at most
  C/P' + 1.5·√d in L2 (:func:`discrete_sensitivity_sq` = its square, the plan's N).

The ledger then charges ``DistributedDiscreteGaussian(σ_s², t, N, d)``
(:func:`pdpfl.fl.uldp.discrete.private_weighting_plan`), the server like a third party (it
decrypts only the sum). The no-wrap bound keeps its form with |z_s| = 2^m·|Z_s| and the dither
|u_s| ≤ 2^m·DIV/2: every silo keeps Σ_u |v_{s,u}| + 2^m·(|Z_s| + 1) below R.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol, runtime_checkable

import numpy as np

from pdpfl.crypto.keys import context, derive, mask_integers
from pdpfl.crypto.paillier import MIN_SECURE_BITS
from pdpfl.fl.aggregation import Payload
from pdpfl.fl.api import Params, Scalars
from pdpfl.randomness import RandomStream

__all__ = [
    "GUARD_BITS",
    "MIN_VALUE_BITS",
    "PROTOCOL",
    "RERANDOMIZER_BITS",
    "PrivateWeightingClient",
    "PrivateWeightingServer",
    "UserUpdates",
    "WeightingParams",
    "cpu_seconds",
    "GRID_TARGET_BITS",
    "discrete_sensitivity_sq",
    "dithers",
    "divisor",
    "grid_bits",
    "no_wrap_bound",
    "noise_plaintext",
    "plain_weighted_sum",
]

PROTOCOL = "private-weighting"
_VERSION = "pdpfl/private-weighting/v1"
#: Bits of the plaintext space kept free to detect garbage (a uniform residue passes w.p. 2^-64).
GUARD_BITS = 64
#: Smallest room (bits) for |Σ|/P that a parameter set must leave in the plaintext space.
MIN_VALUE_BITS = 80
#: Bit length of the re-randomiser exponents k in h^k (2κ for κ = 128).
RERANDOMIZER_BITS = 256
#: Verification aggregate: CHECKS coordinates, t_{s,u} < 2^16, ω_s uniform below DIV·2^76 (on
#: the unit grid: no residue of Σ w·t modulo DIV survives), accepted below DIV·2^84 (up to 255
#: silos and 2^20 users; ω hides Σ DIV·w·t, at most DIV·2^36, up to 2^-40).
_CHECKS, _CHECK_T_BITS, _CHECK_OMEGA_BITS, _CHECK_BOUND_BITS = 8, 16, 76, 84
#: Discrete noise: the grid P' = 2^m·P is the finest power-of-two multiple of P with C/P' ≤ 2^20
#: (σ_s² ≈ σ²·2^40/t: the exact sampler's integer fast path for σ up to 2^6·√t; the rounding
#: inflates the sensitivity by 1.5·√d·2^-20, 0.15 % at d = 10^6).
GRID_TARGET_BITS = 20


# ------------------------------------------------------------------------------ parameters


@lru_cache(maxsize=32)
def _lcm_upto(n: int) -> int:
    return math.lcm(*range(1, int(n) + 1))


def divisor(n_max: int, allowed_totals: tuple[int, ...] | None = None) -> int:
    """DIV: lcm(1..N_max), or lcm(allowed_totals) under the paper's allowed-counts remedy."""
    if allowed_totals:
        return math.lcm(*(int(v) for v in allowed_totals))
    return _lcm_upto(int(n_max))


@dataclass(frozen=True)
class WeightingParams:
    """Public parameters of Protocol 1 (``secure`` section of the experiment config)."""

    paillier_bits: int = MIN_SECURE_BITS
    n_max: int = 2000
    allowed_totals: tuple[int, ...] | None = None
    precision: float = 1e-10
    workers: int | None = None
    #: Accept keys below 3072 bits (tests of properties that do not depend on the key size).
    allow_weak_keys: bool = False

    def __post_init__(self) -> None:
        if self.allowed_totals is not None:
            totals = tuple(sorted({int(v) for v in self.allowed_totals}))
            if not totals or totals[0] < 1:
                raise ValueError("secure.allowed_totals: expected positive record counts")
            object.__setattr__(self, "allowed_totals", totals)
        if not (isinstance(self.n_max, int) and self.n_max >= 1):
            raise ValueError(f"secure.n_max: expected an integer >= 1, got {self.n_max!r}")
        if not 0 < float(self.precision) < 1:
            raise ValueError(f"secure.precision: expected 0 < P < 1, got {self.precision!r}")
        if self.paillier_bits < MIN_SECURE_BITS and not self.allow_weak_keys:
            raise ValueError(
                f"secure.paillier_bits: {self.paillier_bits} < {MIN_SECURE_BITS} (128-bit "
                "security); smaller keys are for tests only"
            )
        room = self.value_bits(self.paillier_bits)
        if room < MIN_VALUE_BITS:
            raise ValueError(self._room_message(room))

    @property
    def max_total(self) -> int:
        """The largest N_u the protocol computes exactly."""
        return max(self.allowed_totals) if self.allowed_totals else self.n_max

    @property
    def divisor(self) -> int:
        return divisor(self.n_max, self.allowed_totals)

    def value_bits(self, key_bits: int) -> int:
        """Bits left for |Σ|/P in a ``key_bits``-bit plaintext space (sign and guard removed)."""
        return int(key_bits) - 2 - GUARD_BITS - self.divisor.bit_length()

    def silo_room(self, key_bits: int, silos: int) -> float:
        """R = 2^(vb-1)/|S|: one silo's share of the no-wrap room, in units of P.

        A silo must keep Σ_u |v_{s,u}| + |z_s| + 1 < R on every coordinate (the +1 covers the
        dither of :func:`noise_plaintext`; with discrete noise on the grid 2^m·P the noise and
        dither terms are 2^m·(|Z_s| + 1); module docstring, :func:`no_wrap_bound`). Capped at
        2^1000 (a float).
        """
        return math.ldexp(1.0, min(self.value_bits(key_bits) - 1, 1000)) / int(silos)

    def _room_message(self, room: int) -> str:
        what = (
            f"secure.allowed_totals: lcm{list(self.allowed_totals)}"
            if self.allowed_totals
            else f"secure.n_max: lcm(1..{self.n_max})"
        )
        largest, value = 1, 1
        while True:
            value = math.lcm(value, largest + 1)
            if value.bit_length() > self.paillier_bits - 2 - GUARD_BITS - MIN_VALUE_BITS:
                break
            largest += 1
        return (
            f"{what} has {self.divisor.bit_length()} bits and leaves {room} bits of a "
            f"{self.paillier_bits}-bit Paillier key for the weighted sum (needs {MIN_VALUE_BITS}); "
            f"the largest usable N_max is {largest} -- lower N_max, give allowed_totals (e.g. "
            "powers of two: DIV is then the largest), or raise secure.paillier_bits"
        )

    def to_payload(self) -> Payload:
        return {
            "n_max": int(self.n_max),
            "allowed_totals": np.asarray(self.allowed_totals or (), dtype=np.int64),
            "precision": float(self.precision),
            "paillier_bits": int(self.paillier_bits),
            "allow_weak_keys": bool(self.allow_weak_keys),
            "workers": int(self.workers or 0),
        }

    @classmethod
    def from_payload(cls, payload: Payload) -> WeightingParams:
        totals = np.asarray(payload.get("allowed_totals", ()), dtype=np.int64)
        return cls(
            paillier_bits=int(payload["paillier_bits"]),
            n_max=int(payload["n_max"]),
            allowed_totals=tuple(int(v) for v in totals.tolist()) or None,
            precision=float(payload["precision"]),
            workers=int(payload.get("workers", 0)) or None,
            allow_weak_keys=bool(payload.get("allow_weak_keys", False)),
        )


# ------------------------------------------------------------------------- algorithm side


def grid_bits(clip: float, precision: float) -> int:
    """m of the discrete noise grid P' = 2^m·P: the smallest m ≥ 0 with C/(2^m·P) ≤ 2^20."""
    clip, precision = float(clip), float(precision)
    if not (math.isfinite(clip) and clip > 0 and 0 < precision < 1):
        raise ValueError(
            f"grid: expected a clip C > 0 and 0 < P < 1, got C={clip!r}, P={precision!r}"
        )
    m = 0
    while clip / math.ldexp(precision, m) > 2.0**GRID_TARGET_BITS:
        m += 1
    return m


def discrete_sensitivity_sq(clip: float, precision: float, dimension: int) -> float:
    """N ≥ (C/P' + 1.5·√d)²: the squared L2 sensitivity, in units of P' = 2^m·P, of the integer
    vector the server reads (module docstring, *Exact discrete noise*), rounded up."""
    m = grid_bits(clip, precision)
    d = int(dimension)
    if d < 1:
        raise ValueError(f"dimension: expected d >= 1, got {dimension!r}")
    bound = float(clip) / math.ldexp(float(precision), m) + 1.5 * math.sqrt(d)
    # a few ulps up: every float step above rounds to nearest (relative error < 2^-50 in all)
    return math.nextafter(bound * bound * (1.0 + 2.0**-48), math.inf)


@dataclass
class UserUpdates:
    """One silo's inputs for one round (never sent: only ciphertexts leave the silo).

    Attributes
    ----------
    users
        (k,) distinct user ids (in 0..|U|-1) trained at this silo this round; each must have
        n_{s,u} > 0.
    deltas
        (k, d) float64: Clip(Δ_{s,u}, C) of those users, flattened in parameter order.
    noise
        (d,) float64: z_s ~ N(0, σ²C²/t·I) from the silo's own randomness (not read when
        ``grid_noise`` is given).
    grid_noise
        Discrete noise (``privacy.noise_shares: discrete``): (d,) int64 Z_s ~ N_Z(0, σ_s²) on
        the grid P' = 2^``grid``·P, drawn by the one noise adder; the protocol encodes this,
        not ``noise`` (module docstring, *Exact discrete noise*).
    grid
        m of that grid (:func:`grid_bits`); 0 with continuous noise.
    """

    users: np.ndarray
    deltas: np.ndarray
    noise: np.ndarray
    grid_noise: np.ndarray | None = None
    grid: int = 0


@runtime_checkable
class PrivateWeightingClient(Protocol):
    """What a silo's algorithm provides to Protocol 1 (ULDP-AVG-w / -ws with private weights)."""

    def user_histogram(self) -> np.ndarray:
        """n_{s,u} for every user u = 0..|U|-1 (int >= 0): this silo's training records."""
        ...

    def user_updates(self, params: Params, round_index: int, config: Scalars) -> UserUpdates:
        """Per-user clipped deltas from ``params`` and the silo's noise (ledger charged first)."""
        ...


@runtime_checkable
class PrivateWeightingServer(Protocol):
    """What the server algorithm provides: |U| and (ULDP-AVG-ws) the user-sampling mask."""

    num_users: int

    def sampled_users(self, round_index: int) -> np.ndarray | None:
        """Algorithm 4's Bernoulli(q) mask over users for ``round_index``, or None (no
        sub-sampling: every user keeps its weight)."""
        ...


def plain_weighted_sum(
    histograms: dict[int, np.ndarray],
    updates: dict[int, UserUpdates],
    sampled: np.ndarray | None = None,
) -> np.ndarray:
    """Σ_s Σ_u w_{s,u}·Δ_{s,u} + Σ_s z_s in float64, w = n_{s,u}/N_u (0 if not sampled): the
    non-private computation Protocol 1 reproduces (reference for tests and benchmarks)."""
    totals = np.sum([np.asarray(h, dtype=np.int64) for h in histograms.values()], axis=0)
    out = None
    for s, up in updates.items():
        h = np.asarray(histograms[s], dtype=np.int64)
        users = np.asarray(up.users, dtype=np.int64)
        w = h[users] / totals[users]
        if sampled is not None:
            w = w * np.asarray(sampled, dtype=bool)[users]
        term = w @ np.asarray(up.deltas, dtype=np.float64) + np.asarray(up.noise, np.float64)
        out = term if out is None else out + term
    return np.zeros(0) if out is None else out


def cpu_seconds() -> float:
    """CPU seconds of this process and its reaped worker processes (robust under load)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


# ------------------------------------------------------------------------------ encodings


def noise_plaintext(div: int, z: int, u: int | None = None) -> int:
    """η = DIV·z + u, u uniform on [-DIV/2, DIV/2): one coordinate's noise plaintext.

    ``z`` = round(z_s/P), the silo's Gaussian noise on the grid P. The dither u (from
    :func:`dithers`; drawn here from the operating system's CSPRNG when not given) puts the noise
    on the unit grid, so that Y mod DIV carries no residue of the signal (module docstring).
    """
    div = int(div)
    if u is None:
        u = secrets.randbelow(div) - div // 2
    return div * int(z) + int(u)


def dithers(div: int, count: int, stream: RandomStream | None = None) -> list[int]:
    """``count`` dithers uniform on [-DIV/2, DIV/2) (statistical distance ≤ 2^-128 each).

    ``stream``: the silo's own :class:`~pdpfl.randomness.RandomStream` (the dither is part of its
    mechanism's randomness: a CSPRNG, or the seeded stream under ``randomness: reproducible``).
    Eight of its uniforms (48 bits each) key a ChaCha20 stream whose integers are reduced
    modulo DIV with 128 extra bits (:func:`~pdpfl.crypto.keys.mask_integers`). Without a
    stream: 32 bytes from the operating system's CSPRNG.
    """
    div, count = int(div), int(count)
    if stream is None:
        seed = secrets.token_bytes(32)
    else:
        words = np.floor(np.asarray(stream.uniform(8), dtype=np.float64) * 2.0**48)
        seed = b"".join(int(w).to_bytes(7, "little") for w in words.tolist())
    key = derive(seed, context(_VERSION, "dither"))
    return [v - div // 2 for v in mask_integers(key, count, div)] if div > 1 else [0] * count


def no_wrap_bound(div: int, values: list[list[int]], noise: list[int], grid: int = 0) -> int:
    """DIV·Σ_s (Σ_u |v_{s,u}| + |z_s| + 2^m/2) for one coordinate (an upper bound on |Y|).

    ``values[s]`` are silo s's encoded deltas v_{s,u}, ``noise[s]`` its noise in units of P
    (round(z_s/P), or 2^m·Z_s with discrete noise on the grid ``grid`` = m, whose dither is
    within 2^m·DIV/2). The silos' checks keep it below DIV·2^vb < n/2^65 (module docstring;
    property-tested).
    """
    total2 = sum(
        2 * (sum(abs(int(v)) for v in vs) + abs(int(z))) + (1 << int(grid))
        for vs, z in zip(values, noise, strict=True)
    )
    return (int(div) * total2 + 1) // 2
