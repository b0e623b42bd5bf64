"""Dropout-robust secure summation (``aggregation: secure``): the server learns only the sum.

Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning" (CCS
2017), §4 and Fig. 4, with the consistency round that §4 adds against an active server, on the
complete graph of a round's silos (the
neighbourhood graphs of SecAgg+, Bell et al. CCS 2020, only pay off for thousands of parties).
Driven purely through ``transport.exchange`` and the silo handler of
:mod:`pdpfl.fl.aggregation.secure_silo`, so the same code runs in-process and on Flower.

One round (``collect``) for the n silos P asked, with t = t(n) from
:mod:`pdpfl.fl.aggregation.threshold` (t ≥ 2, t > n/2); the server stops -- **no aggregate** --
whenever fewer than t silos remain:

0. ``advertise`` -- each silo draws an X25519 channel key c_i and two 16-byte seeds: s_i (its
   pairwise-mask key) and b_i (its self mask); it sends the public keys C_i, S_i and, for each
   other participant, a tag authenticating them with the session, round, participant list, t
   and participation mode under its long-term key
   (:mod:`pdpfl.fl.aggregation.secure_identity`). U1: who answered. A silo that already masked
   this round in an earlier session declines.
1. ``share`` -- the server relays U1's keys and their tags; a silo checks every tag first (a
   substituted key fails). Each silo Shamir-shares b_i and s_i with threshold t
   among U1 (:mod:`pdpfl.crypto.shamir`), and seals the shares for each j with
   ChaCha20-Poly1305 under HKDF(X25519(c_i, C_j)) (only j can open them). U2: who answered.
2. ``upload`` -- the server forwards to each silo the sealed shares addressed to it, with the
   model and round configuration. Each silo computes its contribution once (``client.fit``,
   which receives t under :data:`~pdpfl.fl.aggregation.threshold.SURVIVORS_KEY`), encodes
   update ‖ public metrics in Z_{2^64} (:class:`~pdpfl.crypto.fixedpoint.FixedPointRing`), and
   uploads y_i = x_i + PRG(b_i) + Σ_{j∈U2, i<j} PRG(s_ij) − Σ_{j∈U2, i>j} PRG(s_ij). U3: who
   answered.
3. ``consistency`` -- the server tells U3 who survived; each silo confirms that set (once per
   round, only if it has at least q = ⌈(n + t)/2⌉ silos) with a tag to every other survivor. U4:
   who confirmed; fewer than q: no aggregate.
4. ``unmask`` -- the server relays to each silo of U4 the others' confirmations; a silo that
   finds q valid confirmations of the very set it confirmed returns its shares of b_j for every
   survivor j and of s_j for every dropped j ∈ U2 \\ U3 -- never both for one silo, and only
   once per round. With shares from t silos the server reconstructs those seeds, removes the
   self masks of the survivors and the dropped silos' pairwise masks, and decodes
   Σ_{i∈U3} x_i (checked: masks that did not cancel are refused).

Dropouts and late replies. A silo lost after ``upload`` is simply not summed: its pairwise masks
are removed with s_j, while its self mask b_j is never reconstructed, so its upload -- even if it
arrives late -- stays masked by PRG(b_j). There are no retries: one session masks each
contribution once, so no two sums of the same contributions over different silo sets exist (the
attack of issue #22: attempt 0 minus attempt 1 was the lost silo's update). A round that cannot
keep t silos ends without aggregate; the silos that reached ``upload`` computed (and charged)
their update, which is never released.

What the server learns: the sum of the survivors' updates and metrics, the survivors, their
public weights. Collusion: the server with up to t - 1 silos learns nothing more (semi-honest
model, Bonawitz et al. Thm. 6.3) -- and so does a server that deviates (substitutes keys, tells
different silos different survivor sets, changes t or the mode): two survivor sets confirmed by
q silos each share ≥ 2q − n ≥ t confirmers, and an honest silo confirms one set per round, so
obtaining both seeds of one silo needs t colluders (the quorum t alone would let 2t − n do it).
Price: a round needs q silos alive until its consistency round (dropout tolerance n − q).

**Hidden participation** (``participation: hidden``): every silo is asked every round and uses
its own λ-coin; an unchosen silo uploads masked zeros. Message names, types and sizes do not
depend on the coin; reply *timing* does (a chosen silo trains first), and is not padded: on a
real network the server can tell who took part (docs/secure_aggregation.md).
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np

from pdpfl.crypto import IntegrityError, shamir
from pdpfl.crypto.fixedpoint import FixedPointRing
from pdpfl.crypto.keys import PUBLIC_KEY_BYTES
from pdpfl.fl.aggregation import (
    Payload,
    empty_aggregate,
    register_protocol,
    register_silo_handler,
)
from pdpfl.fl.aggregation.discrete_shares import ShareEncoding, encoding_of
from pdpfl.fl.aggregation.secure_common import (
    PROTOCOL,
    SEALED_SHARE_BYTES,
    mask_key,
    pair_mask,
    self_mask,
)
from pdpfl.fl.aggregation.secure_identity import AUTH_BYTES, consistency_quorum, tag_for
from pdpfl.fl.aggregation.secure_messages import SCHEMAS
from pdpfl.fl.aggregation.secure_silo import silo_handler
from pdpfl.fl.aggregation.threshold import (
    DEFAULT_MIN_SURVIVORS,
    DEFAULT_THRESHOLD,
    survivor_threshold,
)
from pdpfl.fl.api import Aggregate, Params, Scalars, ServerAlgorithm, Transport

__all__ = ["PROTOCOL", "SecureSum", "silo_handler"]


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
    threshold, min_survivors
        The survivor rule t(n) = max(min_survivors, ⌈threshold·n⌉)
        (:func:`~pdpfl.fl.aggregation.threshold.survivor_threshold`).

    ``last_round`` holds the public facts of the last round: the silo sets of each stage, t, and
    ``outcome`` (``released`` or why not).
    """

    name = PROTOCOL
    hides_individual_updates = True

    def __init__(
        self,
        participation: str = "visible",
        client_rate: float = 1.0,
        fractional_bits: int = 32,
        guard_bits: int = 8,
        threshold: float = DEFAULT_THRESHOLD,
        min_survivors: int = DEFAULT_MIN_SURVIVORS,
        **_: object,
    ) -> None:
        if participation not in ("visible", "hidden"):
            raise ValueError(f"participation: expected visible or hidden, got {participation!r}")
        if not 0 < float(client_rate) <= 1:
            raise ValueError(f"training.client_rate: must be in (0, 1], got {client_rate}")
        survivor_threshold(0, threshold, min_survivors)  # validates the rule
        self.participation = participation
        self.client_rate = float(client_rate)
        self.ring = FixedPointRing(int(fractional_bits), int(guard_bits))
        self.threshold = float(threshold)
        self.min_survivors = int(min_survivors)
        self.last_round: dict[str, Any] = {}
        #: Rounds this object has summed (a round is never summed twice).
        self.released: dict[int, list[int]] = {}

    @property
    def silo_side_sampling(self) -> bool:
        """True in hidden mode: the round loop asks every silo (it draws its own coin)."""
        return self.participation == "hidden"

    def survivors_needed(self, n: int) -> int:
        """t(n): the fewest silos whose sum this protocol releases in a round of n silos."""
        return survivor_threshold(n, self.threshold, self.min_survivors)

    def precision(self, parties: int) -> float:
        """Worst-case absolute error of one coordinate of the sum of ``parties`` updates."""
        return self.ring.precision(parties)

    def _stop(self, why: str, params: Params) -> Aggregate:
        self.last_round["outcome"] = why
        return empty_aggregate(params)

    def collect(
        self,
        transport: Transport,
        selected: list[int],
        params: Params,
        round_index: int,
        config: Scalars,
        server: ServerAlgorithm,
    ) -> Aggregate:
        r = int(round_index)
        metric_names = sorted(getattr(server, "public_metrics", frozenset()))
        if self.silo_side_sampling and metric_names:
            raise ValueError(
                "participation: hidden cannot be used with an algorithm that releases metrics "
                f"({', '.join(metric_names)}): their sum would reveal how many silos took part"
            )
        if r in self.released:
            raise ValueError(f"secure summation: round {r} was already summed")
        encoding = encoding_of(server)
        if encoding is not None:  # discrete shares carry the metrics as coordinates
            metric_names = []
        asked = sorted({int(c) for c in selected})
        t = self.survivors_needed(len(asked))
        session = secrets.token_bytes(16)
        self.last_round = {"round": r, "asked": asked, "t": t}
        if not asked:
            return self._stop("no silo asked", params)
        if len(asked) < t:
            return self._stop(f"refused: {len(asked)} silo(s) asked < t = {t}", params)
        q = consistency_quorum(len(asked), t)
        self.last_round["quorum"] = q
        # 0. advertise keys
        request = {
            "session": session,
            "participants": np.asarray(asked, np.int64),
            "threshold": t,
            "hidden": self.silo_side_sampling,
        }
        replies = transport.exchange(PROTOCOL, "advertise", {c: request for c in asked}, r)
        u1 = [c for c in asked if c in replies and replies[c].get("declined") is False]
        self.last_round["declined"] = [c for c in asked if replies.get(c, {}).get("declined")]
        self.last_round["u1"] = u1
        if len(u1) < q:
            return self._stop(f"no aggregate: {len(u1)} silo(s) sent keys < q = {q}", params)
        channel_keys = {c: _key(replies[c], "channel_key", c) for c in u1}
        mask_keys = {c: _key(replies[c], "mask_key", c) for c in u1}
        adverts = {c: replies[c] for c in u1}
        for c in u1:
            _sized(adverts[c], "auth", AUTH_BYTES * (len(asked) - 1), c)
        # 1. share seeds (each silo gets the tags the others addressed to it)
        base = {
            "session": session,
            "u1": np.asarray(u1, np.int64),
            "channel_keys": b"".join(channel_keys[c] for c in u1),
            "mask_keys": b"".join(mask_keys[c] for c in u1),
        }
        requests = {
            j: {
                **base,
                "auth": b"".join(tag_for(adverts[c]["auth"], c, j, asked) for c in u1 if c != j),
            }
            for j in u1
        }
        replies = transport.exchange(PROTOCOL, "share", requests, r)
        size = SEALED_SHARE_BYTES * (len(u1) - 1)
        u2 = [c for c in u1 if c in replies and _sized(replies[c], "shares", size, c)]
        self.last_round["u2"] = u2
        if len(u2) < q:
            return self._stop(f"no aggregate: {len(u2)} silo(s) shared seeds < q = {q}", params)
        # 2. masked upload
        sealed = {c: replies[c]["shares"] for c in u2}
        base = self._upload_request(session, u2, params, config, metric_names, encoding)
        requests = {}
        for receiver in u2:
            blob = []
            for sender in u2:
                if sender != receiver:
                    k = [c for c in u1 if c != sender].index(receiver)
                    blob.append(
                        sealed[sender][k * SEALED_SHARE_BYTES : (k + 1) * SEALED_SHARE_BYTES]
                    )
            requests[receiver] = {**base, "shares": b"".join(blob)}
        replies = transport.exchange(PROTOCOL, "upload", requests, r)
        length = sum(int(np.asarray(p).size) for p in params) + len(metric_names)
        dtype = np.dtype(np.uint64)
        if encoding is not None:
            length, dtype = encoding.upload_length, encoding.dtype
        u3 = [c for c in u2 if c in replies and _vector(replies[c], length, c, dtype)]
        dropped = [c for c in u2 if c not in u3]
        self.last_round.update(u3=u3, dropped=dropped)
        uploads = {c: replies[c] for c in u3}
        if len(u3) < q:
            return self._stop(f"no aggregate: {len(u3)} masked upload(s) < q = {q}", params)
        # 3. consistency: every survivor confirms the survivor set it is shown
        view = {
            "session": session,
            "survivors": np.asarray(u3, np.int64),
            "dropped": np.asarray(dropped, np.int64),
        }
        replies = transport.exchange(PROTOCOL, "consistency", {c: view for c in u3}, r)
        u4 = [
            c
            for c in u3
            if c in replies and _sized(replies[c], "confirm", AUTH_BYTES * (len(u3) - 1), c)
        ]
        self.last_round["u4"] = u4
        if len(u4) < q:
            return self._stop(
                f"no aggregate: {len(u4)} silo(s) confirmed the survivor set < q = {q}", params
            )
        confirms = {c: replies[c]["confirm"] for c in u4}
        # 4. unmask: each confirmer gets the others' confirmations addressed to it
        requests = {
            j: {
                **view,
                "signers": np.asarray(u4, np.int64),
                "confirmations": b"".join(tag_for(confirms[c], c, j, u3) for c in u4 if c != j),
            }
            for j in u4
        }
        replies = transport.exchange(PROTOCOL, "unmask", requests, r)
        u5 = [
            c
            for c in u4
            if c in replies
            and _sized(replies[c], "self_shares", 16 * len(u3), c)
            and _sized(replies[c], "mask_shares", 16 * len(dropped), c)
        ]
        self.last_round["u5"] = u5
        if len(u5) < t:
            return self._stop(f"no aggregate: {len(u5)} silo(s) sent shares < t = {t}", params)
        total = self._unmask(
            session,
            r,
            t,
            u1,
            u2,
            u3,
            dropped,
            mask_keys,
            uploads,
            {c: replies[c] for c in u5},
            length,
            encoding,
        )
        self.released[r] = list(u3)
        self.last_round["outcome"] = "released"
        if encoding is not None:
            return encoding.decode(
                total, params, r, weight=self._weight(uploads, u3), count=len(u3)
            )
        return self._aggregate(total, uploads, u2, u3, params, metric_names)

    # -- helpers -------------------------------------------------------------------------------
    def _upload_request(
        self,
        session: bytes,
        u2: list[int],
        params: Params,
        config: Scalars,
        metric_names: list[str],
        encoding: ShareEncoding | None = None,
    ) -> Payload:
        request: Payload = {
            "session": session,
            "u2": np.asarray(u2, dtype=np.int64),
            "num_params": len(params),
            "metrics": ",".join(metric_names),
            "hidden": self.silo_side_sampling,
            "fractional_bits": self.ring.fractional_bits,
            "guard_bits": self.ring.guard_bits,
            # discrete shares (0: float updates in the fixed-point ring): public sizes
            "share_bits": 0 if encoding is None else encoding.bits,
            "share_length": 0 if encoding is None else encoding.length,
        }
        for i, p in enumerate(params):
            request[f"param.{i}"] = np.asarray(p)
        for k, v in config.items():
            request[f"config.{k}"] = v
        return request

    def _unmask(
        self,
        session: bytes,
        r: int,
        t: int,
        u1: list[int],
        u2: list[int],
        u3: list[int],
        dropped: list[int],
        mask_keys: dict[int, bytes],
        uploads: dict[int, Payload],
        shares: dict[int, Payload],
        length: int,
        encoding: ShareEncoding | None = None,
    ) -> np.ndarray:
        total = np.zeros(length, dtype=np.uint64)
        for c in u3:
            # ring addition (wraps modulo 2^64; discrete shares: 2^b divides 2^64)
            total += np.asarray(uploads[c]["masked"]).astype(np.uint64)

        def table(field: str, owners: list[int]) -> list[dict[int, bytes]]:
            return [
                {h: shares[h][field][16 * k : 16 * (k + 1)] for h in shares}
                for k in range(len(owners))
            ]

        seeds = shamir.combine_many(table("self_shares", u3), t, u1)
        for c, seed in zip(u3, seeds, strict=True):
            total -= self_mask(seed, session, r, c, length)
        lost = shamir.combine_many(table("mask_shares", dropped), t, u1)
        for c, seed in zip(dropped, lost, strict=True):
            key = mask_key(seed, session, r)
            for other in u3:
                mask = pair_mask(key, c, mask_keys[other], other, session, r, length)
                if other < c:  # `other` added this mask, the lost silo would have subtracted it
                    total -= mask
                else:
                    total += mask
        if encoding is not None:
            total &= encoding.mask()
            if np.any(total[encoding.length :]):
                raise IntegrityError(
                    "secure summation: the masks did not cancel (a check word of the discrete "
                    "shares is not 0 modulo 2^b); nothing is released"
                )
        return total

    def _aggregate(
        self,
        total: np.ndarray,
        uploads: dict[int, Payload],
        u2: list[int],
        u3: list[int],
        params: Params,
        metric_names: list[str],
    ) -> Aggregate:
        values = self.ring.decode(total, len(u3), encoded_for=len(u2))
        weight = self._weight(uploads, u3)
        out, start = [], 0
        for p in params:
            arr = np.asarray(p)
            out.append(values[start : start + arr.size].reshape(arr.shape).astype(np.float32))
            start += arr.size
        metrics = {name: float(values[start + i]) for i, name in enumerate(metric_names)}
        return Aggregate(total=out, weight=weight, metrics=metrics, count=len(u3))

    def _weight(self, uploads: dict[int, Payload], u3: list[int]) -> float:
        """Σ of the survivors' public weights (hidden participation: λ·Σ w_i)."""
        weight = 0.0
        for c in u3:
            w = uploads[c].get("weight")
            if isinstance(w, bool) or not isinstance(w, int | float) or not np.isfinite(w):
                raise IntegrityError(f"secure summation: silo {c} sent a malformed weight")
            weight += float(w)
        if self.silo_side_sampling:
            weight *= self.client_rate  # the public normaliser λ·Σ w_i (never a realised count)
        return weight


def _key(reply: Payload, field: str, silo: int) -> bytes:
    value = reply.get(field)
    if not isinstance(value, bytes) or len(value) != PUBLIC_KEY_BYTES:
        raise IntegrityError(f"secure summation: silo {silo} sent a malformed {field}")
    return value


def _sized(reply: Payload, field: str, size: int, silo: int) -> bool:
    value = reply.get(field)
    if not isinstance(value, bytes) or len(value) != size:
        raise IntegrityError(f"secure summation: silo {silo} sent a malformed {field!r}")
    return True


def _vector(reply: Payload, length: int, silo: int, dtype: np.dtype[Any]) -> bool:
    vec = np.asarray(reply.get("masked"))
    if vec.dtype != dtype or vec.shape != (length,):
        raise IntegrityError(f"secure summation: silo {silo} sent a malformed masked vector")
    return True


register_protocol(PROTOCOL, SecureSum)
register_silo_handler(PROTOCOL, silo_handler, schemas=SCHEMAS, secret_memory=True)
