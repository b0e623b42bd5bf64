"""f-DP and Gaussian DP (GDP): trade-off functions, μ-GDP ↔ (ε, δ), CLT accounting, PriFedSync.

References
----------
* Dong, Roth, Su, "Gaussian Differential Privacy", JRSS-B 2022 (arXiv:1905.02383): Def. 2.1
  (trade-off function), Def. 2.6 (G_μ), Cor. 2.13 (μ-GDP → (ε, δ(ε))), Prop. 2.12 (f-DP →
  (ε, 1 + f*(−e^ε))), Cor. 3.3 (composition μ = √Σμ_i²), Cor. 5.4 (CLT for subsampling).
* Bu, Dong, Long, Su, "Deep Learning with Gaussian Differential Privacy", HDSR 2020: the CLT
  μ of Poisson-subsampled NoisySGD, μ = q·√(T(e^{1/σ²} − 1)).
* Zheng, Chen, Long, Su, "Federated f-Differential Privacy" (PriFedSync), AISTATS 2021:
  Def. 3.5 / 3.6 (weak / strong federated f-DP), Lemma 3.4 (GDP composition), Lemma 3.8
  (client sampling, g = max(f, 1 − α − p²)), Theorem 1, Theorem 2 (μ_j of PriFedSync + NoisySGD).
* Dong, Roth, Su, Theorem 3.5 (Berry–Esseen CLT for composition): the n-fold composition of
  symmetric trade-off functions approaches G_μ with μ = 2‖kl‖₁ / √(‖κ₂‖₁ − ‖kl‖₂²), where
  kl(f) = −∫₀¹ log|f′(α)| dα and κ₂(f) = ∫₀¹ log²|f′(α)| dα.

**The CLT values are approximations, not bounds.** :func:`poisson_gaussian_mu_clt` and
:func:`prifedsync_mu` are limits as the number of steps grows; for a finite number of steps they
can *under-report* ε (markedly so for few steps or large q). pdpfl's certified accountant is the
RDP one (:mod:`pdpfl.privacy.two_stage`); use these for comparison with the f-DP literature.
The exact conversions here (:func:`gdp_delta`, :func:`gdp_epsilon`, :func:`tradeoff_to_delta`)
are exact / conservative for the μ or trade-off curve they are given.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from pdpfl.privacy.rdp import check_noise_multiplier, check_rates

__all__ = [
    "gaussian_tradeoff",
    "gdp_delta",
    "gdp_epsilon",
    "compose_gdp",
    "poisson_gaussian_mu_clt",
    "prifedsync_mu",
    "federated_mu",
    "client_sampled_tradeoff",
    "client_sampled_mu_clt",
    "tradeoff_clt_functionals",
    "alpha_grid",
    "tradeoff_to_delta",
    "tradeoff_to_epsilon",
]


def _check_mu(mu: ArrayLike, name: str = "mu") -> np.ndarray:
    m = np.asarray(mu, dtype=np.float64)
    if np.any(~np.isfinite(m)) or np.any(m < 0):
        raise ValueError(f"{name}: every μ must be a finite number >= 0")
    return m


def _check_alpha(alpha: ArrayLike) -> np.ndarray:
    a = np.asarray(alpha, dtype=np.float64)
    if np.any(np.isnan(a)) or np.any(a < 0) or np.any(a > 1):
        raise ValueError("alpha: every type I error level must be in [0, 1]")
    return a


def gaussian_tradeoff(alpha: ArrayLike, mu: ArrayLike) -> np.ndarray:
    """G_μ(α) = Φ(Φ⁻¹(1 − α) − μ) (Dong et al. Def. 2.6; PriFedSync Def. 3.2), broadcasting.

    The smallest type II error of any test at level α between N(0, 1) and N(μ, 1).
    """
    a = _check_alpha(alpha)
    m = _check_mu(mu)
    result: np.ndarray = special.ndtr(special.ndtri(1.0 - a) - m)
    return result


def gdp_delta(mu: ArrayLike, epsilon: ArrayLike) -> np.ndarray:
    """Exact δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong et al. Cor. 2.13).

    Evaluated in log space (``exp(log Φ(a))·(−expm1(ε + log Φ(b) − log Φ(a)))``) so tiny δ keep
    their relative precision. μ = 0 gives δ = 0. Broadcasts ``mu`` against ``epsilon``.
    """
    m = _check_mu(mu)
    e = np.asarray(epsilon, dtype=np.float64)
    if np.any(np.isnan(e)) or np.any(e < 0):
        raise ValueError("epsilon: every ε must be a number >= 0")
    m, e = np.broadcast_arrays(m, e)
    out = np.zeros(m.shape, dtype=np.float64)
    ok = (m > 0) & np.isfinite(e)
    if ok.any():
        mm, ee = m[ok], e[ok]
        la = special.log_ndtr(-ee / mm + mm / 2.0)
        lb = ee + special.log_ndtr(-ee / mm - mm / 2.0)
        with np.errstate(under="ignore"):
            out[ok] = np.exp(la) * -np.expm1(np.minimum(lb - la, 0.0))
    return out if out.ndim else out[()]


def gdp_epsilon(mu: ArrayLike, delta: ArrayLike, *, xtol: float = 1e-12) -> np.ndarray:
    """Smallest ε with δ(ε) ≤ δ for μ-GDP (inverse of :func:`gdp_delta`), broadcasting.

    δ(ε) is strictly decreasing in ε, so the root is bracketed in ``[0, μ²/2 + μ·Φ⁻¹(1 − δ)]``
    (where ``Φ(−ε/μ + μ/2) ≤ δ``) and found by vectorized bisection (all μ at once) down to
    ``xtol + 4·eps·ε``. The invariant ``gdp_delta(μ, hi) ≤ δ`` holds in floating point and
    ``hi`` is returned, so ε is never below the exact value. ε = 0 when
    ``δ ≥ 2Φ(μ/2) − 1`` (and for μ = 0).
    """
    m = _check_mu(mu)
    d = np.asarray(delta, dtype=np.float64)
    if np.any(np.isnan(d)) or np.any(d <= 0) or np.any(d >= 1):
        raise ValueError("delta: every δ must be in (0, 1)")
    m, d = np.broadcast_arrays(m, d)
    out = np.zeros(m.shape, dtype=np.float64)
    todo = (m > 0) & (gdp_delta(m, 0.0) > d)
    if todo.any():
        mm, dd = m[todo], d[todo]
        hi = (mm * mm / 2.0 + mm * special.ndtri(1.0 - dd)) * (1.0 + 1e-9) + 1e-12
        for _ in range(64):  # float rounding at the analytic bracket: widen where needed
            bad = gdp_delta(mm, hi) > dd
            if not bad.any():
                break
            hi = np.where(bad, hi * 1.01 + 1e-12, hi)
        lo = np.zeros_like(hi)
        tol = 4.0 * np.finfo(np.float64).eps
        for _ in range(200):
            open_ = hi - lo > xtol + tol * hi
            if not open_.any():
                break
            mid = 0.5 * (lo + hi)
            above = gdp_delta(mm, mid) > dd
            lo = np.where(open_ & above, mid, lo)
            hi = np.where(open_ & ~above, mid, hi)
        out[todo] = hi
    return out if out.ndim else out[()]


def compose_gdp(mus: ArrayLike, axis: int | None = None) -> np.ndarray | float:
    """μ of the composition of μ_i-GDP mechanisms: √Σμ_i² (Dong et al. Cor. 3.3; PriFedSync
    Lemma 3.4). Exact (no approximation). ``axis=None`` composes everything."""
    m = _check_mu(mus, "mus")
    out = np.sqrt(np.sum(m * m, axis=axis))
    return float(out) if np.ndim(out) == 0 else out


def _check_steps(value: ArrayLike, name: str) -> np.ndarray:
    v = np.asarray(value, dtype=np.float64)
    if np.any(np.isnan(v)) or np.any(v < 0) or np.any(v != np.floor(v)):
        raise ValueError(f"{name}: must be integers >= 0")
    return v


def poisson_gaussian_mu_clt(
    rates: ArrayLike, noise_multiplier: float, steps: int | ArrayLike
) -> np.ndarray:
    """CLT μ of T Poisson-subsampled Gaussian steps: μ = q·√(T·(e^{1/σ²} − 1)) (Bu et al. 2020).

    **An approximation** (the limit q√T → ν, T → ∞), not a bound: for finite T it can
    under-report ε, noticeably for few steps or large q. Sensitivity-1 add/remove neighbours, σ
    the noise multiplier. Vectorized over ``rates`` (and broadcast ``steps``).
    """
    sigma = check_noise_multiplier(noise_multiplier)
    q = check_rates(rates)
    t = _check_steps(steps, "steps")
    with np.errstate(over="ignore"):  # tiny σ: μ = inf (no privacy), not a warning
        result: np.ndarray = q * np.sqrt(t * np.expm1(1.0 / (sigma * sigma)))
        return result


def prifedsync_mu(
    noise_multiplier: ArrayLike,
    batch_size: ArrayLike,
    n_records: ArrayLike,
    local_steps: int | ArrayLike,
    rounds: int | ArrayLike,
) -> np.ndarray:
    """μ_j of PriFedSync with NoisySGD local training (PriFedSync Theorem 2), per client.

    μ_j = √2·c_j·√(e^{σ_j⁻²}Φ(1.5/σ_j) + 3Φ(−0.5/σ_j) − 2), c_j = (B_j/n_j)·√(K·R).

    Algorithm 2 of the paper samples a *fixed-size* batch B_j uniformly without replacement and
    adds N(0, 4C²σ_j²) noise (replace-one neighbours, sensitivity 2C), so σ_j is the noise
    multiplier relative to 2C. The bound does not use client sampling p (it holds for every p).
    **A CLT limit** (B_j/n_j·√(KR) → c_j; Dong et al. Cor. 5.4), not a finite-T bound; it can
    under-report ε. Arguments broadcast over clients.
    """
    sigma = np.asarray(noise_multiplier, dtype=np.float64)
    if np.any(~np.isfinite(sigma)) or np.any(sigma <= 0):
        raise ValueError("noise_multiplier: every σ_j must be a finite number > 0")
    b = np.asarray(batch_size, dtype=np.float64)
    n = np.asarray(n_records, dtype=np.float64)
    if np.any(np.isnan(b)) or np.any(b < 0) or np.any(np.isnan(n)) or np.any(n <= 0):
        raise ValueError("batch_size / n_records: need 0 <= batch_size and n_records > 0")
    if np.any(b > n):
        raise ValueError("batch_size: must be <= n_records")
    k = _check_steps(local_steps, "local_steps")
    r = _check_steps(rounds, "rounds")
    c = (b / n) * np.sqrt(k * r)
    inv = 1.0 / sigma
    with np.errstate(over="ignore"):  # tiny σ: μ = inf (no privacy), not a warning
        inner = np.exp(inv * inv) * special.ndtr(1.5 * inv) + 3.0 * special.ndtr(-0.5 * inv) - 2.0
    result: np.ndarray = math.sqrt(2.0) * c * np.sqrt(np.maximum(inner, 0.0))
    return result


def federated_mu(client_mus: ArrayLike, notion: str = "weak") -> float:
    """Federated GDP parameter from per-client μ_j (PriFedSync Theorem 2, Defs. 3.5 / 3.6).

    ``"weak"`` (one adversarial client): μ_max = max_j μ_j. ``"strong"`` (all other m − 1
    clients colluding): √(m − 1)·μ_max, m = number of clients (``len(client_mus)``).
    """
    m = _check_mu(client_mus, "client_mus").reshape(-1)
    if m.size == 0:
        raise ValueError("client_mus: expected at least one client")
    mu_max = float(m.max())
    if notion == "weak":
        return mu_max
    if notion == "strong":
        return math.sqrt(max(m.size - 1, 0)) * mu_max
    raise ValueError(f"notion: expected 'weak' or 'strong', got {notion!r}")


def client_sampled_tradeoff(
    alpha: ArrayLike, f_values: ArrayLike, client_rate: float
) -> np.ndarray:
    """Trade-off after client sampling with probability p: g = max(f, 1 − α − p²).

    PriFedSync Lemma 3.8 (as stated there, evaluated pointwise on ``alpha``); ``f_values`` is the
    per-round trade-off f_j of the local training at ``alpha``. p = 1 gives f, p = 0 gives Id.
    Composing g over R rounds (Theorem 1) has no closed form and is not implemented.
    """
    a = _check_alpha(alpha)
    f = np.asarray(f_values, dtype=np.float64)
    if f.shape != a.shape:
        raise ValueError(f"f_values: shape {f.shape} must match alpha {a.shape}")
    p = float(client_rate)
    if not (0.0 <= p <= 1.0):
        raise ValueError(f"client_rate: must be in [0, 1], got {client_rate!r}")
    return np.maximum(f, 1.0 - a - p * p)


def tradeoff_clt_functionals(mu: float, client_rate: float = 1.0) -> tuple[float, float]:
    """(kl, κ₂) of g = max(G_μ, 1 − α − p²) (Dong et al. Theorem 3.5's functionals), closed form.

    With z = Φ⁻¹(1 − α): log|G_μ′(α)| = μz − μ²/2 and dα = φ(z)dz, so kl(G_μ) = μ²/2 and
    κ₂(G_μ) = μ² + μ⁴/4. The line 1 − α − p² (slope −1, log|g′| = 0) lies above G_μ exactly where
    Φ(z) − Φ(z − μ) > p², an interval (μ/2 − t, μ/2 + t) when p² < 2Φ(μ/2) − 1; the functionals
    drop that interval's contribution, integrated with the Gaussian moments
    ∫zφ = −φ and ∫z²φ = Φ − zφ.
    """
    m = float(_check_mu(mu))
    p = float(client_rate)
    if not (0.0 <= p <= 1.0):
        raise ValueError(f"client_rate: must be in [0, 1], got {client_rate!r}")
    kl, k2 = m * m / 2.0, m * m + m**4 / 4.0
    if m == 0.0:
        return 0.0, 0.0
    p2 = p * p
    if p2 >= 2.0 * special.ndtr(m / 2.0) - 1.0:
        return kl, k2
    # Φ(μ/2 + t) − Φ(t − μ/2) = p², solved for t ∈ [0, ∞) by bisection (decreasing in t).
    lo, hi = 0.0, 1.0
    while special.ndtr(m / 2.0 + hi) - special.ndtr(hi - m / 2.0) > p2:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if special.ndtr(m / 2.0 + mid) - special.ndtr(mid - m / 2.0) > p2:
            lo = mid
        else:
            hi = mid
    a, b = m / 2.0 - hi, m / 2.0 + hi
    phi_a, phi_b = (
        math.exp(-a * a / 2.0) / math.sqrt(2 * math.pi),
        math.exp(-b * b / 2.0) / math.sqrt(2 * math.pi),
    )
    mass = float(special.ndtr(b) - special.ndtr(a))
    first = phi_a - phi_b  # ∫_a^b z φ(z) dz
    second = mass + a * phi_a - b * phi_b  # ∫_a^b z² φ(z) dz
    i1 = m * first - m * m / 2.0 * mass
    i2 = m * m * second - m**3 * first + m**4 / 4.0 * mass
    return kl + i1, k2 - i2


def client_sampled_mu_clt(mu_round: float, client_rate: float, rounds: int) -> float:
    """CLT μ of R rounds of PriFedSync Lemma 3.8's g = max(G_μ, 1 − α − p²) (Theorem 1).

    ``mu_round``: the GDP μ of one round's local training (e.g. ``prifedsync_mu(σ, B, n, K, 1)``).
    μ_R = 2R·kl / √(R·(κ₂ − kl²)) (Dong et al. Theorem 3.5). **An approximation** (a CLT, like
    Theorem 2), and the lemma itself assumes a client receives nothing in rounds it is not
    sampled in. p = 1 gives exactly √R·μ (Lemma 3.4).
    """
    r = _check_steps(rounds, "rounds")
    kl, k2 = tradeoff_clt_functionals(mu_round, client_rate)
    var = k2 - kl * kl
    if kl <= 0.0 or var <= 0.0 or r == 0:
        return 0.0
    return float(2.0 * math.sqrt(float(r)) * kl / math.sqrt(var))


def _check_curve(alpha: ArrayLike, f_values: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    a = _check_alpha(alpha).reshape(-1)
    f = np.asarray(f_values, dtype=np.float64).reshape(-1)
    if f.shape != a.shape or a.size < 2:
        raise ValueError("f_values: need one value per alpha (at least two grid points)")
    if a[0] != 0.0 or a[-1] != 1.0 or np.any(np.diff(a) <= 0):
        raise ValueError("alpha: the grid must be strictly increasing from 0 to 1")
    if np.any(np.isnan(f)) or np.any(f < 0) or np.any(f > 1):
        raise ValueError("f_values: a trade-off function takes values in [0, 1]")
    return a, f


def alpha_grid(n: int = 4001, smallest: float = 1e-16) -> np.ndarray:
    """A grid for :func:`tradeoff_to_delta`: 0, ``n`` geometric points from ``smallest`` to 1,
    and ``n`` uniform points in [0, 1] (merged, sorted, unique).

    Geometric spacing resolves small α, which decides small δ: the grid bound can never go below
    ``1 − f(smallest)``, so a uniform grid alone is useless for δ ≪ 1/n; the uniform points
    keep the absolute spacing ≤ 1/(n − 1) at large α.
    """
    if int(n) != n or n < 2:
        raise ValueError(f"n: must be an integer >= 2, got {n!r}")
    if not (0.0 < smallest < 1.0):
        raise ValueError(f"smallest: must be in (0, 1), got {smallest!r}")
    return np.unique(
        np.concatenate([[0.0], np.geomspace(smallest, 1.0, int(n)), np.linspace(0, 1, int(n))])
    )


def tradeoff_to_delta(alpha: ArrayLike, f_values: ArrayLike, epsilon: ArrayLike) -> np.ndarray:
    """Conservative δ(ε) = 1 + f*(−e^ε) from a trade-off curve known on a grid (Dong et al.
    Prop. 2.12: f-DP ⇒ (ε, δ(ε))-DP for every ε ≥ 0, neighbouring being symmetric).

    1 + f*(−e^ε) = 1 − inf_α (e^ε α + f(α)). Evaluating the infimum only at grid points would be
    too small a δ (unsafe). Instead, on each cell [α_k, α_{k+1}] a non-increasing f satisfies
    e^ε α + f(α) ≥ e^ε α_k + f(α_{k+1}), so ``δ = 1 − min_k(e^ε α_k + f(α_{k+1}))`` is an upper
    bound on the exact δ for any monotone f whose grid values are exact or lower bounds; it
    converges to the exact δ as the grid is refined.

    Parameters
    ----------
    alpha
        Grid, strictly increasing from 0 to 1.
    f_values
        f(alpha) (lower bounds on the trade-off function), non-increasing.
    epsilon
        ε ≥ 0 (any shape).
    """
    a, f = _check_curve(alpha, f_values)
    if np.any(np.diff(f) > 1e-12):
        raise ValueError("f_values: a trade-off function must be non-increasing in alpha")
    e = np.asarray(epsilon, dtype=np.float64)
    if np.any(~np.isfinite(e)) or np.any(e < 0):
        raise ValueError("epsilon: every ε must be a finite number >= 0")
    lo_a, hi_f = a[1:-1], f[2:]  # cells k >= 1; cell 0 (α_0 = 0) contributes f(α_1)
    with np.errstate(over="ignore"):
        inf = np.minimum(np.min(np.exp(e)[..., None] * lo_a + hi_f, axis=-1, initial=f[1]), f[1])
    out = np.clip(1.0 - inf, 0.0, 1.0)
    result: np.ndarray = out if out.ndim else out[()]
    return result


def tradeoff_to_epsilon(
    alpha: ArrayLike, f_values: ArrayLike, delta: float, *, xtol: float = 1e-10
) -> float:
    """Smallest ε (to ``xtol``, rounded up) with :func:`tradeoff_to_delta` ≤ δ; ``inf`` if none.

    The grid δ(ε) is non-increasing in ε, so bisection is safe; the returned ε always satisfies
    ``tradeoff_to_delta(alpha, f_values, ε) <= delta``.
    """
    d = float(delta)
    if not (0.0 < d < 1.0):
        raise ValueError(f"delta: must be in (0, 1), got {delta!r}")
    a, f = _check_curve(alpha, f_values)
    if tradeoff_to_delta(a, f, 0.0) <= d:
        return 0.0
    if 1.0 - f[1] > d:  # the floor of the grid bound as ε → ∞: refine the grid near α = 0
        return math.inf
    hi = 1.0
    while tradeoff_to_delta(a, f, hi) > d:
        hi *= 2.0
    lo = 0.0
    while hi - lo > xtol * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if tradeoff_to_delta(a, f, mid) > d:
            lo = mid
        else:
            hi = mid
    return hi
