"""Every registered algorithm passes the conformance checks of :mod:`pdpfl.testing`."""

from __future__ import annotations

import pytest

from pdpfl.config import ALGORITHMS
from pdpfl.testing import check_algorithm


@pytest.mark.slow
@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_registered_algorithm_conforms(name: str) -> None:
    check_algorithm(name)
