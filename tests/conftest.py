"""Shared pytest configuration for the pdpfl test-suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property-based tests: no per-example deadline (CI machines vary), and a derandomized,
# reproducible profile on CI so a failure there can be replayed locally.
settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci", deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "default")

#: ``../shared/data`` beside the checkout, where CI and developers keep the real datasets.
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The shared data folder; tests using it skip with a clear reason when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared datasets not found at {SHARED_DATA} (CI provides ../shared/data)")
    return SHARED_DATA


@pytest.fixture(autouse=True, scope="session")
def _two_threads() -> None:
    """Keep torch to the machine's two cores (no oversubscription between BLAS and torch)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return
    torch.set_num_threads(2)


@pytest.fixture(autouse=True, scope="session")
def _key_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """State files are sealed with a party key kept outside run folders (pdpfl.integrity):
    the suite keeps its keys in a temporary folder (inherited by the processes it starts),
    never in the developer's home."""
    if "PDPFL_KEY_DIR" not in os.environ:
        os.environ["PDPFL_KEY_DIR"] = str(tmp_path_factory.mktemp("pdpfl-keys"))
