"""Secure summation (``aggregation: secure``): the server learns only the sum of the updates.

Pairwise additive masking (Bonawitz et al., CCS 2017, without the secret-sharing recovery
layer), driven purely through ``transport.exchange`` and the silo-side handler registered here,
so the same code runs in the in-process simulator and on Flower.

One round (``collect``), for the participant list P (sorted silo ids) the server announces:

1. ``keys`` -- each silo in P draws a fresh X25519 key pair for this round (private key in its
   protocol memory only) and replies with the 32-byte public key.
2. ``upload`` (attempt a = 0, 1, ...) -- the server relays all public keys of P together with
   the global model and the round configuration. Each silo

   * computes its contribution once per round (``client.fit``; cached for repeated attempts so
     that a retry never releases a second noisy update) and checks it
     (:func:`~pdpfl.fl.api.check_contribution`);
   * encodes update ‖ metrics in the fixed-point ring Z_{2^64}
     (:class:`~pdpfl.crypto.fixedpoint.FixedPointRing`; refusing values that could wrap);
   * for every other silo s' in P derives k = HKDF(X25519(own, s'), session ‖ round ‖ attempt
     ‖ H(P) ‖ pair) and the mask m = ChaCha20_k (one word per coordinate); adds m if its id is
     smaller than s', subtracts it otherwise;
   * replies with the masked vector and its public weight.

   The masks cancel in the sum over P; the server decodes the sum (checking that it lies in the
   range the encodings allow, which garbage from non-cancelling masks fails).

**Dropout rule (abort and repeat).** If a silo of P does not answer ``upload``, the attempt is
discarded -- its partial sum would still contain that silo's masks -- and repeated with the
silos that answered, under fresh masks (the attempt number enters every key). Survivors re-mask
the *same* cached contribution, and only one attempt per round is ever unmasked, so the server
learns one sum per round; a silo lost at ``keys`` is simply left out. The lost silo's update is
not part of the round (its ledger was charged: conservative).

**Hidden participation** (``participation: hidden``, beyond the rPDP-FL paper). The server
asks *every* silo every round; each silo flips its own λ-coin from its own randomness
(``client.participation_coin``) and uploads its masked update if chosen and masked zeros
otherwise. Messages have the same names, types and sizes either way, and the aggregate weight is
the public constant λ·Σ_i w_i, so the server's view equals a third party's: rPDP-FL Theorem 1's
λ-amplified bound holds against the server too (the silos' ledgers charge the server observer
like the third-party one). Timing is not hidden: a silo that was not chosen answers sooner unless
the deployment pads response times.

What the server learns: the sum of the participants' updates and metrics, the participant list
and (public) weights. Semi-honest model: a server that lies about dropouts could obtain sums of
different subsets in repeated attempts; silos refuse to reuse an attempt, but detecting such a
server needs the consistency checks of the malicious-secure protocol (not implemented).
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from pdpfl.crypto import IntegrityError
from pdpfl.crypto.fixedpoint import FixedPointRing
from pdpfl.crypto.keys import (
    PUBLIC_KEY_BYTES,
    agree,
    context,
    digest,
    mask_words,
    new_private_key,
    public_bytes,
)
from pdpfl.fl.aggregation import (
    Payload,
    SiloContext,
    empty_aggregate,
    register_protocol,
    register_silo_handler,
)
from pdpfl.fl.api import (
    Aggregate,
    Contribution,
    Params,
    Scalars,
    ServerAlgorithm,
    check_contribution,
)

__all__ = ["PROTOCOL", "SecureSum", "silo_handler"]

PROTOCOL = "secure"
_VERSION = "pdpfl/secure-sum/v1"


def _participants(payload: Payload) -> list[int]:
    arr = np.asarray(payload.get("participants"))
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or arr.size == 0:
        raise IntegrityError("secure summation: participants must be a non-empty int array")
    ids = [int(c) for c in arr.tolist()]
    if ids != sorted(set(ids)):
        raise IntegrityError("secure summation: participants must be sorted and distinct")
    return ids


def _bytes(payload: Payload, key: str, size: int | None = None) -> bytes:
    value = payload.get(key)
    if not isinstance(value, bytes | bytearray) or (size is not None and len(value) != size):
        raise IntegrityError(f"secure summation: field {key!r} is missing or malformed")
    return bytes(value)


class SecureSum:
    """The server side of ``aggregation: secure``.

    Parameters
    ----------
    participation
        ``visible`` (the server samples silos, Algorithm 3 line 7) or ``hidden`` (every silo is
        asked; each silo draws its own λ-coin, see the module docstring).
    client_rate
        λ, the public sampling rate (used in hidden mode for the aggregate's weight λ·Σ w_i).
    fractional_bits
        f of the fixed-point ring Z_{2^64} (resolution 2^-f; range ±2^(55-f)/m per silo).
    guard_bits
        Bits of the ring kept free to detect masks that did not cancel (2^-g per coordinate).
    """

    name = PROTOCOL
    hides_individual_updates = True

    def __init__(
        self,
        participation: str = "visible",
        client_rate: float = 1.0,
        fractional_bits: int = 32,
        guard_bits: int = 8,
        **_: Any,
    ) -> None:
        if participation not in ("visible", "hidden"):
            raise ValueError(f"participation: expected visible or hidden, got {participation!r}")
        if not 0 < float(client_rate) <= 1:
            raise ValueError(f"training.client_rate: must be in (0, 1], got {client_rate}")
        self.participation = participation
        self.client_rate = float(client_rate)
        self.ring = FixedPointRing(int(fractional_bits), int(guard_bits))
        #: Public nonce binding this run's keys (not a secret).
        self.session = secrets.token_bytes(16)
        #: Public facts of the last round: attempts made, silos lost (for logs and tests).
        self.last_round: dict[str, Any] = {}

    @property
    def silo_side_sampling(self) -> bool:
        """True in hidden mode: the round loop asks every silo (it draws its own coin)."""
        return self.participation == "hidden"

    def precision(self, parties: int) -> float:
        """Worst-case absolute error of one coordinate of the sum of ``parties`` updates."""
        return self.ring.precision(parties)

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
        metric_names = sorted(getattr(server, "public_metrics", frozenset()))
        if self.silo_side_sampling and metric_names:
            raise ValueError(
                "participation: hidden cannot be used with an algorithm that releases metrics "
                f"({', '.join(metric_names)}): their sum would reveal how many silos took part"
            )
        participants = sorted({int(c) for c in selected})
        self.last_round = {"round": t, "asked": list(participants), "attempts": 0, "lost": []}
        if not participants:
            return empty_aggregate(params)
        keys = self._keys(transport, participants, t)
        self.last_round["lost"] = [c for c in participants if c not in keys]
        participants = [c for c in participants if c in keys]
        attempt = 0
        while participants:
            self.last_round["attempts"] = attempt + 1
            request = self._upload_request(participants, keys, params, config, metric_names, attempt)
            replies = transport.exchange(PROTOCOL, "upload", {c: request for c in participants}, t)
            answered = [c for c in participants if c in replies]
            if len(answered) < len(participants):
                # Abort: the partial sum still holds the lost silos' masks. Repeat, fresh masks.
                self.last_round["lost"] += [c for c in participants if c not in replies]
                participants, attempt = answered, attempt + 1
                continue
            return self._unmask(replies, participants, params, metric_names)
        return empty_aggregate(params)

    # -- stages --------------------------------------------------------------------------------
    def _keys(self, transport: Any, participants: list[int], t: int) -> dict[int, bytes]:
        request = {"session": self.session, "participants": np.asarray(participants, np.int64)}
        replies = transport.exchange(PROTOCOL, "keys", {c: request for c in participants}, t)
        keys = {}
        for c in participants:
            if c in replies:
                keys[c] = _bytes(replies[c], "public_key", PUBLIC_KEY_BYTES)
        return keys

    def _upload_request(
        self,
        participants: list[int],
        keys: dict[int, bytes],
        params: Params,
        config: Scalars,
        metric_names: list[str],
        attempt: int,
    ) -> Payload:
        request: Payload = {
            "session": self.session,
            "attempt": int(attempt),
            "participants": np.asarray(participants, dtype=np.int64),
            "public_keys": b"".join(keys[c] for c in participants),
            "num_params": len(params),
            "metrics": ",".join(metric_names),
            "hidden": self.silo_side_sampling,
            "fractional_bits": self.ring.fractional_bits,
            "guard_bits": self.ring.guard_bits,
        }
        for i, p in enumerate(params):
            request[f"param.{i}"] = np.asarray(p)
        for k, v in config.items():
            request[f"config.{k}"] = v
        return request

    def _unmask(
        self, replies: dict[int, Payload], participants: list[int], params: Params,
        metric_names: list[str],
    ) -> Aggregate:
        size = sum(int(np.asarray(p).size) for p in params) + len(metric_names)
        total = np.zeros(size, dtype=np.uint64)
        weight = 0.0
        for c in participants:
            vec = np.asarray(replies[c].get("masked"))
            if vec.dtype != np.uint64 or vec.shape != (size,):
                raise IntegrityError(f"secure summation: silo {c} sent a malformed masked vector")
            total += vec  # ring addition (wraps modulo 2^64)
            w = replies[c].get("weight")
            if isinstance(w, bool) or not isinstance(w, int | float) or not np.isfinite(w):
                raise IntegrityError(f"secure summation: silo {c} sent a malformed weight")
            weight += float(w)
        values = self.ring.decode(total, len(participants))
        out, start = [], 0
        for p in params:
            arr = np.asarray(p)
            out.append(values[start : start + arr.size].reshape(arr.shape).astype(np.float32))
            start += arr.size
        metrics = {name: float(values[start + i]) for i, name in enumerate(metric_names)}
        if self.silo_side_sampling:
            weight *= self.client_rate  # the public normaliser λ·Σ w_i (never a realised count)
        return Aggregate(total=out, weight=weight, metrics=metrics, count=len(participants))


# --------------------------------------------------------------------------------- silo side


def _contribution_vector(
    ctx: SiloContext, payload: Payload, t: int, shapes: list[tuple[int, ...]], names: list[str]
) -> tuple[np.ndarray, float]:
    """This silo's update ‖ metrics as float64 (zeros if its hidden coin said no), and weight."""
    client = ctx.client
    params = [np.asarray(payload[f"param.{i}"]) for i in range(len(shapes))]
    config = {k[len("config.") :]: v for k, v in payload.items() if k.startswith("config.")}
    size = sum(int(np.prod(s)) for s in shapes) + len(names)
    if bool(payload.get("hidden")):
        coin = getattr(client, "participation_coin", None)
        weight_of = getattr(client, "public_weight", None)
        if coin is None or weight_of is None:
            raise ValueError(
                f"participation: hidden needs silos that draw their own participation coin; "
                f"{type(client).__name__} does not (use participation: visible)"
            )
        weight = float(weight_of())
        if not coin(t):
            return np.zeros(size, dtype=np.float64), weight
        contribution = client.fit(params, t, config)
    else:
        contribution = client.fit(params, t, config)
        weight = None
    check_contribution(contribution, frozenset(names), len(shapes))
    assert isinstance(contribution, Contribution)
    parts = []
    for i, (u, shape) in enumerate(zip(contribution.update, shapes, strict=True)):
        arr = np.asarray(u, dtype=np.float64)
        if arr.shape != shape:
            raise ValueError(f"silo {ctx.silo_id}: update[{i}] has shape {arr.shape}, not {shape}")
        parts.append(arr.reshape(-1))
    parts.append(np.array([float(contribution.metrics.get(n, 0.0)) for n in names]))
    return np.concatenate(parts), float(contribution.weight) if weight is None else weight


def silo_handler(stage: str, payload: Payload, round_index: int, ctx: SiloContext) -> Payload:
    """The silo side of ``aggregation: secure`` (stages ``keys`` and ``upload``)."""
    t = int(round_index)
    mem = ctx.memory.setdefault(PROTOCOL, {})
    if stage == "keys":
        if mem.get("round") != t:
            mem.clear()  # a new round: forget the last round's keys and contribution
            mem["round"] = t
        participants = _participants(payload)
        if ctx.silo_id not in participants:
            raise IntegrityError(f"secure summation: silo {ctx.silo_id} is not a participant")
        key = new_private_key()
        # Plain data only (bytes, arrays, ints): a runtime may keep this memory in the silo's own
        # process or state folder. It never leaves the silo and is dropped at the next round.
        mem["private_key"] = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        mem["session"] = _bytes(payload, "session")
        mem["attempts"] = []
        return {"public_key": public_bytes(key)}
    if stage != "upload":
        raise ValueError(f"secure summation: unknown stage {stage!r}")
    if mem.get("round") != t or "private_key" not in mem:
        raise IntegrityError(f"secure summation: silo {ctx.silo_id} has no key for round {t}")
    session = _bytes(payload, "session")
    if session != mem["session"]:
        raise IntegrityError("secure summation: the session does not match this round's keys")
    attempt = int(payload.get("attempt", -1))
    if attempt < 0 or attempt in mem["attempts"]:
        raise IntegrityError(f"secure summation: attempt {attempt} of round {t} was already used")
    participants = _participants(payload)
    if ctx.silo_id not in participants:
        raise IntegrityError(f"secure summation: silo {ctx.silo_id} is not a participant")
    blob = _bytes(payload, "public_keys", PUBLIC_KEY_BYTES * len(participants))
    publics = {c: blob[i * PUBLIC_KEY_BYTES : (i + 1) * PUBLIC_KEY_BYTES] for i, c in enumerate(participants)}
    own = X25519PrivateKey.from_private_bytes(mem["private_key"])
    if publics[ctx.silo_id] != public_bytes(own):
        raise IntegrityError("secure summation: the relayed key list does not hold this silo's key")
    ring = FixedPointRing(int(payload["fractional_bits"]), int(payload["guard_bits"]))
    n_params = int(payload["num_params"])
    shapes = [tuple(np.asarray(payload[f"param.{i}"]).shape) for i in range(n_params)]
    names = [n for n in str(payload.get("metrics", "")).split(",") if n]
    if "vector" not in mem:
        mem["vector"], mem["weight"] = _contribution_vector(ctx, payload, t, shapes, names)
    mem["attempts"] = [*mem["attempts"], attempt]
    encoded = ring.encode(
        mem["vector"], len(participants), what=f"silo {ctx.silo_id}: update of round {t}"
    )
    masked = encoded.copy()
    group = digest(*participants)
    for other in participants:
        if other == ctx.silo_id:
            continue
        lo, hi = sorted((ctx.silo_id, other))
        info = context(_VERSION, session, t, attempt, group, lo, hi)
        mask = mask_words(agree(own, publics[other], info), masked.size)
        if ctx.silo_id < other:
            masked += mask
        else:
            masked -= mask
    return {"masked": masked, "weight": float(mem["weight"])}


register_protocol(PROTOCOL, SecureSum)
register_silo_handler(PROTOCOL, silo_handler)
