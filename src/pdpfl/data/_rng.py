"""Per-purpose numpy random streams, torch-free.

Same derivation as :func:`pdpfl.seeding.numpy_generator` (which imports torch, so the data
layer cannot use it): ``SeedSequence([seed, sha256(purpose)[:8], *indices])``. A test checks
that both give identical streams.
"""

from __future__ import annotations

import hashlib

import numpy as np


def numpy_generator(seed: int, purpose: str, *indices: int) -> np.random.Generator:
    key = int.from_bytes(hashlib.sha256(purpose.encode("utf-8")).digest()[:8], "little")
    return np.random.default_rng(np.random.SeedSequence([int(seed), key, *map(int, indices)]))
