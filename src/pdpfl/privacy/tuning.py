"""Private hyper-parameter search: the RDP of releasing the best of a random number of runs.

Papernot & Steinke, "Hyperparameter Tuning with Renyi Differential Privacy", ICLR 2022. A base
algorithm Q (one training run with a hyper-parameter setting drawn at random) is run K times,
K drawn from a public distribution independently of the data, and only the best run (its output
and score) is released. Vectorised over units: every curve is an array ``(..., n_orders)``.

* :class:`TruncatedNegativeBinomial` D_{η,γ} (η > −1, γ ∈ (0, 1); η = 1 is the geometric
  distribution, η = 0 the logarithmic one):
  P[K = k] = (1 − γ)^k / (γ^{−η} − 1) · Π_{ℓ=0}^{k−1} (ℓ + η)/(ℓ + 1)  for k ≥ 1
  (η = 0: (1 − γ)^k / (k log(1/γ))), with
  E[K] = η(1 − γ)/(γ(1 − γ^η)) (η ≠ 0) or (1/γ − 1)/log(1/γ) (η = 0).
* **Theorem 2** (:func:`tnb_rdp`): if Q is (λ, ε(λ))-RDP for every λ, the search is
  (λ, ε'(λ))-RDP with, for any λ̂ ≥ 1,
  ε'(λ) = ε(λ) + (1 + η)(1 − 1/λ̂) ε(λ̂) + (1 + η) log(1/γ)/λ̂ + log E[K]/(λ − 1);
  pdpfl takes the smallest value over λ̂ on the order grid.
* :class:`PoissonTrials` (K ~ Poisson(μ); K = 0 releases nothing data-dependent) and
  **Theorem 3** (:func:`poisson_rdp`): if Q is (λ, ε(λ))-RDP and (ε̂, δ̂)-DP with
  e^{ε̂} ≤ 1 + 1/(λ − 1), then ε'(λ) = ε(λ) + μ δ̂ + log μ/(λ − 1); pdpfl takes
  ε̂ = log(1 + 1/(λ − 1)) and δ̂ the δ that Q's RDP curve gives at that ε̂
  (:func:`~pdpfl.privacy.conversion.rdp_to_delta`). The theorem's bound covers the outcomes of
  K ≥ 1 runs; the outcome of K = 0 (nothing released) has probability e^{−μ} under both
  neighbours and adds exactly e^{−μ} to the Rényi sum, so pdpfl reports
  (1/(λ−1)) log(e^{−μ} + exp((λ−1) ε'(λ))). Without that term the printed form falls below the
  exact divergence for μ < 1 (e.g. μ = 0.5: negative at λ near 1), which the exact toy
  computation in ``tests/test_tune.py`` shows.

Two more exact facts the search needs (not from the paper; standard RDP arguments):

* :func:`mixture_rdp` -- one trial draws its candidate c uniformly at random (random search) and
  releases c with its output; the pair (c, output) has Rényi divergence
  (1/(λ−1)) log Σ_c w_c exp((λ−1) ε_c(λ)) ≤ max_c ε_c(λ), with the same weights w_c under both
  neighbouring datasets (c is independent of the data).
* :func:`random_composition_rdp` -- an observer who sees *every* trial (the coordinating server
  of a federated search) sees (K, all K transcripts); with K independent of the data its Rényi
  divergence is (1/(λ−1)) log Σ_k P[K = k] exp((λ−1) k ε(λ)).

A search that stops after ``m`` trials (:func:`capped_pmf`) differs from the uncapped one only
when K > m, so its released result is (ε, δ + (1 + e^ε) P[K > m])-DP whenever the uncapped one is
(ε, δ)-DP (a coupling: the two outputs agree unless K > m); :func:`pdpfl.tune` spends that slack
out of δ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import special, stats

from pdpfl.privacy.conversion import rdp_to_delta
from pdpfl.privacy.orders import check_orders

__all__ = [
    "PoissonTrials",
    "TruncatedNegativeBinomial",
    "TrialDistribution",
    "capped_pmf",
    "mixture_rdp",
    "poisson_rdp",
    "random_composition_rdp",
    "search_rdp",
    "tnb_rdp",
]


@dataclass(frozen=True)
class TruncatedNegativeBinomial:
    """D_{η,γ} of Papernot & Steinke (2022), §3: support {1, 2, ...}."""

    eta: float
    gamma: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.eta) and self.eta > -1.0):
            raise ValueError(f"eta: must be a finite number > -1, got {self.eta}")
        if not (0.0 < self.gamma < 1.0):
            raise ValueError(f"gamma: must be in (0, 1), got {self.gamma}")

    @property
    def name(self) -> str:
        return "truncated-negative-binomial"

    @property
    def mean(self) -> float:
        """E[K] (Papernot & Steinke 2022, Theorem 2)."""
        g, e = self.gamma, self.eta
        if e == 0.0:
            return (1.0 / g - 1.0) / math.log(1.0 / g)
        return float(e * (1.0 - g) / (g * (1.0 - g**e)))

    @classmethod
    def with_mean(cls, mean: float, eta: float = 0.0) -> TruncatedNegativeBinomial:
        """The D_{η,γ} whose E[K] is ``mean`` (> 1; γ by bisection: E[K] decreases in γ)."""
        if not (math.isfinite(mean) and mean > 1.0):
            raise ValueError(f"expected trials: must be a finite number > 1, got {mean}")
        lo, hi = 1e-12, 1.0 - 1e-12
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if cls(eta, mid).mean > mean:
                lo = mid
            else:
                hi = mid
        return cls(eta, 0.5 * (lo + hi))

    def log_pmf(self, k: ArrayLike) -> np.ndarray:
        """log P[K = k] (−∞ for k < 1)."""
        ks = np.asarray(k, dtype=np.float64)
        g, e = self.gamma, self.eta
        with np.errstate(divide="ignore", invalid="ignore"):
            if e == 0.0:
                out = ks * math.log1p(-g) - np.log(ks) - math.log(math.log(1.0 / g))
            else:
                # Π_{ℓ<k} (ℓ+η)/(ℓ+1) = Γ(k+η)/(Γ(η)Γ(k+1)); its sign is that of η (k ≥ 1),
                # as is the sign of γ^{−η} − 1, so the ratio is positive.
                log_prod = special.gammaln(ks + e) - special.gammaln(e if e > 0 else e + 1)
                log_prod = log_prod - special.gammaln(ks + 1.0)
                if e < 0:  # Γ(η) = Γ(η+1)/η with η < 0: |Γ(η)| = Γ(η+1)/|η|
                    log_prod = log_prod + math.log(-e)
                out = ks * math.log1p(-g) + log_prod - math.log(abs(g ** (-e) - 1.0))
        return np.where(ks >= 1, out, -np.inf)

    def pmf(self, k: ArrayLike) -> np.ndarray:
        return np.asarray(np.exp(self.log_pmf(k)), dtype=np.float64)

    def tail(self, m: int) -> float:
        """P[K > m]."""
        if m < 1:
            return 1.0
        head = float(np.exp(special.logsumexp(self.log_pmf(np.arange(1, m + 1)))))
        if head < 0.5:
            return 1.0 - head
        # the tail directly, summing terms until they vanish (ratio → 1 − γ < 1)
        ks = np.arange(m + 1, m + 1 + _tail_terms(self.gamma))
        return float(np.exp(special.logsumexp(self.log_pmf(ks))))

    def sample(self, uniform: float) -> int:
        """The K whose CDF first reaches ``uniform`` ∈ (0, 1) (inverse transform)."""
        total, k = 0.0, 0
        while True:
            k += 1
            total += float(self.pmf(k))
            if total >= uniform or k > 10_000_000:
                return k


@dataclass(frozen=True)
class PoissonTrials:
    """K ~ Poisson(μ) (Papernot & Steinke 2022, Theorem 3); K = 0 releases nothing."""

    mu: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mu) and self.mu > 0):
            raise ValueError(f"mu: must be a finite number > 0, got {self.mu}")

    @property
    def name(self) -> str:
        return "poisson"

    @property
    def mean(self) -> float:
        return float(self.mu)

    def log_pmf(self, k: ArrayLike) -> np.ndarray:
        return np.asarray(stats.poisson.logpmf(np.asarray(k), self.mu), dtype=np.float64)

    def pmf(self, k: ArrayLike) -> np.ndarray:
        return np.asarray(np.exp(self.log_pmf(k)), dtype=np.float64)

    def tail(self, m: int) -> float:
        return float(stats.poisson.sf(m, self.mu))

    def sample(self, uniform: float) -> int:
        return int(stats.poisson.ppf(uniform, self.mu))


TrialDistribution = TruncatedNegativeBinomial | PoissonTrials


def _tail_terms(gamma: float) -> int:
    """Terms after which (1 − γ)^k is below 1e-300 of the first."""
    return int(min(10_000_000, math.ceil(700.0 / max(-math.log1p(-gamma), 1e-12)) + 10))


def _curve(rdp: ArrayLike, orders: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    a = check_orders(orders)
    r = np.asarray(rdp, dtype=np.float64)
    if r.ndim == 0 or r.shape[-1] != a.size:
        raise ValueError(f"rdp: last axis must have one value per order ({a.size}), got {r.shape}")
    if np.any(np.isnan(r)) or np.any(r < 0):
        raise ValueError("rdp: Rényi divergences must be >= 0 (no NaN)")
    return r, a


def tnb_rdp(
    rdp: ArrayLike, orders: ArrayLike, distribution: TruncatedNegativeBinomial
) -> np.ndarray:
    """ε'(λ) of Theorem 2 at every order λ of the grid (λ̂ optimised over the same grid)."""
    r, a = _curve(rdp, orders)
    eta, gamma = distribution.eta, distribution.gamma
    # (1 + η)(1 − 1/λ̂) ε(λ̂) + (1 + η) log(1/γ)/λ̂, minimised over λ̂ (per unit)
    extra = (1.0 + eta) * ((1.0 - 1.0 / a) * r + math.log(1.0 / gamma) / a)
    best = np.min(extra, axis=-1, keepdims=True)
    return np.asarray(r + best + math.log(distribution.mean) / (a - 1.0), dtype=np.float64)


def poisson_rdp(rdp: ArrayLike, orders: ArrayLike, distribution: PoissonTrials) -> np.ndarray:
    """ε'(λ) of Theorem 3 at every order λ of the grid, with the K = 0 outcome's mass."""
    r, a = _curve(rdp, orders)
    mu = distribution.mu
    out = np.empty_like(r)
    for j, lam in enumerate(a):
        eps_hat = math.log1p(1.0 / (lam - 1.0))
        delta_hat, _ = rdp_to_delta(r, a, eps_hat)
        theorem = r[..., j] + mu * delta_hat + math.log(mu) / (lam - 1.0)
        out[..., j] = np.logaddexp(-mu, (lam - 1.0) * theorem) / (lam - 1.0)
    return out


def search_rdp(rdp: ArrayLike, orders: ArrayLike, distribution: TrialDistribution) -> np.ndarray:
    """The released best run's RDP curve: Theorem 2 or Theorem 3 by the distribution."""
    if isinstance(distribution, TruncatedNegativeBinomial):
        return tnb_rdp(rdp, orders, distribution)
    if isinstance(distribution, PoissonTrials):
        return poisson_rdp(rdp, orders, distribution)
    raise TypeError(f"distribution: expected a trial distribution, got {distribution!r}")


def mixture_rdp(
    curves: ArrayLike, orders: ArrayLike, weights: ArrayLike | None = None
) -> np.ndarray:
    """RDP of one trial that picks candidate c with probability ``weights[c]`` (uniform by
    default) and releases c: ``curves`` has shape ``(n_candidates, ..., n_orders)``."""
    c = np.asarray(curves, dtype=np.float64)
    a = check_orders(orders)
    if c.ndim < 2 or c.shape[-1] != a.size:
        raise ValueError("curves: expected shape (n_candidates, ..., n_orders)")
    n = c.shape[0]
    w = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (n,) or np.any(w < 0) or not math.isclose(float(w.sum()), 1.0, rel_tol=1e-9):
        raise ValueError("weights: expected one probability per candidate, summing to 1")
    shape = (n,) + (1,) * (c.ndim - 1)
    logw = np.log(np.where(w > 0, w, 1.0)).reshape(shape) + np.where(w > 0, 0.0, -np.inf).reshape(
        shape
    )
    return np.asarray(special.logsumexp((a - 1.0) * c + logw, axis=0) / (a - 1.0), dtype=np.float64)


def capped_pmf(distribution: TrialDistribution, cap: int) -> np.ndarray:
    """P[min(K, cap) = k] for k = 0..cap (the number of trials a capped search runs)."""
    if cap < 1:
        raise ValueError(f"cap: must be >= 1, got {cap}")
    p = distribution.pmf(np.arange(cap + 1))
    p[cap] = distribution.tail(cap - 1)  # P[K >= cap]
    return p


def random_composition_rdp(rdp: ArrayLike, orders: ArrayLike, pmf: ArrayLike) -> np.ndarray:
    """RDP of K trials seen together, K ~ ``pmf`` (``pmf[k]`` = P[K = k]) independent of the
    data and seen by the observer: (1/(λ−1)) log Σ_k P[K=k] exp((λ−1) k ε(λ))."""
    r, a = _curve(rdp, orders)
    p = np.asarray(pmf, dtype=np.float64)
    ks = np.flatnonzero(p > 0)
    terms = np.log(p[ks])[:, None] + ks[:, None] * ((a - 1.0) * r[..., None, :])
    return np.asarray(
        np.maximum(special.logsumexp(terms, axis=-2) / (a - 1.0), 0.0), dtype=np.float64
    )
