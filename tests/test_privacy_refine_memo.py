"""The order refinement's memo of exact integer-order RDP gives the same bits (issue #26 item 4).

:func:`pdpfl.privacy._search_orders._refine` evaluates ρ at each rate's own fractional order for
up to 16 Brent steps; the exact values at the integer orders around those orders are computed
once per (rate, order) and reused. Reusing them must not change a single bit: every value
through the memo equals :func:`~pdpfl.privacy.rdp.poisson_gaussian_rdp_pairs`, whether it was
computed in this call, an earlier one, or in a batch of other pairs. The memo is seeded with
the grid search's exact values at integer orders (the matrix path, many rates × many orders at
once), which must be the paired kernel's bits too.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.privacy._rdp_pairs import integer_rdp_pairs
from pdpfl.privacy._search_orders import _IntegerMemo
from pdpfl.privacy.rdp import _subsampled_pairs, poisson_gaussian_rdp, poisson_gaussian_rdp_pairs


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)


@settings(max_examples=40, deadline=None)
@given(
    sigma=st.sampled_from([0.3, 0.7, 1.0, 2.0, 5.0]),
    seed=st.integers(0, 2**32 - 1),
    steps=st.integers(1, 4),
)
def test_memo_values_are_the_direct_values(sigma: float, seed: int, steps: int) -> None:
    rng = np.random.default_rng(seed)
    q = np.unique(10.0 ** rng.uniform(-6, -1e-3, size=60))
    memo = _IntegerMemo(q, sigma)
    for _ in range(steps):  # later steps hit the memo for most (rate, order) pairs
        rows = np.sort(rng.choice(q.size, size=rng.integers(1, q.size + 1), replace=False))
        base = rng.choice([1.5, 2.0, 4.0, 7.5, 12.0, 31.0], size=rows.size)
        alpha = base + rng.uniform(0.0, 1.0, size=rows.size) * rng.integers(0, 2, size=rows.size)

        def integer(i: np.ndarray, k: np.ndarray, rows: np.ndarray = rows) -> np.ndarray:
            return memo(rows[i], k)

        via_memo = _subsampled_pairs(q[rows], sigma, alpha, integer=integer)
        direct = poisson_gaussian_rdp_pairs(q[rows], sigma, alpha)
        assert np.array_equal(_bits(via_memo), _bits(direct))


def test_memo_computes_each_pair_once() -> None:
    q = np.array([1e-4, 1e-3, 1e-2, 0.1])
    memo = _IntegerMemo(q, 1.0)
    rows, k = np.array([0, 1, 2, 3, 1]), np.array([5, 5, 6, 9, 7])
    first = memo(rows, k)
    assert np.array_equal(_bits(first), _bits(integer_rdp_pairs(q[rows], 1.0, k)))
    assert sorted(memo.values) == [5, 6, 7, 9]
    memo.q = np.full(q.size, np.nan)  # a recomputation would now give NaN
    again = memo(rows[::-1], k[::-1])
    assert np.array_equal(_bits(again), _bits(first[::-1]))


@settings(max_examples=25, deadline=None)
@given(
    sigma=st.floats(0.4, 30.0), seed=st.integers(0, 2**32 - 1), top=st.sampled_from([12, 64, 700])
)
def test_grid_values_at_integer_orders_are_the_paired_bits(
    sigma: float, seed: int, top: int
) -> None:
    rng = np.random.default_rng(seed)
    q = np.unique(10.0 ** rng.uniform(-9, -1e-4, size=80))
    orders = np.unique(rng.integers(2, top + 1, size=12)).astype(np.float64)
    grid = poisson_gaussian_rdp(q, sigma, orders)  # the skeleton's matrix path
    rows, cols = np.meshgrid(np.arange(q.size), np.arange(orders.size), indexing="ij")
    paired = integer_rdp_pairs(q[rows.ravel()], sigma, orders[cols.ravel()].astype(np.int64))
    assert np.array_equal(_bits(grid.ravel()), _bits(paired))
