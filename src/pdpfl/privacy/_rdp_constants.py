"""Float constants and helpers shared by :mod:`pdpfl.privacy.rdp` and its batched kernels
(:mod:`pdpfl.privacy._rdp_pairs`): unit round-off, the assumed accuracy of elementary
functions, and the CVZ acceleration of the alternating MTZ series (Cohen, Rodriguez Villegas,
Zagier 2000).
"""

from __future__ import annotations

import math

import numpy as np

#: Terms of the accelerated alternating tail: error ≤ 2·(3+√8)^−16 ≈ 1.1e-12 of its lead term
#: (added to the margin).
_CVZ_TERMS = 16
#: Bound used for that remainder (relative to the lead term of the tail), with room to spare.
_CVZ_REMAINDER = 4.0 * (3.0 + math.sqrt(8.0)) ** (-_CVZ_TERMS)
#: Work-array budget (elements) for the vectorized sums.
_CHUNK_ELEMENTS = 1 << 21
#: Unit round-off of float64 (round to nearest: 2^-53; we use 2^-52 for margin).
_U = 2.0**-52
#: Assumed relative accuracy of each elementary / special function value (16 ulp).
FUNCTION_ACCURACY = 16.0 * _U


def _log_expm1(x: np.ndarray) -> np.ndarray:
    """log(exp(x) − 1) for x > 0, without overflow."""
    x = np.asarray(x, dtype=np.float64)
    small = x <= 30.0
    out = np.empty_like(x)
    out[small] = np.log(np.expm1(x[small]))
    out[~small] = x[~small] + np.log1p(-np.exp(-x[~small]))
    return out


def _cvz_weights(n: int) -> np.ndarray:
    """Weights w with Σ_k (−1)^k a_k ≈ Σ_k w_k a_k (Cohen, Rodriguez Villegas, Zagier 2000, Alg. 1).

    For a Hausdorff moment sequence a_k = ∫_0^1 x^k dμ the error is at most 2·S/(3+√8)^n ≤
    2·a_0/(3+√8)^n (their Proposition 1).
    """
    d = (3.0 + math.sqrt(8.0)) ** n
    d = (d + 1.0 / d) / 2.0
    b, c = -1.0, -d
    w = np.empty(n)
    for k in range(n):
        c = b - c
        w[k] = c / d
        b = (k + n) * (k - n) * b / ((k + 0.5) * (k + 1.0))
    return w


_W = _cvz_weights(_CVZ_TERMS)
