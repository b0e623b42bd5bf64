"""ULDP-FL's private weighting protocol (Kato et al., PVLDB 2024, Protocol 1; spec A.4.3).

ULDP-AVG-w weights user u's clipped delta at silo s by w_{s,u} = n_{s,u} / N_u (Eq. 4), with
N_u = Σ_s n_{s,u}. Sending these weights in the clear would reveal every silo's user histogram.
This protocol computes, at the server,

    Δ = Σ_s ( Σ_u w_{s,u} · Clip(Δ_{s,u}, C) + z_s )                       (Algorithm 3, l. 16-17)

while the server learns only Δ and the blinded totals r_u·N_u mod n, and a silo learns only its
own histogram and Paillier ciphertexts. It is a clean API over plain arrays: a silo supplies its
histogram n_{s,·} (:meth:`PrivateWeightingClient.user_histogram`) and each round its users'
clipped deltas and its noise (:meth:`PrivateWeightingClient.user_updates`); the server
algorithm supplies |U| and, for ULDP-AVG-ws, the user-sampling mask of Algorithm 4
(:class:`PrivateWeightingServer`).

Protocol 1, as implemented (stage names in brackets; ⟦·⟧ Paillier under the server's key):

Setup (once per run)
  (a) [``setup-keys``] A draws a Paillier key pair (``secure.paillier_bits`` ≥ 3072) and sends
      pk; every silo draws an X25519 key pair and returns its public key.
  (b) [``setup-seed``] A relays all public keys; silos derive pairwise keys
      k_{s,s'} = HKDF(X25519(s, s')).
  (c) the first silo draws the shared seed R (32 bytes from :mod:`secrets`) and seals it for every
      other silo with ChaCha20-Poly1305 under k_{s0,s'}; A relays the sealed seeds.
  (d) [``setup-histogram``] every silo derives r_u ∈ Z_n^* from a ChaCha20 stream keyed by R
      (identical at every silo) and blinds h_{s,u} = r_u·n_{s,u} mod n;
  (e) adds pairwise masks (mod n, from k_{s,s'}) and sends h̃_{s,u}; A sums B_u = r_u·N_u.
  (f) A inverts B_u^{-1} mod n (N_u = 0 is an error naming the user).
Weighting (every round t)
  (a) [``weights``, once without user sub-sampling] A encrypts β_u = B_u^{-1} (0 for a user
      not sampled) and sends ⟦β_u⟧; silos compute X_u = ⟦β_u⟧^{r_u·DIV} = ⟦DIV/N_u⟧ (or ⟦0⟧);
      [``install``] each silo then forms C_{s,u} = X_u^{n_{s,u}} = ⟦DIV·w_{s,u}⟧.
  (b) [``round``] silo s encodes v_{s,u} = round(Clip(Δ_{s,u})/P) and computes, per coordinate,
      ⟦Y_s⟧ = Π_u C_{s,u}^{v_{s,u}} ⊕ (DIV·round(z_s/P) + M_s)
  (c) with pairwise masks M_s (mod n, fresh per round and attempt) added as a plaintext; A
      multiplies the silos' ciphertexts, decrypts Y = DIV·Σ_s(Σ_u w v + round(z/P)) and decodes
      Δ = centred(Y)/DIV · P (Algorithm 5).

Speed (the reference needs ≈ 85 s per silo per round at d = 16, |U| = 10; see
benchmarks/secure_weighting.py): gmpy2; step (a) runs once per run without sub-sampling
(spec D19) and its full-size exponentiations X_u are computed by one silo each and shared with
the others, sealed under a key derived from R that the server does not know; per coordinate a
simultaneous multi-exponentiation over users with short signed exponents
(:class:`~pdpfl.crypto.multiexp.MultiExp`) instead of one full-size exponentiation per user and
parameter (spec D28); CRT decryption and encryption at the server; both cores via forked workers.
Each outgoing ciphertext is re-randomised by h^k with h a random n-th residue of the silo and k a
fresh 256-bit exponent (the short-exponent re-randomiser of Damgård-Jurik-Nielsen), so the
server, which holds the factorisation, cannot read the structure of the silo's exponents from
the ciphertext's randomness.

Correctness conditions (Theorem 1 of the paper; never silent garbage)
  * 1 ≤ N_u for every user (else step (f) fails: an error naming the user);
  * N_u | DIV, with DIV = lcm(1..N_max) or lcm(``allowed_totals``): a silo refuses a local count
    above N_max, and a verification aggregate after every (a) detects any user whose total does
    not divide DIV (probability of missing it ≤ 2^-40 with a 3072-bit key and N_max = 2000);
  * no wrap-around: DIV·|Σ| < n / 2^65 -- each silo checks its own encoded values against its
    share of that room, and A checks every decrypted coordinate (a wrong key, a modified
    ciphertext or masks that did not cancel give a uniform residue, which fails this check with
    probability 1 - 2^-64);
  * precision: |Δ - Δ_plain| ≤ P/2 · (Σ_{s,u} w_{s,u} + |S|) ≤ P/2 · (|U| + |S|) per coordinate.
  The paper's remedy for large N_u (DIV = lcm(1..N_max) has 2878 bits for N_max = 2000, so a
  3072-bit key cannot go much beyond N_max ≈ 2040): restrict the totals to ``allowed_totals``
  (e.g. powers of two, DIV = the largest), or cap every user's records per silo at
  ⌊N_max / |S|⌋, which guarantees N_u ≤ N_max locally.

Threat model: semi-honest parties, no collusion between the server and a silo (a colluding silo
knows r_u and would reveal N_u = B_u·r_u^{-1} to the server). The server sees pk-ciphertexts of
uniformly masked values, the blinded totals r_u·N_u (uniform in Z_n when r_u is), the noisy
aggregate Δ and the verification value DIV·(Σ w t + Σ ω) (random t, ω from the silos, hiding
everything but the pass/fail bit). A silo sees its own histogram, pk, the other silos' X25519
public keys, the sealed seed, ⟦β_u⟧ and the X_u shares (ciphertexts). Dropouts: a silo lost
during setup aborts the setup (an error); a silo lost during a round aborts that round's
attempt, which is repeated by the others under fresh masks (their users' weights then sum to
less than 1: still private, since Σ_s w_{s,u} ≤ 1 suffices).
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

import gmpy2
import numpy as np
from gmpy2 import mpz

from pdpfl.crypto import IntegrityError, RingOverflowError
from pdpfl.crypto import parallel as par
from pdpfl.crypto.keys import (
    PUBLIC_KEY_BYTES,
    agree,
    context,
    derive,
    digest,
    mask_integers,
    new_private_key,
    open_sealed,
    public_bytes,
    seal,
)
from pdpfl.crypto.multiexp import FixedBaseExp, MultiExp, plan_multiexp
from pdpfl.crypto.paillier import (
    MIN_SECURE_BITS,
    PaillierPrivateKey,
    PaillierPublicKey,
    generate_keypair,
)
from pdpfl.fl.aggregation import Payload, SiloContext, register_protocol, register_silo_handler
from pdpfl.fl.api import Aggregate, Params, Scalars, ServerAlgorithm

__all__ = [
    "PROTOCOL",
    "PrivateWeightedSum",
    "PrivateWeightingClient",
    "PrivateWeightingServer",
    "UserUpdates",
    "WeightingParams",
    "divisor",
    "plain_weighted_sum",
    "silo_handler",
]

PROTOCOL = "private-weighting"
_VERSION = "pdpfl/private-weighting/v1"
#: Bits of the plaintext space kept free to detect garbage (a uniform residue passes w.p. 2^-64).
GUARD_BITS = 64
#: Smallest room (bits) for |Σ|/P that a parameter set must leave in the plaintext space.
MIN_VALUE_BITS = 80
#: Bit length of the re-randomiser exponents k in h^k (2κ for κ = 128).
RERANDOMIZER_BITS = 256
#: Verification aggregate: CHECKS coordinates, t_{s,u} < 2^16, ω_s < 2^76, accepted below
#: DIV·2^84 (up to 255 silos and 2^20 users; ω hides Σ w·t up to 2^-40).
_CHECKS, _CHECK_T_BITS, _CHECK_OMEGA_BITS, _CHECK_BOUND_BITS = 8, 16, 76, 84


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
        (d,) float64: z_s ~ N(0, σ²C²/|S|·I) from the silo's own randomness.
    """

    users: np.ndarray
    deltas: np.ndarray
    noise: np.ndarray


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
    histograms: dict[int, np.ndarray], updates: dict[int, UserUpdates],
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


# ------------------------------------------------------------------------------ workers


def _encrypt_chunk(sk: PaillierPrivateKey, values: list[int]) -> list[mpz]:
    return [sk.encrypt(v) for v in values]


def _decrypt_chunk(sk: PaillierPrivateKey, per_silo: list[list[mpz]]) -> list[mpz]:
    """⊕ of the silos' ciphertexts, coordinate by coordinate, then CRT decryption."""
    n2 = sk.public_key.n2
    out = []
    for cts in zip(*per_silo, strict=True):
        c = cts[0]
        for other in cts[1:]:
            c = c * other % n2
        out.append(sk.decrypt(c))
    return out


def _power_chunk(n2: mpz, job: tuple[list[mpz], list[mpz]]) -> list[mpz]:
    bases, exponents = job
    return [gmpy2.powmod(b, e, n2) for b, e in zip(bases, exponents, strict=True)]


def _round_chunk(state: _SiloState, job: tuple[np.ndarray, list[int]]) -> bytes:
    """⟦Y⟧ for a block of coordinates: multi-exponentiation, plaintext, re-randomiser."""
    exponents, plain = job
    pk = state.pk
    n, n2 = pk.n, pk.n2
    products = state.multiexp.products(exponents)
    out = []
    for c, a in zip(products, plain, strict=True):
        c = c * (1 + a * n) % n2
        c = c * state.rerandomizer.pow(secrets.randbits(RERANDOMIZER_BITS)) % n2
        out.append(c)
    return pk.ciphertexts_to_bytes(out)


# ------------------------------------------------------------------------------ silo side


class _SiloState:
    """Everything a silo keeps between stages (its protocol memory; never sent)."""

    def __init__(self, silo_id: int, session: bytes, params: WeightingParams,
                 pk: PaillierPublicKey, participants: list[int], histogram: np.ndarray) -> None:
        self.silo_id = silo_id
        self.session = session
        self.params = params
        self.pk = pk
        self.participants = participants
        self.histogram = histogram
        self.divisor = mpz(params.divisor)
        self.dh = new_private_key()
        self.pairwise: dict[int, bytes] = {}
        self.seed: bytes | None = None
        self.group_key: bytes | None = None
        self.r: list[mpz] = []
        self.epoch: int | None = None
        self.users: np.ndarray = np.zeros(0, dtype=np.int64)  # users with n_{s,u} > 0
        self.multiexp: MultiExp | None = None
        self.rerandomizer: FixedBaseExp | None = None
        self.round_cache: dict[str, Any] = {}
        self.timings: dict[str, float] = {}

    @property
    def num_users(self) -> int:
        return int(self.histogram.size)

    def ctx(self, *parts: Any) -> bytes:
        return context(_VERSION, self.session, *parts)

    def pair_masks(self, purpose: bytes, participants: list[int], count: int) -> list[mpz]:
        """Σ_{s'} ±m_{s,s'} mod n (+ if this silo's id is smaller): cancels over participants."""
        n = self.pk.n
        total = [mpz(0)] * count
        for other in participants:
            if other == self.silo_id:
                continue
            key = derive(self.pairwise[other], purpose)
            sign = 1 if self.silo_id < other else -1
            masks = mask_integers(key, count, int(n))
            total = [(t + sign * m) % n for t, m in zip(total, masks, strict=True)]
        return total


def _state(ctx: SiloContext, payload: Payload) -> _SiloState:
    state = ctx.memory.get(PROTOCOL)
    if not isinstance(state, _SiloState):
        raise IntegrityError(f"private weighting: silo {ctx.silo_id} has not been set up")
    if payload.get("session") != state.session:
        raise IntegrityError("private weighting: message for another session")
    return state


def _ids(payload: Payload, key: str) -> list[int]:
    arr = np.asarray(payload.get(key))
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise IntegrityError(f"private weighting: field {key!r} must be an int array")
    ids = [int(v) for v in arr.tolist()]
    if ids != sorted(set(ids)):
        raise IntegrityError(f"private weighting: field {key!r} must be sorted and distinct")
    return ids


def _setup_keys(ctx: SiloContext, payload: Payload) -> Payload:
    client = ctx.client
    if not isinstance(client, PrivateWeightingClient):
        raise ValueError(
            f"weights: private needs a silo algorithm with user_histogram() and user_updates(); "
            f"{type(client).__name__} has neither"
        )
    params = WeightingParams.from_payload(payload)
    pk = PaillierPublicKey.from_bytes(payload["paillier_n"])
    if pk.bits < params.paillier_bits:
        raise IntegrityError(
            f"private weighting: the server's Paillier key has {pk.bits} bits, fewer than the "
            f"configured {params.paillier_bits}"
        )
    num_users = int(payload["num_users"])
    hist = np.asarray(client.user_histogram())
    if hist.shape != (num_users,) or hist.dtype.kind not in "iu":
        raise ValueError(
            f"silo {ctx.silo_id}: user_histogram() must be {num_users} integer counts, got "
            f"{hist.dtype} {hist.shape}"
        )
    hist = hist.astype(np.int64)
    if np.any(hist < 0):
        raise ValueError(f"silo {ctx.silo_id}: user_histogram() has negative counts")
    if np.any(hist > params.max_total):
        raise ValueError(
            f"silo {ctx.silo_id}: a user has more than N_max = {params.max_total} records in "
            "this silo; cap records per user (e.g. at N_max / |S| per silo) or raise secure.n_max"
        )
    participants = _ids(payload, "participants")
    state = _SiloState(ctx.silo_id, bytes(payload["session"]), params, pk, participants, hist)
    ctx.memory[PROTOCOL] = state
    return {"dh_public": public_bytes(state.dh), "pk_fingerprint": pk.fingerprint()}


def _setup_seed(ctx: SiloContext, payload: Payload) -> Payload:
    state = _state(ctx, payload)
    participants = state.participants
    blob = payload.get("dh_publics")
    if not isinstance(blob, bytes) or len(blob) != PUBLIC_KEY_BYTES * len(participants):
        raise IntegrityError("private weighting: malformed list of DH public keys")
    publics = {c: blob[i * PUBLIC_KEY_BYTES : (i + 1) * PUBLIC_KEY_BYTES]
               for i, c in enumerate(participants)}
    if publics[ctx.silo_id] != public_bytes(state.dh):
        raise IntegrityError("private weighting: the relayed key list does not hold this silo's key")
    for other in participants:
        if other != ctx.silo_id:
            lo, hi = sorted((ctx.silo_id, other))
            state.pairwise[other] = agree(state.dh, publics[other], state.ctx("pair", lo, hi))
    state.dh = None  # forward secrecy: the X25519 private key is no longer needed
    leader = participants[0]
    if ctx.silo_id != leader:
        return {"ok": True}
    state.seed = secrets.token_bytes(32)
    return {
        f"seed.{other}": seal(state.pairwise[other], state.seed, state.ctx("seed", leader, other))
        for other in participants[1:]
    }


def _setup_histogram(ctx: SiloContext, payload: Payload) -> Payload:
    state = _state(ctx, payload)
    leader = state.participants[0]
    if ctx.silo_id != leader:
        state.seed = open_sealed(
            state.pairwise[leader], payload.get("seed", b""), state.ctx("seed", leader, ctx.silo_id),
            what="private weighting: shared seed R",
        )
    assert state.seed is not None
    n = state.pk.n
    state.group_key = derive(state.seed, state.ctx("group"))
    # r_u ∈ Z_n^*: identical at every silo (ChaCha20 keyed by R), never known to the server.
    r = [mpz(v) for v in mask_integers(derive(state.seed, state.ctx("r", 0)), state.num_users, int(n))]
    for u, value in enumerate(r):
        attempt = 1
        while value == 0 or gmpy2.gcd(value, n) != 1:  # probability ≈ 2^-1535
            value = mpz(mask_integers(derive(state.seed, state.ctx("r", u, attempt)), 1, int(n))[0])
            attempt += 1
        r[u] = value
    state.r = r
    masks = state.pair_masks(state.ctx("histogram"), state.participants, state.num_users)
    blinded = [(ru * int(h) + m) % n for ru, h, m in zip(r, state.histogram.tolist(), masks, strict=True)]
    return {"blinded_histogram": state.pk.integers_to_bytes(blinded)}


def _weights(ctx: SiloContext, payload: Payload) -> Payload:
    """Step 2(a) at the silo: X_u = ⟦β_u⟧^{r_u·DIV} for the users assigned to this silo."""
    state = _state(ctx, payload)
    started = time.perf_counter()
    epoch = int(payload["epoch"])
    cts = state.pk.ciphertexts_from_bytes(
        payload["weights"], state.num_users, check_units=True, what="encrypted weights ⟦β_u⟧"
    )
    assign = _ids(payload, "assign")
    if assign and (assign[0] < 0 or assign[-1] >= state.num_users):
        raise IntegrityError("private weighting: assigned users out of range")
    n, n2 = state.pk.n, state.pk.n2
    exps = [state.r[u] * state.divisor % n for u in assign]
    bases = [cts[u] for u in assign]
    workers = par.worth_parallel(len(assign) * 1.5 * state.pk.bits, state.params.workers)
    chunks = [(bases[r.start : r.stop], exps[r.start : r.stop]) for r in par.split(len(assign), workers)]
    shares = [x for part in par.run_chunks(_power_chunk, n2, chunks, workers) for x in part]
    state.round_cache.clear()
    state.epoch = None
    state.timings["weights"] = time.perf_counter() - started
    blob = seal(
        state.group_key, state.pk.ciphertexts_to_bytes(shares),
        state.ctx("share", epoch, ctx.silo_id, digest(*assign)),
    )
    return {"shares": blob}


def _install(ctx: SiloContext, payload: Payload) -> Payload:
    """Step 2(a), second half: C_{s,u} = X_u^{n_{s,u}} and the multi-exponentiation tables."""
    state = _state(ctx, payload)
    started = time.perf_counter()
    epoch = int(payload["epoch"])
    senders = _ids(payload, "senders")
    x: list[mpz | None] = [None] * state.num_users
    for s in senders:
        assign = _ids(payload, f"assign.{s}")
        plain = open_sealed(
            state.group_key, payload.get(f"shares.{s}", b""),
            state.ctx("share", epoch, s, digest(*assign)), what=f"weight shares of silo {s}",
        )
        values = state.pk.ciphertexts_from_bytes(plain, len(assign), what="weight shares")
        for u, v in zip(assign, values, strict=True):
            if not 0 <= u < state.num_users or x[u] is not None:
                raise IntegrityError("private weighting: weight shares overlap or are out of range")
            x[u] = v
    if any(v is None for v in x):
        raise IntegrityError("private weighting: weight shares do not cover every user")
    users = np.flatnonzero(state.histogram > 0).astype(np.int64)
    n2 = state.pk.n2
    bases = [gmpy2.powmod(x[u], int(state.histogram[u]), n2) for u in users.tolist()]
    d = int(payload.get("coordinates", 1))
    reuse = int(payload.get("reuse", 1))
    bits = int(math.ceil(math.log2(4.0 / state.params.precision))) + 1
    window, signed = plan_multiexp(len(bases), d, bits, 2 * state.pk.bits, reuse=reuse)
    state.multiexp = MultiExp(bases, n2, window, signed)
    state.users = users
    if state.rerandomizer is None:
        h = gmpy2.powmod(mpz(secrets.randbelow(int(state.pk.n) - 2) + 2), state.pk.n, n2)
        w = min(10, FixedBaseExp.best_window(RERANDOMIZER_BITS, d * reuse))
        state.rerandomizer = FixedBaseExp(h, n2, RERANDOMIZER_BITS, w)
    state.epoch = epoch
    state.round_cache.clear()
    # Verification aggregate: ⟦DIV·(Σ_u w_{s,u}·t_{s,u} + ω_s)⟧ + masks for _CHECKS random
    # vectors t (ω hides Σ w·t). A user whose N_u does not divide DIV makes a coordinate
    # garbage unless N_u/gcd(N_u, DIV) divides Σ_s n_{s,u}·t_{s,u}: missed w.p. ≤ (1/2)^8 per
    # coordinate set, far less for N_u > N_max + 1 (see the module docstring).
    t = np.array(
        [[secrets.randbits(_CHECK_T_BITS) for _ in range(_CHECKS)] for _ in range(users.size)],
        dtype=np.int64,
    ).reshape(users.size, _CHECKS)
    products = state.multiexp.products(t) if users.size else [mpz(1)] * _CHECKS
    masks = state.pair_masks(state.ctx("check", epoch), state.participants, _CHECKS)
    n = state.pk.n
    checks = []
    for prod, mask in zip(products, masks, strict=True):
        omega = secrets.randbits(_CHECK_OMEGA_BITS)
        c = prod * (1 + (state.divisor * omega + mask) % n * n) % n2
        checks.append(c * state.rerandomizer.pow(secrets.randbits(RERANDOMIZER_BITS)) % n2)
    state.timings["install"] = time.perf_counter() - started
    return {"check": state.pk.ciphertexts_to_bytes(checks)}


def _round(ctx: SiloContext, payload: Payload, t: int) -> Payload:
    """Step 2(b)-(c) at the silo: ⟦Y_s⟧ per coordinate, masked for the participants."""
    state = _state(ctx, payload)
    if state.multiexp is None or state.epoch != int(payload["epoch"]):
        raise IntegrityError("private weighting: weights of this epoch are not installed")
    started, cpu = time.perf_counter(), cpu_seconds()
    attempt = int(payload["attempt"])
    participants = _ids(payload, "participants")
    if ctx.silo_id not in participants or not set(participants) <= set(state.participants):
        raise IntegrityError("private weighting: invalid participant list")
    used = state.round_cache.setdefault("attempts", set())
    if state.round_cache.get("round") != t:
        state.round_cache.clear()
        state.round_cache["round"] = t
        used = state.round_cache["attempts"] = set()
    if attempt in used:
        raise IntegrityError(f"private weighting: attempt {attempt} of round {t} was already used")
    used.add(attempt)
    num = int(payload["num_params"])
    shapes = [tuple(np.asarray(payload[f"param.{i}"]).shape) for i in range(num)]
    d = sum(int(np.prod(s)) for s in shapes)
    if "encoded" not in state.round_cache:
        params = [np.asarray(payload[f"param.{i}"]) for i in range(num)]
        config = {k[len("config.") :]: v for k, v in payload.items() if k.startswith("config.")}
        upd = ctx.client.user_updates(params, t, config)
        state.round_cache["encoded"] = _encode_updates(state, upd, d, len(state.participants))
    exponents, noise = state.round_cache["encoded"]
    n = state.pk.n
    masks = state.pair_masks(state.ctx("round", t, attempt, digest(*participants)), participants, d)
    plain = [(state.divisor * z + m) % n for z, m in zip(noise, masks, strict=True)]
    cost = d * (exponents.shape[0] * 5 + 40 + RERANDOMIZER_BITS / state.rerandomizer.window)
    workers = par.worth_parallel(cost, state.params.workers)
    chunks = [(exponents[:, r.start : r.stop], plain[r.start : r.stop])
              for r in par.split(d, workers)]
    blob = b"".join(par.run_chunks(_round_chunk, state, chunks, workers))
    state.timings["round"] = time.perf_counter() - started
    state.timings["round_cpu"] = cpu_seconds() - cpu
    return {"ciphertexts": blob, "pk_fingerprint": state.pk.fingerprint()}


def _encode_updates(state: _SiloState, upd: UserUpdates, d: int, silos: int) -> tuple[np.ndarray, list[int]]:
    """v = round(Δ/P) as an exponent matrix over the installed users, and round(z/P)."""
    users = np.asarray(upd.users)
    deltas = np.asarray(upd.deltas, dtype=np.float64)
    noise = np.asarray(upd.noise, dtype=np.float64).reshape(-1)
    if users.ndim != 1 or users.dtype.kind not in "iu" or np.unique(users).size != users.size:
        raise ValueError(f"silo {state.silo_id}: user_updates().users must be distinct int ids")
    if deltas.shape != (users.size, d) or noise.shape != (d,):
        raise ValueError(
            f"silo {state.silo_id}: user_updates() must give deltas ({users.size}, {d}) and "
            f"noise ({d},), got {deltas.shape} and {noise.shape}"
        )
    if not (np.all(np.isfinite(deltas)) and np.all(np.isfinite(noise))):
        raise RingOverflowError(f"silo {state.silo_id}: user deltas or noise are not finite")
    row = {int(u): i for i, u in enumerate(state.users.tolist())}
    missing = [int(u) for u in users.tolist() if int(u) not in row]
    if missing:
        raise ValueError(
            f"silo {state.silo_id}: user_updates() has users without records in this silo"
        )
    P = float(state.params.precision)
    exps = np.zeros((state.users.size, d), dtype=np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = np.rint(deltas / P)
        z = np.rint(noise / P)
    # No-wrap share: Σ_u |v| + |round(z/P)| must fit this silo's 1/|S| of the room.
    # (capped at 2^1000: a float; every |v| is below 2^62 anyway, checked below)
    room = math.ldexp(1.0, min(state.params.value_bits(state.pk.bits), 1000)) / silos
    worst = float(np.max(np.sum(np.abs(scaled), axis=0) + np.abs(z))) if d else 0.0
    if worst >= room or (scaled.size and float(np.max(np.abs(scaled))) >= 2.0**62):
        raise RingOverflowError(
            f"silo {state.silo_id}: encoded values reach {worst:.3g}·P, beyond the no-wrap room "
            f"of this silo ({room:.3g}·P with P = {P:g}, DIV of "
            f"{state.params.divisor.bit_length()} bits and a {state.pk.bits}-bit key); "
            "use a larger secure.precision P"
        )
    for i, u in enumerate(users.tolist()):
        exps[row[int(u)]] = scaled[i].astype(np.int64)
    return exps, [int(v) for v in z.tolist()]


def silo_handler(stage: str, payload: Payload, round_index: int, ctx: SiloContext) -> Payload:
    """The silo side of Protocol 1 (see the module docstring for the stages)."""
    if stage == "setup-keys":
        return _setup_keys(ctx, payload)
    if stage == "setup-seed":
        return _setup_seed(ctx, payload)
    if stage == "setup-histogram":
        return _setup_histogram(ctx, payload)
    if stage == "weights":
        return _weights(ctx, payload)
    if stage == "install":
        return _install(ctx, payload)
    if stage == "round":
        return _round(ctx, payload, int(round_index))
    raise ValueError(f"private weighting: unknown stage {stage!r}")


# ------------------------------------------------------------------------------ server side


class PrivateWeightedSum:
    """The server side of Protocol 1: a :class:`~pdpfl.fl.aggregation.SumProtocol`.

    The first :meth:`collect` runs the setup; every later round reuses it. The Paillier private
    key is created here and never leaves this object. ``timings`` holds the wall time of each
    phase of the last setup/round (for benchmarks). ``view`` (when ``record_view``) keeps every
    reply the server received, for tests of what the server learns.
    """

    name = PROTOCOL
    hides_individual_updates = True

    def __init__(
        self,
        paillier_bits: int = MIN_SECURE_BITS,
        n_max: int = 2000,
        allowed_totals: list[int] | tuple[int, ...] | None = None,
        precision: float = 1e-10,
        workers: int | None = None,
        expected_rounds: int = 1,
        allow_weak_keys: bool = False,
        record_view: bool = False,
        **_: Any,
    ) -> None:
        self.params = WeightingParams(
            paillier_bits=int(paillier_bits), n_max=int(n_max),
            allowed_totals=tuple(allowed_totals) if allowed_totals else None,
            precision=float(precision), workers=workers, allow_weak_keys=bool(allow_weak_keys),
        )
        self.expected_rounds = max(1, int(expected_rounds))
        self.session: bytes | None = None
        self.participants: list[int] = []
        self.num_users = 0
        self._pk: PaillierPublicKey | None = None
        self.__sk: PaillierPrivateKey | None = None
        self._inverse: list[mpz] = []
        self._epoch = -1
        self._installed_for: tuple | None = None
        self.timings: dict[str, float] = {}
        self.record_view = bool(record_view)
        self.view: list[tuple[str, int, Payload]] = []

    # -- helpers ------------------------------------------------------------------------------
    def _exchange(self, transport: Any, stage: str, requests: dict[int, Payload], t: int,
                  *, required: bool) -> dict[int, Payload]:
        started = time.perf_counter()
        replies = transport.exchange(PROTOCOL, stage, requests, t)
        self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - started
        if self.record_view:
            self.view += [(stage, c, dict(r)) for c, r in replies.items()]
        missing = [c for c in requests if c not in replies]
        if required and missing:
            raise RuntimeError(
                f"private weighting: silo(s) {missing} did not answer stage {stage!r}; the setup "
                "needs every silo -- restart the run (a silo lost in a round is dropped instead)"
            )
        return replies

    def _base(self) -> Payload:
        return {"session": self.session}

    # -- setup --------------------------------------------------------------------------------
    def setup(self, transport: Any, participants: list[int], num_users: int, t: int = 0) -> None:
        """Setup (a)-(f) with ``participants`` (all silos) for ``num_users`` users."""
        if not participants:
            raise ValueError("private weighting: no silos to set up")
        started = time.perf_counter()
        self.session = secrets.token_bytes(16)
        self.participants = sorted(int(c) for c in participants)
        self.num_users = int(num_users)
        if self.num_users < 1:
            raise ValueError("private weighting: num_users must be >= 1")
        pk, sk = generate_keypair(self.params.paillier_bits, allow_weak=self.params.allow_weak_keys)
        self._pk, self.__sk = pk, sk
        self.timings["keygen"] = time.perf_counter() - started
        # (a) pk to the silos, DH public keys back
        req = {**self._base(), **self.params.to_payload(), "paillier_n": pk.to_bytes(),
               "num_users": self.num_users,
               "participants": np.asarray(self.participants, dtype=np.int64)}
        replies = self._exchange(transport, "setup-keys", {c: req for c in self.participants}, t,
                                 required=True)
        for c in self.participants:
            if replies[c].get("pk_fingerprint") != pk.fingerprint():
                raise IntegrityError(f"private weighting: silo {c} holds another Paillier key")
        dh = b"".join(_pub(replies[c], c) for c in self.participants)
        # (b)-(c) relay DH keys; the first silo seals R for the others
        req = {**self._base(), "dh_publics": dh}
        replies = self._exchange(transport, "setup-seed", {c: req for c in self.participants}, t,
                                 required=True)
        leader = self.participants[0]
        seeds = {c: replies[leader].get(f"seed.{c}") for c in self.participants[1:]}
        if any(not isinstance(v, bytes) for v in seeds.values()):
            raise IntegrityError("private weighting: the first silo did not seal the shared seed")
        # (d)-(e) blinded, masked histograms
        requests = {c: {**self._base(), **({"seed": seeds[c]} if c in seeds else {})}
                    for c in self.participants}
        replies = self._exchange(transport, "setup-histogram", requests, t, required=True)
        started = time.perf_counter()
        n = pk.n
        totals = [mpz(0)] * self.num_users
        for c in self.participants:
            values = pk.integers_from_bytes(
                replies[c].get("blinded_histogram", b""), self.num_users,
                what=f"blinded histogram of silo {c}",
            )
            totals = [(a + b) % n for a, b in zip(totals, values, strict=True)]
        # (f) B_u^{-1} mod n
        inverse = []
        for u, b in enumerate(totals):
            if b == 0:
                raise ValueError(
                    f"private weighting: user {u} has no records in any silo (N_u = 0); weights "
                    "n_{s,u}/N_u need 1 <= N_u -- leave users without records out of the user set"
                )
            if gmpy2.gcd(b, n) != 1:  # probability ≈ 2^-1535 for uniform r_u
                raise IntegrityError("private weighting: a blinded total is not invertible; rerun")
            inverse.append(gmpy2.invert(b, n))
        self._inverse = inverse
        self._installed_for = None
        self.timings["inverses"] = time.perf_counter() - started

    def _install(self, transport: Any, sampled: np.ndarray | None, d: int, t: int) -> None:
        """Step 2(a): encrypt β_u, let the silos compute and share X_u, install, verify."""
        assert self._pk is not None and self.__sk is not None
        pk, sk = self._pk, self.__sk
        self._epoch += 1
        epoch = self._epoch
        started = time.perf_counter()
        beta = [b if sampled is None or sampled[u] else mpz(0)
                for u, b in enumerate(self._inverse)]
        workers = par.worth_parallel(len(beta) * pk.bits * 0.8, self.params.workers)
        chunks = [beta[r.start : r.stop] for r in par.split(len(beta), workers)]
        cts = [c for part in par.run_chunks(_encrypt_chunk, sk, chunks, workers) for c in part]
        self.timings["encrypt_weights"] = self.timings.get("encrypt_weights", 0.0) + (
            time.perf_counter() - started
        )
        blob = pk.ciphertexts_to_bytes(cts)
        pending = list(range(self.num_users))
        silos = list(self.participants)
        assignment: dict[int, list[int]] = {}
        shares: dict[int, bytes] = {}
        while pending:
            if not silos:
                raise RuntimeError("private weighting: no silo left to compute the weight shares")
            parts = np.array_split(np.asarray(pending, dtype=np.int64), len(silos))
            ask = {c: [int(u) for u in part] for c, part in zip(silos, parts, strict=True)}
            requests = {c: {**self._base(), "epoch": epoch, "weights": blob,
                            "assign": np.asarray(ask[c], dtype=np.int64)} for c in silos}
            replies = self._exchange(transport, "weights", requests, t, required=False)
            for c in silos:
                if c in replies:
                    assignment[c], shares[c] = ask[c], replies[c].get("shares", b"")
            pending = sorted(u for c in silos if c not in replies for u in ask[c])
            silos = [c for c in silos if c in replies]
        senders = sorted(assignment)
        install: Payload = {**self._base(), "epoch": epoch,
                            "senders": np.asarray(senders, dtype=np.int64),
                            "coordinates": int(d),
                            "reuse": 1 if sampled is not None else self.expected_rounds}
        for c in senders:
            install[f"shares.{c}"] = shares[c]
            install[f"assign.{c}"] = np.asarray(assignment[c], dtype=np.int64)
        replies = self._exchange(transport, "install", {c: install for c in silos}, t,
                                 required=False)
        self.participants = [c for c in silos if c in replies]
        if not self.participants:
            raise RuntimeError("private weighting: every silo was lost while installing weights")
        # Verification aggregate: DIV·(Σ w t + Σ ω) must be small; garbage is not.
        started = time.perf_counter()
        product = [mpz(1)] * _CHECKS
        for c in self.participants:
            cts = pk.ciphertexts_from_bytes(replies[c].get("check", b""), _CHECKS,
                                            what=f"verification ciphertexts of silo {c}")
            product = [pk.add(a, b) for a, b in zip(product, cts, strict=True)]
        ys = [sk.decrypt(c) for c in product]
        bound = mpz(self.params.divisor) << _CHECK_BOUND_BITS
        if not all(y < bound for y in ys):
            raise IntegrityError(
                "private weighting: the verification aggregate is garbage -- some user's total "
                f"N_u does not divide DIV (N_u > N_max = {self.params.max_total}, or not one of "
                "secure.allowed_totals), or a silo used a different key or the weights were "
                "modified; cap each user's records at N_max/|S| per silo, give allowed_totals, "
                "or raise secure.n_max"
            )
        self.timings["verify"] = self.timings.get("verify", 0.0) + time.perf_counter() - started
        self._installed_for = ("all",) if sampled is None else ("round", t)

    # -- SumProtocol --------------------------------------------------------------------------
    def collect(
        self,
        transport: Any,
        selected: list[int],
        params: Params,
        round_index: int,
        config: Scalars,
        server: ServerAlgorithm,
    ) -> Aggregate:
        t = int(round_index)
        d = sum(int(np.asarray(p).size) for p in params)
        num_users = getattr(server, "num_users", None)
        if not isinstance(num_users, int) or num_users < 1:
            raise ValueError(
                "weights: private needs a server algorithm that declares num_users (|U|)"
            )
        sampler = getattr(server, "sampled_users", None)
        sampled = None if sampler is None else sampler(t)
        if sampled is not None:
            sampled = np.asarray(sampled, dtype=bool)
            if sampled.shape != (num_users,):
                raise ValueError(f"sampled_users: expected ({num_users},) booleans")
        self.timings = {}
        if self.session is None or self.num_users != num_users:
            self.setup(transport, list(selected) or list(transport.client_ids), num_users, t)
        if sampled is not None or self._installed_for is None:
            self._install(transport, sampled, d, t)
        participants = [c for c in self.participants if c in set(selected)] if selected else []
        attempt = 0
        while participants:
            request: Payload = {
                **self._base(), "epoch": self._epoch, "attempt": attempt,
                "participants": np.asarray(participants, dtype=np.int64),
                "num_params": len(params),
            }
            for i, p in enumerate(params):
                request[f"param.{i}"] = np.asarray(p)
            for k, v in config.items():
                request[f"config.{k}"] = v
            replies = self._exchange(transport, "round", {c: request for c in participants}, t,
                                     required=False)
            answered = [c for c in participants if c in replies]
            if len(answered) < len(participants):  # abort; repeat without them, fresh masks
                self.participants = [c for c in self.participants if c in replies or c not in participants]
                participants, attempt = answered, attempt + 1
                continue
            total = self._aggregate(replies, participants, d)
            out, start = [], 0
            for p in params:
                arr = np.asarray(p)
                out.append(total[start : start + arr.size].reshape(arr.shape))
                start += arr.size
            return Aggregate(total=out, weight=float(len(participants)), metrics={},
                             count=len(participants))
        from pdpfl.fl.aggregation import empty_aggregate

        return empty_aggregate(params)

    def _aggregate(self, replies: dict[int, Payload], participants: list[int], d: int) -> np.ndarray:
        """Step 2(c): ⊕ over silos, CRT decryption, no-wrap check, Decode (Algorithm 5)."""
        assert self._pk is not None and self.__sk is not None
        pk, sk = self._pk, self.__sk
        started, cpu = time.perf_counter(), cpu_seconds()
        per_silo = []
        for c in participants:
            if replies[c].get("pk_fingerprint") != pk.fingerprint():
                raise IntegrityError(f"private weighting: silo {c} encrypted under another key")
            per_silo.append(pk.ciphertexts_from_bytes(replies[c].get("ciphertexts", b""), d,
                                                      what=f"ciphertexts of silo {c}"))
        workers = par.worth_parallel(d * 1.2 * pk.bits, self.params.workers)
        chunks = [[cts[r.start : r.stop] for cts in per_silo] for r in par.split(d, workers)]
        plain = [m for part in par.run_chunks(_decrypt_chunk, sk, chunks, workers) for m in part]
        n = pk.n
        half = n >> 1
        limit = n >> (GUARD_BITS + 1)
        div = int(self.params.divisor)
        P = float(self.params.precision)
        out = np.empty(d, dtype=np.float64)
        for j, y in enumerate(plain):
            y = int(y - n) if y > half else int(y)
            if abs(y) >= limit:
                raise IntegrityError(
                    "private weighting: a decrypted coordinate is outside the no-wrap range -- "
                    "a wrong key, a modified ciphertext, masks that did not cancel, or a user "
                    "whose N_u does not divide DIV; the aggregate is discarded"
                )
            out[j] = (y / div) * P
        self.timings["aggregate"] = time.perf_counter() - started
        self.timings["aggregate_cpu"] = cpu_seconds() - cpu
        return out


def _pub(reply: Payload, silo: int) -> bytes:
    value = reply.get("dh_public")
    if not isinstance(value, bytes) or len(value) != PUBLIC_KEY_BYTES:
        raise IntegrityError(f"private weighting: silo {silo} sent a malformed DH public key")
    return value


register_protocol(PROTOCOL, PrivateWeightedSum)
register_silo_handler(PROTOCOL, silo_handler, secret_memory=True)
