"""Extra clipped per-example rows in a DP step: the engine's hook for audit canaries.

:mod:`pdpfl.audit` plants *white-box canaries* (Steinke, Nasr & Jagielski, NeurIPS 2023, §6:
"Dirac canaries"): examples whose per-example gradient is a fixed vector, e.g. ``C·e_j`` for a
coordinate ``j`` of their own. They must go through the real mechanism, so the engine treats
each row like a record of the silo (:mod:`pdpfl.dp.engine`, one DP step):

1. **sampling** -- one Bernoulli(``rates[i]``) coin per row from the step's
   :class:`~pdpfl.randomness.RandomStream` (the silo's CSPRNG by default), drawn after the
   records' coins and before the noise;
2. **clipping** -- each sampled row is scaled to L2 norm at most ``C`` (float64, with the same
   few-ulp shrink as :func:`pdpfl.dp.steps.clip_vectors`);
3. the clipped rows are **added to the clipped sum**, to which the engine then adds the noise
   ``N(0, σ²C²)`` and divides by the public normaliser, exactly as for the records.

A row is sparse: ``values[i, k]`` at the flat coordinate ``coords[i, k]`` of the concatenated
trainable parameters (``model.parameters()`` order). A Dirac canary has one entry. Nothing here
is used by an ordinary run: the engine's ``extra`` argument defaults to ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from pdpfl.dp.steps import poisson_sample
from pdpfl.randomness import RandomStream

__all__ = ["ExtraRows"]

#: Clipping factors of scaled rows are shrunk by this many float32 ulps (as clip_vectors does).
_SHRINK = 1.0 - 4.0 * 2.0**-24


@dataclass
class ExtraRows:
    """Sparse extra per-example rows with their own Poisson rates (see the module docstring).

    Attributes
    ----------
    coords
        ``(m, k)`` int64 flat parameter coordinates of each row's entries (distinct per row).
    values
        ``(m, k)`` float64 entries (finite).
    rates
        ``(m,)`` sampling probabilities in ``[0, 1]``.
    counts
        ``(m,)`` how many steps sampled each row (kept by the owner; never released).
    """

    coords: np.ndarray
    values: np.ndarray
    rates: np.ndarray
    counts: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        coords = np.asarray(self.coords)
        values = np.asarray(self.values, dtype=np.float64)
        rates = np.asarray(self.rates, dtype=np.float64)
        if coords.ndim == 1:
            coords, values = coords[:, None], values.reshape(-1, 1)
        if coords.ndim != 2 or values.shape != coords.shape or rates.shape != coords.shape[:1]:
            raise ValueError(
                f"extra rows: coords {coords.shape}, values {values.shape} and rates "
                f"{rates.shape} must be (m, k), (m, k) and (m,)"
            )
        if coords.size and (coords.dtype.kind not in "iu" or int(coords.min()) < 0):
            raise ValueError("extra rows: coords must be non-negative integers")
        if coords.size and np.any(np.diff(np.sort(coords, axis=1), axis=1) == 0):
            raise ValueError("extra rows: a row's coordinates must be distinct")
        if not np.all(np.isfinite(values)):
            raise ValueError("extra rows: values must be finite")
        if rates.size and not (
            np.all(np.isfinite(rates)) and rates.min() >= 0 and rates.max() <= 1
        ):
            raise ValueError("extra rows: rates must be in [0, 1]")
        self.coords = coords.astype(np.int64)
        self.values = values
        self.rates = rates
        self.counts = np.zeros(rates.shape[0], dtype=np.int64)

    @property
    def num_rows(self) -> int:
        return int(self.rates.shape[0])

    def add_sampled(
        self, sums: Sequence[Tensor], stream: RandomStream, max_grad_norm: float
    ) -> None:
        """Sample the rows (coins from ``stream``), clip them to ``max_grad_norm`` and add them
        in place to ``sums`` (the step's float64 clipped sums, one per trainable parameter)."""
        if not (math.isfinite(max_grad_norm) and max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be finite and > 0, got {max_grad_norm}")
        idx = poisson_sample(self.rates, stream).numpy()
        if idx.size == 0:
            return
        np.add.at(self.counts, idx, 1)
        coords, values = self.coords[idx], self.values[idx]
        norms = np.sqrt(np.sum(values * values, axis=1))
        factors = np.where(
            norms > max_grad_norm, max_grad_norm / np.maximum(norms, 1e-300) * _SHRINK, 1.0
        )
        scaled = (values * factors[:, None]).reshape(-1)
        flat = coords.reshape(-1)
        sizes = [int(s.numel()) for s in sums]
        if int(flat.max()) >= sum(sizes):
            raise ValueError(
                f"extra rows: coordinate {int(flat.max())} is outside the {sum(sizes)} "
                "trainable parameters"
            )
        start = 0
        for s, n in zip(sums, sizes, strict=True):
            inside = (flat >= start) & (flat < start + n)
            if inside.any():
                target = s.view(-1)
                local = torch.from_numpy(flat[inside] - start).to(target.device)
                target.index_add_(0, local, torch.from_numpy(scaled[inside]).to(target))
            start += n
