"""The silo side of ``aggregation: secure`` (stages ``advertise``, ``share``, ``upload``,
``unmask``; Bonawitz et al. 2017, Fig. 4, rounds 0-3 for a semi-honest server).

Secrets (the channel key c_i, the seeds b_i and s_i, the shares received) live in
``ctx.memory["secure"]`` only -- a runtime never writes that entry to disk -- and are dropped as
soon as they are no longer needed. The one fact kept in the public, persisted memory is the list
of rounds this silo has *masked*: a silo masks a round's contribution at most once per run, so a
server that restarts the round (a new session after a crash, or a retry) can never obtain two sums
of the same contributions over different silo sets. Such a silo *declines* the round instead.

Checks a silo makes before each reply (an :class:`~pdpfl.crypto.IntegrityError` otherwise):
it is a participant; every participant list is a subset of the previous one; t is the round's
and 2 ≤ t ≤ n, 2t > n; at least t parties remain at every stage; the stage follows the previous
one of the same session and round; it answers ``unmask`` once, with survivors and dropped silos
that partition the silos it masked with, and never both shares of one silo.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from pdpfl.crypto import IntegrityError, shamir
from pdpfl.crypto.fixedpoint import FixedPointRing
from pdpfl.crypto.keys import agree, new_private_key, open_sealed, public_bytes, seal
from pdpfl.fl.aggregation import Payload, SiloContext, public_memory
from pdpfl.fl.aggregation.discrete_shares import ShareEncoding, check_words, encoding_of
from pdpfl.fl.aggregation.secure_common import (
    PROTOCOL,
    SEALED_SHARE_BYTES,
    channel_info,
    field_bytes,
    ids,
    key_table,
    mask_key,
    pair_mask,
    self_mask,
    share_aad,
)
from pdpfl.fl.aggregation.threshold import SURVIVORS_KEY, check_round_threshold
from pdpfl.fl.api import Contribution, check_contribution

__all__ = ["silo_handler"]


def _raw(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def _state(ctx: SiloContext, payload: Payload, t: int, stage: str) -> dict[str, Any]:
    """This round's secret state, checked to be at ``stage`` of the payload's session."""
    mem = ctx.memory.get(PROTOCOL)
    session = field_bytes(payload, "session")
    if not isinstance(mem, dict) or mem.get("round") != t or mem.get("session") != session:
        raise IntegrityError(
            f"secure summation: silo {ctx.silo_id} holds no state for this session of round {t}"
        )
    if mem.get("stage") != stage:
        raise IntegrityError(
            f"secure summation: silo {ctx.silo_id} is at stage {mem.get('stage')!r} of round "
            f"{t}, not {stage!r} (each stage is answered once, in order)"
        )
    return mem


def _subset(ctx: SiloContext, new: list[int], old: list[int], t: int, what: str) -> None:
    if ctx.silo_id not in new:
        raise IntegrityError(f"secure summation: silo {ctx.silo_id} is not among the {what}")
    if not set(new) <= set(old):
        raise IntegrityError(f"secure summation: the {what} are not a subset of the last list")
    if len(new) < t:
        raise IntegrityError(
            f"secure summation: {len(new)} {what} < t = {t}; this silo does not continue"
        )


def _advertise(ctx: SiloContext, payload: Payload, t: int) -> Payload:
    participants = ids(payload, "participants")
    threshold = check_round_threshold(int(payload.get("threshold", 0)), len(participants))
    if ctx.silo_id not in participants:
        raise IntegrityError(f"secure summation: silo {ctx.silo_id} is not a participant")
    session = field_bytes(payload, "session")
    old = ctx.memory.get(PROTOCOL)
    if isinstance(old, dict) and old.get("round") == t and old.get("session") == session:
        raise IntegrityError(f"secure summation: round {t} of this session was already begun")
    ctx.memory.pop(PROTOCOL, None)  # forget any earlier round's secrets
    if t in public_memory(ctx, PROTOCOL).get("masked", []):
        # Masked once already (an earlier session of this round): never again.
        return {"declined": True}
    channel = new_private_key()
    mask_seed, self_seed = secrets.token_bytes(16), secrets.token_bytes(16)
    ctx.memory[PROTOCOL] = {
        "session": session,
        "round": t,
        "stage": "advertised",
        "threshold": threshold,
        "participants": participants,
        "channel_key": _raw(channel),
        "mask_seed": mask_seed,
        "self_seed": self_seed,
    }
    return {
        "declined": False,
        "channel_key": public_bytes(channel),
        "mask_key": public_bytes(mask_key(mask_seed, session, t)),
    }


def _share(ctx: SiloContext, payload: Payload, t: int) -> Payload:
    mem = _state(ctx, payload, t, "advertised")
    session, threshold = mem["session"], mem["threshold"]
    u1 = ids(payload, "u1")
    _subset(ctx, u1, mem["participants"], threshold, "silos with keys")
    channels = key_table(field_bytes(payload, "channel_keys"), u1, "channel")
    masks = key_table(field_bytes(payload, "mask_keys"), u1, "mask")
    own = X25519PrivateKey.from_private_bytes(mem["channel_key"])
    if channels[ctx.silo_id] != public_bytes(own) or masks[ctx.silo_id] != public_bytes(
        mask_key(mem["mask_seed"], session, t)
    ):
        raise IntegrityError(
            "secure summation: the relayed key list does not hold this silo's keys"
        )
    self_shares = shamir.split(mem["self_seed"], threshold, u1)
    mask_shares = shamir.split(mem["mask_seed"], threshold, u1)
    keys, sealed = {}, []
    for other in u1:
        if other == ctx.silo_id:
            continue
        keys[other] = agree(own, channels[other], channel_info(session, t, ctx.silo_id, other))
        plain = self_shares[other] + mask_shares[other]
        sealed.append(seal(keys[other], plain, share_aad(session, t, ctx.silo_id, other)))
    mem.update(
        stage="shared",
        u1=u1,
        mask_keys=masks,
        channels=keys,
        held={ctx.silo_id: (self_shares[ctx.silo_id], mask_shares[ctx.silo_id])},
    )
    del mem["channel_key"]  # the channel keys are derived; the X25519 key is no longer needed
    return {"shares": b"".join(sealed)}


def _open_shares(
    ctx: SiloContext, mem: dict[str, Any], payload: Payload, u2: list[int], t: int
) -> None:
    senders = [c for c in u2 if c != ctx.silo_id]
    blob = field_bytes(payload, "shares", SEALED_SHARE_BYTES * len(senders))
    for i, sender in enumerate(senders):
        plain = open_sealed(
            mem["channels"][sender],
            blob[i * SEALED_SHARE_BYTES : (i + 1) * SEALED_SHARE_BYTES],
            share_aad(mem["session"], t, sender, ctx.silo_id),
            what=f"secure summation: shares from silo {sender}",
        )
        mem["held"][sender] = (plain[:16], plain[16:])
    del mem["channels"]


def _contribution(
    ctx: SiloContext,
    payload: Payload,
    t: int,
    shapes: list[tuple[int, ...]],
    names: list[str],
    config: dict[str, Any],
    encoding: ShareEncoding | None = None,
) -> tuple[np.ndarray, float]:
    """This silo's update ‖ metrics as float64 (zeros if its hidden coin said no), and weight;
    with discrete shares its integer share (uint64, values < 2^b; zeros if not chosen)."""
    client = ctx.client
    params = [np.asarray(payload[f"param.{i}"]) for i in range(len(shapes))]
    size = sum(int(np.prod(s)) for s in shapes) + len(names)
    if encoding is not None:
        size = encoding.length
    weight: float | None = None
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
            zeros = np.zeros(size, dtype=np.uint64 if encoding is not None else np.float64)
            return zeros, weight
    contribution = client.fit(params, t, config)
    # The contribution is the training reply's message before it is masked: the same gate
    # (float32 arrays of the model's shapes, declared metrics; or the discrete share) checks it.
    check_contribution(
        contribution,
        frozenset(names),
        params=params,
        silo=ctx.silo_id,
        round_index=t,
        encoding=encoding,
    )
    assert isinstance(contribution, Contribution)
    if encoding is not None:
        share = encoding.check_share(contribution.update[0], f"silo {ctx.silo_id}: share")
        return share, float(contribution.weight) if weight is None else weight
    parts = [np.asarray(u, dtype=np.float64).reshape(-1) for u in contribution.update]
    parts.append(np.array([float(contribution.metrics.get(n, 0.0)) for n in names]))
    return np.concatenate(parts), float(contribution.weight) if weight is None else weight


def _upload(ctx: SiloContext, payload: Payload, t: int) -> Payload:
    mem = _state(ctx, payload, t, "shared")
    session, threshold = mem["session"], mem["threshold"]
    u2 = ids(payload, "u2")
    _subset(ctx, u2, mem["u1"], threshold, "silos that shared their seeds")
    _open_shares(ctx, mem, payload, u2, t)
    ring = FixedPointRing(int(payload["fractional_bits"]), int(payload["guard_bits"]))
    n_params = int(payload["num_params"])
    shapes = [tuple(np.asarray(payload[f"param.{i}"]).shape) for i in range(n_params)]
    names = [n for n in str(payload.get("metrics", "")).split(",") if n]
    config = {k[len("config.") :]: v for k, v in payload.items() if k.startswith("config.")}
    config[SURVIVORS_KEY] = threshold
    encoding = _encoding(ctx, payload, names)
    # Write-ahead: the round is marked before anything derived from the contribution exists.
    masked_rounds = public_memory(ctx, PROTOCOL).setdefault("masked", [])
    masked_rounds.append(t)
    mem["stage"] = "uploaded"
    vector, weight = _contribution(ctx, payload, t, shapes, names, config, encoding)
    if encoding is not None:  # the share ‖ zero check words, masked modulo 2^b
        masked = np.concatenate([vector, np.zeros(check_words(encoding.bits), np.uint64)])
    else:
        masked = ring.encode(vector, len(u2), what=f"silo {ctx.silo_id}: update of round {t}")
    masked += self_mask(mem["self_seed"], session, t, ctx.silo_id, masked.size)
    own = mask_key(mem["mask_seed"], session, t)
    for other in u2:
        if other == ctx.silo_id:
            continue
        mask = pair_mask(own, ctx.silo_id, mem["mask_keys"][other], other, session, t, masked.size)
        if ctx.silo_id < other:
            masked += mask
        else:
            masked -= mask
    del mem["self_seed"], mem["mask_seed"]  # the others hold shares of them
    mem["u2"] = u2
    if encoding is not None:  # uniform on Z_{2^b}: the server learns the sum modulo 2^b only
        return {"masked": encoding.reduce(masked), "weight": float(weight)}
    return {"masked": masked, "weight": float(weight)}


def _encoding(ctx: SiloContext, payload: Payload, names: list[str]) -> ShareEncoding | None:
    """The silo's own discrete share encoding, checked against what the request announces
    (``share_bits``, ``share_length``; 0: float updates): a server cannot make a silo encode
    at another size or ring."""
    encoding = encoding_of(ctx.client)
    bits = int(payload.get("share_bits", 0))
    length = int(payload.get("share_length", 0))
    mine = (0, 0) if encoding is None else (encoding.bits, encoding.length)
    if (bits, length) != mine:
        raise IntegrityError(
            f"secure summation: the request announces shares of {bits} bits x {length} "
            f"coordinates, silo {ctx.silo_id} encodes {mine[0]} x {mine[1]}; refused"
        )
    if encoding is not None and names:
        raise IntegrityError("secure summation: discrete shares carry their metrics inside")
    return encoding


def _unmask(ctx: SiloContext, payload: Payload, t: int) -> Payload:
    mem = _state(ctx, payload, t, "uploaded")
    threshold, u2 = mem["threshold"], mem["u2"]
    survivors = ids(payload, "survivors")
    dropped = ids(payload, "dropped", nonempty=False)
    if set(survivors) & set(dropped):
        raise IntegrityError(
            "secure summation: a silo listed both as a survivor and as dropped -- revealing both "
            "its self mask and its pairwise masks would reveal its update; refused"
        )
    if sorted(survivors + dropped) != u2:
        raise IntegrityError(
            "secure summation: survivors and dropped silos do not partition "
            "the silos this one masked with"
        )
    _subset(ctx, survivors, u2, threshold, "survivors")
    mem["stage"] = "unmasked"  # answered once: a second request (any lists) is refused
    held = mem.pop("held")
    reply = {
        "self_shares": b"".join(held[c][0] for c in survivors),
        "mask_shares": b"".join(held[c][1] for c in dropped),
    }
    ctx.memory.pop(PROTOCOL, None)  # nothing of this round is needed any more
    ctx.memory[PROTOCOL] = {"session": mem["session"], "round": t, "stage": "unmasked"}
    return reply


def silo_handler(stage: str, payload: Payload, round_index: int, ctx: SiloContext) -> Payload:
    """The silo side of ``aggregation: secure``."""
    t = int(round_index)
    if stage == "advertise":
        return _advertise(ctx, payload, t)
    if stage == "share":
        return _share(ctx, payload, t)
    if stage == "upload":
        return _upload(ctx, payload, t)
    if stage == "unmask":
        return _unmask(ctx, payload, t)
    raise ValueError(f"secure summation: unknown stage {stage!r}")
