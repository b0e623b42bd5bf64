"""Privacy-loss-distribution (PLD) accountant, including the rPDP-FL two-stage round.

RDP is loose for the subsampled Gaussian; PLD accounting (Koskela et al. 2020; Meiser & Mohammadi
2018; Doroshenko et al. 2022, "connect the dots") computes the hockey-stick divergence δ(ε) of
the composed mechanism almost exactly. dp-accounting's ``PLDAccountant`` rejects the rPDP-FL
event (Poisson sampling of records inside Poisson sampling of clients); this module builds it
from dp-accounting's PLD machinery (``privacy_loss_distribution``: pessimistic connect-the-dots
discretization, both the *remove* and the *add* direction, FFT composition).

The two-stage round (rPDP-FL Lemma 6, third-party view). In a round, record j's silo takes part
with probability λ and then runs τ Poisson-sampled Gaussian steps (rate q_j); otherwise the round's
output does not depend on the record at all. Reveal the participation bit ω to the observer: the
pair of output distributions becomes (ω, o) with ω ~ Bernoulli(λ) independent of the data and, given
ω = 1, the τ-step pair (P_τ, Q_τ); given ω = 0, the same distribution under both datasets. Its
privacy loss is therefore 0 with probability 1 − λ and distributed as PLD_τ(q, σ) otherwise:

    PLD_round = (1 − λ)·δ₀ + λ·PLD_τ(q, σ)      (for the remove and the add direction alike)

and the real round, which hides ω, is a post-processing of it, so every δ(ε) computed from this
mixture (composed over T rounds) upper-bounds the real one. The server view has no λ: k·τ steps.
The same accountant serves single-stage Poisson Gaussians (IDP-FedAvg clients, ULDP-FL users).

Every reported ε is an upper bound:

* discretization is pessimistic (dp-accounting's connect-the-dots with ``pessimistic_estimate``),
  the Gaussian's truncated tail (mass ≤ e^{-50}) and the tails truncated during composition
  (≤ 1e-15 each) go to the infinite-loss mass;
* FFT composition has float error. It is bounded (estimate, ≥ 100× the error measured against
  exact convolution) by η = 32·u·N·(log₂ n + 1) per n-fold composition of a PMF of N points
  (u = 2^-52), multiplied by the number of times an inexact PMF is composed afterwards, and δ is
  reduced by it: we report ε at δ − η (never ε at δ);
* the result is ``min(ε_PLD, ε_RDP)``: both are valid bounds (RDP wins at tiny rates, where a
  coarse discretization dominates the PLD).

Discretization interval: per rate and count, ``clip(ε_est/300, 1e-4, 1e-2)`` where ε_est is a
central-limit (Gaussian-DP) estimate of ε -- resolution follows the size of the privacy loss;
any interval gives an upper bound. The interval used is reported.

At scale (per-record rates), rates are rounded **up** to a geometric grid of ``rate_grid_rel_step``
(default 1 %) from ``rate_grid_min`` to 1 before the PLD is computed: ε is non-decreasing in q
(Poisson sampling at q' < q is a mixture of sampling at q and of no access, and hockey-stick
divergences are jointly convex; composition preserves the order), so ε_PLD(q↑) bounds ε(q). The
calibration grid and the ledger then need at most one PLD per grid rate and round count (cached).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar, Union

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.accountant import RdpAccountant
from pdpfl.privacy.mechanisms import (
    Composed,
    GaussianMechanism,
    Mechanism,
    PoissonSampled,
    Sequence,
    TwoStageRound,
    is_mechanism,
    outline,
)
from pdpfl.privacy.orders import DEFAULT_ORDERS
from pdpfl.privacy.registry import (
    Accountant,
    UnsupportedEventError,
    check_counts,
    register_accountant,
)

__all__ = ["PldAccountant", "rate_grid_up"]

_U = 2.0**-52
#: FFT error bound constant (see module docstring).
_FFT_ERROR_CONSTANT = 32.0
#: Tail mass truncated per composition (dp-accounting's default; goes to the infinite loss).
_TAIL = 1e-15


def _dp_accounting() -> Any:
    try:
        from dp_accounting.pld import privacy_loss_distribution as pldlib
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "accountant: 'pld' needs the dp-accounting package (pip install 'pdpfl[pld]')"
        ) from exc
    return pldlib


def rate_grid_up(rates: ArrayLike, rel_step: float, q_min: float) -> np.ndarray:
    """Round rates up to the geometric grid ``q_min·(1+rel_step)^k`` (capped at exactly 1).

    0 stays 0; rates below ``q_min`` become ``q_min``; every output is ≥ its input.
    """
    q = np.asarray(rates, dtype=np.float64)
    if rel_step <= 0:
        return q.copy()
    grid = _geometric_grid(float(rel_step), float(q_min))
    idx = np.searchsorted(grid, q, side="left")
    out = grid[np.minimum(idx, grid.size - 1)]
    return np.where(q <= 0, 0.0, out)


_GRIDS: dict[tuple[float, float], np.ndarray] = {}


def _geometric_grid(rel_step: float, q_min: float) -> np.ndarray:
    key = (rel_step, q_min)
    grid = _GRIDS.get(key)
    if grid is None:
        n = math.ceil(math.log(1.0 / q_min) / math.log1p(rel_step))
        grid = q_min * (1.0 + rel_step) ** np.arange(n + 1)
        grid = np.unique(np.minimum(grid, 1.0))
        grid[-1] = 1.0
        grid.setflags(write=False)
        _GRIDS[key] = grid
    return grid


class PldAccountant:
    """PLD accountant (module docstring) with an RDP fallback; every ε is an upper bound.

    Parameters
    ----------
    max_interval, interval_ratio, min_interval
        Discretization interval ``clip(ε_est / interval_ratio, min_interval, max_interval)``
        (:meth:`interval_for`).
    rate_grid_rel_step, rate_grid_min
        Rates are rounded up to this geometric grid first (``rate_grid_rel_step=0``: exact rates,
        one PLD per distinct rate).
    rdp_orders, rdp_refine
        The RDP accountant whose ε is the fallback (``min(ε_PLD, ε_RDP)``).
    cache_size
        Number of (event, rate, count, δ) results kept.
    """

    name = "pld"
    #: Every ε is an upper bound (pessimistic discretization, FFT error subtracted from δ).
    approximate: ClassVar[bool] = False

    def __init__(
        self,
        max_interval: float = 1e-2,
        interval_ratio: float = 300.0,
        min_interval: float = 1e-4,
        rate_grid_rel_step: float = 0.01,
        rate_grid_min: float = 1e-4,
        rdp_orders: ArrayLike = DEFAULT_ORDERS,
        rdp_refine: bool = True,
        cache_size: int = 100_000,
    ) -> None:
        for name, v in (("max_interval", max_interval), ("min_interval", min_interval)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name}: must be a finite number > 0, got {v!r}")
        if min_interval > max_interval:
            raise ValueError("min_interval: must be <= max_interval")
        if not (interval_ratio >= 1):
            raise ValueError(f"interval_ratio: must be >= 1, got {interval_ratio!r}")
        if not (0 <= rate_grid_rel_step < 1):
            raise ValueError(f"rate_grid_rel_step: must be in [0, 1), got {rate_grid_rel_step!r}")
        if not (0 < rate_grid_min < 1):
            raise ValueError(f"rate_grid_min: must be in (0, 1), got {rate_grid_min!r}")
        self.max_interval = float(max_interval)
        self.interval_ratio = float(interval_ratio)
        self.min_interval = float(min_interval)
        self.rate_grid_rel_step = float(rate_grid_rel_step)
        self.rate_grid_min = float(rate_grid_min)
        self.rdp = RdpAccountant(rdp_orders, refine=rdp_refine)
        self._cache: OrderedDict[tuple[Any, ...], tuple[float, float]] = OrderedDict()
        self._cache_size = int(cache_size)
        self._lock = threading.Lock()
        #: Number of PLDs actually computed (for benchmarks).
        self.computed = 0

    def __repr__(self) -> str:
        return (
            f"PldAccountant(max_interval={self.max_interval:g}, "
            f"rate_grid_rel_step={self.rate_grid_rel_step:g})"
        )

    # -------------------------------------------------------------------------- structure
    def _compile(self, event: Mechanism) -> tuple[_Node, np.ndarray | None]:
        """The one traversal of ``event``: its structure (:data:`_Node`, which holds only what
        this accountant interprets) and the rates of its one Poisson-sampled leaf (None: a
        plain Gaussian); UnsupportedEventError naming what it cannot interpret."""
        if isinstance(event, GaussianMechanism):
            return _Leaf(event.noise_multiplier, False), None
        if isinstance(event, PoissonSampled) and isinstance(event.inner, GaussianMechanism):
            return _Leaf(event.inner.noise_multiplier, True), event.rates
        if isinstance(event, Composed):
            node, rates = self._compile(event.inner)
            return _Rep(node, event.count), rates
        if isinstance(event, TwoStageRound):
            node, rates = self._compile(event.local)
            return _Mix(event.client_rate, node), rates
        kind = (
            "Sequence"
            if isinstance(event, Sequence)
            else outline(event, 1)
            if is_mechanism(event)
            else type(event).__name__
        )
        raise UnsupportedEventError(
            f"PldAccountant cannot interpret {kind}: supported are GaussianMechanism, "
            "PoissonSampled(q, GaussianMechanism), Composed and TwoStageRound of those"
        )

    def supports(self, event: Mechanism) -> bool:
        """True if ``event`` compiles: Gaussian, Poisson-sampled Gaussian, their compositions
        and two-stage rounds."""
        try:
            self._compile(event)
        except UnsupportedEventError:
            return False
        return True

    # -------------------------------------------------------------------------- ε
    def epsilon(self, event: Mechanism, delta: float) -> tuple[np.ndarray, np.ndarray]:
        """ε per rate of ``event`` at ``delta`` (``min`` of PLD and RDP) and the RDP order where
        RDP was the smaller bound (NaN where the PLD was)."""
        return self.composed_epsilon(event, 1, delta)

    def composed_epsilon(
        self, event: Mechanism, counts: ArrayLike, delta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """ε of ``counts[i]`` repetitions of row i of ``event`` (see :meth:`epsilon`)."""
        node, rates = self._compile(event)
        d = float(delta)
        if not (0.0 < d < 1.0):
            raise ValueError(f"delta: must be in (0, 1), got {delta!r}")
        n = 1 if rates is None else rates.size
        k = check_counts(counts, n)
        eps_rdp, order = self.rdp.composed_epsilon(event, k, d)
        eps_pld = self._pld_epsilon(node, rates, k, d)[0]
        take = eps_pld < eps_rdp
        return np.where(take, eps_pld, eps_rdp), np.where(take, np.nan, order)

    def pld_epsilon(
        self, event: Mechanism, counts: ArrayLike, delta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """The PLD bound alone (no RDP fallback): ε per row and the discretization interval used.

        Rates are first rounded up to the rate grid (module docstring).
        """
        node, rates = self._compile(event)
        return self._pld_epsilon(node, rates, counts, delta)

    def _pld_epsilon(
        self, node: _Node, rates: np.ndarray | None, counts: ArrayLike, delta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        n = 1 if rates is None else rates.size
        k = check_counts(counts, n)
        q_up = (
            np.ones(n)
            if rates is None
            else rate_grid_up(rates, self.rate_grid_rel_step, self.rate_grid_min)
        )
        eps = np.zeros(n)
        interval = np.full(n, np.nan)
        pairs: dict[tuple[float, int], list[int]] = {}
        for i in range(n):
            if k[i] == 0 or q_up[i] == 0.0:
                continue
            pairs.setdefault((float(q_up[i]), int(k[i])), []).append(i)
        for (qv, kv), idx in pairs.items():
            e, h = self._one(node, qv, kv, float(delta))
            eps[idx] = e
            interval[idx] = h
        return eps, interval

    def _one(self, node: _Node, q: float, count: int, delta: float) -> tuple[float, float]:
        key = (node, q, count, delta)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        used = self._interval(node, q, count, delta)
        best = self._epsilon_at(node, q, count, delta, used)
        with self._lock:
            self._cache[key] = (best, used)
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return best, used

    def interval_for(self, event: Mechanism, count: int, delta: float) -> float:
        """Discretization interval for ``count`` repetitions of a scalar-rate event.

        ``clip(ε_est / interval_ratio, min_interval, max_interval)`` with ε_est the ε of the
        central-limit Gaussian-DP approximation μ² = Σ (repetitions × λ × q² (e^{1/σ²} − 1))
        (Dong, Roth & Su 2022, Thm. 6) -- an *estimate*, used only to pick the resolution (the
        bound itself is always the pessimistic PLD). Deterministic in (event, count, δ), so the
        calibration and the ledger compute identical PLDs.
        """
        node, rates = self._compile(event)
        return self._interval(node, 1.0 if rates is None else float(rates[0]), count, delta)

    def _interval(self, node: _Node, q: float, count: int, delta: float) -> float:
        mu = math.sqrt(count * _mu2(node, q))
        est = _gdp_epsilon(mu, delta)
        return float(min(max(est / self.interval_ratio, self.min_interval), self.max_interval))

    def _epsilon_at(
        self, node: _Node, q: float, count: int, delta: float, interval: float
    ) -> float:
        pld, eta = _build(_flatten(_Rep(node, count)), q, interval)
        self.computed += 1
        d_eff = delta - eta
        if d_eff <= 0:
            return math.inf
        return float(pld.get_epsilon_for_delta(d_eff))

    def loss_distribution(
        self,
        event: Mechanism,
        count: int = 1,
        *,
        interval: float | None = None,
        pessimistic: bool = True,
    ) -> tuple[Any, float, float]:
        """``(pld, η, interval)``: dp-accounting's PLD of ``count`` repetitions of the
        scalar-rate ``event`` (its one rate rounded up to the rate grid, as :meth:`pld_epsilon`),
        the bound η on its FFT error (module docstring) and the discretization interval used
        (default :meth:`interval_for` at δ = 1e-6). ``pessimistic=False`` rounds the other way:
        every hockey-stick divergence of the result, plus η, is then a *lower* bound on the
        exact one (used where a number must not overstate what a mechanism leaks, e.g. an
        audit's ε̂)."""
        node, rates = self._compile(event)
        q = 1.0
        if rates is not None:
            if rates.size != 1:
                raise ValueError("loss_distribution: expected an event with one sampling rate")
            q = float(rate_grid_up(rates, self.rate_grid_rel_step, self.rate_grid_min)[0])
        k = int(check_counts(count, 1)[0])
        used = self._interval(node, q, k, 1e-6) if interval is None else float(interval)
        if not (math.isfinite(used) and used > 0):
            raise ValueError(f"interval: must be a finite number > 0, got {interval!r}")
        pld, eta = _build(_flatten(_Rep(node, k)), q, used, pessimistic)
        return pld, eta, used


@dataclass(frozen=True)
class _Leaf:
    """A Gaussian of multiplier σ, Poisson-sampled at the row's rate (``sampled``) or not."""

    sigma: float
    sampled: bool


@dataclass(frozen=True)
class _Rep:
    """``count`` compositions of ``inner``."""

    inner: _Node
    count: int


@dataclass(frozen=True)
class _Mix:
    """A two-stage round: ``inner`` with probability λ, nothing otherwise (rPDP-FL Lemma 6)."""

    client_rate: float
    inner: _Node


#: What the PLD accountant interprets (an event compiled by ``PldAccountant._compile``; hashable:
#: the cache key of its PLDs together with the rate and the count).
_Node = Union[_Leaf, _Rep, _Mix]  # noqa: UP007


def _build(node: _Node, q: float, interval: float, pessimistic: bool = True) -> tuple[Any, float]:
    """(PLD, η): the PLD of ``node`` at the scalar rate ``q`` and its accumulated FFT-error
    bound. ``pessimistic=False`` discretizes optimistically (every hockey-stick divergence of
    the result, plus η, is then a lower bound on the exact one)."""
    pldlib = _dp_accounting()
    p = pessimistic
    if isinstance(node, _Leaf):
        if not node.sampled:
            return pldlib.from_gaussian_mechanism(
                node.sigma, value_discretization_interval=interval, pessimistic_estimate=p
            ), 0.0
        if q == 0.0:
            return pldlib.identity(interval, pessimistic_estimate=p), 0.0
        return pldlib.from_gaussian_mechanism(
            node.sigma,
            value_discretization_interval=interval,
            sampling_prob=q,
            pessimistic_estimate=p,
        ), 0.0
    if isinstance(node, _Rep):
        inner, eta = _build(node.inner, q, interval, p)
        if node.count == 0:
            return pldlib.identity(interval, pessimistic_estimate=p), 0.0
        return _compose(inner, node.count, eta)
    local, eta = _build(node.inner, q, interval, p)
    lam = node.client_rate
    if lam == 1.0:
        return local, eta
    return local.compute_mixture(pldlib.identity(interval, pessimistic_estimate=p), lam), lam * eta


def _compose(pld: Any, count: int, eta: float) -> tuple[Any, float]:
    """``count``-fold self-composition and the new error bound (module docstring)."""
    if count == 1:
        return pld, eta
    out = pld.self_compose(count, tail_mass_truncation=_TAIL)
    size = max(out._pmf_remove.size, out._pmf_add.size)  # noqa: SLF001 (dp-accounting internals)
    fft = _FFT_ERROR_CONSTANT * _U * size * (math.log2(count) + 1.0)
    return out, count * eta + 2.0 * fft


def _flatten(node: _Node) -> _Node:
    """Fold nested compositions and drop λ = 1 rounds (one FFT composition instead of two:
    λ = 1 then equals dp-accounting's PLD of the flat composition)."""
    if isinstance(node, _Rep):
        inner = _flatten(node.inner)
        if isinstance(inner, _Rep):
            return _Rep(inner.inner, node.count * inner.count)
        return _Rep(inner, node.count)
    if isinstance(node, _Mix):
        inner = _flatten(node.inner)
        return inner if node.client_rate == 1.0 else _Mix(node.client_rate, inner)
    return node


def _mu2(node: _Node, q: float) -> float:
    """μ² of the central-limit Gaussian-DP approximation of ``node`` at the scalar rate q."""
    if isinstance(node, _Leaf):
        sigma = node.sigma
        if not node.sampled or q == 1.0:
            return 1.0 / sigma**2
        return q * q * math.expm1(min(1.0 / sigma**2, 700.0))
    if isinstance(node, _Rep):
        return node.count * _mu2(node.inner, q)
    return node.client_rate * _mu2(node.inner, q)


def _gdp_epsilon(mu: float, delta: float) -> float:
    """ε of μ-GDP at δ (Dong, Roth & Su 2022, Cor. 2.13), by bisection; 0 for μ = 0."""
    if not (mu > 0 and math.isfinite(mu)):
        return 0.0 if mu == 0 else math.inf
    from scipy.special import log_ndtr

    def log_delta(eps: float) -> float:
        a = log_ndtr(-eps / mu + mu / 2)
        b = eps + log_ndtr(-eps / mu - mu / 2)
        return a + math.log1p(-math.exp(min(b - a, 0.0))) if b < a else -math.inf

    target = math.log(delta)
    if log_delta(0.0) <= target:
        return 0.0
    lo, hi = 0.0, 1.0
    while log_delta(hi) > target and hi < 1e6:
        lo, hi = hi, hi * 2.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if log_delta(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


def _pld_factory(**options: Any) -> Accountant:
    return PldAccountant(**options)


register_accountant("pld", _pld_factory)
