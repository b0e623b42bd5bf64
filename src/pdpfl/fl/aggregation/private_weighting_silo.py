"""The silo side of ULDP-FL's private weighting protocol (Protocol 1; stages in
:mod:`pdpfl.fl.aggregation.private_weighting`).

A silo's state (:class:`_SiloState`: its X25519 key, the pairwise keys, the shared seed R and the
r_u, its histogram) lives in ``ctx.memory`` only -- the protocol is registered with
``secret_memory=True``, so no runtime writes it to disk. Each round's contribution is computed,
encoded (noise on the unit grid: :func:`~pdpfl.fl.aggregation.private_weighting_core.
noise_plaintext`), masked and encrypted once; a repeated round request is refused.
"""

from __future__ import annotations

import math
import secrets
import time
from typing import Any

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
from pdpfl.crypto.paillier import PaillierPublicKey
from pdpfl.fl.aggregation import Payload, SiloContext
from pdpfl.fl.aggregation.private_sampling import choose_items, open_items
from pdpfl.fl.aggregation.private_weighting_core import (
    _CHECK_OMEGA_BITS,
    _CHECK_T_BITS,
    _CHECKS,
    _VERSION,
    PROTOCOL,
    RERANDOMIZER_BITS,
    PrivateWeightingClient,
    UserUpdates,
    WeightingParams,
    cpu_seconds,
    dithers,
    noise_plaintext,
)
from pdpfl.fl.aggregation.threshold import SURVIVORS_KEY, check_round_threshold
from pdpfl.randomness import Randomness

__all__ = ["silo_handler"]


def _power_chunk(n2: mpz, job: tuple[list[mpz], list[mpz]]) -> list[mpz]:
    bases, exponents = job
    return [gmpy2.powmod(b, e, n2) for b, e in zip(bases, exponents, strict=True)]


def _round_chunk(state: _SiloState, job: tuple[np.ndarray, list[int]]) -> bytes:
    """⟦Y⟧ for a block of coordinates: multi-exponentiation, plaintext, re-randomiser."""
    exponents, plain = job
    pk = state.pk
    n, n2 = pk.n, pk.n2
    assert state.multiexp is not None and state.rerandomizer is not None
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

    def __init__(
        self,
        silo_id: int,
        session: bytes,
        params: WeightingParams,
        pk: PaillierPublicKey,
        participants: list[int],
        histogram: np.ndarray,
    ) -> None:
        self.silo_id = silo_id
        self.session = session
        self.params = params
        self.pk = pk
        self.participants = participants
        self.histogram = histogram
        self.divisor = mpz(params.divisor)
        self.dh: Any = new_private_key()
        self.pairwise: dict[int, bytes] = {}
        self.seed: bytes | None = None
        self.group_key: bytes | None = None
        self.r: list[mpz] = []
        self.epoch: int | None = None
        self.users: np.ndarray = np.zeros(0, dtype=np.int64)  # users with n_{s,u} > 0
        self.multiexp: MultiExp | None = None
        self.rerandomizer: FixedBaseExp | None = None
        #: Rounds this silo has masked in this session (each at most once).
        self.masked_rounds: set[int] = set()
        self.timings: dict[str, float] = {}
        #: Private sub-sampling: (epoch, A, this silo's OT receivers by user) -- its choices.
        self.ot: tuple[int, bytes, dict[int, Any]] | None = None

    @property
    def num_users(self) -> int:
        return int(self.histogram.size)

    def ctx(self, *parts: bytes | str | int) -> bytes:
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
    publics = {
        c: blob[i * PUBLIC_KEY_BYTES : (i + 1) * PUBLIC_KEY_BYTES]
        for i, c in enumerate(participants)
    }
    if publics[ctx.silo_id] != public_bytes(state.dh):
        raise IntegrityError(
            "private weighting: the relayed key list does not hold this silo's key"
        )
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
            state.pairwise[leader],
            payload.get("seed", b""),
            state.ctx("seed", leader, ctx.silo_id),
            what="private weighting: shared seed R",
        )
    assert state.seed is not None
    n = state.pk.n
    state.group_key = derive(state.seed, state.ctx("group"))
    # r_u ∈ Z_n^*: identical at every silo (ChaCha20 keyed by R), never known to the server.
    stream = mask_integers(derive(state.seed, state.ctx("r", 0)), state.num_users, int(n))
    r = [mpz(v) for v in stream]
    for u, value in enumerate(r):
        attempt = 1
        while value == 0 or gmpy2.gcd(value, n) != 1:  # probability ≈ 2^-1535
            value = mpz(mask_integers(derive(state.seed, state.ctx("r", u, attempt)), 1, int(n))[0])
            attempt += 1
        r[u] = value
    state.r = r
    masks = state.pair_masks(state.ctx("histogram"), state.participants, state.num_users)
    blinded = [
        (ru * int(h) + m) % n for ru, h, m in zip(r, state.histogram.tolist(), masks, strict=True)
    ]
    return {"blinded_histogram": state.pk.integers_to_bytes(blinded)}


def _assigned(state: _SiloState, payload: Payload) -> list[int]:
    assign = _ids(payload, "assign")
    if assign and (assign[0] < 0 or assign[-1] >= state.num_users):
        raise IntegrityError("private weighting: assigned users out of range")
    return assign


def _weights_ot(ctx: SiloContext, payload: Payload) -> Payload:
    """Private sub-sampling, first half: a uniform choice c_u per assigned user and its OT
    message B_u (:mod:`pdpfl.fl.aggregation.private_sampling`); the choices stay here."""
    state = _state(ctx, payload)
    started = time.perf_counter()
    epoch, assign = int(payload["epoch"]), _assigned(state, payload)
    p = int(payload.get("ot_items", 0))
    if not 2 <= p <= 1000:
        raise IntegrityError(f"private sub-sampling: P = {p} items per user is out of range")
    sender = payload.get("ot_sender")
    if not isinstance(sender, bytes):
        raise IntegrityError("private sub-sampling: missing the server's OT point")
    receivers, message = choose_items(sender, assign, p)
    state.ot = (epoch, sender, receivers)
    state.timings["weights-ot"] = time.perf_counter() - started
    return {"ot_choices": message}


def _chosen_weights(
    state: _SiloState, payload: Payload, epoch: int, assign: list[int]
) -> list[mpz]:
    """The one ciphertext per assigned user this silo's OT choices open (private sub-sampling),
    each checked like ⟦β_u⟧; the choices are forgotten afterwards."""
    if state.ot is None or state.ot[0] != epoch or sorted(state.ot[2]) != assign:
        raise IntegrityError("private sub-sampling: OT items for choices this silo did not make")
    _, sender, receivers = state.ot
    state.ot = None
    p = int(payload.get("ot_items", 0))
    width = state.pk.ciphertext_bytes
    opened = open_items(
        receivers, sender, payload.get("ot_sealed"), assign, p, width, state.session, epoch
    )
    return state.pk.ciphertexts_from_bytes(
        b"".join(opened), len(assign), check_units=True, what="obliviously transferred weights"
    )


def _weights(ctx: SiloContext, payload: Payload) -> Payload:
    """Step 2(a) at the silo: X_u = ⟦β_u⟧^{r_u·DIV} for the users assigned to this silo (⟦β_u⟧
    or ⟦0⟧ obtained by oblivious transfer under private sub-sampling)."""
    state = _state(ctx, payload)
    started = time.perf_counter()
    epoch = int(payload["epoch"])
    assign = _assigned(state, payload)
    if "ot_sealed" in payload:
        bases = _chosen_weights(state, payload, epoch, assign)
    else:
        cts = state.pk.ciphertexts_from_bytes(
            payload["weights"], state.num_users, check_units=True, what="encrypted weights ⟦β_u⟧"
        )
        bases = [cts[u] for u in assign]
    n, n2 = state.pk.n, state.pk.n2
    exps = [state.r[u] * state.divisor % n for u in assign]
    workers = par.worth_parallel(len(assign) * 1.5 * state.pk.bits, state.params.workers)
    chunks = [
        (bases[r.start : r.stop], exps[r.start : r.stop]) for r in par.split(len(assign), workers)
    ]
    shares = [x for part in par.run_chunks(_power_chunk, n2, chunks, workers) for x in part]
    state.epoch = None
    state.timings["weights"] = time.perf_counter() - started
    assert state.group_key is not None
    blob = seal(
        state.group_key,
        state.pk.ciphertexts_to_bytes(shares),
        state.ctx("share", epoch, ctx.silo_id, digest(*assign)),
    )
    return {"shares": blob}


def _install(ctx: SiloContext, payload: Payload) -> Payload:
    """Step 2(a), second half: C_{s,u} = X_u^{n_{s,u}} and the multi-exponentiation tables."""
    state = _state(ctx, payload)
    started = time.perf_counter()
    epoch = int(payload["epoch"])
    senders = np.asarray(payload.get("senders"))
    if senders.ndim != 1 or senders.dtype.kind not in "iu":
        raise IntegrityError("private weighting: field 'senders' must be an int array")
    x: list[mpz | None] = [None] * state.num_users
    assert state.group_key is not None
    # part i: the users assign.i whose X_u silo senders[i] sealed in shares.i (a silo that took
    # over a lost silo's users sends more than one part)
    for i, s in enumerate(int(v) for v in senders.tolist()):
        assign = _ids(payload, f"assign.{i}")
        plain = open_sealed(
            state.group_key,
            payload.get(f"shares.{i}", b""),
            state.ctx("share", epoch, s, digest(*assign)),
            what=f"weight shares of silo {s}",
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
    # Verification aggregate: ⟦DIV·(Σ_u w_{s,u}·t_{s,u} + ω_s)⟧ + masks for _CHECKS random
    # vectors t (ω hides Σ w·t). A user whose N_u does not divide DIV makes a coordinate
    # garbage unless N_u/gcd(N_u, DIV) divides Σ_s n_{s,u}·t_{s,u}: missed w.p. ≤ (1/2)^8 per
    # coordinate set, far less for N_u > N_max + 1 (see the module docstring).
    t = np.array(
        [[secrets.randbits(_CHECK_T_BITS) for _ in range(_CHECKS)] for _ in range(users.size)],
        dtype=np.int64,
    ).reshape(users.size, _CHECKS)
    products = state.multiexp.products(t) if users.size else [mpz(1)] * _CHECKS
    # the silos still answering (a silo lost in ``weights`` is left out), within the setup's
    checking = _ids(payload, "participants") if "participants" in payload else state.participants
    if ctx.silo_id not in checking or not set(checking) <= set(state.participants):
        raise IntegrityError("private weighting: install for participants outside the setup")
    masks = state.pair_masks(state.ctx("check", epoch), checking, _CHECKS)
    n = state.pk.n
    checks = []
    div = int(state.divisor)
    for prod, mask in zip(products, masks, strict=True):
        c = prod * (1 + (check_mask(div) + mask) % n * n) % n2
        checks.append(c * state.rerandomizer.pow(secrets.randbits(RERANDOMIZER_BITS)) % n2)
    state.timings["install"] = time.perf_counter() - started
    return {"check": state.pk.ciphertexts_to_bytes(checks)}


def _round(ctx: SiloContext, payload: Payload, t: int) -> Payload:
    """Step 2(b)-(c) at the silo: ⟦Y_s⟧ per coordinate, masked for the participants.

    Once per round: a silo never masks a second contribution for a round it has masked, and
    never re-masks one (no retry; issue #22).
    """
    state = _state(ctx, payload)
    if state.multiexp is None or state.epoch != int(payload["epoch"]):
        raise IntegrityError("private weighting: weights of this epoch are not installed")
    started, cpu = time.perf_counter(), cpu_seconds()
    participants = _ids(payload, "participants")
    if ctx.silo_id not in participants or not set(participants) <= set(state.participants):
        raise IntegrityError("private weighting: invalid participant list")
    threshold = check_round_threshold(
        int(payload.get("threshold", 0)), len(state.participants), what="private weighting"
    )
    if len(participants) < threshold:
        raise IntegrityError(
            f"private weighting: {len(participants)} participants < t = {threshold}; refused"
        )
    if t in state.masked_rounds:
        raise IntegrityError(f"private weighting: round {t} was already masked by this silo")
    state.masked_rounds.add(t)
    num = int(payload["num_params"])
    shapes = [tuple(np.asarray(payload[f"param.{i}"]).shape) for i in range(num)]
    d = sum(int(np.prod(s)) for s in shapes)
    params = [np.asarray(payload[f"param.{i}"]) for i in range(num)]
    config = {k[len("config.") :]: v for k, v in payload.items() if k.startswith("config.")}
    config[SURVIVORS_KEY] = threshold
    client = ctx.client
    if not isinstance(client, PrivateWeightingClient):
        raise ValueError(f"weights: private needs user_updates() at silo {ctx.silo_id}")
    upd = client.user_updates(params, t, config)
    exponents, noise, grid = _encode_updates(state, upd, d, len(state.participants))
    n = state.pk.n
    div = int(state.divisor)
    masks = state.pair_masks(state.ctx("round", t, digest(*participants)), participants, d)
    randomness = getattr(client, "randomness", None)
    stream = (
        randomness.stream("private-weighting-dither", t, ctx.silo_id)
        if isinstance(randomness, Randomness)
        else None
    )
    # discrete noise on the grid 2^m·P: the dither covers a full residue system modulo 2^m·DIV
    # (private_weighting_core, *Exact discrete noise*)
    us = dithers(div << grid, d, stream)
    plain = [(noise_plaintext(div, z, u) + m) % n for z, u, m in zip(noise, us, masks, strict=True)]
    assert state.rerandomizer is not None
    cost = d * (exponents.shape[0] * 5 + 40 + RERANDOMIZER_BITS / state.rerandomizer.window)
    workers = par.worth_parallel(cost, state.params.workers)
    chunks = [
        (exponents[:, r.start : r.stop], plain[r.start : r.stop]) for r in par.split(d, workers)
    ]
    blob = b"".join(par.run_chunks(_round_chunk, state, chunks, workers))
    state.timings["round"] = time.perf_counter() - started
    state.timings["round_cpu"] = cpu_seconds() - cpu
    return {"ciphertexts": blob, "pk_fingerprint": state.pk.fingerprint()}


def check_mask(div: int) -> int:
    """ω_s of the verification value: uniform below DIV·2^76 on the unit grid (the paper's
    DIV·ω leaves the residue of DIV·Σ w·t modulo DIV -- the lcm of the N_u -- in the clear)."""
    return secrets.randbelow(int(div) << _CHECK_OMEGA_BITS)


def _encode_updates(
    state: _SiloState, upd: UserUpdates, d: int, silos: int
) -> tuple[np.ndarray, list[int], int]:
    """v = round(Δ/P) as an exponent matrix over the installed users, the noise in units of P
    (round(z/P), or 2^m·Z with discrete noise on the grid m) and m (0: continuous)."""
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
    grid = int(upd.grid)
    grid_noise = None
    if upd.grid_noise is not None:
        grid_noise = np.asarray(upd.grid_noise)
        if grid_noise.shape != (d,) or grid_noise.dtype != np.int64 or not 0 <= grid < 512:
            raise ValueError(
                f"silo {state.silo_id}: user_updates().grid_noise must be ({d},) int64 on a "
                f"grid 0 <= m < 512, got {grid_noise.dtype} {grid_noise.shape}, m = {grid}"
            )
    elif grid != 0:
        raise ValueError(f"silo {state.silo_id}: user_updates().grid = {grid} without grid_noise")
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = np.rint(deltas / P)
        z = np.rint(noise / P) if grid_noise is None else grid_noise.astype(np.float64)
    # No-wrap share: Σ_u |v| + 2^m·(|Z| + 1) (z = round(z/P) and m = 0 with continuous noise;
    # the +1 is the dither) must stay below this silo's room R = 2^vb/|S|
    # (private_weighting_core: then |Y| < n/2^65). Every |v| < 2^62, checked below.
    room = state.params.silo_room(state.pk.bits, silos)
    scale = math.ldexp(1.0, grid)
    worst = float(np.max(np.sum(np.abs(scaled), axis=0) + scale * (np.abs(z) + 1.0))) if d else 0.0
    if worst >= room or (scaled.size and float(np.max(np.abs(scaled))) >= 2.0**62):
        raise RingOverflowError(
            f"silo {state.silo_id}: encoded values reach {worst:.3g}·P, beyond the no-wrap room "
            f"of this silo ({room:.3g}·P with P = {P:g}, DIV of "
            f"{state.params.divisor.bit_length()} bits and a {state.pk.bits}-bit key); "
            "use a larger secure.precision P"
        )
    for i, u in enumerate(users.tolist()):
        exps[row[int(u)]] = scaled[i].astype(np.int64)
    if grid_noise is not None:
        return exps, [int(v) << grid for v in grid_noise.tolist()], grid
    return exps, [int(v) for v in z.tolist()], 0


def silo_handler(stage: str, payload: Payload, round_index: int, ctx: SiloContext) -> Payload:
    """The silo side of Protocol 1 (see the module docstring for the stages)."""
    if stage == "setup-keys":
        return _setup_keys(ctx, payload)
    if stage == "setup-seed":
        return _setup_seed(ctx, payload)
    if stage == "setup-histogram":
        return _setup_histogram(ctx, payload)
    if stage == "weights-ot":
        return _weights_ot(ctx, payload)
    if stage == "weights":
        return _weights(ctx, payload)
    if stage == "install":
        return _install(ctx, payload)
    if stage == "round":
        return _round(ctx, payload, int(round_index))
    raise ValueError(f"private weighting: unknown stage {stage!r}")
