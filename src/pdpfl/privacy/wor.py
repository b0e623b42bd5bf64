"""The Gaussian mechanism on batches drawn uniformly *without replacement*: rigorous bounds.

Sampling without replacement (WOR): every step uses a uniformly random subset of exactly ``B`` of
a client's ``n`` records (ratio γ = B/n) -- the sampler of PriFedSync's Algorithm 2. The matching
neighbouring relation is *replace one record* (n is fixed), under which the sum of per-sample
gradients clipped to C has L2 sensitivity Δ = 2C. Every function here takes the noise
multiplier **relative to Δ**: ``σ_Δ = noise std / (2C)``, which is the paper's σ_j (Algorithm 2
adds N(0, 4C²σ_j²)); pdpfl's DP-SGD adds noise of std ``σ·C``, so ``σ_Δ = σ / 2``.

Upper bound (what pdpfl reports and enforces)
---------------------------------------------
Wang, Balle, Kasiviswanathan, "Subsampled Rényi Differential Privacy and Analytical Moments
Accountant", AISTATS 2019, **Theorem 9** (general upper bound): for a base mechanism that is
(α, ε(α))-RDP under replace-one neighbours and every integer α ≥ 2,

    ε'(α) ≤ 1/(α−1) · log(1 + γ²·C(α,2)·min{4(e^{ε(2)} − 1), e^{ε(2)}·min{2, (e^{ε(∞)} − 1)²}}
                              + Σ_{j=3..α} γ^j·C(α,j)·e^{(j−1)ε(j)}·min{2, (e^{ε(∞)} − 1)^j}).

For the Gaussian mechanism ε(α) = α/(2σ_Δ²) and ε(∞) = ∞, so both ``min{2, …}`` are 2. The sum
is evaluated in log space (log-sum-exp of log-binomials), so it neither overflows nor loses the
small terms. The result is also capped by the RDP of the un-sampled Gaussian α/(2σ_Δ²) (every
batch either contains the differing record -- two Gaussians Δ apart -- or not -- identical
outputs; Rényi divergence is jointly quasi-convex). Only integer orders are used (the theorem is
stated for them), which loses nothing that matters: the optimum over a dense integer grid.
dp-accounting's ``SampledWithoutReplacementDpEvent`` implements the Gaussian-specific
strengthening (their Theorem 27) for α ≤ 256 and exactly this bound above 256; the tests check
``ours ≥ theirs`` everywhere and equality above 256.

Lower bound (to show where an approximation under-reports)
----------------------------------------------------------
:func:`wor_gaussian_delta_lower_bound` computes δ(ε) for *explicit pairs* of neighbouring
datasets (per-example gradients that do not depend on the model, e.g. a linear loss, so every
step sees the same pair). In units of Δ, one step outputs

* *point pair*: every other record has the replacement's gradient x', so one dataset always
  sums to the same value and the other differs by Δ when the record is drawn:
  N(0, σ_Δ²) versus (1−γ)·N(0, σ_Δ²) + γ·N(1, σ_Δ²) (both directions) -- the Poisson-subsampled
  Gaussian's pair, which is why WOR at ratio γ is never more private than Poisson at rate γ;
* *mixture pair*: every other record has gradient 0, the replaced one +C or −C:
  (1−γ)·N(0, σ_Δ²) + γ·N(±½, σ_Δ²).

The privacy loss L = log(p/q) of each pair is monotone in the output, so the output axis is cut
into fine cells and each cell's exact P-mass is put on ⌊min L over the cell / h⌋·h ≤ L; tails
beyond ±(1.5 + 14σ_Δ) are dropped; T steps are composed by FFT convolution. Each of these
steps can only *lower* δ(ε) = E_P[(1 − e^{ε−L_T})₊], so the maximum over the pairs is a lower
bound on the mechanism's true δ(ε) (up to float rounding of the convolution, ~1e-14 absolute):
an accountant reporting a smaller δ -- or a smaller ε at the same δ -- under-reports.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from pdpfl.privacy.conversion import rdp_to_delta, rdp_to_epsilon
from pdpfl.privacy.rdp import gaussian_rdp_upper

__all__ = [
    "WOR_ORDERS",
    "check_sampling_ratio",
    "wor_gaussian_delta",
    "wor_gaussian_delta_lower_bound",
    "wor_gaussian_epsilon",
    "wor_gaussian_epsilon_lower_bound",
    "wor_gaussian_rdp",
    "wor_gaussian_rdp_any_order",
]

#: Integer Rényi orders for the WOR bound: 2…64, 72…256 (steps of 8), 320, 384, 512, 768, 1024.
WOR_ORDERS: np.ndarray = np.unique(
    np.concatenate(
        [np.arange(2.0, 65.0), np.arange(72.0, 257.0, 8.0), [320.0, 384.0, 512.0, 768.0, 1024.0]]
    )
)
WOR_ORDERS.setflags(write=False)

#: Largest number of privacy-loss bins the lower bound may allocate (memory guard).
_MAX_BINS = 1 << 26


def check_sampling_ratio(sampling_ratio: float, name: str = "sampling_ratio") -> float:
    """γ = B/n as a float; ValueError naming ``name`` unless in [0, 1]."""
    try:
        g = float(sampling_ratio)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number in [0, 1], got {sampling_ratio!r}") from None
    if not (0.0 <= g <= 1.0):
        raise ValueError(f"{name}: must be in [0, 1] (B/n), got {sampling_ratio!r}")
    return g


def _check_sigma(noise_multiplier: float) -> float:
    try:
        s = float(noise_multiplier)
    except (TypeError, ValueError):
        raise ValueError(
            f"noise_multiplier: expected a number > 0, got {noise_multiplier!r}"
        ) from None
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"noise_multiplier: must be a finite number > 0, got {noise_multiplier!r}")
    return s


def _check_integer_orders(orders: ArrayLike) -> np.ndarray:
    a = np.asarray(orders, dtype=np.float64).reshape(-1)
    if a.size == 0 or np.any(~np.isfinite(a)) or np.any(a < 2) or np.any(a != np.floor(a)):
        raise ValueError("orders: Theorem 9 of Wang et al. needs integer Rényi orders >= 2")
    return a


def _check_steps(steps: float) -> int:
    if isinstance(steps, bool) or int(steps) != steps or steps < 0:
        raise ValueError(f"steps: must be an integer >= 0, got {steps!r}")
    return int(steps)


@lru_cache(maxsize=16)
def _log_binomials(orders_bytes: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(j = 2…max α, log C(α, j) per order and j; −inf where j > α) for a tuple of orders."""
    a = np.frombuffer(orders_bytes, dtype=np.float64)
    j = np.arange(2.0, float(a.max()) + 1.0)
    alpha = a[:, None]
    valid = j <= alpha
    with np.errstate(invalid="ignore"):
        log_binom = (
            special.gammaln(alpha + 1.0)
            - special.gammaln(j + 1.0)
            - special.gammaln(np.where(valid, alpha - j + 1.0, 1.0))
        )
    log_binom = np.where(valid, log_binom, -np.inf)
    log_binom.setflags(write=False)
    return j, log_binom


def wor_gaussian_rdp(
    sampling_ratio: float, noise_multiplier: float, orders: ArrayLike = WOR_ORDERS
) -> np.ndarray:
    """RDP ε'(α) of ONE WOR-subsampled Gaussian step (Wang et al. 2019, Theorem 9).

    Parameters
    ----------
    sampling_ratio
        γ = B/n in [0, 1].
    noise_multiplier
        σ_Δ: noise std divided by the replace-one sensitivity 2C (the paper's σ_j).
    orders
        Integer orders ≥ 2.

    Returns
    -------
    numpy.ndarray
        Shape ``(n_orders,)``: an upper bound on the step's Rényi divergence at each order.
    """
    g = check_sampling_ratio(sampling_ratio)
    sigma = _check_sigma(noise_multiplier)
    a = _check_integer_orders(orders)
    full = gaussian_rdp_upper(a, sigma)
    if g == 0.0:
        return np.zeros_like(a)
    if g == 1.0:
        return full
    log_g = math.log(g)
    eps2 = 1.0 / (sigma * sigma)  # ε(2) = 2 / (2σ²)
    # j = 2: γ²·C(α,2)·min{4(e^{ε(2)} − 1), 2e^{ε(2)}}
    two = min(math.log(4.0) + eps2 + math.log(-math.expm1(-eps2)), math.log(2.0) + eps2)
    j, log_binom = _log_binomials(a.tobytes())
    # j ≥ 3: 2·γ^j·C(α,j)·e^{(j−1)·j/(2σ²)};  log_binom is −inf where j > α.
    per_j = j * log_g + math.log(2.0) + (j - 1.0) * j / (2.0 * sigma * sigma)
    per_j[0] = 2.0 * log_g + two
    terms = log_binom + per_j
    peak = np.maximum(terms.max(axis=1), 0.0)
    with np.errstate(under="ignore"):
        rest = np.exp(terms - peak[:, None]).sum(axis=1)
        # log(1 + Σ) = peak + log(e^{−peak} + Σe^{t−peak}); log1p keeps tiny sums exact.
        log_total = np.where(peak > 0, peak + np.log(np.exp(-peak) + rest), np.log1p(rest))
    out = log_total / (a - 1.0)
    result: np.ndarray = np.minimum(out, full)
    return result


@lru_cache(maxsize=256)
def _rdp_cached(sampling_ratio: float, noise_multiplier: float, orders: bytes) -> np.ndarray:
    out = wor_gaussian_rdp(sampling_ratio, noise_multiplier, np.frombuffer(orders))
    out.setflags(write=False)
    return out


def wor_gaussian_rdp_any_order(
    sampling_ratio: float, noise_multiplier: float, orders: ArrayLike
) -> np.ndarray:
    """An upper bound on the RDP of one WOR-subsampled Gaussian step at *any* orders α > 1.

    Theorem 9 is stated for integer α ≥ 2; Rényi divergence is non-decreasing in α, so
    ρ(α) ≤ ρ(max(2, ⌈α⌉)), which is what is returned (exactly :func:`wor_gaussian_rdp` at
    integer orders ≥ 2). Results are cached per (γ, σ, orders): the ledger asks for the same
    few clients' ratios round after round.
    """
    g = check_sampling_ratio(sampling_ratio)
    sigma = _check_sigma(noise_multiplier)
    a = np.asarray(orders, dtype=np.float64).reshape(-1)
    if a.size == 0 or np.any(~np.isfinite(a)) or np.any(a <= 1.0):
        raise ValueError("orders: every Rényi order must be a finite number > 1")
    up = np.maximum(np.ceil(a), 2.0)
    uniq, inverse = np.unique(up, return_inverse=True)
    rdp = _rdp_cached(g, sigma, uniq.tobytes())
    return np.asarray(rdp[inverse.reshape(-1)], dtype=np.float64)


def wor_gaussian_epsilon(
    sampling_ratio: float,
    noise_multiplier: float,
    steps: int,
    delta: float,
    orders: ArrayLike = WOR_ORDERS,
) -> tuple[float, float]:
    """(ε, optimal order) of ``steps`` composed WOR-subsampled Gaussian steps at δ.

    RDP composes additively over the steps; the conversion is Balle et al. 2020, Prop. 12
    (:func:`pdpfl.privacy.conversion.rdp_to_epsilon`). An upper bound on the true ε.
    """
    t = _check_steps(steps)
    a = _check_integer_orders(orders)
    rdp = t * wor_gaussian_rdp(sampling_ratio, noise_multiplier, a)
    eps, order = rdp_to_epsilon(rdp, a, delta)
    return float(eps), float(order)


def wor_gaussian_delta(
    sampling_ratio: float,
    noise_multiplier: float,
    steps: int,
    epsilon: float,
    orders: ArrayLike = WOR_ORDERS,
) -> float:
    """An upper bound on δ(ε) of ``steps`` WOR-subsampled Gaussian steps (via RDP)."""
    t = _check_steps(steps)
    a = _check_integer_orders(orders)
    rdp = t * wor_gaussian_rdp(sampling_ratio, noise_multiplier, a)
    return float(rdp_to_delta(rdp, a, epsilon)[0])


# ---------------------------------------------------------------------------- lower bound

#: A density, log-density or CDF of the loss variable x, vectorized over numpy arrays.
_Fn = Callable[[np.ndarray], np.ndarray]


def _pairs(gamma: float, sigma: float) -> list[tuple[_Fn, _Fn, _Fn]]:
    """The explicit neighbouring pairs, as (log p(x), log q(x), CDF of P) in units of Δ.

    * *point*: every other record's gradient equals the replacement's, so one dataset always
      outputs N(0, σ²) and the other (1−γ)·N(0, σ²) + γ·N(1, σ²) -- both directions;
    * *mixture*: every other gradient is 0, the replaced record has +C / −C:
      (1−γ)·N(0, σ²) + γ·N(±½, σ²).
    """
    l1g, lg = math.log1p(-gamma), math.log(gamma)

    def normal_logpdf(shift: float) -> _Fn:
        return lambda x: -0.5 * ((x - shift) / sigma) ** 2

    def mixture(shift: float) -> tuple[_Fn, _Fn]:
        base, far = normal_logpdf(0.0), normal_logpdf(shift)
        return (
            lambda x: np.logaddexp(l1g + base(x), lg + far(x)),
            lambda x: (
                (1.0 - gamma) * special.ndtr(x / sigma) + gamma * special.ndtr((x - shift) / sigma)
            ),
        )

    mix1, mix1_cdf = mixture(1.0)
    point, point_cdf = normal_logpdf(0.0), (lambda x: special.ndtr(x / sigma))
    plus, plus_cdf = mixture(0.5)
    minus, _ = mixture(-0.5)
    return [(mix1, point, mix1_cdf), (point, mix1, point_cdf), (plus, minus, plus_cdf)]


def _loss_pmf(
    log_p: _Fn, log_q: _Fn, cdf_p: _Fn, sigma: float, bin_width: float, cells: int
) -> tuple[np.ndarray, int]:
    """PMF (under P) of ⌊L/h⌋ with L = log p/q monotone in x; returns ``(pmf, offset)``."""
    half_width = 1.5 + 14.0 * sigma
    x = np.linspace(-half_width, half_width, cells + 1)
    loss = log_p(x) - log_q(x)
    steps = np.diff(loss)
    if not (np.all(steps >= -1e-12) or np.all(steps <= 1e-12)):  # pragma: no cover
        raise ArithmeticError("privacy loss of the explicit pair is not monotone on the grid")
    low = np.minimum(loss[:-1], loss[1:])  # L on a cell is at least its smaller end value
    mass = np.maximum(np.diff(cdf_p(x)), 0.0)
    bins = np.floor(low / bin_width).astype(np.int64)
    offset = int(bins.min())
    return np.bincount(bins - offset, weights=mass), offset


def _compose_pmf(pmf: np.ndarray, steps: int) -> np.ndarray:
    size = steps * (len(pmf) - 1) + 1
    if size > _MAX_BINS:
        raise ValueError(
            f"steps: the lower bound needs {size} privacy-loss bins (> {_MAX_BINS}); use fewer "
            "steps or a wider bin_width"
        )
    n_fft = 1 << int(math.ceil(math.log2(size)))
    out = np.fft.irfft(np.fft.rfft(pmf, n_fft) ** steps, n_fft)[:size]
    return np.clip(out, 0.0, None)


def _lower_bound_curves(
    gamma: float, sigma: float, steps: int, bin_width: float, cells: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each explicit pair: (composed PMF, privacy-loss values) of ``steps`` steps."""
    out = []
    for log_p, log_q, cdf_p in _pairs(gamma, sigma):
        pmf, offset = _loss_pmf(log_p, log_q, cdf_p, sigma, bin_width, cells)
        composed = _compose_pmf(pmf, steps)
        out.append((composed, (np.arange(len(composed)) + steps * offset) * bin_width))
    return out


def _hockey_stick(curves: list[tuple[np.ndarray, np.ndarray]], eps: float) -> float:
    """max over pairs of E_P[(1 − e^{ε − L})₊]."""
    best = 0.0
    for pmf, losses in curves:
        keep = losses > eps
        best = max(best, float(np.sum(pmf[keep] * -np.expm1(eps - losses[keep]))))
    return min(best, 1.0)


def _lower_inputs(
    sampling_ratio: float, noise_multiplier: float, steps: int, bin_width: float
) -> tuple[float, float, int]:
    g = check_sampling_ratio(sampling_ratio)
    sigma = _check_sigma(noise_multiplier)
    t = _check_steps(steps)
    if not (bin_width > 0 and math.isfinite(bin_width)):
        raise ValueError(f"bin_width: must be a finite number > 0, got {bin_width!r}")
    return g, sigma, t


def wor_gaussian_delta_lower_bound(
    sampling_ratio: float,
    noise_multiplier: float,
    steps: int,
    epsilon: ArrayLike,
    *,
    bin_width: float = 1e-3,
    cells: int = 200_000,
) -> np.ndarray:
    """A lower bound on the true δ(ε) of ``steps`` WOR-subsampled Gaussian steps.

    The largest δ(ε) over a few explicit pairs of neighbouring datasets (module docstring);
    every approximation made here lowers δ, so an accountant reporting less under-reports. Meant
    for moderate ``steps`` (the bins grow linearly with ``steps``; rounding costs at most
    ``steps·bin_width`` of privacy loss).
    """
    g, sigma, t = _lower_inputs(sampling_ratio, noise_multiplier, steps, bin_width)
    e = np.asarray(epsilon, dtype=np.float64)
    if np.any(~np.isfinite(e)) or np.any(e < 0):
        raise ValueError("epsilon: every ε must be a finite number >= 0")
    if g == 0.0 or t == 0:
        return np.zeros_like(e)
    if g == 1.0:  # two Gaussians Δ apart in every step: exactly (√T/σ)-GDP
        from pdpfl.privacy.gdp import gdp_delta

        return np.asarray(gdp_delta(math.sqrt(t) / sigma, e), dtype=np.float64)
    curves = _lower_bound_curves(g, sigma, t, float(bin_width), int(cells))
    flat = [_hockey_stick(curves, float(v)) for v in e.reshape(-1)]
    return np.asarray(flat, dtype=np.float64).reshape(e.shape)


def wor_gaussian_epsilon_lower_bound(
    sampling_ratio: float,
    noise_multiplier: float,
    steps: int,
    delta: float,
    *,
    bin_width: float = 1e-3,
    cells: int = 200_000,
    xtol: float = 1e-4,
) -> float:
    """The largest ε (to ``xtol``, rounded down) at which the lower bound still exceeds δ.

    Every accountant that reports an ε below this value at the same δ under-reports. Never a
    false 0: 0.0 is returned only when it is the truth (no sampling, no steps, or the rigorous
    upper bound's δ(0) is already ≤ δ); when the discretization is too coarse to certify any
    ε > 0 (rounding loses up to ``steps·bin_width`` nats), a ValueError naming ``bin_width``
    says so.
    """
    d = float(delta)
    if not (0.0 < d < 1.0):
        raise ValueError(f"delta: must be in (0, 1), got {delta!r}")
    g, sigma, t = _lower_inputs(sampling_ratio, noise_multiplier, steps, bin_width)
    if g == 0.0 or t == 0:
        return 0.0
    if g == 1.0:
        from pdpfl.privacy.gdp import gdp_epsilon

        return float(gdp_epsilon(math.sqrt(t) / sigma, d))
    curves = _lower_bound_curves(g, sigma, t, float(bin_width), int(cells))
    if _hockey_stick(curves, 0.0) <= d:
        # The discretized pairs certify no ε > 0. That is the truth only if the mechanism's
        # δ(0) (its total variation) is at most δ, which the rigorous upper bound can show;
        # otherwise the rounding (up to steps·bin_width nats of privacy loss) swallowed the
        # bound, and 0 would be a false lower bound.
        if wor_gaussian_delta(g, sigma, t, 0.0) <= d:
            return 0.0
        raise ValueError(
            f"bin_width: the discretized lower bound certifies no ε > 0 here (rounding can lose "
            f"up to steps·bin_width = {t * float(bin_width):.3g} nats of privacy loss over "
            f"{t} steps, while the upper bound's δ(0) exceeds δ = {d:g}); use a smaller "
            "bin_width or fewer steps"
        )
    lo, hi = 0.0, max(float(c[1][-1]) for c in curves)
    while hi - lo > xtol:
        mid = 0.5 * (lo + hi)
        if _hockey_stick(curves, mid) > d:
            lo = mid
        else:
            hi = mid
    return lo
