"""The survivor threshold t of dropout-robust summation, and what a run may say about it.

One rule, used by every summation protocol and by every algorithm whose silos add only a share
of the noise (ULDP-AVG/SGD, IDP-FedAvg ``variant: distributed``):

    t(n) = max(secure.min_survivors, ⌈r · n⌉, ⌊n/2⌋ + 1)

where n is the number of silos *asked* in the round (before any dropout) and r is
``secure.threshold`` as the exact rational of the decimal it is written as (0.55 is 11/20, the
default 2/3 is 0.6666666666666666): integer arithmetic, no float rounding, and t > n/2 always
(the last term), whatever the threshold. A round's sum is
released only if at least t of them contributed; otherwise the round produces no aggregate (the
round loop keeps the model). Consequences, stated in ``docs/secure_aggregation.md``:

* **Dropout tolerance** n - t: up to that many silos may be lost at any stage of the round.
* **Collusion bound** t - 1 (semi-honest server, Bonawitz et al. 2017 Thm. 6.3): the server
  together with up to t - 1 silos learns nothing about the other silos' inputs beyond their sum.
  Against an **active** server -- one that tells different silos different survivor sets to
  collect both the self mask and the pairwise-mask seed of one silo -- the threshold alone holds
  only up to 2t - n - 1 colluders (with n = 3, t = 2: none); secure summation's consistency
  round (:func:`~pdpfl.fl.aggregation.secure_identity.consistency_quorum`: q = ⌈(n + t)/2⌉
  silos confirm one survivor set, authenticated, before any share is revealed) restores t - 1,
  at the price of a dropout tolerance n - q.
* **Noise shares** (item 2 of issue #22): a silo that adds only a share of the Gaussian noise
  sizes it σ²C²/t (variance), so that any released sum -- at least t shares -- carries variance
  ≥ σ²C², the noise the ledgers charge. With c colluding silos that subtract their own shares
  the noise left is (t - c)/t of it; the guarantee against the server assumes no colluding silo.
* **Lone survivor**: t ≥ 2 always, so a single silo's masked upload is never unmasked.

An algorithm whose silos add noise shares sizes them with :func:`share_threshold`
``(config, n)`` -- t(n), or n itself when a single silo is asked (it then adds all the noise;
only plain summation releases such a round) -- with n the silos asked per round (every silo for
ULDP-AVG/SGD and IDP-FedAvg ``distributed``), and declares ``distributed_noise = True`` on its
server algorithm, so that plain summation refuses a sum of fewer shares too. The multi-stage
protocols also hand the round's t to ``fit`` / ``user_updates`` under :data:`SURVIVORS_KEY` in
the round configuration; a silo sizes its share for the smaller of the two (more noise, never
less).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING, Any, SupportsInt

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig

__all__ = [
    "DEFAULT_MIN_SURVIVORS",
    "DEFAULT_THRESHOLD",
    "SURVIVORS_KEY",
    "check_round_threshold",
    "check_threshold",
    "share_std",
    "share_threshold",
    "summary_fields",
    "survivor_threshold",
    "threshold_fraction",
    "threshold_of",
]

#: Round-configuration key under which a summation protocol tells the silo algorithm the
#: round's t (an int): a noise share is sized σ²C²/t.
SURVIVORS_KEY = "secure.survivors"
DEFAULT_THRESHOLD = 2.0 / 3.0
DEFAULT_MIN_SURVIVORS = 2


def check_threshold(threshold: float, min_survivors: int) -> None:
    """Refuse a rule that could release a lone upload or two disjoint survivor sets."""
    f = float(threshold)
    if not (math.isfinite(f) and 0.5 < f <= 1.0):
        raise ValueError(
            f"secure.threshold: must be in (1/2, 1] -- the fraction of a round's silos that must "
            f"survive; above 1/2 so that two disjoint survivor sets can never both reach it; "
            f"got {threshold!r}"
        )
    m = min_survivors
    if isinstance(m, bool) or not isinstance(m, int) or m < 2:
        raise ValueError(
            "secure.min_survivors: must be an integer >= 2 -- with one survivor its masked "
            f"upload would be its update; got {min_survivors!r}"
        )


def threshold_fraction(threshold: float) -> Fraction:
    """The threshold as an exact rational: the decimal its float is written as (the shortest
    repr), so 0.55 is 11/20 and not the binary 0.55000000000000004440892098500626."""
    return Fraction(repr(float(threshold)))


def survivor_threshold(
    n: int, threshold: float = DEFAULT_THRESHOLD, min_survivors: int = DEFAULT_MIN_SURVIVORS
) -> int:
    """t(n) = max(min_survivors, ⌈r·n⌉, ⌊n/2⌋ + 1), r = :func:`threshold_fraction`: exact
    integer arithmetic, t > n/2 always (may exceed n: such a round is refused)."""
    check_threshold(threshold, min_survivors)
    n = int(n)
    if n < 0:
        raise ValueError(f"n: must be >= 0, got {n}")
    return max(int(min_survivors), math.ceil(threshold_fraction(threshold) * n), n // 2 + 1)


def threshold_of(config: ExperimentConfig, n: int) -> int:
    """t(n) under an experiment config (its ``secure`` section; defaults if it has none)."""
    secure = getattr(config, "secure", None)
    return survivor_threshold(
        n,
        float(getattr(secure, "threshold", DEFAULT_THRESHOLD)),
        int(getattr(secure, "min_survivors", DEFAULT_MIN_SURVIVORS)),
    )


def share_threshold(config: ExperimentConfig, n: int) -> int:
    """The number of noise shares every released sum of a round that asks ``n`` silos holds:
    min(n, t(n)) (t(n) exceeds n only for n = 1, whose one silo must then add all the noise).

    A silo adding a share of Gaussian noise of total variance V adds V / share_threshold(...)
    (:func:`share_std`), so that any admissible set of survivors carries at least V.
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"n: the silos asked must be >= 1, got {n}")
    return min(n, threshold_of(config, n))


def share_std(
    total_std: float, survivors: int, announced: SupportsInt | str | None = None
) -> float:
    """The std of one silo's share of Gaussian noise of std ``total_std``: total_std/√t with t
    the ``survivors`` the setup sized it for, or the smaller t a protocol announced in the round
    configuration (``config.get(SURVIVORS_KEY)``) -- never less noise than either needs."""
    t = int(survivors)
    if announced is not None:
        t = min(t, int(announced))
    if t < 1:
        raise ValueError(f"survivors: a noise share needs t >= 1, got {t}")
    return float(total_std) / math.sqrt(t)


def check_round_threshold(t: int, n: int, *, what: str = "secure summation") -> int:
    """A silo's own check of the t a server announces for n participants (2 ≤ t ≤ n, 2t > n)."""
    t, n = int(t), int(n)
    if not (2 <= t <= n and 2 * t > n):
        from pdpfl.crypto import IntegrityError

        raise IntegrityError(
            f"{what}: threshold t = {t} for {n} participants refused (needs 2 <= t <= n and "
            "t > n/2)"
        )
    return t


def summary_fields(config: ExperimentConfig, num_silos: int | None = None) -> dict[str, Any]:
    """What ``summary.json`` may say about summation, dropouts and participation (issue #22).

    ``num_silos`` (default ``config.data.num_clients``) gives the worked numbers for a round
    that asks every silo. Every sentence is one pdpfl stands behind on a real network.
    """
    aggregation = getattr(config, "aggregation", "plain")
    private_weights = getattr(getattr(config, "algorithm", None), "weights", None) == "private"
    protocol = "private-weighting" if private_weights else str(aggregation)
    hidden = getattr(config, "participation", "visible") == "hidden"
    secure = getattr(config, "secure", None)
    threshold = float(getattr(secure, "threshold", DEFAULT_THRESHOLD))
    floor = int(getattr(secure, "min_survivors", DEFAULT_MIN_SURVIVORS))
    if num_silos is None:
        num_silos = getattr(getattr(config, "data", None), "num_clients", None)
    out: dict[str, Any] = {
        "protocol": protocol,
        "server_sees": "every update" if protocol == "plain" else "only the sum of the updates",
        "threshold": threshold,
        "min_survivors": floor,
        "survivors_rule": "a round's sum is released only if at least t = max(min_survivors, "
        "ceil(threshold * n)) of the n silos asked contributed; otherwise the round has no "
        "aggregate and the model is kept",
        "noise_shares": (
            "a silo that adds a share of the noise adds variance sigma^2 C^2 / t, so "
            "every released sum carries at least the noise the ledgers charge"
            + (
                "; discrete (privacy.noise_shares): each share is an exact discrete Gaussian "
                "added to the silo's rounded integer vector, the integers are summed modulo "
                "2^bits and the ledgers charge the distributed discrete Gaussian "
                "(discrete_shares: the encoding, where the algorithm adds shares)"
                if getattr(getattr(config, "privacy", None), "noise_shares", "") == "discrete"
                else "; continuous (privacy.noise_shares): float Gaussian shares in the "
                "fixed-point ring"
            )
        ),
        "participation": "hidden" if hidden else "visible",
        "server_observer": (
            "participation revealed: the server can tell who took part (it samples the silos"
            + (
                "; with participation: hidden message contents do not depend on it, but reply "
                "timing does and is not padded"
                if hidden
                else ""
            )
            + "), so the bound against the server is derived with participation revealed "
            "(realised participations, no client-sampling amplification); the lambda-amplified "
            "bound holds against third parties, who see only the models"
        ),
    }
    if protocol == "secure":
        out["collusion"] = {
            "semi_honest": "the server and up to t - 1 silos learn nothing beyond the sum of the "
            "survivors' updates",
            "active": "a server that deviates from the protocol (substitutes keys, tells silos "
            "different survivor sets, changes t or the participation mode) and up to t - 1 "
            "silos: the same -- each silo authenticates its keys and confirms the survivor set "
            "it was shown to the others, and reveals shares only once q = ceil((n + t)/2) "
            "silos confirmed that very set (the consistency round)",
        }
        out["consistency_rule"] = (
            "a round's shares are revealed only after q = ceil((n + t)/2) of the n silos asked "
            "confirmed one survivor set; a round that keeps fewer than q silos until then has "
            "no aggregate"
        )
    elif protocol != "plain":
        out["collusion"] = {
            "semi_honest": "no colluding silo: a silo that colludes with the server reveals "
            "the users' record totals (Protocol 1 of ULDP-FL assumes none)",
            "active": "not covered: this protocol assumes a semi-honest server",
        }
    if isinstance(num_silos, int) and num_silos >= 1:
        t = survivor_threshold(num_silos, threshold, floor)
        row: dict[str, Any] = {"n": num_silos, "t": t}
        if protocol == "secure" and t <= num_silos:
            q = (num_silos + t + 1) // 2  # secure_identity.consistency_quorum
            row.update(quorum=q, dropout_tolerance=num_silos - q)
            row["collusion_bound"] = {"semi_honest": t - 1, "active": t - 1}
        else:
            row["dropout_tolerance"] = max(0, num_silos - t)
            row["collusion_bound"] = {"semi_honest": 0, "active": 0}
        out["all_silos"] = row
    return out
