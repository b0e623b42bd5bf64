"""ULDP-FL's user-level mechanism as one description, and its accounting helpers.

ULDP-FL (Kato et al., PVLDB 2024; formulas restated in ``docs/uldp_spec.md``, Part A) protects
a *user*: all of one person's records in every silo. Per round, ULDP-NAIVE, ULDP-AVG and
ULDP-SGD release Σ_s of the silos' noisy updates, whose user-level sensitivity is C (Theorem 5;
2|S|C for NAIVE, Theorem 3 with spec D29) against noise of multiplier σ. With user
sub-sampling (Algorithm 4) user u enters a round with probability q_u, drawn by the server.

The two observers see different things, so :class:`UserLevelPlan` gives each its own noise and
charge rule:

* **third party** (sees the global models): one Poisson(q_u)-subsampled Gaussian of noise
  multiplier σ_tp per round, charged *every* round the user is active (Theorem 5 with Remark 1,
  Lemma 6 evaluated numerically);
* **server** (runs the round): it drew the sampling coins, so there is no amplification against
  it -- a plain Gaussian of noise multiplier σ_sv, charged only in the rounds it sampled the user
  (``participated``). Under plain aggregation it sees every silo's update: σ_sv = σ_tp with
  uniform weights, σ_tp/√|S| with public enhanced weights (one user can weigh 1 in one silo's
  update, whose noise is σC/√|S|); under secure summation or the private weighting protocol it
  sees only the sum, σ_sv = σ_tp.

The plan is a :class:`~pdpfl.privacy.unit.UnitMechanism`: the user-level
:class:`~pdpfl.ledger.PrivacyLedger` at the server charges each user's counters by
:meth:`UserLevelPlan.charged_on` and converts them through
:func:`~pdpfl.privacy.accountant.mechanism_epsilon`, the path of the calibration.

Helpers: :data:`ORDERS` (pdpfl's grid ∪ Opacus' orders, spec A.3), :func:`user_epsilon`
(Theorems 3/5 in closed form of the accountant) and :func:`group_epsilon` (ULDP-GROUP-k,
Theorem 4: Lemma 9 and Lemma 8 routes, spec D4-D6).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.accountant import mechanism_epsilon
from pdpfl.privacy.adversary import as_adversary
from pdpfl.privacy.conversion import rdp_to_epsilon
from pdpfl.privacy.group import group_epsilon_dp, group_epsilon_from_rdp
from pdpfl.privacy.mechanisms import Composed, GaussianMechanism, Mechanism, PoissonSampled
from pdpfl.privacy.orders import DEFAULT_ORDERS
from pdpfl.privacy.plan import MIN_NOISE_MULTIPLIER, TrainingPlan
from pdpfl.privacy.rdp import check_rates, poisson_gaussian_rdp
from pdpfl.privacy.unit import Charge, PrivacyUnit

__all__ = [
    "OPACUS_ORDERS",
    "ORDERS",
    "UserLevelPlan",
    "check_group_size",
    "group_epsilon",
    "group_orders",
    "record_rdp",
    "user_epsilon",
]

#: Opacus' ``DEFAULT_ALPHAS`` (1.1 … 10.9 in steps of 0.1, then 12 … 63): the orders behind the
#: paper's ε values (spec A.3).
OPACUS_ORDERS: np.ndarray = np.array(
    [1.0 + x / 10.0 for x in range(1, 100)] + [float(a) for a in range(12, 64)]
)
OPACUS_ORDERS.setflags(write=False)
#: Orders of every ULDP account: pdpfl's default grid ∪ Opacus' (ε is a minimum over the
#: orders, so it is never above either grid's value).
ORDERS: np.ndarray = np.union1d(DEFAULT_ORDERS, OPACUS_ORDERS)
ORDERS.setflags(write=False)

_OBSERVERS = ("third-party", "server")


def _sigma(value: float, name: str) -> float:
    sigma = float(value)
    if not (math.isfinite(sigma) and sigma >= MIN_NOISE_MULTIPLIER):
        raise ValueError(
            f"{name}: must be a finite number >= {MIN_NOISE_MULTIPLIER:g} (smaller noise "
            f"overflows the accountant and protects nothing), got {value!r}"
        )
    return sigma


@dataclass(frozen=True)
class UserLevelPlan:
    """ULDP-FL's user-level mechanism, per observer (see the module docstring).

    Parameters
    ----------
    noise_multiplier
        σ_tp: the noise of the released sum Σ_s over its user-level sensitivity -- what a third
        party sees (Theorems 3 and 5).
    server_noise_multiplier
        σ_sv: the same for what the server sees (σ_tp/√|S| for public enhanced weights under
        plain aggregation, else σ_tp).
    delta
        δ in (0, 1).
    rounds
        T ≥ 1 planned rounds.
    observers_
        Who the guarantee is stated against (default both).
    hidden_sampling
        The server does not learn who was sampled (private user-level sub-sampling by
        oblivious transfer, Sec. 4.1): it is then charged like a third party -- the
        Poisson(q_u)-subsampled Gaussian of multiplier σ_sv, every round the user is active.
    """

    noise_multiplier: float
    server_noise_multiplier: float
    delta: float
    rounds: int
    observers_: tuple[str, ...] = _OBSERVERS
    hidden_sampling: bool = False

    #: The privacy unit: one user with all of their records in every silo.
    unit: ClassVar[PrivacyUnit] = PrivacyUnit.USER

    def __post_init__(self) -> None:
        delta = float(self.delta)
        if not (0.0 < delta < 1.0):
            raise ValueError(f"delta: must be in (0, 1), got {self.delta!r}")
        rounds = self.rounds
        if isinstance(rounds, bool) or int(rounds) != rounds or int(rounds) < 1:
            raise ValueError(f"rounds: must be an integer >= 1, got {rounds!r}")
        obs = tuple(as_adversary(o).value for o in self.observers_)
        if not obs or "both" in obs or len(set(obs)) != len(obs):
            raise ValueError("observers: expected a non-empty subset of third-party, server")
        object.__setattr__(
            self, "noise_multiplier", _sigma(self.noise_multiplier, "noise_multiplier")
        )
        object.__setattr__(
            self,
            "server_noise_multiplier",
            _sigma(self.server_noise_multiplier, "server_noise_multiplier"),
        )
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "rounds", int(rounds))
        object.__setattr__(self, "observers_", obs)

    # -- the UnitMechanism description ----------------------------------------------------
    @property
    def planned_rounds(self) -> int:
        return self.rounds

    @property
    def observers(self) -> tuple[str, ...]:
        return self.observers_

    def _observer(self, observer: str) -> str:
        obs = as_adversary(observer).value
        if obs not in self.observers_:
            raise ValueError(
                f"adversary: this user-level mechanism is accounted against "
                f"{', '.join(self.observers_)}, not {obs}"
            )
        return obs

    def observer_noise(self, observer: str) -> float:
        """The noise multiplier ``observer`` sees (σ_tp or σ_sv)."""
        obs = self._observer(observer)
        return self.noise_multiplier if obs == "third-party" else self.server_noise_multiplier

    def round_event(self, rates: ArrayLike, observer: str) -> Mechanism:
        """One charged round for users with sampling rates ``rates``.

        third-party: ``PoissonSampled(q_u, Gaussian(σ_tp))`` (Lemma 6; q = 1 is the plain
        Gaussian of Theorems 3/5); server: ``PoissonSampled(1, Gaussian(σ_sv))`` -- it knows the
        coins, so a round it sampled the user in is a plain Gaussian round -- or, with
        ``hidden_sampling``, ``PoissonSampled(q_u, Gaussian(σ_sv))`` like a third party.
        """
        obs = self._observer(observer)
        q = check_rates(rates)
        if obs == "server" and not self.hidden_sampling:
            q = np.ones_like(q)
        rate = q if np.ndim(rates) else float(q[0])
        return PoissonSampled(rate, GaussianMechanism(self.observer_noise(obs)))

    def charged_on(self, observer: str) -> Charge:
        """third-party: every round the user is active; server: only rounds it sampled them
        (every active round with ``hidden_sampling``: it does not know which)."""
        if self._observer(observer) == "third-party" or self.hidden_sampling:
            return "active"
        return "participated"

    def total_event(self, rates: ArrayLike, observer: str, rounds: int | None = None) -> Mechanism:
        """``rounds`` (default T) charged rounds composed (the server's worst case: the user
        sampled in every one)."""
        k = self.rounds if rounds is None else int(rounds)
        return Composed(self.round_event(rates, observer), k)

    def with_noise(self, noise_multiplier: float) -> UserLevelPlan:
        """The plan with σ_tp = ``noise_multiplier``; σ_sv keeps its ratio to σ_tp (1 or 1/√|S|:
        a property of the aggregation, not of the noise level)."""
        sigma = _sigma(noise_multiplier, "noise_multiplier")
        ratio = self.server_noise_multiplier / self.noise_multiplier
        return UserLevelPlan(
            sigma, sigma * ratio, self.delta, self.rounds, self.observers_, self.hidden_sampling
        )

    def as_training_plan(self) -> TrainingPlan:
        """The third party's view as a :class:`TrainingPlan` (T rounds of one Poisson-sampled
        Gaussian step, λ = 1) for the certified rate calibrator (personal budgets)."""
        return TrainingPlan(
            noise_multiplier=self.noise_multiplier,
            delta=self.delta,
            steps=1,
            rounds=self.rounds,
            client_rate=1.0,
        )

    def planned_epsilon(
        self, rates: ArrayLike, observer: str, orders: ArrayLike = ORDERS, accountant: str = "rdp"
    ) -> np.ndarray:
        """ε of T charged rounds per rate against ``observer`` under ``accountant`` (the
        ledger's conversion; ``orders`` are the RDP grid, PLD's RDP fallback included)."""
        options = (
            {"orders": orders}
            if accountant == "rdp"
            else {"rdp_orders": orders}
            if accountant == "pld"
            else {}
        )
        eps, _ = mechanism_epsilon(
            self, rates, observer, self.rounds, accountant=accountant, **options
        )
        return eps


# ------------------------------------------------------------------------------ helpers


def user_epsilon(
    noise_multiplier: float,
    delta: float,
    rounds: int,
    rate: float = 1.0,
    orders: ArrayLike | None = None,
) -> float:
    """User-level ε of T rounds of the (Poisson-subsampled) Gaussian (Theorems 3, 5; Lemma 6).

    ε = min_α [T·ρ_SGM(α, q, σ) + log((α−1)/α) − (log δ + log α)/(α − 1)] (Lemma 4).

    By default the minimum runs over :data:`ORDERS` with pdpfl's continuous refinement of the
    optimal order -- the conversion of the user-level ledger (:class:`UserLevelPlan`), so a user
    charged T rounds spends exactly this ε. ``orders=`` restricts α to that grid alone (e.g.
    :data:`OPACUS_ORDERS` to reproduce Opacus' numbers).
    """
    if int(rounds) <= 0:
        return 0.0
    if orders is None:
        plan = UserLevelPlan(
            float(noise_multiplier),
            float(noise_multiplier),
            float(delta),
            int(rounds),
            ("third-party",),
        )
        return float(plan.planned_epsilon(np.array([float(rate)]), "third-party")[0])
    grid = np.asarray(orders, dtype=np.float64)
    rdp = np.asarray(poisson_gaussian_rdp(np.array([rate]), noise_multiplier, grid))
    return float(rdp_to_epsilon(int(rounds) * rdp, grid, delta)[0][0])


def check_group_size(k: object) -> int:
    """k of ULDP-GROUP-k as an integer >= 1 (ValueError naming ``group_k``)."""
    if isinstance(k, bool) or not isinstance(k, int | float | np.integer) or int(k) != k or k < 1:
        raise ValueError(f"group_k: must be an integer >= 1, got {k!r}")
    return int(k)


def group_orders(k: int) -> np.ndarray:
    """Orders for Lemma 9 with groups of k (rounded up to 2^c): ORDERS plus a grid ≥ 2·2^c."""
    c = math.ceil(math.log2(k)) if k > 1 else 0
    lo = 2.0 ** (c + 1)
    extra = np.concatenate(
        [lo + np.arange(100) / 10.0, lo * np.array([1.25, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32])]
    )
    return np.union1d(ORDERS, extra)


def group_epsilon(
    rdp_fn: Callable[[np.ndarray], np.ndarray], delta: float, k: int, route: str = "best"
) -> dict[str, float]:
    """User-level ε of a record-level RDP curve for groups of k records (Theorem 4).

    ``rdp_fn(orders) -> rdp`` gives the record-level RDP (any orders). Routes:

    * ``rdp`` -- Lemma 9 (Mironov 2017, Prop. 2): k rounded *up* to 2^c, orders α ≥ 2^{c+1},
      (α/2^c, 3^c ρ(α))-RDP, then Lemma 4. Never 0 for k that is not a power of two (spec D4),
      never an order below 2k (D5).
    * ``dp`` -- Lemma 4 then Lemma 8 with the optimal inner δ_in over the whole range that can
      matter (:func:`pdpfl.privacy.group.group_epsilon_dp`, exact for the orders; any k).
    * ``best`` -- the smaller of the two (D6).

    Returns ``{"rdp": ε, "dp": ε, "epsilon": reported, "k_rdp": 2^c}``.
    """
    k = check_group_size(k)
    if route not in ("best", "rdp", "dp"):
        raise ValueError(f"group_conversion: expected best, rdp or dp, got {route!r}")
    out: dict[str, float] = {"k_rdp": float(2 ** (math.ceil(math.log2(k)) if k > 1 else 0))}
    go = group_orders(k)
    eps_rdp = float(group_epsilon_from_rdp(rdp_fn(go), go, delta, k)[0].reshape(-1)[0])
    out["rdp"] = eps_rdp
    rec = np.asarray(rdp_fn(ORDERS), dtype=np.float64)
    best_dp = float(group_epsilon_dp(rec, ORDERS, delta, k)[0].reshape(-1)[0])
    out["dp"] = best_dp
    out["epsilon"] = {"rdp": eps_rdp, "dp": best_dp, "best": min(eps_rdp, best_dp)}[route]
    return out


def record_rdp(
    noise_multiplier: float, rate: float, steps: int
) -> Callable[[np.ndarray], np.ndarray]:
    """ρ(α) of ``steps`` Poisson-sampled Gaussian steps at one record rate (GROUP's silos)."""

    def rdp(orders: np.ndarray) -> np.ndarray:
        return steps * np.asarray(poisson_gaussian_rdp(np.array([rate]), noise_multiplier, orders))

    return rdp
