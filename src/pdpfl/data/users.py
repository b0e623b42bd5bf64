"""Linking records to users and silos, for user-level DP across silos (ULDP-FL §5.1).

Distributions (:func:`assign_users`):

``uniform``
    every record gets a user uniformly at random and, unless silos are fixed, a silo
    uniformly at random.
``zipf``
    the number of records per user follows a Zipf law with exponent ``alpha_user``
    (default 0.5); each user's records are spread over the silos by a second Zipf law with
    exponent ``alpha_silo`` (default 2.0) over a random per-user silo order.
fixed silos (``silo_ids=`` given, e.g. Fed-Heart-Disease)
    ``uniform``: users uniformly at random within the fixed silos; ``zipf``: Zipf records per
    user, ``home_fraction`` (80 %) of each user's records in a home silo (drawn with
    probability proportional to silo size), the rest spread uniformly over the other
    silos; silo sizes are kept by moving surplus slots of full silos to silos with room.

In every case each record gets exactly one user, every user has at least one record
(so ``num_users <= num_records``), and ``num_users`` need not divide ``num_records``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

USER_DISTRIBUTIONS = ("uniform", "zipf")


@dataclass
class UserAllocation:
    """``user_ids[j]`` and ``silo_ids[j]`` of each record ``j``."""

    user_ids: np.ndarray
    silo_ids: np.ndarray
    num_users: int
    num_silos: int

    def records_per_user(self) -> np.ndarray:
        return np.bincount(self.user_ids, minlength=self.num_users)

    def histogram(self) -> np.ndarray:
        """``(num_users, num_silos)`` counts of records per user and silo."""
        h = np.zeros((self.num_users, self.num_silos), dtype=np.int64)
        np.add.at(h, (self.user_ids, self.silo_ids), 1)
        return h


def _zipf_probs(k: int, alpha: float) -> np.ndarray:
    p = np.arange(1, k + 1, dtype=np.float64) ** (-float(alpha))
    return p / p.sum()


def _zipf_counts(total: int, k: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """``k`` positive counts summing to ``total``, Zipf-shaped, in random rank order."""
    counts = 1 + rng.multinomial(total - k, _zipf_probs(k, alpha))
    return counts[rng.permutation(k)].astype(np.int64)


def _uniform_users(n: int, num_users: int, rng: np.random.Generator) -> np.ndarray:
    users = np.empty(n, dtype=np.int64)
    perm = rng.permutation(n)
    users[perm[:num_users]] = np.arange(num_users)  # every user gets one record first
    users[perm[num_users:]] = rng.integers(num_users, size=n - num_users)
    return users


def _check(name: str, value: float, low: float, strict: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float | np.number) or (
            value <= low if strict else value < low):
        op = ">" if strict else ">="
        raise ValueError(f"{name} must be a number {op} {low}, got {value!r}")


def assign_users(
    num_records: int,
    num_users: int,
    num_silos: int | None = None,
    *,
    distribution: str = "uniform",
    silo_ids: np.ndarray | None = None,
    alpha_user: float = 0.5,
    alpha_silo: float = 2.0,
    home_fraction: float = 0.8,
    rng: np.random.Generator,
) -> UserAllocation:
    """Assign each of ``num_records`` records a user (and a silo unless ``silo_ids`` is given).

    Parameters
    ----------
    num_records, num_users:
        ``1 <= num_users <= num_records``.
    num_silos:
        number of silos to allocate to; ignored (taken from ``silo_ids``) for fixed silos.
    distribution:
        ``"uniform"`` or ``"zipf"`` (see the module docstring).
    silo_ids:
        fixed silo of each record (the fixed-silo variant); ``None`` to allocate silos too.
    alpha_user, alpha_silo, home_fraction:
        Zipf exponents (>= 0) and the home-silo share for fixed silos (in [0, 1]).
    rng:
        the random stream (e.g. ``pdpfl.seeding.numpy_generator(seed, "users")``).
    """
    if distribution not in USER_DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {list(USER_DISTRIBUTIONS)}, "
                         f"got {distribution!r}")
    n = int(num_records)
    if n < 1:
        raise ValueError(f"num_records must be >= 1, got {num_records}")
    if isinstance(num_users, bool) or not isinstance(num_users, int | np.integer) or not (
            1 <= num_users <= n):
        raise ValueError(f"num_users must be an integer in [1, {n}] (every user needs a "
                         f"record), got {num_users!r}")
    _check("alpha_user", alpha_user, 0.0)
    _check("alpha_silo", alpha_silo, 0.0)
    if not 0.0 <= home_fraction <= 1.0:
        raise ValueError(f"home_fraction must be in [0, 1], got {home_fraction!r}")
    u = int(num_users)
    if silo_ids is not None:
        silos = np.asarray(silo_ids, dtype=np.int64).reshape(-1)
        if len(silos) != n or (silos < 0).any():
            raise ValueError("silo_ids must hold one non-negative silo index per record")
        s = int(silos.max()) + 1
        if distribution == "uniform":
            return UserAllocation(_uniform_users(n, u, rng), silos, u, s)
        return _fixed_silo_zipf(silos, s, u, alpha_user, home_fraction, rng)
    if isinstance(num_silos, bool) or not isinstance(num_silos, int | np.integer) or (
            num_silos < 1):
        raise ValueError(f"num_silos must be an integer >= 1, got {num_silos!r}")
    s = int(num_silos)
    if distribution == "uniform":
        return UserAllocation(_uniform_users(n, u, rng), rng.integers(s, size=n), u, s)
    per_user = _zipf_counts(n, u, alpha_user, rng)
    p_silo = _zipf_probs(s, alpha_silo)
    blocks = np.stack([rng.multinomial(k, p_silo)[np.argsort(rng.permutation(s))]
                       for k in per_user])  # (u, s): Zipf over a random silo order
    flat = blocks.reshape(-1)
    user_of = np.repeat(np.repeat(np.arange(u), s), flat)
    silo_of = np.repeat(np.tile(np.arange(s), u), flat)
    perm = rng.permutation(n)
    users = np.empty(n, dtype=np.int64)
    out_silos = np.empty(n, dtype=np.int64)
    users[perm] = user_of
    out_silos[perm] = silo_of
    return UserAllocation(users, out_silos, u, s)


def _fixed_silo_zipf(silos: np.ndarray, s: int, u: int, alpha_user: float,
                     home_fraction: float, rng: np.random.Generator) -> UserAllocation:
    n = len(silos)
    cap = np.bincount(silos, minlength=s)
    per_user = _zipf_counts(n, u, alpha_user, rng)
    home = rng.choice(s, size=u, p=cap / n)
    slot_user = np.repeat(np.arange(u), per_user)
    n_home = np.rint(home_fraction * per_user).astype(np.int64)
    is_home = np.arange(n) - np.repeat(np.cumsum(per_user) - per_user, per_user) < np.repeat(
        n_home, per_user)
    slot_silo = np.repeat(home, per_user)
    if s > 1:  # the rest uniformly over the user's other silos
        away = rng.integers(s - 1, size=n)
        away = away + (away >= slot_silo)
        slot_silo = np.where(is_home, slot_silo, away)
    # Keep the fixed silo sizes: surplus slots of over-full silos go to silos with room.
    overflow = []
    for k in range(s):
        mine = np.flatnonzero(slot_silo == k)
        if len(mine) > cap[k]:
            overflow.append(rng.choice(mine, size=len(mine) - cap[k], replace=False))
    if overflow:
        moved = np.concatenate(overflow)
        room = cap - np.bincount(np.delete(slot_silo, moved), minlength=s)
        slot_silo[moved] = rng.permutation(np.repeat(np.arange(s), room))
    users = np.empty(n, dtype=np.int64)
    for k in range(s):
        records = np.flatnonzero(silos == k)
        users[records[rng.permutation(len(records))]] = slot_user[slot_silo == k]
    return UserAllocation(users, silos.copy(), u, s)
