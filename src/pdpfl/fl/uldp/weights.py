"""User weights of ULDP-AVG/SGD (Algorithm 3, Eq. 4) and the flags of ULDP-GROUP-k (Alg. 2).

* :func:`uniform_weights` / :func:`enhanced_weights` -- w_{s,u} = 1/|S| or n_{s,u}/N_u, with
  :func:`check_weights` enforcing Theorem 5's premise Σ_s w_{s,u} ≤ 1 (user-level
  sensitivity C); :func:`silo_weights` is the same at one silo from the published N_u;
* :func:`fair_group_quotas` / :func:`split_group_quotas` -- the fixed GROUP flags (at most k
  records per user across all silos; the reference's fair rule without its
  in-place histogram edits, spec D20); :func:`resolve_group_k` -- k = an integer,
  ``max`` or ``median`` of N_u.

Spec references: ``docs/uldp_spec.md``, Part A.
"""

from __future__ import annotations

import math

import numpy as np

from pdpfl.privacy.uldp import check_group_size

__all__ = [
    "check_weights",
    "enhanced_weights",
    "fair_group_quotas",
    "resolve_group_k",
    "silo_weights",
    "split_group_quotas",
    "uniform_weights",
]

#: Enhanced weights are shrunk by this many ulps per silo, so that Σ_s w_{s,u} ≤ 1 in floats.
_SHRINK_ULPS = 4.0


def uniform_weights(present: np.ndarray) -> np.ndarray:
    """w_{s,u} = 1/|S| where user u has records in silo s, else 0 (``present``: (S, U) bool).

    Users absent from a silo get no weight there (the reference assigns 1/|S| even there, but
    such a silo trains nothing for the user, so the aggregate is the same).
    """
    present = np.asarray(present, dtype=bool)
    return np.where(present, 1.0 / present.shape[0], 0.0)


def enhanced_weights(histogram: np.ndarray) -> np.ndarray:
    """Eq. (4): w_{s,u} = n_{s,u}/N_u, shrunk by a few ulps so that Σ_s w_{s,u} ≤ 1 exactly.

    ``histogram``: (S, U) non-negative counts. A user with no records (N_u = 0) gets no weight.
    """
    h = np.asarray(histogram, dtype=np.float64)
    if h.ndim != 2 or (h < 0).any() or not np.isfinite(h).all():
        raise ValueError("user_histogram: expected an (S, U) array of non-negative counts")
    totals = h.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(totals > 0, h / np.where(totals > 0, totals, 1.0), 0.0)
    w *= 1.0 - _SHRINK_ULPS * h.shape[0] * np.finfo(np.float64).eps
    check_weights(w)
    return w


def check_weights(weights: np.ndarray) -> None:
    """Validate user weights: w ≥ 0 and Σ_s w_{s,u} ≤ 1 for every user (Theorem 5's premise)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2 or not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("weights: expected an (S, U) array of finite weights >= 0")
    sums = w.sum(axis=0)
    if (sums > 1.0).any():
        u = int(np.argmax(sums))
        raise ValueError(
            f"weights: Σ_s w_(s,u) = {sums[u]!r} > 1 for user {u}; the user-level sensitivity "
            "would exceed C"
        )


def silo_weights(
    kind: str,
    counts: np.ndarray,
    users: np.ndarray,
    num_silos: int,
    totals: tuple[int, ...] | None,
    silo: int,
) -> np.ndarray | None:
    """w_{s,u} of one silo's users (``counts`` n_{s,u} of ``users``), computed at the silo.

    ``uniform``: 1/|S|; ``enhanced``: n_{s,u}/N_u from the published totals (a silo whose own
    count exceeds N_u refuses: the disclosed histogram would not bound Σ_s w by 1);
    ``private``: None -- only the protocol computes these weights, encrypted.
    """
    if kind == "uniform":
        return np.full(len(users), 1.0 / num_silos)
    if kind == "private":
        return None
    if totals is None:
        raise ValueError("weights: enhanced weights need the published user_totals N_u")
    n_u = np.asarray(totals, dtype=np.float64)[users]
    if (counts > n_u).any():
        raise ValueError(
            f"silo {silo}: a user has more records here than the published total N_u; the "
            "disclosed histogram does not match the data"
        )
    return np.asarray(counts / n_u * (1.0 - _SHRINK_ULPS * num_silos * np.finfo(np.float64).eps))


# ------------------------------------------------------------------------------ GROUP flags


def _waterfill(counts: np.ndarray, target: int, offset: int) -> np.ndarray:
    """Take ``target`` items from bins ``counts`` as evenly as possible (round-robin)."""
    counts = np.asarray(counts, dtype=np.int64)
    if target >= counts.sum():
        return counts.copy()
    lo, hi = 0, int(counts.max())
    while lo < hi:  # largest level L with Σ min(n_s, L) ≤ target
        mid = (lo + hi + 1) // 2
        if np.minimum(counts, mid).sum() <= target:
            lo = mid
        else:
            hi = mid - 1
    take: np.ndarray = np.minimum(counts, lo)
    rest = target - int(take.sum())
    s = len(counts)
    for j in range(s):  # one more record from the next silos that still have some
        if rest == 0:
            break
        k = (offset + j) % s
        if counts[k] > take[k]:
            take[k] += 1
            rest -= 1
    return take


def fair_group_quotas(histogram: np.ndarray, k: int) -> np.ndarray:
    """GROUP flags from the histograms: per user, min(k, N_u) records spread round-robin over
    the silos holding them (the reference's "fair" rule; user u starts at silo u mod |S|).

    Returns (S, U) quotas n̂_{s,u} ≤ n_{s,u} with Σ_s n̂_{s,u} ≤ k.
    """
    h = np.asarray(histogram, dtype=np.int64)
    k = check_group_size(k)
    out = np.zeros_like(h)
    for u in range(h.shape[1]):
        out[:, u] = _waterfill(h[:, u], min(k, int(h[:, u].sum())), u % h.shape[0])
    return out


def split_group_quotas(num_silos: int, num_users: int, k: int) -> np.ndarray:
    """Data-independent GROUP flags: silo s keeps at most ⌊k/|S|⌋ (+1 for k mod |S| silos,
    rotating with the user id) of each user's records, so Σ_s n̂_{s,u} ≤ k without any
    histogram."""
    k = check_group_size(k)
    s = np.arange(int(num_silos))[:, None]
    u = np.arange(int(num_users))[None, :]
    return k // num_silos + ((s - u) % num_silos < k % num_silos).astype(np.int64)


def resolve_group_k(k: int | str, totals: np.ndarray | None) -> int:
    """k as an integer: fixed, ``max`` N_u or ``median`` N_u (floor; at least 1)."""
    if isinstance(k, str):
        if totals is None:
            raise ValueError(
                f"algorithm.group_k: {k} needs the silos' per-user record counts "
                "(data.public_user_histograms: true; not collected by the Flower runtime yet)"
            )
        t = np.asarray(totals, dtype=np.float64)
        t = t[t > 0]
        if t.size == 0:
            raise ValueError("algorithm.group_k: no user has any record")
        return max(1, int(t.max() if k == "max" else math.floor(float(np.median(t)))))
    return check_group_size(k)
