"""A broken noise sampler, for tests that must catch a mechanism releasing less noise.

Every DP noise of pdpfl is drawn by :func:`pdpfl.dp.noise.add_noise` from a description whose
event the ledger charges, and every party checks that description against its ledger before it
draws (``tests/test_noise_binding.py``): a silo can no longer be made to add less noise by
editing its setup. The one bug left to simulate is a broken sampler, which is what
:func:`weaken_noise` installs (for the duration of a test, through ``monkeypatch``).
"""

from __future__ import annotations

from typing import Any

import pytest

from pdpfl.dp import noise as noise_module


def weaken_noise(monkeypatch: pytest.MonkeyPatch, factor: float = 10.0) -> None:
    """Make the Gaussian sampler draw ``1/factor`` of the std it is asked for."""
    original = noise_module._SAMPLERS["gaussian"]

    def weak(targets: Any, noise: Any, std: float, stream: Any, shapes: Any) -> None:
        original(targets, noise, std / factor, stream, shapes)

    monkeypatch.setitem(noise_module._SAMPLERS, "gaussian", weak)
