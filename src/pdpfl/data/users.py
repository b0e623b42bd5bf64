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

User-level non-IID labels (``labels_per_user=k`` with ``labels=``; ULDP-FL's MNIST
"zipf-noniid", spec A.5.2): each user keeps its number of records (and their silos) but its
records are drawn from k labels chosen at random; when a label runs out, the user is filled
from the labels with the most records left, so every record is still used exactly once.

In every case each record gets exactly one user, every user has at least one record
(so ``num_users <= num_records``), ``num_users`` need not divide ``num_records``, and no index
past the data is ever produced (the reference's uniform allocation has ⌈n/|U|⌉·|U| > n
entries: spec D13).
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
    p: np.ndarray = np.arange(1, k + 1, dtype=np.float64) ** (-float(alpha))
    return p / float(p.sum())


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
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float | np.number)
        or (value <= low if strict else value < low)
    ):
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
    labels: np.ndarray | None = None,
    labels_per_user: int | None = None,
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
    labels, labels_per_user:
        with ``labels_per_user=k`` (requires ``labels``, one class per record): each user's
        records come from k random labels (user-level non-IID); not for fixed silos.
    rng:
        the random stream (e.g. ``pdpfl.seeding.numpy_generator(seed, "users")``).
    """
    if distribution not in USER_DISTRIBUTIONS:
        raise ValueError(
            f"distribution must be one of {list(USER_DISTRIBUTIONS)}, got {distribution!r}"
        )
    n = int(num_records)
    if n < 1:
        raise ValueError(f"num_records must be >= 1, got {num_records}")
    if (
        isinstance(num_users, bool)
        or not isinstance(num_users, int | np.integer)
        or not (1 <= num_users <= n)
    ):
        raise ValueError(
            f"num_users must be an integer in [1, {n}] (every user needs a "
            f"record), got {num_users!r}"
        )
    _check("alpha_user", alpha_user, 0.0)
    _check("alpha_silo", alpha_silo, 0.0)
    if not 0.0 <= home_fraction <= 1.0:
        raise ValueError(f"home_fraction must be in [0, 1], got {home_fraction!r}")
    u = int(num_users)
    if labels_per_user is not None:
        if (
            isinstance(labels_per_user, bool)
            or not isinstance(labels_per_user, int | np.integer)
            or labels_per_user < 1
        ):
            raise ValueError(f"labels_per_user must be an integer >= 1, got {labels_per_user!r}")
        if labels is None or np.shape(labels) != (n,):
            raise ValueError("labels_per_user needs labels: one class label per record")
        if silo_ids is not None:
            raise ValueError("labels_per_user: not available with fixed silos")
    if silo_ids is not None:
        silos = np.asarray(silo_ids, dtype=np.int64).reshape(-1)
        if len(silos) != n or (silos < 0).any():
            raise ValueError("silo_ids must hold one non-negative silo index per record")
        s = int(silos.max()) + 1
        if distribution == "uniform":
            return UserAllocation(_uniform_users(n, u, rng), silos, u, s)
        return _fixed_silo_zipf(silos, s, u, alpha_user, home_fraction, rng)
    if (
        isinstance(num_silos, bool)
        or not isinstance(num_silos, int | np.integer)
        or (num_silos < 1)
    ):
        raise ValueError(f"num_silos must be an integer >= 1, got {num_silos!r}")
    s = int(num_silos)
    if distribution == "uniform":
        alloc = UserAllocation(_uniform_users(n, u, rng), rng.integers(s, size=n), u, s)
        if labels_per_user is None:
            return alloc
        return _relabel(alloc, np.asarray(labels), int(labels_per_user), rng)
    per_user = _zipf_counts(n, u, alpha_user, rng)
    p_silo = _zipf_probs(s, alpha_silo)
    blocks = np.stack(
        [rng.multinomial(k, p_silo)[np.argsort(rng.permutation(s))] for k in per_user]
    )  # (u, s): Zipf over a random silo order
    flat = blocks.reshape(-1)
    user_of = np.repeat(np.repeat(np.arange(u), s), flat)
    silo_of = np.repeat(np.tile(np.arange(s), u), flat)
    perm = rng.permutation(n)
    users = np.empty(n, dtype=np.int64)
    out_silos = np.empty(n, dtype=np.int64)
    users[perm] = user_of
    out_silos[perm] = silo_of
    alloc = UserAllocation(users, out_silos, u, s)
    if labels_per_user is None:
        return alloc
    return _relabel(alloc, np.asarray(labels), int(labels_per_user), rng)


def _relabel(
    alloc: UserAllocation, labels: np.ndarray, k: int, rng: np.random.Generator
) -> UserAllocation:
    """Re-deal the records to the (user, silo) slots of ``alloc`` so that each user's records
    come from ``k`` random labels (counts per user and per (user, silo) are kept)."""
    n = len(labels)
    classes, y = np.unique(labels, return_inverse=True)
    pools = [rng.permutation(np.flatnonzero(y == c)) for c in range(len(classes))]
    left = np.array([len(p) for p in pools])
    used = np.zeros(len(classes), dtype=np.int64)
    slots = np.argsort(alloc.user_ids, kind="stable")  # slot positions grouped by user
    need = np.bincount(alloc.user_ids, minlength=alloc.num_users)
    start = np.concatenate([[0], np.cumsum(need)])
    record_of_slot = np.empty(n, dtype=np.int64)
    for user in rng.permutation(alloc.num_users):
        m = int(need[user])
        live = np.flatnonzero(left > 0)
        chosen = list(rng.choice(live, size=min(k, len(live)), replace=False))
        got: list[np.ndarray] = []
        while m > 0:
            avail = [c for c in chosen if left[c] > 0]
            if not avail:  # the user's labels ran out: take the label with most records left
                c = int(np.argmax(left))
                chosen.append(c)
                avail = [c]
            per = -(-m // len(avail))
            for c in avail:
                take = int(min(per, left[c], m))
                got.append(pools[c][used[c] : used[c] + take])
                used[c] += take
                left[c] -= take
                m -= take
                if m == 0:
                    break
        mine = slots[start[user] : start[user + 1]]
        record_of_slot[mine] = rng.permutation(np.concatenate(got)) if got else mine[:0]
    users = np.empty(n, dtype=np.int64)
    silos = np.empty(n, dtype=np.int64)
    users[record_of_slot] = alloc.user_ids
    silos[record_of_slot] = alloc.silo_ids
    return UserAllocation(users, silos, alloc.num_users, alloc.num_silos)


def _fixed_silo_zipf(
    silos: np.ndarray,
    s: int,
    u: int,
    alpha_user: float,
    home_fraction: float,
    rng: np.random.Generator,
) -> UserAllocation:
    n = len(silos)
    cap = np.bincount(silos, minlength=s)
    per_user = _zipf_counts(n, u, alpha_user, rng)
    home = rng.choice(s, size=u, p=cap / n)
    slot_user = np.repeat(np.arange(u), per_user)
    n_home = np.rint(home_fraction * per_user).astype(np.int64)
    is_home = np.arange(n) - np.repeat(np.cumsum(per_user) - per_user, per_user) < np.repeat(
        n_home, per_user
    )
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
