"""Group privacy conversions (Mironov 2017 Prop. 2; (kε, k e^{(k−1)ε} δ))."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.privacy import DEFAULT_ORDERS, poisson_gaussian_rdp, rdp_to_epsilon
from pdpfl.privacy.group import group_epsilon_delta, group_epsilon_from_rdp, group_rdp


@settings(max_examples=30, deadline=None)
@given(q=st.floats(1e-5, 1.0), sigma=st.floats(0.5, 20.0), k=st.integers(1, 300))
def test_group_epsilon_never_below_record_epsilon(q, sigma, k) -> None:
    rdp = 100 * poisson_gaussian_rdp(q, sigma)[0]
    rec, _ = rdp_to_epsilon(rdp, DEFAULT_ORDERS, 1e-5)
    grp, _ = group_epsilon_from_rdp(rdp, DEFAULT_ORDERS, 1e-5, k)
    assert grp >= rec
    if rec > 0 and k > 1:
        assert grp > 0


def test_non_power_of_two_rounds_up() -> None:
    rdp = poisson_gaussian_rdp(0.1, 1.0)[0]
    r3, a3 = group_rdp(rdp, DEFAULT_ORDERS, 3)
    r4, a4 = group_rdp(rdp, DEFAULT_ORDERS, 4)
    np.testing.assert_array_equal(r3, r4)
    np.testing.assert_array_equal(a3, a4)
    assert np.all(a4 >= 2) and np.all(r4 == 9 * rdp[DEFAULT_ORDERS >= 8])
    with pytest.raises(ValueError, match="group_size"):
        group_rdp(rdp, DEFAULT_ORDERS, 0)
    with pytest.raises(ValueError, match="group_size"):
        group_rdp(rdp[:2], np.array([2.0, 3.0]), 4)  # no order ≥ 8


def test_epsilon_delta_group() -> None:
    assert group_epsilon_delta(0.5, 1e-6, 1) == (0.5, 1e-6)
    e, d = group_epsilon_delta(0.5, 1e-6, 4)
    assert e == 2.0 and d == pytest.approx(4 * np.exp(1.5) * 1e-6)
    assert group_epsilon_delta(5.0, 0.1, 50)[1] == 1.0
