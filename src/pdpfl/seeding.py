"""Reproducible randomness derived from one configured seed.

Every random stream in a run is derived from ``(seed, purpose, *indices)`` with NumPy's
``SeedSequence``, never from process order, so that the in-process simulator and a
multi-process Flower federation draw the very same numbers for (round t, silo i).
Cryptographic material (keys, masks) never comes from here: use :mod:`secrets`.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch


def _purpose_key(purpose: str) -> int:
    return int.from_bytes(hashlib.sha256(purpose.encode("utf-8")).digest()[:8], "little")


def seed_sequence(seed: int, purpose: str, *indices: int) -> np.random.SeedSequence:
    """The SeedSequence for one named stream, e.g.
    ``seed_sequence(42, "record-sampling", t, i)``."""
    return np.random.SeedSequence([int(seed), _purpose_key(purpose), *map(int, indices)])


def derive_seed(seed: int, purpose: str, *indices: int) -> int:
    """A 63-bit integer seed for one named stream."""
    return int(seed_sequence(seed, purpose, *indices).generate_state(1, dtype=np.uint64)[0] >> 1)


def numpy_generator(seed: int, purpose: str, *indices: int) -> np.random.Generator:
    return np.random.default_rng(seed_sequence(seed, purpose, *indices))


def torch_generator(
    seed: int, purpose: str, *indices: int, device: str | torch.device = "cpu"
) -> torch.Generator:
    import torch  # here: the numpy streams (budgets, partitions) never import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(seed, purpose, *indices))
    return gen
