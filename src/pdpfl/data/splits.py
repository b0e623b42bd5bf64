"""Stratified train/test splitting used by every per-silo split (66 % / 34 % by default)."""

from __future__ import annotations

import math

import numpy as np

#: rPDP-FL Table 1: every silo keeps 66 % of its records for training, 34 % for testing.
DEFAULT_TEST_FRACTION = 0.34


def num_test_records(n: int, test_fraction: float) -> int:
    """``ceil(test_fraction * n)`` (scikit-learn's convention), robust to float round-off."""
    return int(math.ceil(test_fraction * n - 1e-9))


def _largest_remainder(
    total: int, weights: np.ndarray, caps: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Integer allocation of ``total`` proportional to ``weights`` with per-entry ``caps``."""
    alloc = np.zeros(len(weights), dtype=np.int64)
    remaining = total
    active = caps > 0
    while remaining > 0 and active.any():
        w = np.where(active, weights, 0.0).astype(float)
        ideal = remaining * w / w.sum()
        base = np.minimum(np.floor(ideal).astype(np.int64), caps - alloc)
        alloc += base
        remaining -= int(base.sum())
        if remaining > 0:
            frac = ideal - np.floor(ideal)
            # Largest fractional part first; random tie-break keeps it unbiased.
            order = np.lexsort((rng.random(len(w)), -frac))
            for k in order:
                if remaining == 0:
                    break
                if active[k] and alloc[k] < caps[k]:
                    alloc[k] += 1
                    remaining -= 1
        active = alloc < caps
    return alloc


def stratified_split(
    y: np.ndarray,
    test_fraction: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Split positions ``0..len(y)-1`` into sorted train and test index arrays.

    The test side gets ``ceil(test_fraction * n)`` records allocated across classes by
    largest remainder; every class with at least one record keeps at least one record on
    the train side, so a silo's training labels are exactly the labels it holds.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    y = np.asarray(y).reshape(-1)
    n = len(y)
    classes, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    n_test = min(num_test_records(n, test_fraction), int((counts - 1).sum()))
    alloc = _largest_remainder(n_test, counts.astype(float), counts - 1, rng)
    train, test = [], []
    for k in range(len(classes)):
        idx = np.flatnonzero(inverse == k)
        idx = idx[rng.permutation(len(idx))]
        test.append(idx[: alloc[k]])
        train.append(idx[alloc[k] :])
    tr = np.sort(np.concatenate(train)) if train else np.zeros(0, np.int64)
    te = np.sort(np.concatenate(test)) if test else np.zeros(0, np.int64)
    return tr.astype(np.int64), te.astype(np.int64)
