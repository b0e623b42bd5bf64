"""Shared pytest configuration for the pdpfl test-suite."""

from __future__ import annotations

import os
from collections.abc import Iterator
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


@pytest.fixture(autouse=True, scope="session")
def _budget_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Budget stores (a person's budget for life, pdpfl.ledger.lifetime) are kept in a temporary
    folder (inherited by the processes the suite starts), never in the developer's home."""
    if "PDPFL_BUDGET_DIR" not in os.environ:
        os.environ["PDPFL_BUDGET_DIR"] = str(tmp_path_factory.mktemp("pdpfl-budgets"))


@pytest.fixture(autouse=True, scope="module")
def _module_budget_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A fresh budget store folder per module, so that a module's shared runs never find the
    data already spent by another module's runs."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PDPFL_BUDGET_DIR", str(tmp_path_factory.mktemp("budgets-module")))
        yield


@pytest.fixture(autouse=True)
def _test_budget_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh budget store folder per test: the suite runs the same examples on the same data
    many times, and each test starts with every lifetime budget unspent."""
    monkeypatch.setenv("PDPFL_BUDGET_DIR", str(tmp_path_factory.mktemp("budgets")))
