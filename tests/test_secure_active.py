"""Secure summation against an *active* server (issue #34, item 3): a server that equivocates
about who survived, flips the participation mode, substitutes keys or announces another t.

The equivocation attack (Bonawitz et al. 2017, §4): the server tells some silos that a victim
survived (they reveal shares of its self-mask seed b_V) and the others that it dropped (they
reveal shares of its pairwise-mask seed s_V); with both seeds it unmasks the victim's upload. On
the unmask rule before this issue, 2t − n colluding silos sufficed (n = 3, t = 2: one) -- shown
here recovering the victim's update exactly. With the consistency round no split of the honest
silos, with up to t − 1 colluders, yields both seeds, for n = 3, 4, 5, 7 (every split searched).
"""

from __future__ import annotations

import copy
import itertools
import math
from decimal import ROUND_CEILING, Decimal
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdpfl.crypto import IntegrityError, shamir
from pdpfl.crypto.fixedpoint import FixedPointRing
from pdpfl.fl.aggregation import SiloContext
from pdpfl.fl.aggregation.secure import SecureSum
from pdpfl.fl.aggregation.secure_common import mask_key, pair_mask, self_mask
from pdpfl.fl.aggregation.secure_identity import (
    consistency_quorum,
    ephemeral_security,
    tag_for,
)
from pdpfl.fl.aggregation.secure_silo import _contribution, view_statement
from pdpfl.fl.aggregation.threshold import survivor_threshold
from secagg_attacks import RecordingDropTransport, legacy_unmask
from test_secure_sum import PARAMS, ScriptedClient, Server, _clients

SIZES = [3, 4, 5, 7]


class Round:
    """A round run honestly up to the masked uploads, then handed to the attacker."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.clients = _clients(n)
        transport = RecordingDropTransport(self.clients)
        original = transport.exchange

        class Halt(Exception):
            pass

        def exchange(protocol, stage, requests, round_index):
            if stage == "consistency":
                raise Halt
            return original(protocol, stage, requests, round_index)

        transport.exchange = exchange  # type: ignore[method-assign]
        proto = SecureSum()
        with pytest.raises(Halt):
            proto.collect(transport, list(range(n)), PARAMS, 0, {}, Server())
        transport.exchange = original  # type: ignore[method-assign]
        self.transport = transport
        self.t = proto.last_round["t"]
        self.q = proto.last_round["quorum"]
        self.session = transport.requests[0][2]["session"]
        self.mask_keys = {c: r["mask_key"] for c, r in transport.replies_at("advertise").items()}
        self.uploads = {c: r["masked"] for c, r in transport.replies_at("upload").items()}
        self.memory = copy.deepcopy(transport._silo_memory)  # after the uploads

    def fresh(self) -> dict[int, dict[str, Any]]:
        """The silos' memories as they were after the uploads (each attempt starts there)."""
        mem = copy.deepcopy(self.memory)
        self.transport._silo_memory = mem
        return mem

    def recover(self, victim: int, b: bytes, s: bytes) -> np.ndarray:
        """The victim's update from its two seeds and its masked upload."""
        y = self.uploads[victim].copy()
        y -= self_mask(b, self.session, 0, victim, y.size)
        key = mask_key(s, self.session, 0)
        for other in range(self.n):
            if other != victim:
                mask = pair_mask(key, victim, self.mask_keys[other], other, self.session, 0, y.size)
                y = y - mask if victim < other else y + mask
        return FixedPointRing().decode(y, 1, encoded_for=self.n)


def _views(n: int, victim: int) -> dict[str, tuple[list[int], list[int]]]:
    everyone = list(range(n))
    return {
        "X": (everyone, []),  # the victim survived: its b_V is revealed
        "Y": ([c for c in everyone if c != victim], [victim]),  # it dropped: its s_V
    }


def _attack(
    rnd: Round, victim: int, colluders: list[int], shown: dict[int, str], legacy: bool
) -> tuple[dict[int, bytes], dict[int, bytes], list[int]]:
    """The malicious server: each honest silo h is shown the view ``shown[h]``; colluders
    confirm every view and hand over every share they hold. Returns the shares of b_V and of
    s_V obtained (by holder) and the honest silos that refused."""
    mem = rnd.fresh()
    views = _views(rnd.n, victim)
    sec = rnd.transport.security
    b_shares: dict[int, bytes] = {c: mem[c]["secure"]["held"][victim][0] for c in colluders}
    s_shares: dict[int, bytes] = {c: mem[c]["secure"]["held"][victim][1] for c in colluders}
    refused: list[int] = []
    confirms: dict[tuple[int, str], bytes] = {}
    request = {"session": rnd.session}
    if not legacy:  # the consistency round: honest silos confirm the set they are shown
        for h, name in shown.items():
            surv, drop = views[name]
            payload = {**request, "survivors": np.array(surv), "dropped": np.array(drop, np.int64)}
            try:
                reply = rnd.transport.exchange("secure", "consistency", {h: payload}, 0)[h]
            except IntegrityError:  # e.g. a set smaller than q: the silo confirms nothing
                continue
            confirms[(h, name)] = reply["confirm"]
        for c in colluders:  # a colluder confirms anything
            for name, (surv, drop) in views.items():
                statement = view_statement(rnd.session, 0, list(range(rnd.n)), surv, drop)
                confirms[(c, name)] = sec[c].tags(statement, surv)
    for h, name in shown.items():
        surv, drop = views[name]
        try:
            if legacy:
                own, lost = legacy_unmask(mem[h], h, surv, drop)
            else:
                signers = sorted({c for (c, v) in confirms if v == name})
                blob = b"".join(tag_for(confirms[(c, name)], c, h, surv) for c in signers if c != h)
                payload = {
                    **request,
                    "survivors": np.array(surv),
                    "dropped": np.array(drop, np.int64),
                    "signers": np.array(signers),
                    "confirmations": blob,
                }
                reply = rnd.transport.exchange("secure", "unmask", {h: payload}, 0)[h]
                own = {c: reply["self_shares"][16 * k : 16 * k + 16] for k, c in enumerate(surv)}
                lost = {c: reply["mask_shares"][16 * k : 16 * k + 16] for k, c in enumerate(drop)}
        except (IntegrityError, ValueError):
            refused.append(h)
            continue
        if victim in own:
            b_shares[h] = own[victim]
        if victim in lost:
            s_shares[h] = lost[victim]
    return b_shares, s_shares, refused


@pytest.mark.parametrize("n", SIZES)
def test_the_equivocation_attack_unmasks_a_silo_on_the_old_rule_and_fails_now(n: int) -> None:
    rnd = Round(n)
    t, q, victim = rnd.t, rnd.q, 0
    c = 2 * t - n  # the fewest colluders the old rule needed
    assert 1 <= c < t and q == math.ceil((n + t) / 2) and 2 * q - n >= t
    colluders = list(range(n - c, n))
    honest = [h for h in range(n) if h not in colluders]
    # the victim and t - c - 1 others are told it survived, the other t - c that it dropped
    shown = {h: ("X" if k < t - c else "Y") for k, h in enumerate(honest)}
    truth = rnd.clients[victim].flat(0)

    b, s, refused = _attack(rnd, victim, colluders, shown, legacy=True)
    assert len(b) >= t and len(s) >= t and not refused
    recovered = rnd.recover(victim, shamir.combine(b, t, list(range(n))),
                            shamir.combine(s, t, list(range(n))))  # fmt: skip
    assert np.max(np.abs(recovered - truth)) < 1e-6  # the old rule gave the update away

    b, s, refused = _attack(rnd, victim, colluders, shown, legacy=False)
    assert sorted(refused) == honest  # no honest silo found q confirmations of its set
    assert len(b) < t and len(s) < t


@pytest.mark.parametrize("n", SIZES)
def test_no_split_of_the_honest_silos_gives_both_seeds_with_fewer_than_t_colluders(n: int) -> None:
    """Every number of colluders up to t - 1 and every assignment of the honest silos to the
    two stories (the victim is told it survived): the server never holds t shares of both."""
    rnd = Round(n)
    t, victim = rnd.t, 0
    tried = 0
    for c in range(t):
        colluders = list(range(n - c, n))
        others = [h for h in range(1, n - c)]
        for stories in itertools.product("XY", repeat=len(others)):
            shown = {victim: "X", **dict(zip(others, stories, strict=True))}
            b, s, _ = _attack(rnd, victim, colluders, shown, legacy=False)
            assert len(b) < t or len(s) < t, (c, shown)
            tried += 1
    assert tried == sum(2 ** (n - 1 - c) for c in range(t))


@pytest.mark.parametrize("n", SIZES)
def test_a_flipped_participation_mode_is_refused_by_every_silo(n: int) -> None:
    """The silos take part in hidden mode (each flips its own λ-coin): a server that asks for
    visible mode would make every silo it asks train, whatever its coin. Before this issue the
    silo read the mode from the request; now it takes its own and refuses the request."""
    coins = {0: False}  # every silo's coin says "sit this round out"
    clients = {c: ScriptedClient(c, [(3, 4), (5,)], coins=coins) for c in range(n)}
    ctx = SiloContext(clients[0], 0, {})
    flipped = {"hidden": False, "num_params": 2, "metrics": "", "param.0": PARAMS[0],
               "param.1": PARAMS[1]}  # fmt: skip
    _contribution(ctx, flipped, 0, [(3, 4), (5,)], [], {})
    assert clients[0].fits == [0]  # the old path: trained although its coin said no
    clients[0].fits.clear()
    for silos, server in (("hidden", "visible"), ("visible", "hidden")):
        transport = RecordingDropTransport(clients)
        transport.security = ephemeral_security(list(range(n)), participation=silos)
        proto = SecureSum(participation=server, client_rate=0.5)
        with pytest.raises(IntegrityError, match=f"participation: {silos}"):
            proto.collect(transport, list(range(n)), PARAMS, 0, {}, Server())
        assert all(cl.fits == [] for cl in clients.values())


@pytest.mark.parametrize("n", SIZES)
def test_a_substituted_key_or_another_threshold_is_refused(n: int) -> None:
    """The server puts its own mask key in place of silo 1's (it would learn their pairwise
    mask), or announces a smaller t than the silos' own rule: refused before anything is shared."""
    server_key = bytes(range(32))

    class Substitute(RecordingDropTransport):
        def exchange(self, protocol, stage, requests, round_index):
            if stage == "share":
                keys = bytearray(requests[0]["mask_keys"])
                keys[32:64] = server_key
                requests = {**requests, 0: {**requests[0], "mask_keys": bytes(keys)}}
            return super().exchange(protocol, stage, requests, round_index)

    clients = _clients(n)
    with pytest.raises(IntegrityError, match="not authenticated by silo 1's long-term key"):
        SecureSum().collect(Substitute(clients), list(range(n)), PARAMS, 0, {}, Server())

    class Lower(SecureSum):
        def survivors_needed(self, m: int) -> int:
            return max(2, super().survivors_needed(m) - 1)  # below the silos' configured rule

    if n > 3:
        with pytest.raises(IntegrityError, match="own rule gives t"):
            Lower().collect(RecordingDropTransport(_clients(n)), list(range(n)), PARAMS, 0, {},
                            Server())  # fmt: skip


@given(
    n=st.integers(0, 10_000),
    num=st.integers(501, 1000),
    floor=st.integers(2, 10),
)
def test_the_threshold_is_exact_rational_arithmetic(n: int, num: int, floor: int) -> None:
    """t(n) = max(min_survivors, ⌈r·n⌉, ⌊n/2⌋ + 1) with r the decimal written in the config,
    checked against Python's decimal arithmetic; t > n/2 always; q = ⌈(n + t)/2⌉ is the least
    quorum whose two copies share t silos."""
    threshold = num / 1000  # e.g. 0.55: binary 0.55000000000000004, decimal 11/20
    ref = int((Decimal(repr(threshold)) * n).to_integral_value(rounding=ROUND_CEILING))
    t = survivor_threshold(n, threshold, floor)
    assert t == max(floor, ref, n // 2 + 1) and 2 * t > n
    if 1 <= t <= n:
        q = consistency_quorum(n, t)
        assert t <= q <= n and 2 * q - n >= t and 2 * (q - 1) - n < t


def test_float_rounding_no_longer_decides_the_threshold() -> None:
    # 0.55 · 20 is 11.000000000000002 in floating point: ⌈·⌉ would ask 12 survivors
    assert survivor_threshold(20, 0.55) == 11
    assert [survivor_threshold(n) for n in (3, 4, 10, 100)] == [2, 3, 7, 67]
    # a threshold just above 1/2 still yields a strict majority
    assert survivor_threshold(10, 0.5000000001) == 6


@pytest.mark.parametrize("n", [3, 5])
def test_a_replayed_or_moved_confirmation_does_not_count(n: int) -> None:
    """The server cannot make one silo's confirmation count twice: a tag is bound to its
    sender, so one moved into another silo's slot fails, and the signer list is distinct."""
    rnd = Round(n)
    rnd.fresh()
    everyone = list(range(n))
    view = {"session": rnd.session, "survivors": np.array(everyone),
            "dropped": np.array([], np.int64)}  # fmt: skip
    replies = rnd.transport.exchange("secure", "consistency", {c: view for c in everyone}, 0)
    victim = 0
    tags = {c: tag_for(replies[c]["confirm"], c, victim, everyone) for c in everyone if c != 0}
    honest = {**view, "signers": np.array(everyone),
              "confirmations": b"".join(tags[c] for c in everyone if c != 0)}  # fmt: skip
    moved = {**honest, "confirmations": tags[1] * (n - 1)}  # silo 1's tag in every slot
    with pytest.raises(IntegrityError, match="confirmation of the survivor set does not verify"):
        rnd.transport.exchange("secure", "unmask", {victim: moved}, 0)
    twice = {**honest, "signers": np.array([0, 1, 1]), "confirmations": tags[1] * 2}
    with pytest.raises(IntegrityError, match="sorted and distinct"):
        rnd.transport.exchange("secure", "unmask", {victim: twice}, 0)
    reply = rnd.transport.exchange("secure", "unmask", {victim: honest}, 0)[victim]
    assert len(reply["self_shares"]) == 16 * n  # the genuine confirmations are enough
