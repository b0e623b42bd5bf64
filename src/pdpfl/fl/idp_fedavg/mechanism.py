"""What the IDP-FedAvg server publishes before round 1 (Algorithm 2, lines 1-3), and its noise.

:func:`publish` computes, from the configuration and the number of clients only (no data):

* the privacy groups -- each client's ε (:mod:`~pdpfl.fl.idp_fedavg.budgets`) grouped by
  value, with the realized counts or the nominal ratios as sizes (``rate_fractions``, spec I3);
* per ``method``: SAMPLE's σ and q_p (``individual``, Algorithm 1,
  :func:`~pdpfl.fl.idp_fedavg.sample.sample_group_rates`); everyone at ε_min / ε_max with
  q = c/N (``strict`` / ``relaxed``); SCALE (spec B.2, :func:`scale_noise`); or no DP;
* the adaptive-clipping split σ → (σ_v, 2σ_b) (:func:`split_noise`, Andrew et al. 2021) and
  the public denominator (the expected number of sampled clients).

The result is the frozen :class:`IdpSetup`; silos rebuild it with :meth:`IdpSetup.from_dict`.

The noise, described once (:mod:`pdpfl.privacy.noise`): :meth:`IdpSetup.value_noise` (the
clipped-update sum of group p: multiplier σ_v·C/C_p over the group's clip C_t·C_p/C, std σ_v·C_t --
one noise for every group; t shares in the distributed variant), :meth:`IdpSetup.count_noise`
(the adaptive-clipping count, multiplier 2σ_b over sensitivity ½) and
:meth:`IdpSetup.release_noise` (both, one Gaussian event). The server and the clients draw from
these descriptions (:func:`pdpfl.dp.noise.add_noise`), and each client's accounting event,
:func:`client_mechanism`, is built from its group's :meth:`~IdpSetup.release_noise`: the σ a
ledger charges (``IdpSetup.noise_multipliers``) is computed from the noise that is added.
With ``central_noise: discrete`` (central variant) the server draws the exact discrete noises of
:mod:`~pdpfl.fl.idp_fedavg.central_discrete` instead, and :func:`client_mechanism` is their
event (SAMPLE's σ and rates are fitted to it: ``_noise(..., noise="discrete")``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.fl.aggregation.threshold import share_threshold
from pdpfl.fl.algorithm import PublicSetup
from pdpfl.fl.idp_fedavg.budgets import GroupAssignment, assign_client_budgets
from pdpfl.fl.idp_fedavg.sample import noise_for_rate, sample_group_rates
from pdpfl.fl.idp_fedavg.training import LocalTraining
from pdpfl.privacy.mechanisms import Mechanism
from pdpfl.privacy.noise import GaussianNoise, JointGaussian
from pdpfl.privacy.unit import PrivacyUnit, SampledGaussianPlan, UnitMechanism

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.config import ExperimentConfig
    from pdpfl.fl.api import FederationInfo

__all__ = [
    "IdpOptions",
    "IdpSetup",
    "clip_update",
    "client_mechanism",
    "client_events",
    "publish",
    "scale_noise",
    "split_noise",
]


# ------------------------------------------------------------------ adaptive clipping (Alg. 2)


def split_noise(sigma: float, count_std: float) -> float:
    """σ_v with 1/σ² = 1/σ_v² + 1/(2σ_b)² (Andrew et al. 2021): the value query's multiplier.

    The count query (each client adds 1[‖Δ‖ ≤ C] − ½: sensitivity ½, noise std σ_b) is a
    Gaussian of multiplier 2σ_b; the two compose to one Gaussian of multiplier σ (spec B.3).
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
    return float((s**-2 - b**-2) ** -0.5)


def clip_update(clip: float, unclipped_fraction: float, quantile: float, lr: float) -> float:
    """The geometric rule: C_{t+1} = C_t · exp(−η_C (b̃_t − γ)), b̃_t clipped to [0, 1]."""
    b = min(1.0, max(0.0, float(unclipped_fraction)))
    return float(clip) * math.exp(-float(lr) * (b - float(quantile)))


def scale_noise(
    sigmas: ArrayLike, fractions: ArrayLike, count_std: float | None
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


# --------------------------------------------------------------------------------- the setup


def _inf_to_none(values: Sequence[float | None]) -> list[float | None]:
    return [None if (v is None or math.isinf(v)) else float(v) for v in values]


@dataclass(frozen=True)
class IdpSetup(PublicSetup):
    """What the server publishes before round 1 (JSON-able; ∞ is written as ``None``).

    ``budgets`` are the privacy groups' own budgets (ascending; ``inf`` = non-private),
    ``sizes`` the group sizes SAMPLE used, ``assigned`` what each group is accounted against
    under ``method`` (ε_min for strict, ...; ``None`` = no DP), ``rates`` the sampling rates,
    ``clip_factors`` C_p/C (SCALE), ``noise_multiplier`` the run's σ (σ_SAMPLE; the
    uniform σ of strict/relaxed; σ̄ of SCALE), ``value_noise_multiplier`` σ_v of the update sum,
    ``count_noise_std`` σ_b, ``denominator`` the public divisor of the sum (the expected number
    of sampled clients), ``asked_per_round`` the clients asked per round in the distributed
    variant (all N; 0: central), ``survivors`` t = min(N, t(N)) (0: central): the fewest
    contributions any released sum holds, each client's noise shares sized σ_v²C_t²/t and
    σ_b²/t so that any admissible set of survivors carries at least the accounted noise
    (:func:`pdpfl.fl.aggregation.share_threshold`; issue #22), ``observers`` who each client's
    ε is stated against, ``accountant`` the accountant of SAMPLE's calibration and of every
    client's ledger. What each group is charged, :attr:`noise_multipliers`, is derived from the
    noise descriptions (:meth:`release_noise`), never published separately.
    """

    method: str
    variant: str
    delta: float
    rounds: int
    num_clients: int
    clients_per_round: float
    budgets: tuple[float, ...]
    sizes: tuple[float, ...]
    assigned: tuple[float | None, ...]
    rates: tuple[float, ...]
    clip_factors: tuple[float, ...]
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
    survivors: int
    local: LocalTraining
    rate_fractions: str
    observers: tuple[str, ...]
    accountant: str = "rdp"
    #: Distributed variant: ``discrete`` (integer shares, :mod:`pdpfl.fl.idp_fedavg.discrete`)
    #: or ``continuous`` float shares; and the public parameters of the integer encoding.
    noise_shares: str = "continuous"
    share_bits: int = 32
    share_rotation: bool = True
    share_max_wrap: float = 1e-6
    share_max_inflation: float = 0.05
    #: d: the model's coordinates (sizes the integer shares and the central discrete grid).
    model_size: int = 0
    #: Central variant: ``discrete`` (exact discrete Gaussians on grids,
    #: :mod:`pdpfl.fl.idp_fedavg.central_discrete`) or ``continuous`` (``privacy.central_noise``).
    central_noise: str = "continuous"

    def __post_init__(self) -> None:
        if self.central_noise not in ("continuous", "discrete") or (
            self.central_noise == "discrete" and self.variant != "central"
        ):
            raise ValueError(
                "setup: central_noise must be continuous, or discrete for the central variant, "
                f"got {self.central_noise!r} ({self.variant})"
            )
        n, t = self.asked_per_round, self.survivors
        if self.variant == "distributed" and not 1 <= t <= n:
            raise ValueError(
                f"setup: survivors must be in [1, asked_per_round = {n}] for the distributed "
                f"variant (the fewest noise shares a released sum holds), got {t}"
            )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["budgets"] = _inf_to_none(self.budgets)
        d["assigned"] = _inf_to_none(self.assigned)
        for key, value in d.items():
            if isinstance(value, tuple):
                d[key] = list(value)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IdpSetup:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
        d = dict(data)
        d["budgets"] = tuple(math.inf if v is None else float(v) for v in d["budgets"])
        d["assigned"] = tuple(None if v is None else float(v) for v in d["assigned"])
        for key in ("sizes", "rates", "clip_factors"):
            d[key] = tuple(float(v) for v in d[key])
        d["observers"] = tuple(str(o) for o in d["observers"])
        local = d["local"]
        if not isinstance(local, LocalTraining):
            try:
                local = LocalTraining(**dict(local))
            except TypeError as err:
                raise ValueError(f"{cls.__name__}: local: {err}") from None
        d["local"] = local
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

    # ------------------------------------------------------------------ the noise (described)
    @property
    def shares(self) -> int:
        """t: the noise shares of one release (1: central noise)."""
        return self.survivors if self.variant == "distributed" else 1

    def accounted(self, group: int) -> bool:
        """Whether group ``group``'s clients are accounted (DP and a finite assigned ε)."""
        return self.assigned[group] is not None and self.value_noise_multiplier is not None

    def value_noise(self, group: int, clip: float) -> GaussianNoise:
        """The noise of the clipped-update sum as group ``group`` is charged for it in a round
        clipped at C_t = ``clip``: multiplier σ_v·C/C_p over the group's bound C_t·C_p/C (std
        σ_v·C_t; SCALE: one noise, per-group bounds), in :attr:`shares` shares."""
        sigma = self.value_noise_multiplier
        if sigma is None:
            raise ValueError(f"method {self.method!r} adds no noise")
        f = float(self.clip_factors[group])
        return GaussianNoise(sigma / f, float(clip) * f, self.shares)

    def count_noise(self) -> GaussianNoise | None:
        """Adaptive clipping's count noise N(0, σ_b²) (a query of sensitivity ½, multiplier
        2σ_b), in :attr:`shares` shares; None with fixed clipping."""
        if not self.adaptive or self.count_noise_std is None:
            return None
        return GaussianNoise(2.0 * float(self.count_noise_std), 0.5, self.shares)

    def release_noise(self, group: int) -> GaussianNoise | JointGaussian:
        """Everything a client of ``group`` is charged for per round it enters: its value noise
        and (adaptive clipping) the count noise, one Gaussian event (the multiplier does not
        depend on C_t)."""
        value = self.value_noise(group, self.initial_clip)
        count = self.count_noise()
        return value if count is None else JointGaussian((value, count))

    @property
    def noise_multipliers(self) -> tuple[float | None, ...]:
        """The σ each group's ledger charges (``None``: not accounted), from
        :meth:`release_noise`."""
        return tuple(
            self.release_noise(g).noise_multiplier if self.accounted(g) else None
            for g in range(len(self.budgets))
        )

    def aggregation_noise(self, clip: float) -> GaussianNoise:
        """The central server's one value noise for a round clipped at ``clip``: the accounted
        groups' :meth:`value_noise` with the largest std (they agree up to rounding, so no group
        gets less than it is charged for)."""
        groups = [g for g in range(len(self.budgets)) if self.accounted(g)]
        if not groups:
            raise ValueError("no accounted group: nothing to add noise for")
        return max((self.value_noise(g, clip) for g in groups), key=lambda n: n.std())


def client_mechanism(setup: IdpSetup, group: int | None = None) -> UnitMechanism:
    """The client-level event every client is charged per round (spec B.4): one
    Poisson-subsampled Gaussian, against the published observers, at the σ of ``group``'s
    :meth:`~IdpSetup.release_noise` (``None``: the run's σ, for a ledger whose units give their
    own σ)."""
    if setup.central_noise == "discrete":
        from pdpfl.fl.idp_fedavg.central_discrete import group_plan as central_plan

        return cast(UnitMechanism, central_plan(setup, group))  # the noises actually drawn
    if group is not None and setup.noise_shares == "discrete":
        from pdpfl.fl.idp_fedavg.discrete import group_plan

        return cast(UnitMechanism, group_plan(setup, group))  # the shares actually added
    if group is not None:
        sigma: float | None = setup.release_noise(group).noise_multiplier
    else:
        sigma = setup.noise_multiplier
    if sigma is None:
        raise ValueError(f"method {setup.method!r} adds no noise: nothing to account")
    plan = SampledGaussianPlan(
        PrivacyUnit.CLIENT, sigma, setup.delta, setup.rounds, setup.observers
    )
    return cast(UnitMechanism, plan)  # a frozen dataclass: read-only attributes


def client_events(config: ExperimentConfig, variant: str) -> list[Mechanism]:
    """The round events a client's ledger charges under this config, and those SAMPLE's
    calibration evaluates (the equivalent plan's), at a nominal σ and rate."""
    plan = SampledGaussianPlan(
        PrivacyUnit.CLIENT,
        1.0,
        float(config.privacy.delta),
        int(config.training.rounds),
        _observers(config, variant),
    )
    q = np.array([0.5])
    return [plan.round_event(q, obs) for obs in plan.observers] + [
        plan.as_training_plan().round_event(q, "third-party")
    ]


# --------------------------------------------------------------------------------- publish


class IdpOptions(GroupAssignment, Protocol):
    """The ``idp-fedavg`` config fields :func:`publish` reads (see the config section)."""

    @property
    def method(self) -> str: ...
    @property
    def variant(self) -> str: ...
    @property
    def clients_per_round(self) -> float: ...
    @property
    def rate_fractions(self) -> str: ...
    @property
    def nonprivate_rate(self) -> float: ...
    @property
    def sample_tolerance(self) -> float: ...
    @property
    def local_epochs(self) -> int: ...
    @property
    def local_batch_size(self) -> int: ...
    @property
    def local_training(self) -> str: ...
    @property
    def clipping(self) -> str: ...
    @property
    def initial_clip(self) -> float: ...
    @property
    def target_quantile(self) -> float: ...
    @property
    def clip_lr(self) -> float: ...
    @property
    def count_noise_ratio(self) -> float: ...
    @property
    def server_lr(self) -> float: ...


def _group_sizes(algo: IdpOptions, per_client: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct budgets (ascending) and their sizes: realized counts or nominal ratio × N."""
    levels, counts = np.unique(per_client, return_counts=True)
    if algo.rate_fractions != "nominal" or algo.budget_file is not None:
        return levels, counts.astype(np.float64)
    nominal = dict(zip(algo.group_budgets, algo.group_ratios, strict=True))
    sizes = np.array([nominal.get(float(b), 0.0) * n for b in levels])
    extra = [b for b in algo.group_budgets if not np.isin(b, levels)]
    levels = np.concatenate([levels, np.asarray(extra, dtype=np.float64)])
    sizes = np.concatenate([sizes, [nominal[b] * n for b in extra]])
    order = np.argsort(levels)
    return levels[order], sizes[order]


@dataclass(frozen=True)
class _Noise:
    rates: list[float]
    assigned: list[float | None]
    clip_factors: list[float]
    sigma: float | None
    value_sigma: float | None
    count_std: float | None


def _noise(
    algo: IdpOptions,
    levels: np.ndarray,
    sizes: np.ndarray,
    q: float,
    delta: float,
    rounds: int,
    count_std: float | None,
    accountant: str = "rdp",
    noise: str = "continuous",
) -> _Noise:
    """σ, rates and accounting per group for ``algo.method`` (see the module docstring), every
    ε computed by ``accountant`` for the round event of ``noise`` (``discrete``: the central
    discrete Gaussian's, :mod:`pdpfl.fl.idp_fedavg.central_discrete`)."""
    P = len(levels)
    if algo.method == "no-dp":
        return _Noise([q] * P, [None] * P, [1.0] * P, None, None, None)
    if algo.method == "individual":
        res = sample_group_rates(
            levels,
            sizes,
            q,
            delta=delta,
            rounds=rounds,
            nonprivate_rate=algo.nonprivate_rate,
            rate_tol=algo.sample_tolerance,
            accountant=accountant,
            noise=noise,
        )
        sigma = res.noise_multiplier
        value = (
            None
            if sigma is None
            else (split_noise(sigma, count_std) if count_std is not None else sigma)
        )
        return _Noise(
            list(res.rates),
            [float(b) if math.isfinite(b) else None for b in levels],
            [1.0] * P,
            sigma,
            value,
            count_std,
        )
    finite = levels[np.isfinite(levels)]
    if finite.size == 0:
        raise ValueError(f"algorithm.method: {algo.method} needs at least one finite budget")
    if algo.method in ("strict", "relaxed"):
        eps = float(finite.min() if algo.method == "strict" else finite.max())
        sigma = noise_for_rate(eps, q, delta, rounds, accountant, noise)
        value = split_noise(sigma, count_std) if count_std is not None else sigma
        return _Noise([q] * P, [eps] * P, [1.0] * P, sigma, value, count_std)
    # SCALE: σ_p at the uniform rate, one noise σ̄·C, per-group clip C·σ̄/σ_p
    priv = np.isfinite(levels)
    sig_p = np.array(
        [noise_for_rate(float(b), q, delta, rounds, accountant, noise) for b in levels[priv]]
    )
    # (the effective σ of each group, scale_noise's last value, is IdpSetup.noise_multipliers:
    # derived from the noise descriptions built on σ̄_v and the clip factors)
    bar, bar_v, factors, _ = scale_noise(sig_p, sizes[priv], count_std)
    it = iter(factors)
    assigned: list[float | None] = []
    clip_factors = [1.0] * P
    for g, b in enumerate(levels):
        if math.isfinite(b):
            clip_factors[g] = float(next(it))
            assigned.append(float(b))
        else:  # non-private clients: bounded like the least private group, unaccounted
            clip_factors[g] = float(max(factors))
            assigned.append(None)
    return _Noise([q] * P, assigned, clip_factors, bar, bar_v, count_std)


def _observers(config: ExperimentConfig, variant: str) -> tuple[str, ...]:
    """Central: third parties (the server is a trusted aggregator); distributed: the server
    too, but only when secure summation hides the individual noise shares from it."""
    if variant == "distributed" and config.aggregation != "plain":
        return ("third-party", "server")
    return ("third-party",)


def publish(algo: IdpOptions, config: ExperimentConfig, info: FederationInfo) -> IdpSetup:
    """Algorithm 2, lines 1-3: privacy groups, SAMPLE (or a comparison method's σ and rates).

    Public; computed from the configuration and the number of clients only.
    """
    n = info.num_clients
    c = float(algo.clients_per_round)
    if c > n:
        raise ValueError(f"algorithm.clients_per_round: c = {c:g} exceeds the {n} clients")
    distributed = algo.variant == "distributed"
    # Every client is asked; a released sum holds at least t of their noise shares.
    survivors = share_threshold(config, n) if distributed else 0
    rounds = int(config.training.rounds)
    delta = float(config.privacy.delta)
    levels, sizes = _group_sizes(algo, assign_client_budgets(algo, config.seed, n), n)
    count_std = algo.count_noise_ratio * c if algo.clipping == "adaptive" else None
    accountant = str(config.privacy.accountant)
    central = _central_noise(config, algo)
    noise = _noise(algo, levels, sizes, c / n, delta, rounds, count_std, accountant, central)
    # The public denominator: the expected number of sampled clients (c up to SAMPLE's
    # tolerance; more when non-private clients are sampled at q = 1).
    weights = sizes / sizes.sum() * n
    tr = config.training
    return IdpSetup(
        method=algo.method,
        variant=algo.variant,
        delta=delta,
        rounds=rounds,
        num_clients=n,
        clients_per_round=c,
        budgets=tuple(float(b) for b in levels),
        sizes=tuple(float(s) for s in sizes),
        assigned=tuple(noise.assigned),
        rates=tuple(float(r) for r in noise.rates),
        clip_factors=tuple(noise.clip_factors),
        noise_multiplier=None if noise.sigma is None else float(noise.sigma),
        value_noise_multiplier=None if noise.value_sigma is None else float(noise.value_sigma),
        count_noise_std=None if noise.count_std is None else float(noise.count_std),
        denominator=float(np.dot(weights, noise.rates)),
        clipping=algo.clipping,
        initial_clip=float(algo.initial_clip),
        target_quantile=float(algo.target_quantile),
        clip_lr=float(algo.clip_lr),
        server_lr=float(algo.server_lr),
        asked_per_round=n if distributed else 0,
        survivors=survivors,
        local=LocalTraining(
            epochs=int(algo.local_epochs),
            batch_size=int(algo.local_batch_size),
            optimizer=str(tr.optimizer),
            lr=float(tr.lr),
            momentum=float(tr.momentum),
            weight_decay=float(tr.weight_decay),
            strategy=str(algo.local_training),
        ),
        rate_fractions=algo.rate_fractions,
        observers=_observers(config, algo.variant),
        accountant=accountant,
        **_share_fields(config, info, distributed and algo.method != "no-dp"),
        **_central_fields(config, info, central),
    )


def _central_noise(config: ExperimentConfig, algo: IdpOptions) -> str:
    """``discrete`` for the central variant with DP under ``privacy.central_noise: discrete``."""
    if (
        algo.variant == "central"
        and algo.method != "no-dp"
        and str(config.privacy.central_noise) == "discrete"
    ):
        return "discrete"
    return "continuous"


def _central_fields(config: ExperimentConfig, info: FederationInfo, noise: str) -> dict[str, Any]:
    """The published fields of central discrete noise (its grid needs the model's size)."""
    if noise != "discrete":
        return {}
    from pdpfl.fl.common import ModelSource, initial_params

    source = ModelSource.of(config.model, seed=config.seed, device=config.training.device)
    return {
        "central_noise": "discrete",
        "model_size": int(sum(np.asarray(p).size for p in initial_params(source, info))),
    }


def _share_fields(config: ExperimentConfig, info: FederationInfo, shared: bool) -> dict[str, Any]:
    """The published fields of discrete noise shares (distributed variant with DP only)."""
    if not shared or config.privacy.noise_shares != "discrete":
        return {}
    from pdpfl.fl.common import ModelSource, initial_params

    sec = config.secure
    return {
        "noise_shares": "discrete",
        "share_bits": int(sec.bits),
        "share_rotation": sec.rotation != "off",
        "share_max_wrap": float(sec.max_wrap),
        "share_max_inflation": float(sec.max_inflation),
        "model_size": int(
            sum(
                np.asarray(p).size
                for p in initial_params(
                    ModelSource.of(config.model, seed=config.seed, device=config.training.device),
                    info,
                )
            )
        ),
    }
