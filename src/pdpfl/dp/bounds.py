"""Rigorous floating-point error bounds for per-sample gradient norms.

Model of arithmetic (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §2.2):
IEEE binary32/binary64, round to nearest, ``fl(x op y) = (x op y)(1 + δ) + η`` with
``|δ| ≤ u`` (u = 2⁻²⁴ resp. 2⁻⁵³) and an absolute underflow term ``|η|`` of at most half the
smallest subnormal (multiplication only; additions that underflow are exact). A dot product or
a sum of ``n`` terms computed in *any* order, with or without fused multiply-add, has absolute
error at most ``γ_n · Σ|x_k y_k|`` with ``γ_n = n·u / (1 − n·u)`` (Higham, Eq. 3.5 and §4.2):
the bounds below hold whatever blocking, threading or summation tree BLAS and torch's
reductions use -- provided they compute in IEEE float32 (no TF32/bfloat16 shortcuts:
:func:`float32_is_ieee` checks the global switches that would allow them).

:func:`norm_bounds` turns one ``torch.linalg.vector_norm`` per row into an estimate and a
*guaranteed upper bound* on the exact L2 norm of each row as stored. Long rows are reduced in two
levels (blocks of :data:`NORM_BLOCK` elements in the tensor's dtype, then a float64 sum over the
blocks), so the relative error of a float32 norm is ~γ₁₃₂ ≈ 8e-6 instead of γ_n.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

__all__ = [
    "NORM_BLOCK",
    "block_norm_bounds",
    "SMALL",
    "U32",
    "U64",
    "float32_is_ieee",
    "gamma",
    "norm_bounds",
    "unit_roundoff",
]

#: float32 unit roundoff.
U32 = 2.0**-24
#: float64 unit roundoff.
U64 = 2.0**-53
#: Elements per first-level block of :func:`norm_bounds`.
NORM_BLOCK = 128
#: Tensors of at most this many elements are handled in float64 outright (cheaper than the
#: two-level float32 reduction's extra operations).
SMALL = 2**15
_F64 = torch.float64


def unit_roundoff(dtype: torch.dtype) -> float:
    """``u`` of a floating dtype (float16/bfloat16 included)."""
    return float(torch.finfo(dtype).eps) / 2.0


def _tiny(dtype: torch.dtype) -> float:
    """The smallest positive subnormal of ``dtype`` (bounds the underflow of one product)."""
    fi = torch.finfo(dtype)
    return float(fi.smallest_normal) * float(fi.eps)


def gamma(n: int, u: float) -> float:
    """``γ_n = n·u / (1 − n·u)``, rounded up by a few float64 ulps; requires ``n·u < 1/2``."""
    nu = float(n) * u
    if not nu < 0.5:
        raise ValueError(f"gamma: n·u = {nu} is too large for a meaningful error bound")
    return nu / (1.0 - nu) * (1.0 + 8 * U64)


def norm_bounds(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row L2 norms of ``x`` (rows = first axis): ``(estimate, upper)``, both float64 ``(B,)``.

    ``upper`` is at least the exact norm of each stored row; ``estimate`` is the computed norm
    (``upper`` exceeds it by a relative ~1e-5 in float32, ~1e-14 in float64). A row holding a
    non-finite value, or whose squares overflow in ``x``'s dtype, gives a non-finite bound.

    Derivation: a block of ``k`` elements has computed norm ``ν = √(s(1+θ))(1+δ)`` with
    ``|θ| ≤ γ_{k+2}`` (an optional rescaling, the squares and their sum), ``|δ| ≤ 2u`` (square
    root, undoing the rescaling), plus at most ``k·tiny/2`` of underflow in ``s``; so
    ``√s ≤ ν(1 + γ_{k+4}) + √(k·tiny)``. Two more ``u`` cover evaluating that expression in
    float64 (``k + 6``); the float64 second level adds ``γ₆₄`` terms (``m + 6``).
    """
    b = x.shape[0]
    flat = x.reshape(b, -1)
    n = flat.shape[1]
    if n == 0:
        zero = torch.zeros(b, dtype=_F64, device=x.device)
        return zero, zero
    if x.dtype == _F64 or b * n <= SMALL:  # float64 of exactly converted values: one op
        nu = torch.linalg.vector_norm(flat, dim=1, dtype=_F64)
        return nu, nu * (1.0 + gamma(n + 6, U64)) + math.sqrt(n * _tiny(_F64))
    u = unit_roundoff(x.dtype)
    tiny = _tiny(x.dtype)
    if n <= NORM_BLOCK:
        k = n
        nu = torch.linalg.vector_norm(flat, dim=1).to(_F64)
        est = nu
        up = nu * (1.0 + gamma(k + 6, u)) + math.sqrt(k * tiny)
    else:
        k = NORM_BLOCK
        m, rest = divmod(n, k)
        blocks = torch.linalg.vector_norm(flat[:, : m * k].reshape(b, m, k), dim=2)
        if rest:
            tail = torch.linalg.vector_norm(flat[:, m * k :], dim=1)
            blocks = torch.cat([blocks, tail[:, None]], 1)
        return block_norm_bounds(blocks, k, x.dtype)
    return est, up


def block_norm_bounds(partial: Tensor, k: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(estimate, upper)`` per row from per-block norms ``partial`` ``(B, m)``, each computed by
    ``vector_norm`` in ``dtype`` over at most ``k`` elements (see :func:`norm_bounds`).

    The blocks are combined in float64: squares, a sum of ``m`` terms and a square root.
    """
    scale, shift = _block_constants(k, dtype)
    p = partial.to(_F64)
    est = torch.linalg.vector_norm(p, dim=1)
    # a float64 norm of m terms is within the same γ_{m+6} as squares, sum and square root
    up = torch.linalg.vector_norm(p.mul(scale).add_(shift), dim=1)
    return est, up.mul_(1.0 + gamma(p.shape[1] + 6, U64))


@functools.lru_cache(maxsize=256)
def _block_constants(k: int, dtype: torch.dtype) -> tuple[float, float]:
    """``(1 + γ_{k+6}, √(k·tiny))`` of :func:`block_norm_bounds` for blocks of ``k``."""
    return 1.0 + gamma(k + 6, unit_roundoff(dtype)), math.sqrt(k * _tiny(dtype))


def _flag(module: object, name: str) -> str | None:
    value = getattr(module, name, None)
    return value if isinstance(value, str) else None


def float32_is_ieee(device: torch.device | str) -> bool:
    """Whether float32 matrix products on ``device`` are IEEE float32 (no TF32 / bfloat16).

    ``torch.set_float32_matmul_precision("high"/"medium")``, ``allow_tf32`` and the
    ``fp32_precision`` switches let BLAS trade accuracy for speed; the float32 error bounds of
    :mod:`pdpfl.dp.grad_sample` assume they are off, and the engine falls back to float64 when
    one is on.
    """
    device = torch.device(device)
    if torch.get_float32_matmul_precision() != "highest":
        return False
    backends = torch.backends
    generic = _flag(backends, "fp32_precision")
    if generic not in (None, "none", "ieee"):
        return False
    if device.type == "cpu":
        mkldnn = getattr(backends, "mkldnn", None)
        for sub in (mkldnn, getattr(mkldnn, "matmul", None)):
            if _flag(sub, "fp32_precision") not in (None, "none", "ieee"):
                return False
        return True
    if device.type == "cuda":
        matmul = backends.cuda.matmul
        if bool(getattr(matmul, "allow_tf32", False)):
            return False
        return _flag(matmul, "fp32_precision") in (None, "none", "ieee")
    return False  # other accelerators: no guarantee known; use float64 (or the CPU) instead
