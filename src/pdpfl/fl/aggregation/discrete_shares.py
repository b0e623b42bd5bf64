"""Discrete noise shares in the summation protocols (issue #33, item 3: the wiring).

Where silos add only a share of the noise (ULDP-AVG/SGD, IDP-FedAvg ``variant: distributed``),
the default (``privacy.noise_shares: discrete``) is the distributed discrete Gaussian of Kairouz,
Liu & Steinke (ICML 2021): each silo scales its clipped contribution, rounds it to an integer
vector with conditional randomized rounding, adds one exact discrete Gaussian share through the
one noise adder and releases an integer vector in Z_{2^b}
(:mod:`pdpfl.dp.discrete_encoding`). What travels:

* a silo's training reply is one integer vector (``share``: uint32 when b ≤ 32, else uint64;
  d' coordinates, values < 2^b) -- the message gate refuses floats, a wrong size or a value
  ≥ 2^b (:data:`pdpfl.fl.messages.TRAIN_REPLY`, sized by :class:`ShareEncoding`);
* plain summation adds the integer vectors modulo 2^b (:func:`ring_sum`);
* secure summation masks them **modulo 2^b** (masks reduced mod 2^b, so each masked upload is
  uniform on Z_{2^b} and the server learns the sum modulo 2^b only -- never how many silos'
  coordinates wrapped, which the integer sum of the residues would tell) and appends
  :func:`check_words` zero coordinates: after unmasking they must be 0 modulo 2^b, else the masks
  did not cancel (the analogue of the continuous ring's guard bits; a wrong unmask passes with
  probability ≤ 2^-64);
* the server decodes the sum with :func:`pdpfl.dp.discrete_encoding.decode_sum` (centred lift,
  ÷γ, inverse rotation) -- post-processing of the exact integer sum.

The rotation seed of a round is public (:func:`rotation_seed`: the round index): the rotation
only spreads a vector over the coordinates against modular wrapping (utility, not privacy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdpfl.dp.discrete_params import DiscreteShareParams
from pdpfl.fl.api import Aggregate, Params

__all__ = [
    "CHECK_BITS",
    "ShareEncoding",
    "check_words",
    "encoding_of",
    "ring_sum",
    "rotation_seed",
]

#: A failed unmask passes the zero check with probability at most 2^-CHECK_BITS.
CHECK_BITS = 64


def rotation_seed(round_index: int) -> int:
    """The public rotation seed of round ``round_index`` (independent of any data)."""
    return int(round_index)


def check_words(bits: int) -> int:
    """Zero coordinates a masked discrete upload carries: ⌈64/b⌉ (module docstring)."""
    return -(-CHECK_BITS // int(bits))


@dataclass(frozen=True)
class ShareEncoding:
    """How one algorithm's silos encode their contribution as a discrete share.

    ``params`` is the integer encoding (its ``dimension`` = the model's coordinates + one per
    entry of ``metrics``); ``metrics`` are Contribution metrics carried as trailing coordinates
    (IDP-FedAvg's ``clip_count``), each decoded as coordinate / factor (``metric_factors``).
    Everything here is a function of public values (the configuration, the model's size).
    """

    params: DiscreteShareParams
    model_size: int
    metrics: tuple[str, ...] = ()
    metric_factors: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.params.dimension != self.model_size + len(self.metrics):
            raise ValueError(
                f"encoding: dimension {self.params.dimension} != {self.model_size} model "
                f"coordinates + {len(self.metrics)} metrics"
            )
        factors = tuple(float(f) for f in self.metric_factors) or (1.0,) * len(self.metrics)
        if len(factors) != len(self.metrics) or not all(
            math.isfinite(f) and f > 0 for f in factors
        ):
            raise ValueError("metric_factors: one finite factor > 0 per metric")
        object.__setattr__(self, "metric_factors", factors)

    @property
    def bits(self) -> int:
        return self.params.bits

    @property
    def length(self) -> int:
        """d': the coordinates of one share."""
        return self.params.padded_dimension

    @property
    def dtype(self) -> np.dtype[Any]:
        """The container: uint32 when b ≤ 32, else uint64."""
        return np.dtype(self.params.container)

    @property
    def upload_length(self) -> int:
        """d' + :func:`check_words`: the coordinates of a masked upload."""
        return self.length + check_words(self.bits)

    def mask(self) -> np.uint64:
        return np.uint64((1 << self.bits) - 1)

    def reduce(self, values: np.ndarray) -> np.ndarray:
        """uint64 values modulo 2^b, in the container dtype."""
        return (np.asarray(values, dtype=np.uint64) & self.mask()).astype(self.dtype)

    def check_share(self, share: object, what: str) -> np.ndarray:
        """The share as uint64 if it is the container dtype, d' coordinates, values < 2^b."""
        arr = np.asarray(share)
        if arr.dtype != self.dtype or arr.shape != (self.length,):
            raise ValueError(
                f"{what}: expected a {self.dtype.name} share of {self.length} coordinates, got "
                f"{arr.dtype.name} {arr.shape}"
            )
        wide = arr.astype(np.uint64)
        if wide.size and int(wide.max()) >> self.bits:
            raise ValueError(f"{what}: a share coordinate is not below 2^{self.bits}")
        return wide

    def decode(
        self,
        total: np.ndarray,
        params: Params,
        round_index: int,
        *,
        weight: float,
        count: int,
    ) -> Aggregate:
        """The :class:`Aggregate` of a ring sum (d' coordinates modulo 2^b): decoded, split into
        the model's shapes (float32) and the metrics."""
        from pdpfl.dp.discrete_encoding import decode_sum

        ring = self.reduce(np.asarray(total, dtype=np.uint64)[: self.length])
        values = decode_sum(ring, self.params, rotation_seed(round_index))
        out, start = [], 0
        for p in params:
            arr = np.asarray(p)
            out.append(values[start : start + arr.size].reshape(arr.shape).astype(np.float32))
            start += arr.size
        if start != self.model_size:
            raise ValueError(
                f"encoding: the model has {start} coordinates, the encoding {self.model_size}"
            )
        metrics = {
            name: float(values[start + i]) / self.metric_factors[i]
            for i, name in enumerate(self.metrics)
        }
        return Aggregate(total=out, weight=float(weight), metrics=metrics, count=int(count))

    def summary(self) -> dict[str, Any]:
        """``summary.json``'s description of the shares (the encoding's, plus what travels)."""
        out = dict(self.params.summary())
        out["bits_per_coordinate"] = 8 * self.dtype.itemsize
        out["masked_upload_coordinates"] = self.upload_length
        out["rotation_seed"] = "the round index (public)"
        if self.metrics:
            out["metric_coordinates"] = dict(zip(self.metrics, self.metric_factors, strict=True))
        return out


def encoding_of(party: object) -> ShareEncoding | None:
    """The :class:`ShareEncoding` a silo or server algorithm declares (``share_encoding``)."""
    enc = getattr(party, "share_encoding", None)
    return enc if isinstance(enc, ShareEncoding) else None


def ring_sum(shares: list[np.ndarray], encoding: ShareEncoding) -> np.ndarray:
    """Σ shares modulo 2^b (uint64; each share checked first)."""
    total = np.zeros(encoding.length, dtype=np.uint64)
    for k, s in enumerate(shares):
        total += encoding.check_share(s, f"share {k}")  # wraps modulo 2^64; 2^b divides it
    return total & encoding.mask()
