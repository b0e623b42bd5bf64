"""Integer encoding of distributed discrete noise: rotate → scale → round → + share → mod 2^b.

The silo side of the distributed discrete Gaussian (Kairouz, Liu & Steinke, ICML 2021, Alg. 1
and 2; parameters from :mod:`pdpfl.dp.discrete_params`):

1. **rotation** (optional): x ↦ H·D_ξ·x/√d' on x zero-padded to d' = 2^k coordinates, H the
   Walsh–Hadamard matrix and ξ ∈ {±1}^{d'} public random signs from the round's rotation seed
   (SHAKE-256 of the seed: the same bits on every machine). Orthonormal, so L2-preserving; it
   spreads a vector's mass evenly over the coordinates, which makes modular wrapping unlikely;
2. **scale** by γ = 2^k (exact in float64), after clipping the float vector to norm C again
   (a no-op for the clipped vectors callers pass; the exact check below is what guarantees);
3. **conditional randomized rounding**: each coordinate rounded up with probability equal to its
   fractional part (to 2^-32: 32-bit lanes of the silo's random words; a row with no
   fractional part draws nothing: every draw would give ⌊v⌋), redrawn while
   ‖x̃‖₂² > N_p; the check is exact in integers (:func:`norm_sq_at_most`). After
   :data:`MAX_ROUNDING_TRIES` draws (each fails with probability ≤ β for a clipped input) the
   vector is rounded toward zero and, if the input was not clipped, shrunk by integer steps
   x̃ ← x̃ − ⌊x̃/4⌋ (toward zero) until it passes: **every** released integer vector satisfies
   ‖x̃‖₂² ≤ N_p, whatever the input (adversarial, unclipped, NaN refused);
4. **+ one exact discrete Gaussian share** N_Z(0, σ_s²)^{d'} (:mod:`pdpfl.discrete_noise`, from
   the silo's stream, integer arithmetic only);
5. **mod 2^b** (two's complement bits: uint32 containers when b ≤ 32, else uint64).

Secure summation adds the survivors' vectors in Z_{2^32} or Z_{2^64} (2^b divides both);
:func:`decode_sum` reduces modulo 2^b, lifts to the centred residue in [−2^{b−1}, 2^{b−1}),
divides by γ and undoes the rotation. Under exactly t survivors the released integer sum is
Σ_i x̃_i + Z, Z a sum of t i.i.d. N_Z(0, σ_s²) per coordinate: the accounted law (tested against
the exact convolution pmf). Wrapping, when it happens, is a deterministic function of that
exact sum: post-processing (utility, not privacy).

ULDP-FL (a user's records in several silos): :func:`round_units` rounds each unit's weighted
vector separately at its own bound N_p (:meth:`~pdpfl.dp.discrete_params.DiscreteShareParams.
part_bound_sq`) and sums the integer vectors; the user's total over silos then stays within the
accounted N (derivation in :mod:`pdpfl.dp.discrete_params`).

Intended call sites (wiring phase of issue #33): ULDP-AVG/SGD's ``privatize`` step and
IDP-FedAvg ``distributed``'s ``release_update`` call :func:`encode_share` (or
:func:`round_units` + :func:`add_noise_share`) instead of adding float shares; the secure
summation's fixed-point ring (:class:`pdpfl.crypto.fixedpoint.FixedPointRing`) is bypassed for
these vectors (already integers in Z_{2^b}) and the server calls :func:`decode_sum`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from pdpfl.dp.discrete_params import DiscreteShareParams
from pdpfl.dp.noise import add_noise
from pdpfl.randomness import RandomStream

__all__ = [
    "MAX_ROUNDING_TRIES",
    "add_noise_share",
    "decode_sum",
    "encode_share",
    "hadamard_rotate",
    "hadamard_unrotate",
    "norm_sq_at_most",
    "conditional_round",
    "conditional_round_rows",
    "round_units",
    "scale_and_round",
]

#: Redraws of the randomized rounding before the deterministic fallback (module docstring).
MAX_ROUNDING_TRIES = 64
_TWO_53 = float(2**53)


# ----------------------------------------------------------------------------- rotation


def _signs(seed: int, dim: int) -> NDArray[np.float64]:
    """ξ ∈ {±1}^dim from SHAKE-256(``pdpfl-rotation-v1`` ‖ seed): platform independent."""
    digest = hashlib.shake_256(b"pdpfl-rotation-v1" + int(seed).to_bytes(16, "little", signed=True))
    bits = np.unpackbits(np.frombuffer(digest.digest((dim + 7) // 8), dtype=np.uint8))[:dim]
    return 1.0 - 2.0 * bits.astype(np.float64)


def _fwht(x: np.ndarray) -> NDArray[np.float64]:
    """Unnormalised Walsh–Hadamard transform along the last axis (length a power of two):
    butterflies (a + b, a − b) written into a second buffer, the two buffers swapped per level."""
    y = np.array(x, dtype=np.float64, copy=True)
    z = np.empty_like(y)
    n = y.shape[-1]
    lead = y.shape[:-1]
    h = 1
    while h < n:
        v = y.reshape(*lead, n // (2 * h), 2, h)
        o = z.reshape(*lead, n // (2 * h), 2, h)
        np.add(v[..., 0, :], v[..., 1, :], out=o[..., 0, :])
        np.subtract(v[..., 0, :], v[..., 1, :], out=o[..., 1, :])
        y, z = z, y
        h *= 2
    return y


def hadamard_rotate(x: np.ndarray, seed: int, dim: int) -> NDArray[np.float64]:
    """H·D_ξ·x/√dim for x (…, d) zero-padded to ``dim`` = 2^k ≥ d (float64, L2-preserving)."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    if dim & (dim - 1) or dim < d:
        raise ValueError(f"dim: must be a power of two >= {d}, got {dim}")
    padded = np.zeros((*x.shape[:-1], dim), dtype=np.float64)
    padded[..., :d] = x
    padded *= _signs(seed, dim)
    return _fwht(padded) / math.sqrt(dim)


def hadamard_unrotate(y: np.ndarray, seed: int, d: int) -> NDArray[np.float64]:
    """The inverse of :func:`hadamard_rotate`: D_ξ·H·y/√d', first ``d`` coordinates."""
    y = np.asarray(y, dtype=np.float64)
    dim = y.shape[-1]
    x = _fwht(y) / math.sqrt(dim)
    x *= _signs(seed, dim)
    return x[..., :d]


# ----------------------------------------------------------------------------- rounding


def norm_sq_at_most(x: np.ndarray, bound: int) -> bool:
    """‖x‖₂² ≤ bound, exactly, for an int64 vector and 0 ≤ bound < 2^62.

    Any |x_j| > ⌊√bound⌋ fails at once; otherwise every square is ≤ bound < 2^62 and the sum is
    formed as a tree of pairwise uint64 additions, each level checked against ``bound`` (a
    partial sum of non-negative terms above it already fails), so nothing can overflow.
    """
    bound = int(bound)
    if not 0 <= bound < (1 << 62):
        raise ValueError(f"bound: must be in [0, 2^62), got {bound}")
    x = np.asarray(x)
    if x.dtype != np.int64:
        raise ValueError(f"x: expected an int64 vector, got {x.dtype}")
    if x.size == 0:
        return True
    root = math.isqrt(bound)
    mag = np.abs(x)  # |−2^63| wraps negative: caught by the sign check
    if np.any(mag < 0) or np.any(mag > root):
        return False
    level = (mag.astype(np.uint64)) ** 2
    lim = np.uint64(bound)
    while level.size > 1:
        if level.size % 2:
            level = np.append(level, np.uint64(0))
        level = level[0::2] + level[1::2]
        if np.any(level > lim):
            return False
    return bool(level[0] <= lim)


def _rows_at_most(x: np.ndarray, bounds: np.ndarray) -> NDArray[np.bool_]:
    """Row-wise ‖x_i‖₂² ≤ bounds_i, exactly, for a float64 batch of integers (|x| < 2^53): a
    float64 sum of squares decides when it is clear of the bound by more than its worst-case
    rounding error (4·(d + 1)·2^-53 relative: d squares and d − 1 additions of non-negative
    terms, any summation order), :func:`norm_sq_at_most` on the int64 row when it is not."""
    total: NDArray[np.float64] = np.einsum("ij,ij->i", x, x)
    lim = bounds.astype(np.float64)
    slack = 4.0 * (x.shape[1] + 1) * 2.0**-53
    out: NDArray[np.bool_] = total <= lim * (1.0 - slack)
    unclear = np.flatnonzero(~out & (total <= lim * (1.0 + slack)))
    for i in unclear.tolist():
        out[i] = norm_sq_at_most(x[i].astype(np.int64), int(bounds[i]))
    return out


def conditional_round(v: np.ndarray, bound_sq: int, stream: RandomStream) -> NDArray[np.int64]:
    """An int64 vector x̃ with ‖x̃‖₂² ≤ ``bound_sq`` from the scaled float vector v (module
    docstring, step 3): randomized rounding redrawn up to :data:`MAX_ROUNDING_TRIES` times,
    then the deterministic fallback."""
    v = np.asarray(v, dtype=np.float64)
    row: NDArray[np.int64] = conditional_round_rows(v.reshape(1, -1), [bound_sq], stream)[0]
    return row


#: Coordinates rounded per batch of rows (memory: three int64 arrays of this size).
_ROUND_CHUNK = 1 << 22


def conditional_round_rows(
    rows: np.ndarray, bounds: Sequence[int], stream: RandomStream
) -> NDArray[np.int64]:
    """:func:`conditional_round` for each row of a (k, d') float batch, row i at ``bounds[i]``
    (one vectorized draw per attempt for all rows still failing) → int64 (k, d')."""
    v = np.asarray(rows, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"rows: expected a 2-d batch, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError("vector: contains NaN or infinity")
    if v.size and float(np.max(np.abs(v))) >= 2.0**52:
        raise ValueError("vector: a scaled coordinate is beyond 2^52 (the input is not clipped)")
    lims = np.array([int(b) for b in bounds], dtype=np.int64)
    if lims.shape != (v.shape[0],) or np.any(lims < 0) or np.any(lims >= 2**62):
        raise ValueError(f"bounds: expected {v.shape[0]} integers in [0, 2^62)")
    out = np.empty(v.shape, dtype=np.int64)
    per = max(1, _ROUND_CHUNK // max(1, v.shape[1]))
    for s in range(0, v.shape[0], per):
        out[s : s + per] = _round_chunk(v[s : s + per], lims[s : s + per], stream)
    return out


def _round_chunk(v: np.ndarray, lims: np.ndarray, stream: RandomStream) -> np.ndarray:
    low = np.floor(v)
    # P(round up) = ⌊frac·2^32⌋/2^32: a uint32 lane of the silo's words below the threshold
    # (v − low can round to 1.0 for tiny negative v: the threshold is capped at 2^32 − 1)
    thr = np.minimum((v - low) * 4294967296.0, 4294967295.0).astype(np.uint32)
    out = np.empty(v.shape, dtype=np.int64)
    todo = np.arange(v.shape[0])
    d = v.shape[1]
    exact = ~np.any(thr, axis=1)
    if exact.any():  # no coordinate can round up (e.g. a silo's zeros): every draw gives ⌊v⌋
        idx = np.flatnonzero(exact)
        ok = _rows_at_most(low[idx], lims[idx])
        out[idx[ok]] = low[idx[ok]].astype(np.int64)
        exact[idx[~ok]] = False
        todo = np.flatnonzero(~exact)
    for _ in range(MAX_ROUNDING_TRIES):
        if not todo.size:
            return out
        lanes = stream.words((todo.size * d + 1) // 2).view(np.uint32)[: todo.size * d]
        x = low[todo] + (lanes.reshape(todo.size, d) < thr[todo])  # integers in float64
        ok = _rows_at_most(x, lims[todo])
        out[todo[ok]] = x[ok].astype(np.int64)
        todo = todo[~ok]
    for i in todo.tolist():  # the deterministic fallback (module docstring)
        x = np.trunc(v[i]).astype(np.int64)  # |x_j| ≤ |v_j|: ‖x‖ ≤ ‖v‖
        while not norm_sq_at_most(x, int(lims[i])):
            x = x - np.sign(x) * (np.abs(x) // 4) - np.sign(x) * (np.abs(x) % 4 > 0)
        out[i] = x
    return out


def _prepare(
    rows: np.ndarray, params: DiscreteShareParams, rotation_seed: int | None
) -> np.ndarray:
    """Steps 1-2 for a (k, d) batch: refuse NaN/inf, clip each row to C again (defensive: callers
    pass clipped rows; the exact integer check is what guarantees), rotate (one batched
    transform), scale by γ → float64 (k, d')."""
    if rows.ndim != 2 or rows.shape[1] != params.dimension:
        raise ValueError(
            f"vector: expected {params.dimension} coordinates per vector, got shape {rows.shape}"
        )
    if not np.all(np.isfinite(rows)):
        raise ValueError("vector: contains NaN or infinity")
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    factor = np.ones_like(norms)
    np.divide(params.clip, norms, out=factor, where=norms > params.clip)
    rows = rows * factor
    if params.rotation:
        if rotation_seed is None:
            raise ValueError("rotation_seed: required when the rotation is on")
        if np.any(rows):
            rows = hadamard_rotate(rows, rotation_seed, params.padded_dimension)
        else:  # H·D_ξ·0 = 0 (a silo that was not sampled sends zeros and its share)
            rows = np.zeros((rows.shape[0], params.padded_dimension), dtype=np.float64)
    return rows * params.scale


def scale_and_round(
    vector: np.ndarray,
    params: DiscreteShareParams,
    stream: RandomStream,
    rotation_seed: int | None,
    *,
    bound_sq: int | None = None,
) -> np.ndarray:
    """Steps 1-3 for one vector of ``params.dimension`` coordinates → int64 (d',) with
    ‖x̃‖₂² ≤ ``bound_sq`` (default N)."""
    rows = np.asarray(vector, dtype=np.float64).reshape(1, -1)
    bound = params.l2_sensitivity_sq if bound_sq is None else int(bound_sq)
    seeded = rotation_seed is not None or not params.rotation
    if rows.shape[1] == params.dimension and not rows.any() and bound >= 0 and seeded:
        # zeros (a silo that was not sampled): rotation, scale and rounding all give zeros
        return np.zeros(params.padded_dimension, dtype=np.int64)
    return conditional_round(_prepare(rows, params, rotation_seed)[0], bound, stream)


def round_units(
    vectors: np.ndarray,
    weights: np.ndarray,
    params: DiscreteShareParams,
    stream: RandomStream,
    rotation_seed: int | None,
) -> np.ndarray:
    """Σ_u x̃_u for a silo's unit vectors (k, d), each weighted ``w_u·v_u`` (‖v_u‖ ≤ C,
    w_u ∈ [0, 1]) and rounded separately at its part bound N_p(w_u) → int64 (d',).

    The ULDP-FL helper (module docstring): every unit's total over the silos stays within the
    accounted N when its weights sum to at most 1 and ``params.parts`` covers its silos. The
    rotation runs once over the whole batch.
    """
    rows = np.asarray(vectors, dtype=np.float64)
    if rows.ndim != 2:
        raise ValueError(f"vectors: expected shape (k, {params.dimension}), got {rows.shape}")
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.size != rows.shape[0]:
        raise ValueError(f"weights: expected {rows.shape[0]} weights, got {w.size}")
    bounds = [params.part_bound_sq(float(weight)) for weight in w]  # validates the weights
    scaled = _prepare(rows * w[:, None], params, rotation_seed)
    if not scaled.shape[0]:
        return np.zeros(params.padded_dimension, dtype=np.int64)
    rounded = conditional_round_rows(scaled, bounds, stream)
    total: NDArray[np.int64] = rounded.sum(axis=0)  # |Σ| ≤ k·2^31 per coordinate: no overflow
    return total


# ----------------------------------------------------------------------------- noise and ring


def _mask(params: DiscreteShareParams) -> np.uint64:
    return np.uint64(params.modulus - 1)


def add_noise_share(
    rounded: np.ndarray, params: DiscreteShareParams, stream: RandomStream
) -> np.ndarray:
    """Steps 4-5: rounded + N_Z(0, σ_s²)^{d'} modulo 2^b (uint32 if b ≤ 32, else uint64)."""
    x = np.asarray(rounded)
    if x.dtype != np.int64 or x.shape != (params.padded_dimension,):
        raise ValueError(
            f"rounded: expected an int64 vector of {params.padded_dimension} coordinates, "
            f"got {x.dtype} {x.shape}"
        )
    noisy = x.copy()
    add_noise(noisy, params.noise(), stream)  # the one noise adder: N_Z(0, σ_s²) per coordinate
    if params.bits == 32:  # the uint32 cast is the reduction mod 2^32 (two's complement)
        return noisy.view(np.uint64).astype(np.uint32)
    total = noisy.view(np.uint64) & _mask(params)  # two's complement
    return total.astype(np.uint32) if params.bits <= 32 else total


def encode_share(
    vector: np.ndarray,
    params: DiscreteShareParams,
    stream: RandomStream,
    rotation_seed: int | None,
) -> np.ndarray:
    """One silo's share: rotate → scale → conditional rounding → + discrete Gaussian share →
    mod 2^b (the module docstring's steps 1-5)."""
    return add_noise_share(scale_and_round(vector, params, stream, rotation_seed), params, stream)


def decode_sum(
    total: np.ndarray, params: DiscreteShareParams, rotation_seed: int | None
) -> np.ndarray:
    """The float64 sum (d,) from the ring sum of the survivors' shares: mod 2^b, centred lift
    to [−2^{b−1}, 2^{b−1}), ÷γ, inverse rotation."""
    t = np.asarray(total)
    if t.dtype not in (np.uint32, np.uint64) or t.shape != (params.padded_dimension,):
        raise ValueError(
            f"total: expected a uint32/uint64 vector of {params.padded_dimension} coordinates, "
            f"got {t.dtype} {t.shape}"
        )
    r = t.astype(np.uint64) & _mask(params)
    half = np.uint64(1 << (params.bits - 1))
    signed = r.astype(np.int64) - np.where(r >= half, np.int64(params.modulus), np.int64(0))
    values = signed.astype(np.float64) / params.scale
    if params.rotation:
        if rotation_seed is None:
            raise ValueError("rotation_seed: required when the rotation is on")
        return hadamard_unrotate(values, rotation_seed, params.dimension)
    return values
