"""Test helpers for the attacks of issue #22 on secure summation.

``legacy_abort_and_retry`` reproduces the masking of pdpfl's secure summation *before* issue #22
(pairwise masks only; a silo lost at the upload aborts the attempt, which is repeated with the
survivors under fresh masks while their cached contributions are re-masked). It exists only so
that the tests can show the attack succeeding on the old protocol and failing on the new one.

``RecordingDropTransport`` is the in-process transport of an honest-but-curious server that
loses some silos' replies at a given stage (they "arrive late": kept in ``late``) and records
every reply it did receive.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pdpfl.crypto.fixedpoint import FixedPointRing
from pdpfl.crypto.keys import agree, context, mask_words, new_private_key, public_bytes
from pdpfl.runtime.simulation import InProcessTransport


def legacy_abort_and_retry(
    updates: dict[int, np.ndarray], victim: int, ring: FixedPointRing
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """The old protocol's uploads: attempt 0 by every silo (the victim's arrives late) and
    attempt 1 by the survivors, under fresh pairwise masks, of the *same* contributions."""
    keys = {c: new_private_key() for c in updates}
    publics = {c: public_bytes(k) for c, k in keys.items()}

    def upload(silo: int, members: list[int], attempt: int) -> np.ndarray:
        masked = ring.encode(updates[silo], len(members)).copy()
        for other in members:
            if other == silo:
                continue
            lo, hi = sorted((silo, other))
            key = agree(keys[silo], publics[other], context("legacy", attempt, lo, hi))
            mask = mask_words(key, masked.size)
            if silo < other:
                masked += mask
            else:
                masked -= mask
        return masked

    everyone = sorted(updates)
    survivors = [c for c in everyone if c != victim]
    return (
        {c: upload(c, everyone, 0) for c in everyone},
        {c: upload(c, survivors, 1) for c in survivors},
    )


def attempt_difference(
    attempt0: dict[int, np.ndarray], attempt1: dict[int, np.ndarray], ring: FixedPointRing
) -> np.ndarray:
    """The attack: Σ attempt 0 (completed by the late reply) − Σ attempt 1 = the lost update."""
    total0 = np.zeros_like(next(iter(attempt0.values())))
    for v in attempt0.values():
        total0 += v
    total1 = np.zeros_like(total0)
    for v in attempt1.values():
        total1 += v
    return ring.decode(total0, len(attempt0)) - ring.decode(
        total1, len(attempt1), encoded_for=len(attempt1)
    )


class RecordingDropTransport(InProcessTransport):
    """Loses the replies of ``victims`` at ``stage`` (kept in ``late``); records the rest."""

    def __init__(
        self, clients: dict[int, Any], victims: tuple[int, ...] = (), stage: str = "upload"
    ) -> None:
        super().__init__(clients)
        self.victims, self.stage = set(victims), stage
        self.late: dict[int, dict[str, Any]] = {}
        self.received: list[tuple[str, int, dict[str, Any]]] = []
        self.requests: list[tuple[str, int, dict[str, Any]]] = []

    def exchange(self, protocol, stage, requests, round_index):
        self.requests += [(stage, c, r) for c, r in requests.items()]
        replies = super().exchange(protocol, stage, requests, round_index)
        if stage == self.stage:
            for c in list(replies):
                if c in self.victims:
                    self.late[c] = replies.pop(c)
        self.received += [(stage, c, r) for c, r in replies.items()]
        return replies

    def replies_at(self, stage: str) -> dict[int, dict[str, Any]]:
        return {c: r for s, c, r in self.received if s == stage}

    def stages(self) -> list[str]:
        out: list[str] = []
        for s, _, _ in self.requests:
            if not out or out[-1] != s:
                out.append(s)
        return out


def legacy_unmask(memory: dict[str, Any], silo: int, survivors: list[int], dropped: list[int]):
    """The unmask rule of a silo *before* issue #34 (semi-honest server): it checked only its own
    request -- survivors and dropped silos partition the silos it masked with, at least t
    survivors, no silo in both lists, one answer per round -- and revealed its shares of b_j for
    each survivor and of s_j for each dropped j. Kept so that the tests can show the
    equivocation attack succeeding on it; returns ``(self_shares, mask_shares)`` by silo."""
    mem = memory["secure"]
    if set(survivors) & set(dropped) or sorted(survivors + dropped) != mem["u2"]:
        raise ValueError("refused")
    if silo not in survivors or len(survivors) < mem["threshold"] or mem["stage"] != "uploaded":
        raise ValueError("refused")
    mem["stage"] = "unmasked"
    held = mem["held"]
    return {c: held[c][0] for c in survivors}, {c: held[c][1] for c in dropped}
