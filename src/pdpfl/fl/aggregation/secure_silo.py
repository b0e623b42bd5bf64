"""The silo side of ``aggregation: secure`` (stages ``advertise``, ``share``, ``upload``,
``consistency``, ``unmask``; Bonawitz et al. 2017, Fig. 4 with §4's consistency round against
an active server).

Secrets (the channel key c_i, the seeds b_i and s_i, the shares received) live in
``ctx.memory["secure"]`` only -- a runtime never writes that entry to disk -- and are dropped as
soon as they are no longer needed. The one fact kept in the public, persisted memory is the list
of rounds this silo has *masked*: a silo masks a round's contribution at most once per run, so a
server that restarts the round (a new session after a crash, or a retry) can never obtain two sums
of the same contributions over different silo sets. Such a silo *declines* the round instead.

Checks a silo makes before each reply (an :class:`~pdpfl.crypto.IntegrityError` otherwise):
it is a participant; every participant list is a subset of the previous one; t is the one its
own rule gives for the n participants (``ctx.security``: its configuration, never the
server's), 2 ≤ t ≤ n, 2t > n; the participation mode of the request is its own; at least t
parties remain at every stage; the stage follows the previous one of the same session and round.

Against an active server (:mod:`pdpfl.fl.aggregation.secure_identity`): ``advertise`` returns,
with the round keys, one authentication tag per other participant over (session, round,
participants, t, mode, silo, keys); ``share`` verifies every U1 member's tag before sealing
anything for it (a substituted key fails); ``consistency`` confirms the survivor set the silo is
shown -- once per round, only if it partitions the silos it masked with and holds at least q =
⌈(n + t)/2⌉ silos -- with a tag to every other survivor; ``unmask`` answers once, only for the
very set it confirmed, and only with valid confirmations of that set from at least q − 1 other
survivors: never both shares of one silo, whatever different silos were told.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from pdpfl.crypto import IntegrityError, shamir
from pdpfl.crypto.fixedpoint import FixedPointRing
from pdpfl.crypto.keys import agree, context, new_private_key, open_sealed, public_bytes, seal
from pdpfl.fl.aggregation import Payload, SiloContext, public_memory
from pdpfl.fl.aggregation.discrete_shares import ShareEncoding, check_words, encoding_of
from pdpfl.fl.aggregation.secure_common import (
    PROTOCOL,
    SEALED_SHARE_BYTES,
    VERSION,
    channel_info,
    field_bytes,
    ids,
    key_table,
    mask_key,
    pair_mask,
    self_mask,
    share_aad,
)
from pdpfl.fl.aggregation.secure_identity import (
    AUTH_BYTES,
    SiloSecurity,
    consistency_quorum,
)
from pdpfl.fl.aggregation.threshold import SURVIVORS_KEY, check_round_threshold
from pdpfl.fl.api import Contribution, check_contribution

__all__ = ["advert_statement", "silo_handler", "view_statement"]


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


def _subset(
    ctx: SiloContext, new: list[int], old: list[int], t: int, what: str, name: str = "t"
) -> None:
    if ctx.silo_id not in new:
        raise IntegrityError(f"secure summation: silo {ctx.silo_id} is not among the {what}")
    if not set(new) <= set(old):
        raise IntegrityError(f"secure summation: the {what} are not a subset of the last list")
    if len(new) < t:
        raise IntegrityError(
            f"secure summation: {len(new)} {what} < {name} = {t}; this silo does not continue"
        )


def _security(ctx: SiloContext) -> SiloSecurity:
    sec = ctx.security
    if not isinstance(sec, SiloSecurity) or sec.silo != ctx.silo_id:
        raise IntegrityError(
            f"secure summation: silo {ctx.silo_id} has no identity, peer keys and settings of "
            "its own (SiloContext.security); it does not take part in secure summation without "
            "them"
        )
    return sec


def _check_mode(sec: SiloSecurity, payload: Payload, silo: int) -> bool:
    """The participation mode of the request must be the silo's own (never the server's)."""
    asked = payload.get("hidden")
    if not isinstance(asked, bool | np.bool_) or bool(asked) != sec.hidden:
        raise IntegrityError(
            f"secure summation: silo {silo} takes part with participation: {sec.participation} "
            f"(its own configuration); the request says hidden = {asked!r}; refused"
        )
    return sec.hidden


def advert_statement(
    session: bytes,
    round_index: int,
    participants: list[int],
    threshold: int,
    hidden: bool,
    silo: int,
    channel_key: bytes,
    mask_key_: bytes,
) -> bytes:
    """What a silo authenticates at ``advertise``: its round keys bound to the session, the
    round, the participants, t and the mode."""
    return context(
        VERSION, "advertise", session, round_index, *participants, "t", threshold, hidden,
        "silo", silo, channel_key, mask_key_,
    )  # fmt: skip


def view_statement(
    session: bytes, round_index: int, participants: list[int], survivors: list[int],
    dropped: list[int],
) -> bytes:  # fmt: skip
    """What a silo confirms in the consistency round: the survivor set it was shown."""
    return context(
        VERSION, "consistency", session, round_index, "participants", *participants,
        "survivors", *survivors, "dropped", *dropped,
    )  # fmt: skip


def _advertise(ctx: SiloContext, payload: Payload, t: int) -> Payload:
    sec = _security(ctx)
    participants = ids(payload, "participants")
    if ctx.silo_id not in participants:
        raise IntegrityError(f"secure summation: silo {ctx.silo_id} is not a participant")
    hidden = _check_mode(sec, payload, ctx.silo_id)
    own_t = sec.survivors_needed(len(participants))
    asked_t = payload.get("threshold", 0)
    if isinstance(asked_t, bool) or int(asked_t) != own_t:
        raise IntegrityError(
            f"secure summation: the request announces threshold t = {asked_t} for "
            f"{len(participants)} participants; silo {ctx.silo_id}'s own rule gives t = {own_t}; "
            "refused"
        )
    threshold = check_round_threshold(own_t, len(participants))
    sec.check_peers(participants)
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
    channel_pub = public_bytes(channel)
    mask_pub = public_bytes(mask_key(mask_seed, session, t))
    ctx.memory[PROTOCOL] = {
        "session": session,
        "round": t,
        "stage": "advertised",
        "threshold": threshold,
        "quorum": consistency_quorum(len(participants), threshold),
        "hidden": hidden,
        "participants": participants,
        "channel_key": _raw(channel),
        "mask_seed": mask_seed,
        "self_seed": self_seed,
    }
    statement = advert_statement(
        session, t, participants, threshold, hidden, ctx.silo_id, channel_pub, mask_pub
    )
    return {
        "declined": False,
        "channel_key": channel_pub,
        "mask_key": mask_pub,
        "auth": sec.tags(statement, participants),
    }


def _share(ctx: SiloContext, payload: Payload, t: int) -> Payload:
    mem = _state(ctx, payload, t, "advertised")
    session, threshold = mem["session"], mem["threshold"]
    u1 = ids(payload, "u1")
    # fewer than q silos left: the round cannot be unmasked; nothing more is computed
    _subset(ctx, u1, mem["participants"], mem["quorum"], "silos with keys", "q")
    channels = key_table(field_bytes(payload, "channel_keys"), u1, "channel")
    masks = key_table(field_bytes(payload, "mask_keys"), u1, "mask")
    # Every key must be its owner's: authenticated to this silo by the owner's long-term key
    # over this session, round, participant list, t and mode (a relayed key is never trusted).
    sec = _security(ctx)
    others = [c for c in u1 if c != ctx.silo_id]
    auth = field_bytes(payload, "auth", AUTH_BYTES * len(others))
    for k, c in enumerate(others):
        statement = advert_statement(
            session, t, mem["participants"], threshold, mem["hidden"], c, channels[c], masks[c]
        )
        if not sec.check(c, statement, auth[k * AUTH_BYTES : (k + 1) * AUTH_BYTES]):
            raise IntegrityError(
                f"secure summation: the keys relayed for silo {c} are not authenticated by silo "
                f"{c}'s long-term key for this session, round, participant list, t and mode; "
                f"silo {ctx.silo_id} shares nothing"
            )
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
    _check_mode(_security(ctx), payload, ctx.silo_id)
    mem = _state(ctx, payload, t, "shared")
    session, threshold = mem["session"], mem["threshold"]
    u2 = ids(payload, "u2")
    _subset(ctx, u2, mem["u1"], mem["quorum"], "silos that shared their seeds", "q")
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


def _view(ctx: SiloContext, mem: dict[str, Any], payload: Payload) -> tuple[list[int], list[int]]:
    """The survivor set of a request, checked against what this silo masked with."""
    survivors = ids(payload, "survivors")
    dropped = ids(payload, "dropped", nonempty=False)
    if set(survivors) & set(dropped):
        raise IntegrityError(
            "secure summation: a silo listed both as a survivor and as dropped -- revealing both "
            "its self mask and its pairwise masks would reveal its update; refused"
        )
    if sorted(survivors + dropped) != mem["u2"]:
        raise IntegrityError(
            "secure summation: survivors and dropped silos do not partition "
            "the silos this one masked with"
        )
    _subset(ctx, survivors, mem["u2"], mem["threshold"], "survivors")
    return survivors, dropped


def _consistency(ctx: SiloContext, payload: Payload, t: int) -> Payload:
    """Confirm (once per round) the survivor set this silo is shown, to every other survivor."""
    sec = _security(ctx)
    mem = _state(ctx, payload, t, "uploaded")
    survivors, dropped = _view(ctx, mem, payload)
    if len(survivors) < mem["quorum"]:
        raise IntegrityError(
            f"secure summation: {len(survivors)} survivors < q = {mem['quorum']} (the "
            "consistency quorum); this silo confirms nothing"
        )
    statement = view_statement(mem["session"], t, mem["participants"], survivors, dropped)
    mem.update(stage="confirmed", view=(survivors, dropped))  # one set per round, ever
    return {"confirm": sec.tags(statement, survivors)}


def _unmask(ctx: SiloContext, payload: Payload, t: int) -> Payload:
    sec = _security(ctx)
    mem = _state(ctx, payload, t, "confirmed")
    survivors, dropped = _view(ctx, mem, payload)
    if (survivors, dropped) != tuple(mem["view"]):
        raise IntegrityError(
            "secure summation: the unmask request's survivor set is not the one this silo "
            "confirmed; refused"
        )
    signers = ids(payload, "signers")
    others = [c for c in signers if c != ctx.silo_id]
    if not set(signers) <= set(survivors):
        raise IntegrityError("secure summation: a confirmation from a silo that is no survivor")
    blob = field_bytes(payload, "confirmations", AUTH_BYTES * len(others))
    statement = view_statement(mem["session"], t, mem["participants"], survivors, dropped)
    for k, c in enumerate(others):
        if not sec.check(c, statement, blob[k * AUTH_BYTES : (k + 1) * AUTH_BYTES]):
            raise IntegrityError(
                f"secure summation: silo {c}'s confirmation of the survivor set does not verify "
                f"(it confirmed another set, or the server forged it); silo {ctx.silo_id} "
                "reveals nothing"
            )
    confirmed = len(others) + 1  # this silo confirmed the same set itself
    if confirmed < mem["quorum"]:
        raise IntegrityError(
            f"secure summation: {confirmed} silo(s) confirmed the survivor set < q = "
            f"{mem['quorum']}; silo {ctx.silo_id} reveals nothing"
        )
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
    if stage == "consistency":
        return _consistency(ctx, payload, t)
    if stage == "unmask":
        return _unmask(ctx, payload, t)
    raise ValueError(f"secure summation: unknown stage {stage!r}")
