"""What a ULDP-FL server publishes, and the user-level mechanism it accounts.

Before round 1 the server publishes a frozen :class:`UldpSetup` to every silo (ULDP-NAIVE and
DEFAULT), a :class:`UserLevelSetup` (ULDP-AVG/SGD, Algorithm 3) or a :class:`GroupSetup`
(ULDP-GROUP-k, Algorithm 2): σ and the per-silo noise std, C, Q, τ, and -- only when the
histograms are declared public (``data.public_user_histograms``) -- what the silos need from
them (N_u for enhanced weights, the GROUP flags). Everything in it is public.

The server keeps what the silos must not learn: the users' budgets and sampling rates q_u
(personal budgets, certified calibration at the user level) and the
:class:`~pdpfl.privacy.uldp.UserLevelPlan` it charges its user-level ledger with
(:func:`user_plan`). Formula and deviation numbers refer to ``docs/uldp_spec.md`` (Part A:
Theorems 3-5, Algorithms 1-4, D1-D29).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.fl.algorithm import PublicSetup
from pdpfl.privacy.uldp import UserLevelPlan, check_group_size
from pdpfl.privacy.uldp_discrete import DiscreteUserLevelPlan

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.config import ExperimentConfig
    from pdpfl.fl.api import FederationInfo

__all__ = [
    "GroupSetup",
    "UldpSetup",
    "UserLevelSetup",
    "decode_mask",
    "encode_mask",
    "need_histogram",
    "noise_multiplier",
    "num_users",
    "planned_budgets",
    "public_histogram",
    "setup_fields",
    "user_budgets",
    "user_plan",
    "user_rates",
]


@dataclass(frozen=True)
class UldpSetup(PublicSetup):
    """The published setup of every ULDP-FL algorithm (ULDP-NAIVE and DEFAULT use it as is).

    Attributes
    ----------
    num_silos, num_users
        |S| and the public number of users |U| (0 for DEFAULT without ``num_users``).
    noise_multiplier
        σ (0 for DEFAULT).
    noise_std
        The std of each silo's Gaussian noise per release: σκC√|S| (NAIVE, Alg. 1 line 14;
        κ = 2 rigorous, 1 paper), σC/√t (AVG/SGD: a share sized for the t survivors every
        released sum holds, :class:`UserLevelSetup`; Alg. 3 line 17 has σC/√|S|, which a
        dropout leaves short), σC per DP-SGD step (GROUP), 0 (DEFAULT).
    delta, rounds, max_grad_norm, local_epochs, local_steps
        δ, T, C, Q and τ.
    """

    num_silos: int
    num_users: int
    noise_multiplier: float
    noise_std: float
    delta: float
    rounds: int
    max_grad_norm: float
    local_epochs: int
    local_steps: int

    def __post_init__(self) -> None:
        for name in ("num_silos", "num_users", "rounds", "local_epochs", "local_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or int(value) < 0:
                raise ValueError(f"setup: {name} must be an integer >= 0, got {value!r}")
            object.__setattr__(self, name, int(value))
        for name in ("noise_multiplier", "noise_std", "delta", "max_grad_norm"):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"setup: {name} must be a finite number >= 0")
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class UserLevelSetup(UldpSetup):
    """ULDP-AVG / ULDP-SGD (Algorithm 3, with Algorithm 4's user sub-sampling).

    Attributes
    ----------
    weights
        ``uniform`` (w = 1/|S|), ``enhanced`` (w = n_{s,u}/N_u, Eq. 4, from the published
        ``user_totals``) or ``private`` (the same weights, computed only inside the private
        weighting protocol).
    user_totals
        N_u for every user (enhanced weights only: disclosed with the histograms).
    user_sampling
        The server samples users each round (``user_rate`` or personal budgets) and sends the
        round's user mask in the round configuration.
    survivors
        t: the fewest noise shares any released sum holds (``pdpfl.fl.aggregation.
        share_threshold`` of the |S| silos asked; 0 = |S|). Each silo's share has variance
        σ²C²/t (``noise_std`` = σC/√t), so every admissible set of survivors carries at least
        the σ²C² the ledger charges (issue #22); the full round carries |S|/t times it.
    ot_items
        P > 0: private user-level sub-sampling (Sec. 4.1; ``algorithm.subsampling: private``):
        the server sends no user mask, a silo picks each user's weight ciphertext by 1-out-of-P
        oblivious transfer (q·P of the P encrypt the weight), and the server, which never learns
        the choice, is accounted like a third party. 0: the server samples (Algorithm 4).
    """

    weights: str = "uniform"
    user_totals: tuple[int, ...] | None = None
    user_sampling: bool = False
    survivors: int = 0
    ot_items: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.weights not in ("uniform", "enhanced", "private"):
            raise ValueError(
                f"weights: expected uniform, enhanced or private, got {self.weights!r}"
            )
        if self.user_totals is not None:
            object.__setattr__(self, "user_totals", tuple(int(v) for v in self.user_totals))
        if self.weights == "enhanced" and self.user_totals is None:
            raise ValueError("weights: enhanced weights need the published user_totals N_u")
        object.__setattr__(self, "user_sampling", bool(self.user_sampling))
        t = self.survivors
        if isinstance(t, bool) or int(t) != t or not 0 <= int(t) <= self.num_silos:
            raise ValueError(
                f"setup: survivors must be an integer in [0, {self.num_silos}], got {t!r}"
            )
        object.__setattr__(self, "survivors", int(t) or self.num_silos)
        p = self.ot_items
        if isinstance(p, bool) or int(p) != p or int(p) < 0 or (p and self.weights != "private"):
            raise ValueError(
                f"setup: ot_items must be 0, or P >= 2 with private weights, got {p!r}"
            )
        object.__setattr__(self, "ot_items", int(p))


@dataclass(frozen=True)
class GroupSetup(UldpSetup):
    """ULDP-GROUP-k (Algorithm 2): k, the fixed flags (quotas n̂_{s,u}) and the record rate.

    Attributes
    ----------
    group_k
        k: records kept per user across all silos.
    group_quota
        (|S|, |U|) quotas: silo s keeps the first ``group_quota[s][u]`` records of user u
        (Σ_s ≤ k; never changes during the run).
    record_rate
        The public per-record Poisson rate of the silos' DP-SGD.
    """

    group_k: int = 1
    group_quota: tuple[tuple[int, ...], ...] = ()
    record_rate: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "group_k", check_group_size(self.group_k))
        object.__setattr__(
            self, "group_quota", tuple(tuple(int(v) for v in row) for row in self.group_quota)
        )
        rate = float(self.record_rate)
        if not (0.0 < rate <= 1.0):
            raise ValueError(f"record_rate: must be in (0, 1], got {self.record_rate!r}")
        object.__setattr__(self, "record_rate", rate)


# ------------------------------------------------------------------------------ the config


def num_users(config: ExperimentConfig) -> int:
    """|U|: ``data.options.num_users`` (ValueError without it)."""
    value = dict(config.data.options).get("num_users")
    if value is None:
        raise ValueError("data.options.num_users: required by user-level DP")
    return int(value)


def noise_multiplier(
    config: ExperimentConfig, user_rate: float = 1.0, *, discrete: bool = False
) -> float:
    """σ: ``privacy.noise_multiplier``, or the σ whose planned third-party ε (T rounds at the
    user rate q: 1 without sub-sampling or with personal budgets) equals
    ``privacy.epsilon_max`` under ``privacy.accountant``
    (:func:`pdpfl.calibration.noise.noise_for_uniform_rate`); ``discrete``: against the
    central discrete Gaussian's event (``privacy.central_noise: discrete``,
    :mod:`pdpfl.privacy.uldp_central`)."""
    pv = config.privacy
    if pv.noise_multiplier is not None:
        return float(pv.noise_multiplier)
    if pv.epsilon_max is None:
        raise ValueError("privacy: set privacy.noise_multiplier or privacy.epsilon_max")
    from pdpfl.calibration.noise import noise_for_uniform_rate

    template = UserLevelPlan(1.0, 1.0, pv.delta, config.training.rounds).as_training_plan()
    if discrete:
        template = replace(template, noise="discrete")
    return float(
        noise_for_uniform_rate(
            float(pv.epsilon_max),
            float(user_rate),
            template,
            accountant=pv.accountant,
        )
    )


def public_histogram(
    config: ExperimentConfig, info: FederationInfo, users: int
) -> np.ndarray | None:
    """The disclosed (|S|, |U|) histogram n_{s,u} (``data.public_user_histograms``), or None."""
    if info.user_histogram is None:
        return None
    hist = np.asarray(info.user_histogram, dtype=np.int64)
    silos = info.num_clients
    if hist.ndim != 2 or hist.shape[0] != silos or hist.shape[1] > users:
        raise ValueError(
            f"data.public_user_histograms: histogram of shape {hist.shape} for {silos} silos "
            f"and {users} users"
        )
    return np.pad(hist, ((0, 0), (0, users - hist.shape[1])))


def need_histogram(hist: np.ndarray | None, what: str) -> np.ndarray:
    """``hist``, or a ValueError saying ``what`` needs it and how to provide it."""
    if hist is None:
        raise ValueError(
            f"{what} need the silos' per-user record counts, which this runtime did not collect "
            "(data.public_user_histograms: true in the simulator; the Flower runtime does not "
            "collect them yet)"
        )
    return hist


def user_budgets(config: ExperimentConfig) -> np.ndarray:
    """ε_u of every user: the ``budgets`` scenario drawn over |U| users (seeded: the users'
    choices are part of the simulated data), or ``budgets.file`` with one value per user."""
    from pdpfl import budgets as budgets_mod
    from pdpfl.seeding import numpy_generator

    n = num_users(config)
    if config.budgets.file is not None:
        values = np.asarray(budgets_mod.load_budgets(config.budgets.file), dtype=float)
        if values.shape != (n,):
            raise ValueError(
                f"budgets.file: {n} users but {config.budgets.file} has {values.size} budgets"
            )
        return values
    scenario = budgets_mod.make_scenario(config.budgets.scenario, **config.budgets.params)
    rng = numpy_generator(config.seed, "user-budgets")
    return np.asarray(budgets_mod.assign_budgets(scenario, n, rng), dtype=float)


# ------------------------------------------------------------------------ the server's view


def user_plan(setup: UldpSetup, third_party: float, server: float) -> UserLevelPlan:
    """The :class:`~pdpfl.privacy.uldp.UserLevelPlan` of the server's user-level ledger (the
    server charged like a third party when the sampling is hidden from it: ``ot_items``)."""
    hidden = int(getattr(setup, "ot_items", 0)) > 0
    return UserLevelPlan(
        float(third_party), float(server), setup.delta, setup.rounds, hidden_sampling=hidden
    )


def user_rates(
    budgets: np.ndarray, plan: UserLevelPlan, *, allow_exclusion: bool, accountant: str = "rdp"
) -> np.ndarray:
    """q_u = F(ε_u) from the certified calibrator at the user level (T rounds of
    SGM(q_u, σ_tp) against third parties, under ``accountant``): no user's planned ε exceeds
    ε_u.

    Users whose budget is below the smallest achievable ε get q = 0 (with
    ``allow_exclusion``; otherwise a ValueError naming ``budgets``).
    """
    from pdpfl.calibration.certified import CertifiedEstimator

    est = CertifiedEstimator.fit(plan.as_training_plan(), "third-party", accountant=accountant)
    rates = np.clip(np.asarray(est.rates(budgets), dtype=np.float64), 0.0, 1.0)
    excluded = rates <= 0
    if excluded.any() and not allow_exclusion:
        low = budgets[excluded]
        raise ValueError(
            f"budgets: {int(excluded.sum())} user(s) have budgets in [{low.min():g}, "
            f"{low.max():g}], below the smallest ε this mechanism can give a positive rate "
            f"(σ = {plan.noise_multiplier:g}, T = {plan.rounds}); set privacy.allow_exclusion: "
            "true to exclude them, or raise σ"
        )
    return rates


def planned_budgets(
    plan: UserLevelPlan | DiscreteUserLevelPlan, rates: np.ndarray, accountant: str = "rdp"
) -> np.ndarray:
    """Without personal budgets every user has one budget: the planned ε of T rounds under
    ``accountant``, the larger over the observers (reported, never a reason to stop)."""
    from pdpfl.privacy.uldp import ORDERS

    budgets: np.ndarray = np.max(
        [plan.planned_epsilon(rates, o, ORDERS, accountant=accountant) for o in plan.observers],
        axis=0,
    )
    return budgets


# ------------------------------------------------------------------------ per-round config


def encode_mask(mask: np.ndarray) -> str:
    """A user bit mask as a hex string (a scalar, so it fits any runtime's round config)."""
    return np.packbits(np.asarray(mask, dtype=bool)).tobytes().hex()


def decode_mask(text: str, users: int) -> np.ndarray:
    """Inverse of :func:`encode_mask` for ``users`` users."""
    bits = np.unpackbits(np.frombuffer(bytes.fromhex(str(text)), dtype=np.uint8))
    if bits.size < users:
        raise ValueError(f"users: mask has {bits.size} bits for {users} users")
    return bits[:users].astype(bool)


def setup_fields(
    config: ExperimentConfig, info: FederationInfo, users: int, sigma: float, noise_std: float
) -> dict[str, Any]:
    """The :class:`UldpSetup` fields every variant shares."""
    tr = config.training
    algo: Any = config.algorithm
    return dict(
        num_silos=info.num_clients,
        num_users=users,
        noise_multiplier=sigma,
        noise_std=noise_std,
        delta=config.privacy.delta,
        rounds=tr.rounds,
        max_grad_norm=float(tr.max_grad_norm),
        local_epochs=int(algo.local_epochs),
        local_steps=tr.local_steps,
    )
