"""The survivor threshold t of dropout-robust summation, and what a run may say about it.

One rule, used by every summation protocol and by every algorithm whose silos add only a share
of the noise (ULDP-AVG/SGD, IDP-FedAvg ``variant: distributed``):

    t(n) = max(secure.min_survivors, ⌈secure.threshold · n⌉)

where n is the number of silos *asked* in the round (before any dropout). A round's sum is
released only if at least t of them contributed; otherwise the round produces no aggregate (the
round loop keeps the model). Consequences, stated in ``docs/secure_aggregation.md``:

* **Dropout tolerance** n - t: up to that many silos may be lost at any stage of the round.
* **Collusion bound** t - 1 (semi-honest server, Bonawitz et al. 2017 Thm. 6.3): the server
  together with up to t - 1 silos learns nothing about the other silos' inputs beyond their sum.
  Because ``secure.threshold`` > 1/2, two disjoint survivor sets can never both reach t: the
  server cannot obtain the self mask *and* the pairwise masks of one silo even if it tells
  different silos different stories, as long as it colludes with fewer than 2t - n silos.
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
from typing import Any

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


def survivor_threshold(
    n: int, threshold: float = DEFAULT_THRESHOLD, min_survivors: int = DEFAULT_MIN_SURVIVORS
) -> int:
    """t(n) = max(min_survivors, ⌈threshold · n⌉) (may exceed n: such a round is refused)."""
    check_threshold(threshold, min_survivors)
    n = int(n)
    if n < 0:
        raise ValueError(f"n: must be >= 0, got {n}")
    # round() first: 2/3 · 3 must give 2, not ⌈2.0000000000000004⌉ = 3.
    return max(int(min_survivors), math.ceil(round(float(threshold) * n, 9)))


def threshold_of(config: Any, n: int) -> int:
    """t(n) under an experiment config (its ``secure`` section; defaults if it has none)."""
    secure = getattr(config, "secure", None)
    return survivor_threshold(
        n,
        float(getattr(secure, "threshold", DEFAULT_THRESHOLD)),
        int(getattr(secure, "min_survivors", DEFAULT_MIN_SURVIVORS)),
    )


def share_threshold(config: Any, n: int) -> int:
    """The number of noise shares every released sum of a round that asks ``n`` silos holds:
    min(n, t(n)) (t(n) exceeds n only for n = 1, whose one silo must then add all the noise).

    A silo adding a share of Gaussian noise of total variance V adds V / share_threshold(...)
    (:func:`share_std`), so that any admissible set of survivors carries at least V.
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"n: the silos asked must be >= 1, got {n}")
    return min(n, threshold_of(config, n))


def share_std(total_std: float, survivors: int, announced: Any = None) -> float:
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


def summary_fields(config: Any, num_silos: int | None = None) -> dict[str, Any]:
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
    if protocol != "plain":
        out["collusion"] = (
            "semi-honest server: the server and up to t - 1 silos learn nothing beyond the sum "
            "of the other survivors' updates"
        )
    if isinstance(num_silos, int) and num_silos >= 1:
        t = survivor_threshold(num_silos, threshold, floor)
        out["all_silos"] = {
            "n": num_silos,
            "t": t,
            "dropout_tolerance": max(0, num_silos - t),
            "collusion_bound": t - 1 if protocol != "plain" else 0,
        }
    return out
