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
from typing import Any, ClassVar

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
    outline,
)
from pdpfl.privacy.orders import DEFAULT_ORDERS
from pdpfl.privacy.registry import Accountant, check_counts, register_accountant

__all__ = ["PldAccountant", "rate_grid_up"]

_U = 2.0**-52
#: FFT error bound constant (see module docstring).
_FFT_ERROR_CONSTANT = 32.0
#: Tail mass truncated per composition (dp-accounting's default; goes to the infinite loss).
_TAIL = 1e-15


def _dp_accounting():
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
        self._cache: OrderedDict[tuple, tuple[float, float]] = OrderedDict()
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
    def supports(self, event: Mechanism) -> bool:
        """Gaussian, Poisson-sampled Gaussian, their compositions and two-stage rounds."""
        if isinstance(event, GaussianMechanism):
            return True
        if isinstance(event, PoissonSampled):
            return isinstance(event.inner, GaussianMechanism)
        if isinstance(event, Composed):
            return self.supports(event.inner)
        if isinstance(event, TwoStageRound):
            return self.supports(event.local)
        return False

    def _rates(self, event: Mechanism) -> np.ndarray | None:
        """The per-row rates of the (single) PoissonSampled leaf, or None (no rates)."""
        if isinstance(event, PoissonSampled):
            return event.rates
        if isinstance(event, GaussianMechanism):
            return None
        if isinstance(event, Composed):
            return self._rates(event.inner)
        if isinstance(event, TwoStageRound):
            return self._rates(event.local)
        raise self._unsupported(event)

    def _unsupported(self, event: Mechanism) -> ValueError:
        return self._unsupported_static(event)

    @staticmethod
    def _unsupported_static(event: Mechanism) -> ValueError:
        kind = "Sequence" if isinstance(event, Sequence) else outline(event, 1)
        return ValueError(
            f"PldAccountant cannot interpret {kind}: supported are GaussianMechanism, "
            "PoissonSampled(q, GaussianMechanism), Composed and TwoStageRound of those"
        )

    @staticmethod
    def _signature(event: Mechanism) -> tuple[Any, ...]:
        if isinstance(event, GaussianMechanism):
            return ("G", event.noise_multiplier)
        if isinstance(event, PoissonSampled):
            return ("P", PldAccountant._signature(event.inner))
        if isinstance(event, Composed):
            return ("C", event.count, PldAccountant._signature(event.inner))
        if isinstance(event, TwoStageRound):
            return ("T", event.client_rate, PldAccountant._signature(event.local))
        raise PldAccountant._unsupported_static(event)

    # -------------------------------------------------------------------------- ε
    def epsilon(self, event: Mechanism, delta: float) -> tuple[np.ndarray, np.ndarray]:
        """ε per rate of ``event`` at ``delta`` (``min`` of PLD and RDP) and the RDP order where
        RDP was the smaller bound (NaN where the PLD was)."""
        return self.composed_epsilon(event, 1, delta)

    def composed_epsilon(
        self, event: Mechanism, counts: ArrayLike, delta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """ε of ``counts[i]`` repetitions of row i of ``event`` (see :meth:`epsilon`)."""
        if not self.supports(event):
            raise self._unsupported(event)
        d = float(delta)
        if not (0.0 < d < 1.0):
            raise ValueError(f"delta: must be in (0, 1), got {delta!r}")
        rates = self._rates(event)
        n = 1 if rates is None else rates.size
        k = check_counts(counts, n)
        eps_rdp, order = self.rdp.composed_epsilon(event, k, d)
        eps_pld = self.pld_epsilon(event, k, d)[0]
        take = eps_pld < eps_rdp
        return np.where(take, eps_pld, eps_rdp), np.where(take, np.nan, order)

    def pld_epsilon(
        self, event: Mechanism, counts: ArrayLike, delta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """The PLD bound alone (no RDP fallback): ε per row and the discretization interval used.

        Rates are first rounded up to the rate grid (module docstring).
        """
        if not self.supports(event):
            raise self._unsupported(event)
        rates = self._rates(event)
        n = 1 if rates is None else rates.size
        k = check_counts(counts, n)
        q_up = (
            np.ones(n)
            if rates is None
            else rate_grid_up(rates, self.rate_grid_rel_step, self.rate_grid_min)
        )
        sig = self._signature(event)
        eps = np.zeros(n)
        interval = np.full(n, np.nan)
        pairs: dict[tuple[float, int], list[int]] = {}
        for i in range(n):
            if k[i] == 0 or q_up[i] == 0.0:
                continue
            pairs.setdefault((float(q_up[i]), int(k[i])), []).append(i)
        for (qv, kv), idx in pairs.items():
            e, h = self._one(event, sig, qv, kv, float(delta), rates is not None)
            eps[idx] = e
            interval[idx] = h
        return eps, interval

    def _one(
        self, event: Mechanism, sig: tuple, q: float, count: int, delta: float, has_rates: bool
    ) -> tuple[float, float]:
        key = (sig, q, count, delta)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        scalar = _with_rate(event, q) if has_rates else event
        used = self.interval_for(scalar, count, delta)
        best = self._epsilon_at(scalar, count, delta, used)
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
        mu = math.sqrt(count * _mu2(event))
        est = _gdp_epsilon(mu, delta)
        return float(min(max(est / self.interval_ratio, self.min_interval), self.max_interval))

    def _epsilon_at(self, event: Mechanism, count: int, delta: float, interval: float) -> float:
        pld, eta = self._build(_flatten(Composed(event, count)), interval)
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
        (default :meth:`interval_for`). ``pessimistic=False`` rounds the other way: every
        hockey-stick divergence of the result, plus η, is then a *lower* bound on the exact one
        (used where a number must not overstate what a mechanism leaks, e.g. an audit's ε̂)."""
        if not self.supports(event):
            raise self._unsupported(event)
        rates = self._rates(event)
        scalar = event
        if rates is not None:
            if rates.size != 1:
                raise ValueError("loss_distribution: expected an event with one sampling rate")
            q_up = rate_grid_up(rates, self.rate_grid_rel_step, self.rate_grid_min)
            scalar = _with_rate(event, float(q_up[0]))
        k = int(check_counts(count, 1)[0])
        used = self.interval_for(scalar, k, 1e-6) if interval is None else float(interval)
        if not (math.isfinite(used) and used > 0):
            raise ValueError(f"interval: must be a finite number > 0, got {interval!r}")
        pld, eta = self._build(_flatten(Composed(scalar, k)), used, pessimistic)
        return pld, eta, used

    def _build(
        self, event: Mechanism, interval: float, pessimistic: bool = True
    ) -> tuple[Any, float]:
        """(PLD, η): the PLD of a scalar-rate event and its accumulated FFT-error bound."""
        pldlib = _dp_accounting()
        if isinstance(event, GaussianMechanism):
            return pldlib.from_gaussian_mechanism(
                event.noise_multiplier,
                value_discretization_interval=interval,
                pessimistic_estimate=pessimistic,
            ), 0.0
        if isinstance(event, PoissonSampled):
            q = float(event.rate)  # a scalar-rate event here
            if q == 0.0:
                return pldlib.identity(interval, pessimistic_estimate=pessimistic), 0.0
            assert isinstance(event.inner, GaussianMechanism)
            return pldlib.from_gaussian_mechanism(
                event.inner.noise_multiplier,
                value_discretization_interval=interval,
                sampling_prob=q,
                pessimistic_estimate=pessimistic,
            ), 0.0
        if isinstance(event, Composed):
            inner, eta = self._build(event.inner, interval, pessimistic)
            if event.count == 0:
                return pldlib.identity(interval, pessimistic_estimate=pessimistic), 0.0
            return _compose(inner, event.count, eta)
        assert isinstance(event, TwoStageRound)
        local, eta = self._build(event.local, interval, pessimistic)
        lam = event.client_rate
        if lam == 1.0:
            return local, eta
        identity = pldlib.identity(interval, pessimistic_estimate=pessimistic)
        return local.compute_mixture(identity, lam), lam * eta


def _compose(pld: Any, count: int, eta: float) -> tuple[Any, float]:
    """``count``-fold self-composition and the new error bound (module docstring)."""
    if count == 1:
        return pld, eta
    out = pld.self_compose(count, tail_mass_truncation=_TAIL)
    size = max(out._pmf_remove.size, out._pmf_add.size)  # noqa: SLF001 (dp-accounting internals)
    fft = _FFT_ERROR_CONSTANT * _U * size * (math.log2(count) + 1.0)
    return out, count * eta + 2.0 * fft


def _with_rate(event: Mechanism, q: float) -> Mechanism:
    """``event`` with its PoissonSampled leaf's rates replaced by the scalar ``q``."""
    if isinstance(event, PoissonSampled):
        return PoissonSampled(q, event.inner)
    if isinstance(event, Composed):
        return Composed(_with_rate(event.inner, q), event.count)
    if isinstance(event, TwoStageRound):
        return TwoStageRound(event.client_rate, _with_rate(event.local, q))
    return event


def _flatten(event: Mechanism) -> Mechanism:
    """Fold nested compositions and drop λ = 1 rounds (one FFT composition instead of two:
    λ = 1 then equals dp-accounting's PLD of the flat composition)."""
    if isinstance(event, Composed):
        inner = _flatten(event.inner)
        if isinstance(inner, Composed):
            return Composed(inner.inner, event.count * inner.count)
        return Composed(inner, event.count)
    if isinstance(event, TwoStageRound):
        local = _flatten(event.local)
        return local if event.client_rate == 1.0 else TwoStageRound(event.client_rate, local)
    return event


def _mu2(event: Mechanism) -> float:
    """μ² of the central-limit Gaussian-DP approximation of a scalar-rate event."""
    if isinstance(event, GaussianMechanism):
        return 1.0 / event.noise_multiplier**2
    if isinstance(event, PoissonSampled):
        assert isinstance(event.inner, GaussianMechanism)
        q, sigma = float(event.rate), event.inner.noise_multiplier
        if q == 1.0:
            return 1.0 / sigma**2
        return q * q * math.expm1(min(1.0 / sigma**2, 700.0))
    if isinstance(event, Composed):
        return event.count * _mu2(event.inner)
    if isinstance(event, TwoStageRound):
        return event.client_rate * _mu2(event.local)
    raise ValueError(f"event: unsupported {type(event).__name__}")  # pragma: no cover


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
