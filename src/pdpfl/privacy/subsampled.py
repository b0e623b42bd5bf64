"""Poisson sub-sampling of any mechanism given by its RDP curve: a rigorous bound, both ways.

pdpfl's subsampled-Gaussian RDP (:mod:`pdpfl.privacy.rdp`) is exact for Gaussians only. For any
other base mechanism M (the distributed discrete Gaussian, :mod:`pdpfl.privacy.discrete`) known
only through an RDP curve ε(ℓ) that holds for add/remove neighbours in **both** directions, this
module bounds the RDP of M ∘ PoissonSample(γ) at every order. Following Zhu & Wang, "Poisson
Subsampled Rényi Differential Privacy" (ICML 2019), write the neighbours' output laws as q
(without the unit) and p = (1 − γ)q + γμ (with it), y = μ/q, so E_q[y] = 1, and, by joint
convexity of (μ, q) ↦ ∫μ^ℓ q^{1−ℓ} over the sub-samples of the other units,

    E_q[y^ℓ] ≤ e^{(ℓ−1)ε(ℓ)}   and   E_q[y^{1−ℓ}] = E_μ[(q/μ)^ℓ] ≤ e^{(ℓ−1)ε(ℓ)}    (ℓ ≥ 2).

Both directions are bounded separately, at integer α ≥ 2 (``g = (α − 1)·RDP``):

Direction p ‖ q (the unit added). Binomial expansion of E_q[((1 − γ) + γy)^α] (all terms ≥ 0)
and Σ_ℓ C(α,ℓ)γ^ℓ(1−γ)^{α−ℓ} = 1 give

    A1 = 1 + Σ_{ℓ=2}^{α} C(α,ℓ) γ^ℓ (1−γ)^{α−ℓ} (e^{(ℓ−1)ε(ℓ)} − 1)

-- the expression of Zhu & Wang's Theorem 6 (their bound under a "tightness" condition; for
this direction it needs no condition), equal to the exact RDP of the sub-sampled Gaussian
(Mironov, Talwar & Zhang 2019, §3.2) when ε is the Gaussian's. Also A2 = 1 + γ(e^{(α−1)ε(α)} − 1)
(joint convexity of the mixture).

Direction q ‖ p (the unit removed). E_p[(q/p)^α] = E_q[(1 + u)^{−(α−1)}] with u = γ(y − 1) ≥ −γ.
Taylor's theorem with the Lagrange remainder, f(r) = r^{−β}, β = α − 1: the third-order
remainder is ≤ 0 for u ≥ 0 and at most C(α+1,3)(1−γ)^{−α−2}|u|³ for u ∈ [−γ, 0), where
|u|³ = γ³(1 − y)³ ≤ γ³(1 − y)²; with E_q[u] = 0 and E_q[(1 − y)²] = E_q[y²] − 1 ≤ e^{ε(2)} − 1:

    B1 = 1 + (e^{ε(2)} − 1)·(C(α,2)γ² + C(α+1,3)γ³(1−γ)^{−α−2}),

and, stopping at the second-order remainder (at most C(α,2)(1−γ)^{−α−1}u² for u < 0 and
C(α,2)u² for u ≥ 0), B1' = 1 + (e^{ε(2)} − 1)·C(α,2)γ²(1−γ)^{−α−1} (smaller at large γ).

Also B2 = 1 + γ(e^{(α−1)ε(α)} − 1) (convexity of r ↦ r^{−β} between 1 and y, then the
negative moment above) and B3 = (1 − γ)^{−(α−1)} (q/p ≤ 1/(1 − γ) pointwise).

Symmetric mechanisms: the second direction is never the larger (``symmetric=True``).
*Lemma.* Let (μ₀, μ₁) be mutually absolutely continuous with an involution τ such that
τ#μ₀ = μ₁ (so τ#μ₁ = μ₀). Then for every α ≥ 1 and γ ∈ [0, 1], with p = (1 − γ)μ₀ + γμ₁,
D_α(μ₀ ‖ p) ≤ D_α(p ‖ μ₀).
*Proof.* Let x = log(μ₁/μ₀) and ν its law under μ₀. Since x∘τ = −x, E_ν[f(−x)] =
E_ν[e^x f(x)], so ρ = e^{x/2}ν is a symmetric measure. With h(x) = 1 − γ + γe^x,
e^{(α−1)D_α(p‖μ₀)} = ∫h^α dν and e^{(α−1)D_α(μ₀‖p)} = ∫h^{1−α} dν; symmetrising over ρ it
suffices that, for every x, h(x)^α e^{−x/2} + h(−x)^α e^{x/2} ≥ h(x)^{1−α}e^{−x/2} +
h(−x)^{1−α}e^{x/2}. With v = e^x ≥ 1 (the case x ≤ 0 is the same by symmetry), f = h(x) ≥ 1 and
φ = h(−x) ≤ 1 satisfy v(1 − φ) = f − 1, and the inequality becomes ψ(f) ≥ ψ(φ) for
ψ(e^s) = sinh((α − ½)s)/sinh(s/2), which is even in s and increasing in |s| (α ≥ 1); and
log f ≥ −log φ because fφ = (1−γ)² + γ(1−γ)(v + 1/v) + γ² ≥ 1. ∎
The distributed discrete Gaussian is such a pair for every fixed shift k and every fixed sum S of
the other units (τ(z) = 2S + k − z; Z is symmetric), and joint convexity carries both
directions over the mixtures: its sub-sampled RDP is bounded by min(A1, A2) alone -- for a
Gaussian base exactly the exact sub-sampled Gaussian at integer orders (Mironov, Talwar & Zhang
2019 prove this domination for the Gaussian; the lemma needs only the symmetry).

Zhu & Wang's general Theorem 5 adds a factor 3 to every ℓ ≥ 3 term of A1 to cover the second
direction for any mechanism; here B1, B1', B2, B3 do that job (``symmetric=False``), and the
bound is

    g(α) = max(log min(A1, A2), log min(B1, B1', B2, B3)),    RDP(α) = g(α)/(α − 1).

Fractional α: (α − 1)·D_α is convex in α for every pair of laws, so g(α) is at most the chord
of the integer bounds at ⌊α⌋ and ⌈α⌉ (g(1) = 0). For α ∈ (1, 2) the addition direction also
has the Taylor bound of :mod:`pdpfl.privacy.rdp` (bound 3 with ⌈α⌉ = 2):
(1 + u)^α ≤ 1 + αu + C(α,2)(1 − γ)^{α−2}u² for u = γ(y − 1) ≥ −γ, so
A(α) ≤ 1 + C(α,2)(1 − γ)^{α−2}γ²(e^{ε(2)} − 1) -- used for symmetric mechanisms, where the
addition direction is the whole bound. Finally RDP is non-decreasing in α, so each
order takes the smallest bound of the orders at or above it, and it never exceeds the base
ε(α) (sub-sampling is a mixture). γ = 1 returns the base curve; γ = 0 returns 0.

Checked in ``tests/test_privacy_discrete.py``: against the exact sub-sampled Gaussian (this
bound is ≥ it; with ``symmetric=True`` equal at integer orders) and against both directions
computed numerically from the exact pmf of a sub-sampled distributed discrete Gaussian.

Float error: every log-term is a sum of at most six float values; 1e-12 times the sum of their
magnitudes (far above the float error of gammaln, log1p and expm1) is added before the
log-sum-exp, and the RDP is rounded up by two ulps (never above the base curve, itself an upper
bound).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from pdpfl.privacy._rdp_constants import _log_expm1
from pdpfl.privacy.orders import check_orders
from pdpfl.privacy.rdp import check_rates

__all__ = ["poisson_subsampled_rdp"]

#: RDP curve of the base mechanism at the given orders (same shape).
RdpCurve = Callable[[np.ndarray], np.ndarray]

_REL_MARGIN = 1e-12
_CHUNK = 1 << 20


def poisson_subsampled_rdp(
    rates: ArrayLike, base: RdpCurve, orders: ArrayLike, *, symmetric: bool = False
) -> np.ndarray:
    """RDP of ``base`` ∘ Poisson sub-sampling at each rate (module docstring).

    Parameters
    ----------
    rates
        γ in [0, 1]: a scalar or one per unit.
    base
        The base mechanism's RDP curve, a function of an array of orders (it must hold for
        add/remove neighbours in both directions).
    orders
        Rényi orders α > 1.
    symmetric
        True only if every neighbouring pair of the base mechanism is symmetric in the sense of
        the module docstring's lemma (additive noise with a symmetric law, shift neighbours:
        the distributed discrete Gaussian); the removal direction is then not bounded
        separately.

    Returns
    -------
    numpy.ndarray
        Shape ``(n_rates, n_orders)``; upper bounds.
    """
    a = check_orders(orders)
    q = check_rates(rates)
    out = np.zeros((q.size, a.size), dtype=np.float64)
    base_at_a = np.asarray(base(a), dtype=np.float64)
    full = q >= 1.0
    out[full] = base_at_a
    inner = (q > 0.0) & (q < 1.0)
    if not inner.any():
        return out
    uq, inv = np.unique(q[inner], return_inverse=True)
    lo = np.floor(a).astype(np.int64)
    hi = np.ceil(a).astype(np.int64)
    needed = np.unique(np.concatenate([hi, lo[lo >= 2]]))
    top = int(needed.max())
    ells = np.arange(2, top + 1, dtype=np.float64)
    eps = np.asarray(base(ells), dtype=np.float64)  # ε(ℓ), ℓ = 2..top
    if np.any(np.isnan(eps)) or np.any(eps < 0):
        raise ValueError("base: the RDP curve must be >= 0 (and not NaN)")
    g_int = _integer_g(uq, eps, needed, bool(symmetric))  # (n_uq, n_needed)
    col = {int(v): i for i, v in enumerate(needed)}
    g = np.empty((uq.size, a.size), dtype=np.float64)
    for j, alpha in enumerate(a):
        h = int(hi[j])
        if lo[j] == hi[j]:
            g[:, j] = g_int[:, col[h]]
            continue
        f = alpha - lo[j]
        g_lo = g_int[:, col[int(lo[j])]] if lo[j] >= 2 else 0.0
        g[:, j] = (1.0 - f) * g_lo + f * g_int[:, col[h]]
    if symmetric:  # α ∈ (1, 2): the second-order Taylor bound on A (module docstring)
        low = np.flatnonzero((a > 1.0) & (a < 2.0))
        if low.size:
            g[:, low] = np.minimum(g[:, low], _taylor_low(uq, a[low], float(eps[0])))
    rho = np.nextafter(np.nextafter(g / (a - 1.0)[None, :], np.inf), np.inf)
    rho = np.minimum(rho, base_at_a[None, :])  # the base curve is itself an upper bound
    # RDP is non-decreasing in α: each order takes the least bound at or above it.
    order = np.argsort(a, kind="stable")
    srt = rho[:, order]
    srt = np.minimum.accumulate(srt[:, ::-1], axis=1)[:, ::-1]
    rho[:, order] = srt
    out[inner] = rho[inv.reshape(-1)]
    return out


def _taylor_low(q: np.ndarray, alpha: np.ndarray, eps2: float) -> np.ndarray:
    """log(1 + C(α,2)(1−γ)^{α−2}γ²(e^{ε(2)} − 1)) for α ∈ (1, 2), shape (q, α)."""
    lq = np.log(q)[:, None]
    l1q = np.log1p(-q)[:, None]
    al = alpha[None, :]
    log_e2 = float(_log_expm1(np.array([eps2]))[0])
    if not np.isfinite(log_e2):
        return (
            np.zeros((q.size, alpha.size)) if log_e2 < 0 else np.full((q.size, alpha.size), np.inf)
        )
    t = np.log(al * (al - 1.0) / 2.0) + (al - 2.0) * l1q + 2.0 * lq + log_e2
    t += _REL_MARGIN * (np.abs(t) + np.abs(l1q) + np.abs(lq) + 4.0)
    result: np.ndarray = np.logaddexp(0.0, t) * (1.0 + 8.0 * 2.0**-52)
    return result


def _integer_g(q: np.ndarray, eps: np.ndarray, alphas: np.ndarray, symmetric: bool) -> np.ndarray:
    """g(α) = (α − 1)·RDP bound at integer orders ``alphas`` ≥ 2, for rates q in (0, 1);
    ``eps[ℓ − 2]`` = ε(ℓ)."""
    af = alphas.astype(np.float64)
    lq = np.log(q)[:, None]
    l1q = np.log1p(-q)[:, None]
    cum = (np.arange(2, eps.size + 2) - 1.0) * eps  # (ℓ − 1)·ε(ℓ)
    log_m1 = _log_expm1(cum)  # log(e^{(ℓ−1)ε(ℓ)} − 1); −inf where ε = 0
    # A1: log(A1 − 1) by a segmented log-sum-exp over ℓ = 2..α for each α.
    lens = alphas - 1
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    ell = np.concatenate([np.arange(2, al + 1, dtype=np.float64) for al in alphas])
    al_rep = np.repeat(af, lens)
    lcomb = special.gammaln(al_rep + 1.0) - special.gammaln(ell + 1.0)
    lcomb -= special.gammaln(al_rep - ell + 1.0)
    lm = log_m1[(ell - 2).astype(np.int64)]
    const = lcomb + lm
    const_mag = np.abs(lcomb) + np.where(np.isfinite(lm), np.abs(lm), 0.0) + 4.0
    log_a1m1 = np.empty((q.size, alphas.size))
    chunk = max(1, _CHUNK // max(1, ell.size))
    for s in range(0, q.size, chunk):
        e = slice(s, s + chunk)
        u = ell[None, :] * lq[e]
        v = (al_rep - ell)[None, :] * l1q[e]
        work = const[None, :] + u + v
        work += _REL_MARGIN * (const_mag[None, :] + np.abs(u) + np.abs(v))
        finite = np.isfinite(work)
        mx = np.maximum.reduceat(np.where(finite, work, -np.inf), starts, axis=1)
        safe = np.where(np.isfinite(mx), mx, 0.0)
        with np.errstate(under="ignore", invalid="ignore", over="ignore"):
            ex = np.exp(np.where(finite, work - np.repeat(safe, lens, axis=1), -np.inf))
        total = np.add.reduceat(ex, starts, axis=1)
        with np.errstate(divide="ignore"):
            log_a1m1[e] = np.where(np.isfinite(mx), safe + np.log(total), -np.inf)
    log_a1 = np.logaddexp(0.0, log_a1m1)
    # A2 = B2 = 1 + γ(e^{(α−1)ε(α)} − 1)
    cum_a = cum[alphas - 2][None, :]
    lin = np.logaddexp(0.0, lq + _log_expm1(cum_a) + _REL_MARGIN * (np.abs(lq) + cum_a + 4.0))
    up = np.minimum(log_a1, lin)
    if symmetric:  # the removal direction is at most the addition direction (lemma)
        g = up * (1.0 + 8.0 * 2.0**-52)
        return np.where(np.isnan(g), np.inf, g)
    # B1 = 1 + (e^{ε(2)} − 1)(C(α,2)γ² + C(α+1,3)γ³(1−γ)^{−α−2})
    log_e2 = float(_log_expm1(eps[:1])[0])
    t2 = np.log(af * (af - 1.0) / 2.0)[None, :] + 2.0 * lq
    t3 = np.log((af + 1.0) * af * (af - 1.0) / 6.0)[None, :] + 3.0 * lq - (af + 2.0) * l1q
    t2b = t2 - (af + 1.0)[None, :] * l1q  # second-order remainder: C(α,2)γ²(1−γ)^{−α−1}
    if np.isfinite(log_e2):
        mag = np.abs(t2) + np.abs(t3) + abs(log_e2) + 4.0
        b1 = np.logaddexp(0.0, log_e2 + np.logaddexp(t2, t3) + _REL_MARGIN * mag)
        mag2 = np.abs(t2b) + abs(log_e2) + 4.0
        b1 = np.minimum(b1, np.logaddexp(0.0, log_e2 + t2b + _REL_MARGIN * mag2))
    else:  # ε(2) = 0: y = 1 q-almost surely (e^{ε(2)} = ∞ would leave B1 infinite: no bound)
        b1 = np.zeros_like(t2) if log_e2 < 0 else np.full_like(t2, np.inf)
    # B3 = (1 − γ)^{−(α−1)}
    b3 = -(af - 1.0)[None, :] * l1q * (1.0 + _REL_MARGIN)
    down = np.minimum(np.minimum(b1, lin), b3)
    g = np.maximum(up, down) * (1.0 + 8.0 * 2.0**-52)
    return np.where(np.isnan(g), np.inf, g)  # an infinite base moment: no finite bound
