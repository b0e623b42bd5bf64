"""Who is looking: the two adversaries of rPDP-FL (Section 4) and their combination."""

from __future__ import annotations

import enum

__all__ = ["Adversary", "as_adversary"]


class Adversary(str, enum.Enum):  # noqa: UP042 (contract: str mixin)
    """Threat model used to turn a training plan into ε.

    THIRD_PARTY
        Type II: other clients and consumers of the published models. They do not see which
        clients took part in a round, so client sampling amplifies privacy: ``T·ρ^{τ,λ}``
        (rPDP-FL Lemma 6, Theorem 1).
    SERVER
        Type I: an honest-but-curious server. It sees which clients were sampled, so no λ
        amplification: ``k·τ·ρ_SGM`` with ``k`` the rounds the record's client actually took part
        in (before training, ``k = T``).
    BOTH
        The stricter of the two: the larger ε.
    """

    THIRD_PARTY = "third-party"
    SERVER = "server"
    BOTH = "both"


def as_adversary(value: Adversary | str) -> Adversary:
    """Parse an :class:`Adversary` (or its string value); ValueError names ``adversary``."""
    if isinstance(value, Adversary):
        return value
    try:
        return Adversary(str(value).strip().lower())
    except ValueError:
        allowed = ", ".join(a.value for a in Adversary)
        raise ValueError(f"adversary: expected one of {allowed}, got {value!r}") from None
