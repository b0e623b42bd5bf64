"""SAMPLE for clients (Algorithm 1, GetGroupSamplingRates) with the verification flidp lacks.

One noise multiplier σ and one sampling rate q_p per privacy group, such that the
size-weighted mean rate of the private groups is c/N (``clients_per_round`` over the number of
clients) and every group spends at most its ε_p in I rounds of the Poisson-subsampled Gaussian
(spec B.1, docs/idp_fedavg.md):

* the σ search is :func:`pdpfl.calibration.noise.group_sampling_rates` (σ ← s·σ from
  getNoise(ε_1, c/N), then refined to the target mean rate) and getNoise is
  :func:`pdpfl.calibration.noise.noise_for_uniform_rate`; rates are recomputed with the
  calibration's :func:`~pdpfl.calibration.binary_search.bisect_rates` (no search of its own);
* every q_p is then **recomputed at the returned σ** with the exact accountant unless the proposed
  rate is verified to be within budget and maximal (flidp keeps stale rates when a search step
  fails, spec B.7 I1/I2), and ``ε_p(σ, q_p) ≤ ε_p`` and the mean rate are checked;
* non-private groups (ε = ∞) take ``nonprivate_rate`` (default q = 1) and do not constrain σ;
* ``noise="discrete"`` (the central variant under ``privacy.central_noise: discrete``): every ε
  is that of the exact discrete Gaussian's round event
  (:meth:`~pdpfl.privacy.plan.TrainingPlan.step_event`, the event the clients' ledgers charge,
  :mod:`pdpfl.fl.idp_fedavg.central_discrete`), so σ and the rates are fitted to it.

Results are memoized (``functools.lru_cache``): they are pure functions of public numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.unit import PrivacyUnit, SampledGaussianPlan

__all__ = ["GroupRates", "client_plan", "noise_for_rate", "sample_group_rates"]

#: SAMPLE's feasibility probe: no deployment uses a noise multiplier this small.
_SIGMA_FLOOR = 0.01


@dataclass(frozen=True)
class GroupRates:
    """The verified output of SAMPLE: σ and one rate per privacy group.

    ``budgets`` ascending (``inf`` = non-private), ``sizes`` the |G_p| (realized counts or
    nominal ratio × N) used in the search, ``epsilons`` the exact ε of each group at
    (σ, q_p) after ``rounds`` rounds (``inf`` for non-private groups), ``mean_rate`` the
    size-weighted mean rate of the private groups (target: ``target_rate`` = c/N).
    """

    budgets: tuple[float, ...]
    sizes: tuple[float, ...]
    rates: tuple[float, ...]
    noise_multiplier: float | None
    epsilons: tuple[float, ...]
    target_rate: float
    mean_rate: float
    delta: float
    rounds: int


def client_plan(sigma: float, delta: float, rounds: int, noise: str = "continuous") -> TrainingPlan:
    """I rounds of one Poisson-subsampled Gaussian (the client's mechanism, spec B.4) as the
    equivalent :class:`~pdpfl.privacy.plan.TrainingPlan` of the fast accountant paths; with
    ``noise="discrete"`` its step is the central discrete Gaussian's event (T rounds of
    ``PoissonSampled(q, DistributedDiscreteGaussian(σ², 1, 1, 1))``)."""
    plan = SampledGaussianPlan(PrivacyUnit.CLIENT, float(sigma), float(delta), int(rounds))
    if noise == "discrete":
        return replace(plan.as_training_plan(), noise="discrete")
    if noise != "continuous":
        raise ValueError(f"noise: expected continuous or discrete, got {noise!r}")
    return plan.as_training_plan()


def _exact_eps(
    rates: np.ndarray,
    sigma: float,
    delta: float,
    rounds: int,
    accountant: str = "rdp",
    noise: str = "continuous",
) -> np.ndarray:
    from pdpfl.calibration import exact_epsilon

    q = np.asarray(rates, dtype=np.float64)
    out = np.zeros(q.shape)
    pos = q > 0
    if pos.any():
        out[pos] = exact_epsilon(
            q[pos],
            client_plan(sigma, delta, rounds, noise),
            "third-party",
            accountant=accountant,
        )
    return out


@lru_cache(maxsize=64)
def noise_for_rate(
    epsilon: float,
    rate: float,
    delta: float,
    rounds: int,
    accountant: str = "rdp",
    noise: str = "continuous",
) -> float:
    """getNoise(ε, δ, q, I): the smallest σ (to the search's tolerance) with ε(q, σ) ≤ ε for I
    Poisson(q)-subsampled Gaussian rounds under ``accountant`` (``noise="discrete"``: the
    central discrete Gaussian's rounds; memoized: a pure function of public values)."""
    from pdpfl.calibration.noise import noise_for_uniform_rate

    return float(
        noise_for_uniform_rate(
            float(epsilon),
            float(rate),
            client_plan(1.0, delta, rounds, noise),
            accountant=accountant,
        )
    )


def sample_group_rates(
    budgets: ArrayLike,
    sizes: ArrayLike,
    target_rate: float,
    *,
    delta: float,
    rounds: int,
    nonprivate_rate: float = 1.0,
    rate_tol: float = 1e-3,
    q_tol: float = 1e-6,
    accountant: str = "rdp",
    noise: str = "continuous",
) -> GroupRates:
    """Algorithm 1 (GetGroupSamplingRates) with the verification flidp lacks.

    ``budgets`` are the distinct group budgets (``inf`` = non-private), ``sizes`` the group
    sizes (counts, or nominal fractions: only their proportions matter). Private groups share
    one σ and are sampled on average at ``target_rate`` (= c/N); non-private groups take
    ``nonprivate_rate`` and do not constrain σ.

    The search (σ ← s·σ from getNoise(ε_1, c/N), refined to the target mean rate) is
    :func:`pdpfl.calibration.noise.group_sampling_rates`. Then every rate is recomputed at the
    returned σ with the exact accountant (never a value kept from an earlier σ), each group's ε at
    (σ, q_p) is evaluated and must be ≤ its budget, and the mean rate must lie within
    ``rate_tol`` (relative) below the target (at least twice the relative step of a rate grid
    the accountant rounds rates up to: 2 % with ``pld``). Any failure raises ``RuntimeError``.
    Every ε is computed by ``accountant`` (``rdp``, ``pld``, ...: the clients' ledgers use the
    same); ``noise="discrete"``: of the central discrete Gaussian's rounds (:func:`client_plan`).
    """
    eps = np.asarray(budgets, dtype=np.float64).reshape(-1)
    size = np.asarray(sizes, dtype=np.float64).reshape(-1)
    if eps.size == 0 or eps.shape != size.shape:
        raise ValueError("budgets/sizes: need two non-empty sequences of equal length")
    return _sample_cached(
        tuple(eps.tolist()),
        tuple(size.tolist()),
        float(target_rate),
        float(delta),
        int(rounds),
        float(nonprivate_rate),
        float(rate_tol),
        float(q_tol),
        str(accountant),
        str(noise),
    )


def _check(eps: np.ndarray, size: np.ndarray, target_rate: float, nonprivate_rate: float) -> None:
    if np.isnan(eps).any() or (eps <= 0).any():
        raise ValueError("budgets: every group ε must be > 0 (inf = non-private)")
    if np.isnan(size).any() or (size < 0).any() or size.sum() <= 0:
        raise ValueError("sizes: must be >= 0 and not all zero")
    if not 0 < target_rate <= 1:
        raise ValueError(f"target_rate: must be in (0, 1], got {target_rate!r}")
    if not 0 < nonprivate_rate <= 1:
        raise ValueError(f"nonprivate_rate: must be in (0, 1], got {nonprivate_rate!r}")


@lru_cache(maxsize=32)
def _sample_cached(
    budgets: tuple[float, ...],
    sizes: tuple[float, ...],
    target_rate: float,
    delta: float,
    rounds: int,
    nonprivate_rate: float,
    rate_tol: float,
    q_tol: float,
    accountant: str = "rdp",
    noise: str = "continuous",
) -> GroupRates:
    from pdpfl.calibration import noise as calibration
    from pdpfl.calibration.binary_search import bisect_rates

    eps = np.asarray(budgets, dtype=np.float64).reshape(-1)
    size = np.asarray(sizes, dtype=np.float64).reshape(-1)
    _check(eps, size, target_rate, nonprivate_rate)
    rate_tol = max(rate_tol, _rate_resolution(accountant))
    order = np.argsort(eps, kind="stable")
    eps, size = eps[order], size[order]
    private = np.isfinite(eps)
    rates = np.where(private, 0.0, float(nonprivate_rate))
    epsilons = np.where(private, 0.0, np.inf)
    live = private & (size > 0)
    if not live.any():  # nothing private is sampled: no noise needed for anyone
        return GroupRates(
            _floats(eps),
            _floats(size),
            _floats(rates),
            None,
            _floats(epsilons),
            float(target_rate),
            float(target_rate),
            float(delta),
            int(rounds),
        )
    p_eps, p_size = eps[live], size[live]
    weights = p_size / p_size.sum()
    # Feasibility: a budget so large that q = 1 fits it even at σ = 0.01 keeps its group at
    # q = 1 for every usable σ; if such groups alone exceed c/N the search could never end.
    floor = _exact_eps(np.array([1.0]), _SIGMA_FLOOR, delta, rounds, accountant, noise)
    huge = p_eps >= float(floor[0])
    if huge.any() and float(weights[huge].sum()) >= target_rate:
        raise ValueError(
            f"budgets: the groups with ε = {sorted(set(p_eps[huge].tolist()))} are sampled with "
            f"q = 1 at any usable σ and alone exceed c/N = {target_rate:.4g}; declare them "
            "non-private (.inf, rate algorithm.nonprivate_rate) or raise clients_per_round"
        )
    single = np.unique(p_eps).size == 1
    if single:  # one private group: the standard getNoise(ε, c/N), and q = c/N itself
        sigma = noise_for_rate(float(p_eps[0]), target_rate, delta, rounds, accountant, noise)
        proposed = np.where(eps[private] == p_eps[0], target_rate, np.nan)
    else:
        found_sigma, found = calibration.group_sampling_rates(
            p_eps,
            p_size,
            target_rate,
            client_plan(1.0, delta, rounds, noise),
            rate_tol=rate_tol,
            accountant=accountant,
        )
        sigma = float(found_sigma)
        lookup = dict(
            zip(p_eps.tolist(), np.asarray(found, dtype=np.float64).tolist(), strict=True)
        )
        proposed = np.array([lookup.get(float(e), np.nan) for e in eps[private]])

    # Verification at the returned σ: a proposed rate is kept only if it is within its budget
    # and (except the single-group c/N) the largest such rate up to q_tol -- i.e. it was
    # computed at this σ; otherwise (stale, missing, over budget) it is recomputed with the
    # calibration's bisection (pdpfl.calibration.binary_search.bisect_rates).
    def eps_of(q: np.ndarray) -> np.ndarray:
        return _exact_eps(q, sigma, delta, rounds, accountant, noise)

    fresh = proposed.copy()
    ok = np.isfinite(proposed) & (proposed >= 0) & (proposed <= 1)
    if ok.any():
        within = eps_of(np.where(ok, proposed, 0.0)) <= eps[private]
        ok &= within
        if not single:
            nxt = np.minimum(1.0, np.where(ok, proposed, 0.0) + 2 * q_tol)
            maximal = (proposed >= 1.0) | (eps_of(nxt) > eps[private])
            ok &= maximal
    if (~ok).any():
        fresh[~ok] = bisect_rates(eps[private][~ok], eps_of, q_tol=q_tol)
    rates[private] = fresh
    epsilons[private] = eps_of(fresh)
    over = private & (epsilons > eps)
    if over.any():
        raise RuntimeError(
            f"SAMPLE verification failed: group(s) {eps[over].tolist()} would spend "
            f"{epsilons[over].tolist()} at σ = {sigma:.6g}"
        )
    mean = float(weights @ rates[live])
    if not (target_rate * (1 - rate_tol) - q_tol <= mean <= target_rate * (1 + 1e-9) + q_tol):
        raise RuntimeError(
            f"SAMPLE verification failed: mean rate {mean:.6g} is not within {rate_tol:g} "
            f"(relative) below the target c/N = {target_rate:.6g} at σ = {sigma:.6g}"
        )
    return GroupRates(
        _floats(eps),
        _floats(size),
        _floats(rates),
        sigma,
        _floats(epsilons),
        float(target_rate),
        mean,
        float(delta),
        int(rounds),
    )


def _rate_resolution(accountant: str) -> float:
    """How closely rates can match a target under ``accountant``: the PLD accountant rounds
    rates up to a geometric grid (relative step r), so a group's largest feasible rate moves in
    steps of r and the mean rate is matched to within 2r; 0 for accountants of exact rates."""
    from pdpfl.privacy.registry import make_accountant

    step = getattr(make_accountant(accountant), "rate_grid_rel_step", 0.0)
    return 2.0 * float(step)


def _floats(values: np.ndarray) -> tuple[float, ...]:
    return tuple(float(v) for v in np.asarray(values).reshape(-1))
