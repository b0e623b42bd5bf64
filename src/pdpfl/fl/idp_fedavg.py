"""IDP-FedAvg: every client its own ε through individualized client sampling.

Lange, Borchardt & Rahm, "Federated Learning With Individualized Privacy Through Client
Sampling" (arXiv 2501.17634; reference code luckyos-code/flidp). The privacy unit is a whole
client; equations and algorithm numbers below are the paper's (restated in the spec,
``uldp-fl_idp-fedavg.md`` Part B).

Server, once before round 1 (:func:`setup`, public, reads no data):

* each client's budget ε_i -- privacy groups with ratios (``group_budgets``/``group_ratios``;
  ε = ∞ for non-private clients) or one ε per client from ``budget_file``;
* **SAMPLE** (Algorithm 1, GetGroupSamplingRates; :func:`sample_group_rates`): one noise
  multiplier σ and per-group rates q_p so that the expected number of sampled clients per round
  is c (``clients_per_round``). The search is :func:`pdpfl.calibrate.group_sampling_rates`;
  afterwards every q_p is **recomputed at the returned σ** with the exact accountant and
  ``ε_p(σ, q_p) ≤ target`` is verified for every group (flidp keeps stale rates when a search
  step fails, spec B.7 I1/I2). Non-private groups (ε = ∞) take ``nonprivate_rate`` (default
  q = 1) and do not constrain σ. Group fractions are the realized ones (default) or the nominal
  ratios (``rate_fractions``; spec I3);
* the comparison methods (``method``): ``strict``/``relaxed`` (everyone at ε_min / ε_max, uniform
  rate c/N), ``scale`` (Boenisch et al.'s SCALE, spec B.2: uniform rate, per-group clip
  C_p = C·σ̄/σ_p, one noise σ̄·C) and ``no-dp`` (same sampling, no clipping, no noise).

Each round (Algorithm 2, made exact as in spec B.3):

1. sampling -- one independent Bernoulli(q_{g(i)}) per client, no redraw of an empty round;
2. each sampled client trains E local epochs (``local_epochs``; ``local_batch_size``; the
   ``training`` optimizer, Adam 5e-4 in the paper) from the global model and forms Δ_i;
3. clipping to C_t, sum, Gaussian noise N(0, σ_v²C_t²), division by the public denominator
   (the expected number of sampled clients, c up to SAMPLE's tolerance), θ ← θ + η_s·mean;
4. adaptive clipping (Andrew et al. 2021, geometric rule; :func:`clip_update`): the noisy
   fraction of unclipped updates b̃_t (count noise σ_b = 0.05·c) moves
   C_{t+1} = C_t·exp(−η_C(b̃_t − γ)). The noise is split σ → (σ_v, 2σ_b) with
   σ_v = (σ⁻² − (2σ_b)⁻²)^(−1/2) (:func:`split_noise`), so value and count queries compose to
   one Gaussian of multiplier σ, which is what the accountant charges. C_t is public.

Two trust models (``variant``):

``central`` (the paper)
    The aggregator is trusted: it samples the clients (so it knows every client's privacy
    group), receives each sampled client's *unclipped* update, clips, adds the noise and the
    count noise with its own randomness. The guarantee is against everyone who sees the models
    (third parties), not against the aggregator. The server declares
    ``needs_individual_updates``; secure summation is refused.
``distributed``
    Every client is asked every round; it flips its own coin with q_{g(i)} from its own
    randomness, clips its update to the public C_t when sampled (a zero vector otherwise), and
    adds its share N(0, σ_v²C_t²/M) of the noise (M = clients asked − ``tolerated_dropouts``)
    and a share of the count noise. The server learns only sums; with secure summation
    (``aggregation`` other than ``plain``) the guarantee also holds against the server, which
    then learns neither who was sampled nor the groups. With ``aggregation: plain`` the server
    sees each low-noise share: no guarantee against the server. A coalition of k clients that
    pools its shares removes a fraction k/M of the noise variance; more than
    ``tolerated_dropouts`` lost clients leave less noise than accounted.

Accounting per client: ``SampledGaussianPlan("client", σ_eff, δ, I)`` with the client's rate
q_{g(i)}: each client's ledger (:class:`pdpfl.ledger.PrivacyLedger`, stays at the client) is
charged every round and stops the client (it then releases nothing that depends on its data)
before it would exceed its budget.

Local training of the sampled clients of one process runs as one batched computation
(:func:`pdpfl.dp.batched.train_copies`) through a per-process :class:`_Cohort`; see
``local_training`` for when the per-client loop is faster (conv nets on CPU).
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from pdpfl.fl.api import Aggregate, Contribution, FederationInfo, Params, Scalars
from pdpfl.fl.common import initial_params, silo_model
from pdpfl.fl.registry import (
    AlgorithmConfig,
    AlgorithmSpec,
    MethodSpec,
    register_algorithm,
    register_method,
)
from pdpfl.randomness import Randomness

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pdpfl.config import ExperimentConfig

__all__ = [
    "GroupRates",
    "IdpFedAvgClient",
    "IdpFedAvgConfig",
    "IdpFedAvgServer",
    "IdpSetup",
    "assign_client_budgets",
    "clip_update",
    "label_of",
    "noise_for_rate",
    "sample_group_rates",
    "scale_noise",
    "setup",
    "split_noise",
]

METHODS = ("individual", "strict", "relaxed", "scale", "no-dp")
#: Tolerance when comparing spent ε with a budget (floating-point noise only).
_EPS_TOL = 1e-9


# ------------------------------------------------------------------------------ configuration


class IdpFedAvgConfig(AlgorithmConfig):
    """IDP-FedAvg (Algorithms 1 and 2) and its comparison methods (``method``).

    Uses ``training.rounds`` (I), ``training.optimizer/lr/momentum/weight_decay`` (the local
    optimizer; the paper: Adam, 5e-4) and ``privacy.delta``. ``training.local_steps``,
    ``training.client_rate``, ``training.batch_size``, ``privacy.noise_multiplier``/
    ``epsilon_max`` and the ``budgets`` section are record-level settings it does not use.
    """

    name: Literal["idp-fedavg"] = "idp-fedavg"
    method: Literal["individual", "strict", "relaxed", "scale", "no-dp"] = Field(
        "individual",
        description="individual: IDP-FedAvg (SAMPLE); strict/relaxed: everyone at ε_min/ε_max; "
        "scale: per-group clipping (SCALE); no-dp: no clipping, no noise",
    )
    variant: Literal["central", "distributed"] = Field(
        "central",
        description="central: trusted aggregator clips and noises (the paper); distributed: "
        "clients self-sample, clip and add noise shares (for secure summation)",
    )
    clients_per_round: float = Field(30.0, gt=0, description="c: expected sampled clients")
    group_budgets: list[float] = Field(
        default_factory=lambda: [1.0, 2.0, 3.0],
        description="ε of each privacy group (.inf for non-private clients)",
        json_schema_extra={"allow_infinity": True},
    )
    group_ratios: list[float] = Field(
        default_factory=lambda: [0.54, 0.37, 0.09], description="fraction of clients per group"
    )
    budget_file: str | None = Field(
        None, description="one ε per client (.csv/.txt one per line, .json list or .npy; inf ok)"
    )
    assignment: Literal["iid", "exact"] = Field(
        "iid",
        description="iid: each client draws its group with the ratios (flidp); exact: the "
        "counts are the ratios × N (largest remainder), shuffled",
    )
    rate_fractions: Literal["realized", "nominal"] = Field(
        "realized", description="group fractions entering SAMPLE: realized counts or the ratios"
    )
    nonprivate_rate: float = Field(1.0, gt=0, le=1, description="q of ε = ∞ clients")
    sample_tolerance: float = Field(
        1e-3, gt=0, lt=0.5, description="relative tolerance of SAMPLE's mean rate vs c/N"
    )
    local_epochs: int = Field(15, ge=1, le=10_000, description="E local epochs")
    local_batch_size: int = Field(128, ge=1, description="local minibatch size")
    local_training: Literal["auto", "batched", "loop"] = Field(
        "auto",
        description="batched: all sampled clients of a process as one vmap computation; loop: "
        "one client at a time; auto: loop for conv nets on CPU (faster there), else batched",
    )
    clipping: Literal["adaptive", "fixed"] = "adaptive"
    initial_clip: float = Field(0.1, gt=0, description="C_0 (fixed clipping: C)")
    target_quantile: float = Field(0.5, gt=0, lt=1, description="γ")
    clip_lr: float = Field(0.2, gt=0, description="η_C of the geometric update")
    count_noise_ratio: float = Field(0.05, gt=0, description="σ_b = ratio × c")
    server_lr: float = Field(1.0, gt=0, description="η_s")
    tolerated_dropouts: int = Field(
        0, ge=0, description="distributed variant: clients that may drop with full noise"
    )

    def check(self, config: ExperimentConfig) -> list[str]:
        problems: list[str] = []
        if len(self.group_budgets) != len(self.group_ratios):
            problems.append(
                "algorithm.group_ratios: one ratio per entry of algorithm.group_budgets "
                f"({len(self.group_ratios)} vs {len(self.group_budgets)})"
            )
        if any(not (b > 0) for b in self.group_budgets):
            problems.append("algorithm.group_budgets: every ε must be > 0 (.inf = non-private)")
        if len(set(self.group_budgets)) != len(self.group_budgets):
            problems.append("algorithm.group_budgets: budgets must be distinct")
        if any(not (r >= 0 and math.isfinite(r)) for r in self.group_ratios) or not math.isclose(
            sum(self.group_ratios), 1.0, abs_tol=1e-6
        ):
            problems.append("algorithm.group_ratios: must be finite, >= 0 and sum to 1")
        if self.variant == "central" and config.aggregation != "plain":
            problems.append(
                "algorithm.variant: central IDP-FedAvg clips each client's update at the "
                f"aggregator, which the {config.aggregation!r} protocol hides; use variant: "
                "distributed (clients clip and add noise shares) or aggregation: plain"
            )
        if self.variant == "central" and config.privacy.adversary == "server":
            problems.append(
                "privacy.adversary: the central variant trusts the aggregator (it sees clipped "
                "updates); its guarantee is against third parties -- use third-party/both, or "
                "variant: distributed with secure aggregation"
            )
        n = config.data.num_clients
        if n is not None and self.clients_per_round > n:
            problems.append(
                f"algorithm.clients_per_round: c = {self.clients_per_round:g} exceeds the "
                f"{n} clients (data.num_clients)"
            )
        finite = [b for b in self.group_budgets if math.isfinite(b)]
        if (
            self.method in ("strict", "relaxed", "scale")
            and not finite
            and self.budget_file is None
        ):
            problems.append(f"algorithm.method: {self.method} needs at least one finite budget")
        return problems


# --------------------------------------------------------------------------- budgets per client


def label_of(budget: float) -> str:
    """The report label of a privacy group (``"1"``, ``"0.6"``, ``"inf"``)."""
    return "inf" if math.isinf(budget) else f"{budget:g}"


def _largest_remainder(total: int, ratios: np.ndarray) -> np.ndarray:
    ideal = total * ratios / ratios.sum()
    counts = np.floor(ideal).astype(np.int64)
    rest = total - int(counts.sum())
    order = np.argsort(-(ideal - counts), kind="stable")
    counts[order[:rest]] += 1
    return counts


def read_budget_file(path: str | Path) -> np.ndarray:
    """ε per client from ``.npy``, ``.json`` (a list) or text/CSV (one number per line; ``inf``
    allowed, an optional header line is skipped). No pickle."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"algorithm.budget_file: {p} does not exist")
    try:
        if p.suffix.lower() == ".npy":
            values = np.load(p, allow_pickle=False)
        elif p.suffix.lower() == ".json":
            values = np.asarray(json.loads(p.read_text()), dtype=np.float64)
        else:
            lines = [ln.split(",")[0].strip() for ln in p.read_text().splitlines()]
            lines = [ln for ln in lines if ln]
            if lines and not _is_number(lines[0]):
                lines = lines[1:]
            values = np.asarray([float(v) for v in lines], dtype=np.float64)
    except (ValueError, OSError, TypeError) as exc:
        raise ValueError(
            f"algorithm.budget_file: {p.name} is not a list of numbers ({exc})"
        ) from None
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if values.size == 0 or np.isnan(values).any() or (values <= 0).any():
        raise ValueError(f"algorithm.budget_file: {p.name} needs one ε > 0 per client (inf ok)")
    return values


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _ratios(algo: IdpFedAvgConfig) -> tuple[np.ndarray, np.ndarray]:
    budgets = np.asarray(algo.group_budgets, dtype=np.float64)
    ratios = np.asarray(algo.group_ratios, dtype=np.float64)
    return budgets, ratios / ratios.sum()


@lru_cache(maxsize=8)
def _exact_assignment(budgets: tuple, ratios: tuple, seed: int, n: int) -> np.ndarray:
    from pdpfl.seeding import numpy_generator

    counts = _largest_remainder(n, np.asarray(ratios))
    values = np.repeat(np.asarray(budgets), counts)
    out = values[numpy_generator(seed, "idp-budgets").permutation(n)]
    out.setflags(write=False)
    return out


@lru_cache(maxsize=8)
def _file_budgets(path: str, mtime: float) -> np.ndarray:
    out = read_budget_file(path)
    out.setflags(write=False)
    return out


def _iid_budget(budgets: np.ndarray, ratios: np.ndarray, seed: int, i: int) -> float:
    from pdpfl.seeding import numpy_generator

    cum = np.cumsum(ratios)
    cum[-1] = 1.0
    u = numpy_generator(seed, "idp-budgets", int(i)).random()
    return float(budgets[min(int(np.searchsorted(cum, u, side="right")), len(budgets) - 1)])


def client_budget(algo: IdpFedAvgConfig, seed: int, num_clients: int, client_id: int) -> float:
    """ε of one client, computed where it is needed (see :func:`assign_client_budgets`)."""
    n, i = int(num_clients), int(client_id)
    if not 0 <= i < n:
        raise ValueError(f"client_id: must be in [0, {n}), got {client_id}")
    if algo.budget_file is not None or algo.assignment == "exact":
        return float(assign_client_budgets(algo, seed, n)[i])
    budgets, ratios = _ratios(algo)
    return _iid_budget(budgets, ratios, seed, i)


def assign_client_budgets(algo: IdpFedAvgConfig, seed: int, num_clients: int) -> np.ndarray:
    """ε of every client (``inf`` = non-private): from ``budget_file`` or the privacy groups.

    A pure function of the configuration (the clients' privacy choices are part of the simulated
    data): ``iid`` draws client i's group from ``numpy_generator(seed, "idp-budgets", i)``
    (flidp draws i.i.d., unseeded); ``exact`` deals round(ratio·N) budgets (largest remainder)
    in a seeded random order. In the central variant the server needs these memberships to sample
    clients at q_{g(i)} (as in the paper); each client computes only its own entry
    (:func:`client_budget`).
    """
    n = int(num_clients)
    if algo.budget_file is not None:
        path = Path(algo.budget_file)
        if not path.is_file():
            raise ValueError(f"algorithm.budget_file: {path} does not exist")
        values = _file_budgets(str(path.resolve()), path.stat().st_mtime)
        if values.size != n:
            raise ValueError(
                f"algorithm.budget_file: {values.size} budgets for {n} clients (one per client)"
            )
        return values.copy()
    budgets, ratios = _ratios(algo)
    if algo.assignment == "exact":
        return _exact_assignment(
            tuple(budgets.tolist()), tuple(ratios.tolist()), int(seed), n
        ).copy()
    return np.array([_iid_budget(budgets, ratios, seed, i) for i in range(n)])


# ------------------------------------------------------------------------- SAMPLE (Algorithm 1)


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


def _client_plan(sigma: float, delta: float, rounds: int):  # -> TrainingPlan
    from pdpfl.privacy.unit import SampledGaussianPlan

    return SampledGaussianPlan("client", float(sigma), float(delta), int(rounds)).as_training_plan()


def _exact_eps(rates: np.ndarray, sigma: float, delta: float, rounds: int) -> np.ndarray:
    from pdpfl.calibration._accounting import exact_epsilon

    q = np.asarray(rates, dtype=np.float64)
    out = np.zeros(q.shape)
    pos = q > 0
    if pos.any():
        out[pos] = exact_epsilon(q[pos], _client_plan(sigma, delta, rounds), "third-party")
    return out


#: SAMPLE's feasibility probe: no deployment uses a noise multiplier this small.
_SIGMA_FLOOR = 0.01


@lru_cache(maxsize=64)
def noise_for_rate(epsilon: float, rate: float, delta: float, rounds: int) -> float:
    """getNoise(ε, δ, q, I): the smallest σ (to the search's tolerance) with ε(q, σ) ≤ ε for I
    Poisson(q)-subsampled Gaussian rounds (memoized: a pure function of public values)."""
    from pdpfl.calibration.noise import noise_for_uniform_rate

    return float(noise_for_uniform_rate(
        float(epsilon), float(rate), _client_plan(1.0, delta, rounds)
    ))


def sample_group_rates(
    budgets: Sequence[float],
    sizes: Sequence[float],
    target_rate: float,
    *,
    delta: float,
    rounds: int,
    nonprivate_rate: float = 1.0,
    rate_tol: float = 1e-3,
    q_tol: float = 1e-6,
) -> GroupRates:
    """Algorithm 1 (GetGroupSamplingRates) with the verification flidp lacks.

    ``budgets`` are the distinct group budgets (``inf`` = non-private), ``sizes`` the group
    sizes (counts, or nominal fractions: only their proportions matter). Private groups share
    one σ and are sampled on average at ``target_rate`` (= c/N); non-private groups take
    ``nonprivate_rate`` and do not constrain σ.

    The search (σ ← s·σ from getNoise(ε_1, c/N), refined to the target mean rate) is
    :func:`pdpfl.calibrate.group_sampling_rates`. Then every rate is recomputed at the returned
    σ by bisection with the exact accountant (never a value kept from an earlier σ), each
    group's ε at (σ, q_p) is evaluated and must be ≤ its budget, and the mean rate must lie
    within ``rate_tol`` (relative) below the target. Any failure raises ``RuntimeError``.
    """
    eps = np.asarray(budgets, dtype=np.float64).reshape(-1)
    size = np.asarray(sizes, dtype=np.float64).reshape(-1)
    if eps.size == 0 or eps.shape != size.shape:
        raise ValueError("budgets/sizes: need two non-empty sequences of equal length")
    return _sample_cached(
        tuple(eps.tolist()), tuple(size.tolist()), float(target_rate), float(delta),
        int(rounds), float(nonprivate_rate), float(rate_tol), float(q_tol),
    )


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
) -> GroupRates:
    from pdpfl.calibrate import group_sampling_rates
    from pdpfl.calibration.binary_search import bisect_rates

    eps = np.asarray(budgets, dtype=np.float64).reshape(-1)
    size = np.asarray(sizes, dtype=np.float64).reshape(-1)
    if eps.size == 0 or eps.shape != size.shape:
        raise ValueError("budgets/sizes: need two non-empty sequences of equal length")
    if np.isnan(eps).any() or (eps <= 0).any():
        raise ValueError("budgets: every group ε must be > 0 (inf = non-private)")
    if np.isnan(size).any() or (size < 0).any() or size.sum() <= 0:
        raise ValueError("sizes: must be >= 0 and not all zero")
    if not 0 < target_rate <= 1:
        raise ValueError(f"target_rate: must be in (0, 1], got {target_rate!r}")
    if not 0 < nonprivate_rate <= 1:
        raise ValueError(f"nonprivate_rate: must be in (0, 1], got {nonprivate_rate!r}")
    order = np.argsort(eps, kind="stable")
    eps, size = eps[order], size[order]
    private = np.isfinite(eps)
    rates = np.where(private, 0.0, float(nonprivate_rate))
    epsilons = np.where(private, 0.0, np.inf)
    live = private & (size > 0)
    if not live.any():  # nothing private is sampled: no noise needed for anyone
        return GroupRates(
            _floats(eps), _floats(size), _floats(rates), None, _floats(epsilons),
            float(target_rate), float(target_rate), float(delta), int(rounds),
        )
    plan = _client_plan(1.0, delta, rounds)
    p_eps, p_size = eps[live], size[live]
    weights = p_size / p_size.sum()
    # Feasibility: a budget so large that q = 1 fits it even at σ = 0.01 keeps its group at
    # q = 1 for every usable σ; if such groups alone exceed c/N the search could never end.
    huge = p_eps >= float(_exact_eps(np.array([1.0]), _SIGMA_FLOOR, delta, rounds)[0])
    if huge.any() and float(weights[huge].sum()) >= target_rate:
        raise ValueError(
            f"budgets: the groups with ε = {sorted(set(p_eps[huge].tolist()))} are sampled with "
            f"q = 1 at any usable σ and alone exceed c/N = {target_rate:.4g}; declare them "
            "non-private (.inf, rate algorithm.nonprivate_rate) or raise clients_per_round"
        )
    single = np.unique(p_eps).size == 1
    if single:  # one private group: the standard getNoise(ε, c/N), and q = c/N itself
        sigma = noise_for_rate(float(p_eps[0]), target_rate, delta, rounds)
        proposed = np.where(eps[private] == p_eps[0], target_rate, np.nan)
    else:
        sigma, found = group_sampling_rates(p_eps, p_size, target_rate, plan, rate_tol=rate_tol)
        sigma = float(sigma)
        lookup = dict(zip(p_eps.tolist(), np.asarray(found, dtype=np.float64).tolist(),
                          strict=True))
        proposed = np.array([lookup.get(float(e), np.nan) for e in eps[private]])

    # Verification at the returned σ: a proposed rate is kept only if it is within its budget
    # and (except the single-group c/N) the largest such rate up to q_tol -- i.e. it was
    # computed at this σ; otherwise (stale, missing, over budget) it is recomputed by bisection.
    def eps_of(q: np.ndarray) -> np.ndarray:
        return _exact_eps(q, sigma, delta, rounds)

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
        _floats(eps), _floats(size), _floats(rates), sigma, _floats(epsilons),
        float(target_rate), mean, float(delta), int(rounds),
    )


def _floats(values: np.ndarray) -> tuple[float, ...]:
    return tuple(float(v) for v in np.asarray(values).reshape(-1))


# ------------------------------------------------------------------ adaptive clipping (Alg. 2)


def split_noise(sigma: float, count_std: float) -> float:
    """σ_v with 1/σ² = 1/σ_v² + 1/(2σ_b)² (Andrew et al. 2021): the value query's multiplier.

    The count query (each client adds 1[‖Δ‖ ≤ C] − ½: sensitivity ½, noise std σ_b) is a
    Gaussian of multiplier 2σ_b; the two compose to one Gaussian of multiplier σ.
    """
    s, b = float(sigma), 2.0 * float(count_std)
    if not (s > 0 and b > 0):
        raise ValueError("sigma and count_std must be > 0")
    if s >= b:
        raise ValueError(
            f"algorithm.count_noise_ratio: the noise multiplier σ = {s:.4g} is not below "
            f"2σ_b = {b:.4g}; adaptive clipping cannot split it -- raise "
            "algorithm.count_noise_ratio or clients_per_round, or use clipping: fixed"
        )
    return (s**-2 - b**-2) ** -0.5


def clip_update(clip: float, unclipped_fraction: float, quantile: float, lr: float) -> float:
    """The geometric rule: C_{t+1} = C_t · exp(−η_C (b̃_t − γ)), b̃_t clipped to [0, 1]."""
    b = min(1.0, max(0.0, float(unclipped_fraction)))
    return float(clip) * math.exp(-float(lr) * (b - float(quantile)))


def scale_noise(
    sigmas: Sequence[float], fractions: Sequence[float], count_std: float | None
) -> tuple[float, float, list[float], list[float]]:
    """SCALE (spec B.2) under DP-FedAvg: (σ̄, σ̄_v, clip factors C_p/C, effective σ per group).

    σ̄ = Σ r_p σ_p; group p is clipped to C_p = C·σ̄/σ_p and one noise N(0, (σ̄_v C)²) is added,
    so its value multiplier is σ̄_v·σ_p/σ̄. With adaptive clipping (``count_std`` = σ_b) the count
    query (multiplier 2σ_b for every group) must fit too: σ̄_v = σ̄ / sqrt(1 − σ_max²/(2σ_b)²)
    makes the strictest group compose to exactly σ_max and every other group to at least σ_p
    (returned, used by the accountant). Without adaptive clipping σ̄_v = σ̄ and group p's
    multiplier is exactly σ_p.
    """
    s = np.asarray(sigmas, dtype=np.float64)
    r = np.asarray(fractions, dtype=np.float64)
    r = r / r.sum()
    bar = float(r @ s)
    factors = (bar / s).tolist()
    if count_std is None:
        return bar, bar, factors, s.tolist()
    b = 2.0 * float(count_std)
    if s.max() >= b:
        split_noise(float(s.max()), float(count_std))  # raises with the explanation
    bar_v = bar / math.sqrt(1.0 - (s.max() / b) ** 2)
    eff = (1.0 / ((bar / (bar_v * s)) ** 2 + b**-2)) ** 0.5
    return bar, bar_v, factors, eff.tolist()


# --------------------------------------------------------------------------------- setup


@dataclass
class IdpSetup:
    """What the server publishes before round 1 (JSON-able; ∞ is written as ``None``).

    ``budgets`` are the privacy groups' own budgets (ascending), ``assigned`` what each group
    is accounted against under ``method`` (ε_min for strict, ...; ``None`` = no DP), ``rates``
    the sampling rates, ``noise_multipliers`` the effective σ each group's accountant uses,
    ``clip_factors`` C_p/C (SCALE), ``denominator`` the public divisor of the sum.
    """

    method: str
    variant: str
    delta: float
    rounds: int
    num_clients: int
    clients_per_round: float
    budgets: list[float]
    sizes: list[float]
    assigned: list[float | None]
    rates: list[float]
    noise_multipliers: list[float | None]
    clip_factors: list[float]
    noise_multiplier: float | None
    value_noise_multiplier: float | None
    count_noise_std: float | None
    denominator: float
    clipping: str
    initial_clip: float
    target_quantile: float
    clip_lr: float
    server_lr: float
    asked_per_round: int
    tolerated_dropouts: int
    local: dict[str, Any]
    strategy: str
    rate_fractions: str
    observers: list[str]
    cohort: str = field(default_factory=lambda: secrets.token_hex(8))

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        for key in ("budgets", "assigned"):
            d[key] = [None if (v is None or math.isinf(v)) else float(v) for v in d[key]]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IdpSetup:
        d = dict(d)
        d["budgets"] = [math.inf if v is None else float(v) for v in d["budgets"]]
        return cls(**d)

    def group_of(self, budget: float) -> int:
        """Index of the privacy group whose budget is ``budget``."""
        for g, b in enumerate(self.budgets):
            if b == budget or (math.isinf(b) and math.isinf(budget)):
                return g
        raise ValueError(f"budget {budget!r} is not one of the published groups {self.budgets}")

    @property
    def private(self) -> bool:
        return self.method != "no-dp"

    @property
    def adaptive(self) -> bool:
        return self.private and self.clipping == "adaptive"


def _groups(budgets_per_client: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    levels, counts = np.unique(budgets_per_client, return_counts=True)
    return levels, counts.astype(np.float64)


def _observers(config: ExperimentConfig, variant: str) -> list[str]:
    if variant == "distributed" and config.aggregation != "plain":
        return ["third-party", "server"]
    return ["third-party"]


def setup(config: ExperimentConfig, info: FederationInfo) -> dict[str, Any]:
    """Algorithm 2, lines 1-3: privacy groups, SAMPLE (or a comparison method's σ and rates).

    Public; computed from the configuration and the number of clients only.
    """
    algo: IdpFedAvgConfig = config.algorithm  # type: ignore[assignment]
    n = info.num_clients
    c = float(algo.clients_per_round)
    if c > n:
        raise ValueError(f"algorithm.clients_per_round: c = {c:g} exceeds the {n} clients")
    rounds = int(config.training.rounds)
    delta = float(config.privacy.delta)
    per_client = assign_client_budgets(algo, config.seed, n)
    levels, counts = _groups(per_client)
    if algo.rate_fractions == "nominal" and algo.budget_file is None:
        nominal = dict(zip(algo.group_budgets, algo.group_ratios, strict=True))
        sizes = np.array([nominal.get(float(b), 0.0) * n for b in levels])
        extra = [b for b in algo.group_budgets if not np.isin(b, levels)]
        levels = np.concatenate([levels, np.asarray(extra, dtype=np.float64)])
        sizes = np.concatenate([sizes, [nominal[b] * n for b in extra]])
        order = np.argsort(levels)
        levels, sizes = levels[order], sizes[order]
    else:
        sizes = counts
    q = c / n
    finite = levels[np.isfinite(levels)]
    count_std = algo.count_noise_ratio * c if algo.clipping == "adaptive" else None
    P = len(levels)
    clip_factors = [1.0] * P
    value_sigma: float | None
    if algo.method == "no-dp":
        rates = [q] * P
        sigmas: list[float | None] = [None] * P
        assigned: list[float | None] = [None] * P
        sigma = value_sigma = None
        count_std = None
    elif algo.method == "individual":
        res = sample_group_rates(
            levels, sizes, q, delta=delta, rounds=rounds,
            nonprivate_rate=algo.nonprivate_rate, rate_tol=algo.sample_tolerance,
        )
        rates = list(res.rates)
        sigma = res.noise_multiplier
        assigned = [float(b) if math.isfinite(b) else None for b in levels]
        sigmas = [sigma if math.isfinite(b) else None for b in levels]
        value_sigma = None if sigma is None else (
            split_noise(sigma, count_std) if count_std is not None else sigma
        )
    else:
        if finite.size == 0:
            raise ValueError(f"algorithm.method: {algo.method} needs at least one finite budget")
        rates = [q] * P
        if algo.method in ("strict", "relaxed"):
            eps = float(finite.min() if algo.method == "strict" else finite.max())
            sigma = noise_for_rate(eps, q, delta, rounds)
            assigned = [eps] * P
            sigmas = [sigma] * P
            value_sigma = split_noise(sigma, count_std) if count_std is not None else sigma
        else:  # SCALE: σ_p at the uniform rate, one noise σ̄·C, per-group clip C·σ̄/σ_p
            priv = np.isfinite(levels)
            sig_p = np.array([noise_for_rate(float(b), q, delta, rounds) for b in levels[priv]])
            bar, bar_v, factors, eff = scale_noise(sig_p, sizes[priv], count_std)
            sigma, value_sigma = bar, bar_v
            it = iter(zip(factors, eff, strict=True))
            sigmas, assigned = [], []
            for b in levels:
                if math.isfinite(b):
                    f, e = next(it)
                    clip_factors[len(sigmas)] = float(f)
                    sigmas.append(float(e))
                    assigned.append(float(b))
                else:  # non-private clients: bounded like the least private group, unaccounted
                    clip_factors[len(sigmas)] = float(max(factors))
                    sigmas.append(None)
                    assigned.append(None)
    # The public denominator: the expected number of sampled clients (c up to SAMPLE's tolerance).
    weights = sizes / sizes.sum() * n
    denominator = float(np.dot(weights, rates))
    asked = n if algo.variant == "distributed" else 0
    if algo.variant == "distributed" and algo.tolerated_dropouts >= n:
        raise ValueError("algorithm.tolerated_dropouts: must be smaller than the number of clients")
    tr = config.training
    pub = IdpSetup(
        method=algo.method,
        variant=algo.variant,
        delta=delta,
        rounds=rounds,
        num_clients=n,
        clients_per_round=c,
        budgets=[float(b) for b in levels],
        sizes=[float(s) for s in sizes],
        assigned=assigned,
        rates=[float(r) for r in rates],
        noise_multipliers=[None if s is None else float(s) for s in sigmas],
        clip_factors=clip_factors,
        noise_multiplier=None if sigma is None else float(sigma),
        value_noise_multiplier=None if value_sigma is None else float(value_sigma),
        count_noise_std=None if count_std is None else float(count_std),
        denominator=denominator,
        clipping=algo.clipping,
        initial_clip=float(algo.initial_clip),
        target_quantile=float(algo.target_quantile),
        clip_lr=float(algo.clip_lr),
        server_lr=float(algo.server_lr),
        asked_per_round=asked,
        tolerated_dropouts=int(algo.tolerated_dropouts),
        local={
            "epochs": int(algo.local_epochs),
            "batch_size": int(algo.local_batch_size),
            "optimizer": tr.optimizer,
            "lr": float(tr.lr),
            "momentum": float(tr.momentum),
            "weight_decay": float(tr.weight_decay),
        },
        strategy=algo.local_training,
        rate_fractions=algo.rate_fractions,
        observers=_observers(config, algo.variant),
    )
    return {"idp": pub.to_dict()}


# ----------------------------------------------------------------------- per-client accounting

#: (σ, δ, T, q, observers) → a ledger whose RDP rows all clients of that group share.
_LEDGER_TEMPLATES: dict[tuple, Any] = {}
#: (template key, charged rounds) → ε (third-party, server), shared by all clients of a group.
_EPS_MEMO: dict[tuple, tuple[float, float]] = {}
_MEMO_LOCK = threading.Lock()


class _ClientAccount:
    """One client's :class:`~pdpfl.ledger.PrivacyLedger` (a single unit) with shared ε memo.

    Clients of one group have the same (σ, q): their ledgers share the RDP rows (computed once)
    and the ε of k charged rounds is memoized per group -- the ledger computes it on a miss.
    """

    def __init__(self, budget: float, rate: float, sigma: float, delta: float, rounds: int,
                 observers: tuple[str, ...]) -> None:
        import copy

        from pdpfl.ledger import PrivacyLedger
        from pdpfl.privacy.unit import SampledGaussianPlan

        self.key = (float(sigma), float(delta), int(rounds), float(rate), tuple(observers))
        with _MEMO_LOCK:
            template = _LEDGER_TEMPLATES.get(self.key)
            if template is None:
                plan = SampledGaussianPlan("client", sigma, delta, rounds, tuple(observers))
                template = PrivacyLedger(np.array([1.0]), np.array([float(rate)]), plan)
                _LEDGER_TEMPLATES[self.key] = template
        ledger = copy.copy(template)  # shares the immutable RDP rows; fresh counters below
        ledger.budgets = np.array([float(budget)])
        ledger.third_party_rounds = np.zeros(1, dtype=np.int64)
        ledger.server_rounds = np.zeros(1, dtype=np.int64)
        ledger.sat_out_rounds = np.zeros(1, dtype=np.int64)
        ledger.rounds_recorded = 0
        self.ledger = ledger
        self.budget = float(budget)

    def _eps(self, extra: int = 0) -> tuple[float, float]:
        k = int(self.ledger.third_party_rounds[0]) + extra
        ks = int(self.ledger.server_rounds[0]) + extra
        key = (self.key, k, ks)
        hit = _EPS_MEMO.get(key)
        if hit is None:
            saved = (self.ledger.third_party_rounds, self.ledger.server_rounds)
            self.ledger.third_party_rounds = np.array([k], dtype=np.int64)
            self.ledger.server_rounds = np.array([ks], dtype=np.int64)
            try:
                tp = float(self.ledger.spent_epsilon("third-party")[0])
                srv = (
                    float(self.ledger.spent_epsilon("server")[0])
                    if "server" in self.ledger.observers
                    else math.nan
                )
            finally:
                self.ledger.third_party_rounds, self.ledger.server_rounds = saved
            hit = (tp, srv)
            with _MEMO_LOCK:
                _EPS_MEMO[key] = hit
        return hit

    def would_exceed(self) -> bool:
        """Pre-check: would one more charged round overspend the budget (any observer)?"""
        tp, srv = self._eps(extra=1)
        worst = tp if math.isnan(srv) else max(tp, srv)
        return worst > self.budget * (1 + _EPS_TOL) + _EPS_TOL

    def record(self, participated: bool, active: bool) -> None:
        self.ledger.record_round(
            participated=np.array([participated and active]), active=np.array([active])
        )

    def spent(self) -> tuple[float, float]:
        return self._eps()

    def state(self) -> dict[str, int]:
        lg = self.ledger
        return {
            "third_party_rounds": int(lg.third_party_rounds[0]),
            "server_rounds": int(lg.server_rounds[0]),
            "sat_out_rounds": int(lg.sat_out_rounds[0]),
            "rounds_recorded": int(lg.rounds_recorded),
        }

    def load(self, state: dict[str, Any]) -> None:
        self.ledger.load_state_dict({
            "third_party_rounds": np.array([int(state["third_party_rounds"])]),
            "server_rounds": np.array([int(state["server_rounds"])]),
            "sat_out_rounds": np.array([int(state["sat_out_rounds"])]),
            "rounds_recorded": int(state["rounds_recorded"]),
        })


# ------------------------------------------------------------------ batched local training


def has_conv(model: torch.nn.Module) -> bool:
    import torch

    conv = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    return any(isinstance(m, conv) for m in model.modules())


def choose_strategy(strategy: str, model: torch.nn.Module) -> str:
    """``auto``: the per-client loop for conv nets on CPU (vmap turns their convolutions into
    grouped ones, measured 2-3× slower than the loop there, see benchmarks/RESULTS.md), the
    batched computation otherwise."""
    if strategy != "auto":
        return strategy
    device = next(iter(model.parameters())).device
    return "loop" if (has_conv(model) and device.type == "cpu") else "batched"


def repeated_epochs(
    x: torch.Tensor, y: torch.Tensor, epochs: int, stream: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """E shuffled passes over a client's data, concatenated (``shuffle().repeat(E)`` in flidp):
    minibatches of the concatenation may span an epoch boundary, as in the reference."""
    import torch

    n = int(y.shape[0])
    if n == 0:
        return x[:0], y[:0]
    perms = [np.argsort(stream.uniform(n), kind="stable") for _ in range(int(epochs))]
    idx = torch.as_tensor(np.concatenate(perms), dtype=torch.long)
    return x[idx], y[idx]


def train_clients(
    model: torch.nn.Module,
    params: Params,
    datasets: Sequence[tuple[torch.Tensor, torch.Tensor]],
    local: dict[str, Any],
    strategy: str,
) -> list[list[np.ndarray]]:
    """Local updates Δ_k (trained − global, float64) of several clients from ``params``.

    Each dataset is already the client's E shuffled epochs (:func:`repeated_epochs`), trained
    as one pass in minibatches of ``local["batch_size"]``. ``strategy`` ``batched`` uses
    :func:`pdpfl.dp.batched.train_copies`, ``loop`` :func:`~pdpfl.dp.batched.train_copies_loop`
    (the same updates).
    """
    from pdpfl.dp.batched import LocalTrainingSpec, train_copies, train_copies_loop
    from pdpfl.models import set_params

    set_params(model, params)
    spec = LocalTrainingSpec(
        epochs=1,
        batch_size=int(local["batch_size"]),
        optimizer=str(local["optimizer"]),
        lr=float(local["lr"]),
        momentum=float(local["momentum"]),
        weight_decay=float(local["weight_decay"]),
    )
    fn = train_copies if choose_strategy(strategy, model) == "batched" else train_copies_loop
    deltas = fn(model, list(datasets), spec, stream=None)
    return [
        [d[k].detach().to("cpu").numpy().astype(np.float64) for d in deltas]
        for k in range(len(datasets))
    ]


class _DeferredUpdate(list):
    """The update of a :class:`Contribution` whose local training runs with the cohort's.

    It is a list of float32 arrays like any update; the first read (summation, encoding)
    trains every pending client of the process at once (:meth:`_Cohort.flush`).
    """

    def __init__(self, cohort: _Cohort, num_params: int) -> None:
        super().__init__()
        self._cohort: _Cohort | None = cohort
        self._n = int(num_params)

    def _set(self, arrays: list[np.ndarray]) -> None:
        list.extend(self, arrays)
        self._cohort = None

    def _resolve(self) -> None:
        if self._cohort is not None:
            self._cohort.flush()
            if self._cohort is not None:  # pragma: no cover - defensive
                raise RuntimeError("deferred IDP-FedAvg update was not trained")

    def __len__(self) -> int:
        return self._n if self._cohort is not None else list.__len__(self)

    def __iter__(self):
        self._resolve()
        return list.__iter__(self)

    def __getitem__(self, i):
        self._resolve()
        return list.__getitem__(self, i)

    def __reduce__(self):  # never pickled with pending work; resolve and pickle as a list
        self._resolve()
        return (list, (list(list.__iter__(self)),))


@dataclass
class _Job:
    params: Params
    key: bytes
    data: tuple[Any, Any]
    finish: Callable[[list[np.ndarray]], list[np.ndarray]]
    out: _DeferredUpdate


def _fingerprint(params: Params) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in params:
        a = np.ascontiguousarray(np.asarray(p, dtype=np.float32))
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.digest()


class _Cohort:
    """IDP-FedAvg clients that live in one process (the simulator: all of them).

    Clients submit their round's training job; the first read of any pending update trains
    all pending jobs as one batched computation. Evaluation of one global model on every
    member's test split is likewise one pass. One operator owns every member (in-process), and
    each member still only ever sees its own data, updates and metrics.
    """

    def __init__(self, model_factory: Callable[[], torch.nn.Module], strategy: str,
                 local: dict[str, Any]) -> None:
        self.model_factory = model_factory
        self._model: torch.nn.Module | None = None
        self.strategy = strategy
        self.local = dict(local)
        self.jobs: list[_Job] = []
        self.lock = threading.RLock()
        self.members: weakref.WeakValueDictionary[int, IdpFedAvgClient] = (
            weakref.WeakValueDictionary()
        )
        self._eval: dict[tuple, dict[int, Scalars]] = {}
        self._eval_data: tuple | None = None

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            self._model = self.model_factory()
        return self._model

    def join(self, client: IdpFedAvgClient) -> None:
        with self.lock:
            self.members[client.client_id] = client
            self._eval_data = None

    def submit(self, job: _Job) -> None:
        with self.lock:
            self.jobs.append(job)

    def flush(self) -> None:
        """Train every pending job (grouped by global model) and fill in their updates."""
        with self.lock:
            jobs, self.jobs = self.jobs, []
            by_key: dict[bytes, list[_Job]] = {}
            for job in jobs:
                by_key.setdefault(job.key, []).append(job)
            for group in by_key.values():
                deltas = train_clients(
                    self.model, group[0].params, [j.data for j in group], self.local,
                    self.strategy,
                )
                for job, delta in zip(group, deltas, strict=True):
                    job.out._set(job.finish(delta))

    def evaluate(self, client: IdpFedAvgClient, params: Params, round_index: int) -> Scalars:
        """Test metrics of ``params`` on ``client``'s test split, computed for all members."""
        key = (int(round_index), _fingerprint(params))
        with self.lock:
            cached = self._eval.get(key)
            if cached is None or client.client_id not in cached:
                cached = self._evaluate_all(params)
                self._eval = {key: cached}  # keep only the latest model's results
            return dict(cached[client.client_id])

    def _evaluate_all(self, params: Params) -> dict[int, Scalars]:
        import torch
        import torch.nn.functional as F

        from pdpfl.models import predict, set_params

        members = dict(self.members)
        if self._eval_data is None or set(self._eval_data[0]) != set(members):
            ids = sorted(members)
            xs = [members[c].x_test for c in ids]
            ys = [members[c].y_test for c in ids]
            owner = np.concatenate(
                [np.full(len(y), k, dtype=np.int64) for k, y in enumerate(ys)]
            ) if ids else np.zeros(0, dtype=np.int64)
            self._eval_data = (ids, torch.cat(xs), torch.cat(ys), owner)
        ids, x, y, owner = self._eval_data
        model = self.model
        set_params(model, params)
        was = model.training
        model.eval()
        losses, correct = [], []
        try:
            with torch.no_grad():
                for s in range(0, len(y), 4096):
                    out = model(x[s : s + 4096])
                    t = y[s : s + 4096]
                    if out.shape[1] == 1:
                        loss = F.binary_cross_entropy_with_logits(
                            out[:, 0], t.to(out.dtype), reduction="none"
                        )
                    else:
                        loss = F.cross_entropy(out, t, reduction="none")
                    losses.append(loss.double().numpy())
                    correct.append((predict(out) == t).numpy())
        finally:
            model.train(was)
        loss_all = np.concatenate(losses) if losses else np.zeros(0)
        corr_all = np.concatenate(correct).astype(np.float64) if correct else np.zeros(0)
        k = len(ids)
        n = np.bincount(owner, minlength=k)
        loss_sum = np.bincount(owner, weights=loss_all, minlength=k)
        corr_sum = np.bincount(owner, weights=corr_all, minlength=k)
        out: dict[int, Scalars] = {}
        for j, cid in enumerate(ids):
            m = int(n[j])
            out[cid] = {
                "loss": float(loss_sum[j] / m) if m else float("nan"),
                "accuracy": float(corr_sum[j] / m) if m else float("nan"),
                "n": m,
            }
        return out


#: Cohorts by the publication's token (one per run in a process).
_COHORTS: weakref.WeakValueDictionary[str, _Cohort] = weakref.WeakValueDictionary()
_COHORT_LOCK = threading.Lock()


def _cohort_for(token: str, factory: Callable[[], _Cohort]) -> _Cohort:
    with _COHORT_LOCK:
        cohort = _COHORTS.get(token)
        if cohort is None:
            cohort = factory()
            _COHORTS[token] = cohort
        return cohort


# ------------------------------------------------------------------------------- silo side


class IdpFedAvgClient:
    """One client of IDP-FedAvg (holds its data, its budget, its ledger and its randomness).

    Parameters
    ----------
    client_id
        The client's index.
    data
        Its :class:`~pdpfl.data.federation.ClientData` (never leaves it).
    budget
        Its own ε (``inf``: non-private).
    publication
        The server's :class:`IdpSetup`.
    randomness
        The client's own mechanism randomness (self-sampling coin and noise shares in the
        distributed variant, shuffling of its data).
    cohort
        The in-process :class:`_Cohort` it trains and evaluates with (``None``: alone).
    model_factory
        Builds the public initial model (used when the client has no cohort).
    """

    def __init__(
        self,
        client_id: int,
        data: Any,
        budget: float,
        publication: IdpSetup,
        *,
        randomness: Randomness,
        cohort: _Cohort | None = None,
        model_factory: Callable[[], torch.nn.Module] | None = None,
    ) -> None:
        import torch

        self.client_id = int(client_id)
        self.pub = publication
        self.randomness = randomness
        self.budget = float(budget)
        self.group = publication.group_of(self.budget)
        self.rate = float(publication.rates[self.group])
        self.clip_factor = float(publication.clip_factors[self.group])
        self.x_train = torch.as_tensor(np.asarray(data.x_train, dtype=np.float32))
        self.y_train = torch.as_tensor(np.asarray(data.y_train, dtype=np.int64))
        self.x_test = torch.as_tensor(np.asarray(data.x_test, dtype=np.float32))
        self.y_test = torch.as_tensor(np.asarray(data.y_test, dtype=np.int64))
        self.cohort = cohort
        self._model_factory = model_factory
        self._model: torch.nn.Module | None = None
        assigned = publication.assigned[self.group]
        sigma = publication.noise_multipliers[self.group]
        self.account: _ClientAccount | None = None
        if publication.private and assigned is not None and sigma is not None:
            self.account = _ClientAccount(
                float(assigned), self.rate, float(sigma), publication.delta, publication.rounds,
                tuple(publication.observers),
            )
        self.next_round = 0
        self.participations = 0
        self.stopped = False
        if cohort is not None:
            cohort.join(self)

    # -- helpers -----------------------------------------------------------------------------
    @property
    def model(self) -> torch.nn.Module:
        if self.cohort is not None:
            return self.cohort.model
        if self._model is None:
            if self._model_factory is None:
                raise ValueError("IdpFedAvgClient: needs a cohort or a model_factory")
            self._model = self._model_factory()
        return self._model

    @property
    def ledger(self):  # the outputs writer saves every client's ledger
        return None if self.account is None else self.account.ledger

    def _active(self) -> bool:
        if self.account is None or self.stopped:
            return not self.stopped
        if self.account.would_exceed():
            self.stopped = True
        return not self.stopped

    def _record(self, participated: bool, active: bool) -> None:
        if self.account is not None:
            self.account.record(participated, active)
        self.participations += int(participated and active)
        self.next_round += 1

    def _catch_up(self, until: int) -> None:
        while self.next_round < until:
            self._record(False, self._active())

    def coin(self, round_index: int) -> bool:
        """Distributed variant: this client's own Bernoulli(q_{g(i)}) for ``round_index``."""
        u = self.randomness.stream("client-sampling", int(round_index), self.client_id)
        return bool(u.uniform(1)[0] < self.rate)

    def _zeros(self, params: Params) -> list[np.ndarray]:
        return [np.zeros(np.shape(p), dtype=np.float64) for p in params]

    # -- ClientAlgorithm -----------------------------------------------------------------------
    def fit(self, global_params: Params, round_index: int, config: Scalars) -> Contribution:
        t = int(round_index)
        if t < self.next_round:
            raise ValueError(f"client {self.client_id}: round {t} was already accounted")
        self._catch_up(t)
        active = self._active()
        if self.pub.variant == "central":
            sampled = active  # the server's coin chose this client
        else:
            sampled = active and self.coin(t)
        # Write-ahead: the round is charged before anything is returned.
        self._record(sampled, active)
        clip = float(config.get("clip_norm", self.pub.initial_clip)) * self.clip_factor
        finish = self._finisher(t, clip, sampled)
        if not sampled:
            update = finish(self._zeros(global_params))
            return self._contribution(update)
        data = repeated_epochs(
            self.x_train, self.y_train, self.pub.local["epochs"],
            self.randomness.stream("local-shuffle", t, self.client_id),
        )
        if self.cohort is not None:
            out = _DeferredUpdate(self.cohort, len(global_params))
            metrics: dict[str, float] = {}
            self.cohort.submit(
                _Job(
                    [np.asarray(p, dtype=np.float32) for p in global_params],
                    _fingerprint(global_params), data,
                    lambda d: self._finish_into(finish, d, metrics), out,
                )
            )
            return Contribution(update=out, weight=1.0, metrics=metrics)
        delta = train_clients(self.model, global_params, [data], self.pub.local,
                              self.pub.strategy)[0]
        return self._contribution(finish(delta))

    def _finish_into(self, finish, delta, metrics: dict[str, float]) -> list[np.ndarray]:
        arrays, m = finish(delta)
        metrics.update(m)
        return arrays

    def _contribution(self, finished: tuple[list[np.ndarray], dict[str, float]]) -> Contribution:
        arrays, metrics = finished
        return Contribution(update=arrays, weight=1.0, metrics=metrics)

    def _finisher(self, t: int, clip: float, sampled: bool):
        """What the client does with its delta before release (per variant)."""
        pub = self.pub

        def central(delta: list[np.ndarray]):
            # The trusted aggregator clips and noises; the client releases Δ_i to it only.
            return [d.astype(np.float32) for d in delta], {}

        def distributed(delta: list[np.ndarray]):
            import torch

            from pdpfl.dp.steps import clip_vectors, vector_norms

            vecs = [torch.as_tensor(d, dtype=torch.float64).unsqueeze(0) for d in delta]
            metrics: dict[str, float] = {}
            if pub.private:
                norm = float(vector_norms(vecs)[0])
                vecs, _ = clip_vectors(vecs, clip)
                m = max(1, pub.asked_per_round - pub.tolerated_dropouts)
                sv = float(pub.value_noise_multiplier or 0.0)
                std = sv * clip / self.clip_factor / math.sqrt(m)
                stream = self.randomness.stream("noise-share", t, self.client_id)
                vecs = [v[0] + std * stream.normal(tuple(v.shape[1:])) if std > 0 else v[0]
                        for v in vecs]
                if pub.adaptive:
                    below = (1.0 if norm <= clip else 0.0) - 0.5 if sampled else 0.0
                    share = float(pub.count_noise_std) / math.sqrt(m)
                    z = float(self.randomness.stream("count-share", t, self.client_id).normal(
                        (1,))[0])
                    metrics["clip_count"] = below + share * z
            else:
                vecs = [v[0] for v in vecs]
            return [v.numpy().astype(np.float32) for v in vecs], metrics

        return central if pub.variant == "central" else distributed

    def evaluate(self, params: Params, round_index: int, config: Scalars) -> Scalars:
        from pdpfl.dp.engine import evaluate
        from pdpfl.models import set_params

        self._catch_up(int(round_index) + 1)
        if self.cohort is not None:
            return self.cohort.evaluate(self, params, int(round_index))
        set_params(self.model, params)
        res = evaluate(self.model, self.x_test, self.y_test)
        return {"loss": float(res["loss"]), "accuracy": float(res["accuracy"]), "n": int(res["n"])}

    def spent(self) -> tuple[float, float]:
        """ε spent so far (third party, server; ``nan`` where not an observer, ``inf``: no DP)."""
        if self.account is None:
            return math.inf, math.nan
        return self.account.spent()

    def privacy_summary(self) -> Scalars:
        """This client's privacy state (stays at the client; the simulator merges them)."""
        tp, srv = self.spent()
        label = label_of(self.budget)
        own = self.budget
        out: Scalars = {
            "n_records": 1,
            "participations": self.participations,
            "stopped": int(self.stopped),
            "excluded": 0,
            "private": self.account is not None,
        }
        key = f"group.{label}"
        out[f"{key}.count"] = 1
        out[f"{key}.budget"] = own
        out[f"{key}.rate"] = self.rate
        sigma = self.pub.noise_multipliers[self.group]
        if sigma is not None:  # the σ this client's accountant uses (SCALE: per group)
            out[f"{key}.noise_multiplier"] = float(sigma)
        if self.pub.noise_multiplier is not None:  # σ_SAMPLE (strict/relaxed: σ; SCALE: σ̄)
            out["noise_multiplier"] = float(self.pub.noise_multiplier)
        for value, tag in ((tp, "third_party"), (srv, "server")):
            if math.isnan(value):
                continue
            over = value > own * (1 + _EPS_TOL) + _EPS_TOL
            out[f"over_budget_{tag}"] = int(over)
            out[f"eps_{tag}_max"] = value
            out[f"{key}.max_spent_{tag}"] = value
            util = value / own if math.isfinite(own) else 0.0
            out[f"{key}.sum_utilization_{tag}"] = util
            out[f"{key}.over_budget_{tag}"] = int(over)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "next_round": self.next_round,
            "participations": self.participations,
            "stopped": bool(self.stopped),
            "ledger": None if self.account is None else self.account.state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_round = int(state["next_round"])
        self.participations = int(state["participations"])
        self.stopped = bool(state["stopped"])
        if self.account is not None and state.get("ledger") is not None:
            self.account.load(state["ledger"])


# ----------------------------------------------------------------------------- server side


class IdpFedAvgServer:
    """The IDP-FedAvg server (Algorithm 2). Subclasses fix the trust model.

    Parameters
    ----------
    initial_params
        θ⁰ (public).
    publication
        The :class:`IdpSetup`.
    client_groups
        Central variant: each client's privacy-group index (the server samples client i with
        q_{g(i)}, so it knows the groups, as in the paper). ``None`` in the distributed variant.
    randomness
        The server's own randomness (client coins, noise, count noise).
    """

    public_metrics: ClassVar[frozenset[str]] = frozenset()
    needs_individual_updates: ClassVar[bool] = False

    def __init__(
        self,
        initial_params: Params,
        publication: IdpSetup,
        *,
        client_groups: np.ndarray | None,
        randomness: Randomness,
    ) -> None:
        self._initial = [np.asarray(p, dtype=np.float32).copy() for p in initial_params]
        self.pub = publication
        self.randomness = randomness
        self.groups = None if client_groups is None else np.asarray(client_groups, dtype=np.int64)
        self.clip_norm = float(publication.initial_clip)
        self.clip_history: list[float] = []
        self.unclipped_history: list[float] = []
        self.participation: dict[int, int] = {}
        self.rounds_done = 0
        self.empty_rounds = 0
        self._selected: dict[int, list[int]] = {}

    def initial_params(self) -> Params:
        return [p.copy() for p in self._initial]

    def round_config(self, round_index: int) -> Scalars:
        """Public per-round values: the round and the current clip norm C_t."""
        return {"round": int(round_index), "clip_norm": float(self.clip_norm)}

    def _step(self, global_params: Params, mean: list[np.ndarray]) -> Params:
        eta = self.pub.server_lr
        return [
            (np.asarray(base, dtype=np.float64) + eta * np.asarray(m, dtype=np.float64)).astype(
                np.float32
            )
            for base, m in zip(global_params, mean, strict=True)
        ]

    def _adapt(self, unclipped: float) -> None:
        """C_{t+1} from the noisy unclipped fraction (adaptive clipping only)."""
        self.clip_history.append(self.clip_norm)
        if not self.pub.adaptive:
            return
        b = min(1.0, max(0.0, unclipped))
        self.unclipped_history.append(b)
        self.clip_norm = clip_update(
            self.clip_norm, b, self.pub.target_quantile, self.pub.clip_lr
        )

    def record_round(self, round_index: int, selected: list[int]) -> None:
        for c in selected:
            self.participation[int(c)] = self.participation.get(int(c), 0) + 1
        self.rounds_done += 1
        self.empty_rounds += int(not selected)
        self._selected.pop(int(round_index), None)

    def state_dict(self) -> dict[str, Any]:
        return {
            "clip_norm": self.clip_norm,
            "clip_history": list(self.clip_history),
            "unclipped_history": list(self.unclipped_history),
            "participation": {str(k): v for k, v in self.participation.items()},
            "rounds_done": self.rounds_done,
            "empty_rounds": self.empty_rounds,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clip_norm = float(state["clip_norm"])
        self.clip_history = [float(v) for v in state["clip_history"]]
        self.unclipped_history = [float(v) for v in state["unclipped_history"]]
        self.participation = {int(k): int(v) for k, v in state["participation"].items()}
        self.rounds_done = int(state["rounds_done"])
        self.empty_rounds = int(state["empty_rounds"])


class CentralIdpServer(IdpFedAvgServer):
    """Central DP (the paper): the trusted aggregator samples, clips, sums and adds noise."""

    needs_individual_updates: ClassVar[bool] = True

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        """One independent Bernoulli(q_{g(i)}) per client from the server's randomness."""
        ids = sorted(int(c) for c in client_ids)
        assert self.groups is not None
        rates = np.asarray(self.pub.rates)[self.groups[ids]]
        coins = self.randomness.stream("client-sampling", int(round_index)).uniform(len(ids))
        chosen = [c for c, u, q in zip(ids, coins, rates, strict=True) if u < q]
        self._selected[int(round_index)] = chosen
        return chosen

    def aggregate(self, round_index: int, global_params: Params, aggregate: Aggregate) -> Params:
        """Clip each Δ_i to C_t (SCALE: C_{g(i)}), sum, add N(0, σ_v²C_t²), divide by the
        public denominator; update C_t with the noisy unclipped fraction."""
        import torch

        from pdpfl.dp.steps import clip_vectors, noisy_normalised_sum, vector_norms

        t = int(round_index)
        pub = self.pub
        contributions = list(aggregate.contributions or [])
        shapes = [np.shape(p) for p in global_params]
        if contributions:
            stacked = [
                torch.as_tensor(
                    np.stack([np.asarray(c.update[i], dtype=np.float64) for c in contributions])
                )
                for i in range(len(shapes))
            ]
        else:
            stacked = [torch.zeros((0, *s), dtype=torch.float64) for s in shapes]
        if not pub.private:
            sums = [s.sum(0) for s in stacked]
            mean = noisy_normalised_sum(sums, 0.0, pub.denominator, None)
            self._adapt(0.0)
            return self._step(global_params, [m.numpy() for m in mean])
        k = len(contributions)
        factors = self._clip_factors(t, k)
        bound = torch.as_tensor(self.clip_norm * factors, dtype=torch.float64)
        if k:
            # A non-finite update (crafted or broken) would turn the noisy sum into NaN: it is
            # replaced by zeros, which the clipping bound trivially holds for.
            bad = ~torch.stack([torch.isfinite(s.reshape(k, -1)).all(1) for s in stacked]).all(0)
            if bool(bad.any()):
                keep = (~bad).to(torch.float64)
                stacked = [
                    torch.nan_to_num(s, nan=0.0, posinf=0.0, neginf=0.0)
                    * keep.reshape(-1, *([1] * (s.dim() - 1)))
                    for s in stacked
                ]
            norms = vector_norms(stacked)
            norms = torch.where(bad, torch.full_like(norms, math.inf), norms)
            clipped, _ = clip_vectors(stacked, bound)
            sums = [c.sum(0) for c in clipped]
            below = float((norms <= bound).to(torch.float64).sum()) - 0.5 * k
        else:
            sums = [torch.zeros(s, dtype=torch.float64) for s in shapes]
            below = 0.0
        # (no private client at all -- every group ε = ∞ -- needs no noise)
        std = float(pub.value_noise_multiplier or 0.0) * self.clip_norm
        mean = noisy_normalised_sum(
            sums, std, pub.denominator, self.randomness.stream("aggregation-noise", t)
        )
        unclipped = 0.0
        if pub.adaptive:
            z = float(self.randomness.stream("count-noise", t).normal((1,))[0])
            unclipped = (below + float(pub.count_noise_std) * z) / pub.denominator + 0.5
        new = self._step(global_params, [m.numpy() for m in mean])
        self._adapt(unclipped)
        return new

    def _clip_factors(self, t: int, k: int) -> np.ndarray:
        """C_{g(i)}/C_t per contribution (SCALE); contributions arrive in selected order."""
        factors = np.asarray(self.pub.clip_factors, dtype=np.float64)
        if np.all(factors == 1.0):
            return np.ones(k)
        chosen = self._selected.get(t, [])
        if len(chosen) == k and self.groups is not None:
            return factors[self.groups[np.asarray(chosen, dtype=np.int64)]]
        # A lost client broke the alignment: the smallest clip bounds everyone (more private).
        return np.full(k, float(factors.min()))


class DistributedIdpServer(IdpFedAvgServer):
    """Distributed noise: clients self-sample, clip and noise; the server sees only sums."""

    public_metrics: ClassVar[frozenset[str]] = frozenset({"clip_count"})

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        """Every client is asked (each flips its own coin, hidden under secure summation)."""
        return sorted(int(c) for c in client_ids)

    def aggregate(self, round_index: int, global_params: Params, aggregate: Aggregate) -> Params:
        pub = self.pub
        mean = [np.asarray(t, dtype=np.float64) / pub.denominator for t in aggregate.total]
        unclipped = 0.0
        if pub.adaptive:
            unclipped = float(aggregate.metrics.get("clip_count", 0.0)) / pub.denominator + 0.5
        new = self._step(global_params, mean)
        self._adapt(unclipped)
        return new


# ------------------------------------------------------------------------------ builders


def build_server(
    config: ExperimentConfig, info: FederationInfo, public: dict[str, Any], randomness: Randomness
) -> IdpFedAvgServer:
    pub = IdpSetup.from_dict(public["idp"])
    if pub.variant == "central":
        budgets = assign_client_budgets(config.algorithm, config.seed, info.num_clients)
        groups = np.array([pub.group_of(float(b)) for b in budgets], dtype=np.int64)
        return CentralIdpServer(
            initial_params(config, info), pub, client_groups=groups, randomness=randomness
        )
    return DistributedIdpServer(
        initial_params(config, info), pub, client_groups=None, randomness=randomness
    )


def _budget_of(config: ExperimentConfig, client_id: int, n: int) -> float:
    """The client's own ε, computed at the client."""
    return client_budget(config.algorithm, config.seed, n, client_id)


def build_client(
    config: ExperimentConfig,
    client_id: int,
    data: Any,
    info: FederationInfo,
    public: dict[str, Any],
    randomness: Randomness,
) -> IdpFedAvgClient:
    pub = IdpSetup.from_dict(public["idp"])

    def factory() -> torch.nn.Module:
        return silo_model(config, info)

    cohort = _cohort_for(pub.cohort, lambda: _Cohort(factory, pub.strategy, pub.local))
    return IdpFedAvgClient(
        client_id,
        data,
        _budget_of(config, client_id, info.num_clients),
        pub,
        randomness=randomness,
        cohort=cohort,
        model_factory=factory,
    )


#: ``--set`` overrides turning pdpfl's toy config (3 digits silos, 2 rounds) into a toy run.
TOY_OVERRIDES = (
    "algorithm.clients_per_round=2",
    "algorithm.group_budgets=[2.0,8.0]",
    "algorithm.group_ratios=[0.5,0.5]",
    "algorithm.assignment=exact",
    "algorithm.local_epochs=1",
    "algorithm.local_batch_size=8",
    "algorithm.count_noise_ratio=1.0",
)

register_algorithm(
    AlgorithmSpec(
        name="idp-fedavg",
        config=IdpFedAvgConfig,
        unit="client",
        setup=setup,
        server=build_server,
        client=build_client,
        summary="IDP-FedAvg: every client its own ε (individual client sampling rates, SAMPLE)",
        **(  # the conformance/Flower tests' toy run (field added on main after this module)
            {"toy_overrides": TOY_OVERRIDES}
            if "toy_overrides" in getattr(AlgorithmSpec, "__dataclass_fields__", {})
            else {}
        ),
    )
)
for _name, _help in (
    ("idp-fedavg", "IDP-FedAvg: individual client sampling rates (SAMPLE)"),
    ("strict", "IDP-FedAvg baseline: every client at ε_min (uniform rate c/N)"),
    ("relaxed", "IDP-FedAvg baseline: every client at ε_max (uniform rate c/N)"),
    ("scale", "IDP-FedAvg baseline SCALE: per-group clip C·σ̄/σ_p, one noise σ̄·C"),
    ("no-dp", "IDP-FedAvg baseline: same sampling, no clipping, no noise"),
):
    _method = "individual" if _name == "idp-fedavg" else _name
    register_method(
        MethodSpec(
            _name,
            lambda _arg, m=_method: ["algorithm.name=idp-fedavg", f"algorithm.method={m}"],
            _help,
        ),
        replace=True,
    )
