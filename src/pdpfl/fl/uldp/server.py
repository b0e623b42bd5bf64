"""ULDP-FL servers: the global step, user sampling (Alg. 4) and the user-level ledger.

Every silo takes part in every round (the |S| divisor assumes it). The server

* applies the global step: x + η_g/|S|·Σ (Algorithms 1-2 line 7, DEFAULT) or
  x ± η_g/(q|S||U|)·Σ (Algorithms 3-4; + AVG, − SGD, a gradient -- spec D1; the divisor
  |S|·Σ_u q_u is a float, D2/D24);
* for ULDP-NAIVE/AVG/SGD keeps **one** :class:`~pdpfl.ledger.PrivacyLedger` of its users (unit
  ``user``, ids 0..|U|-1 -- the global user ids of the data), charged under a
  :class:`~pdpfl.privacy.uldp.UserLevelPlan`: third parties every round the user is active,
  the server itself only the rounds it sampled the user. The round is charged when the server
  decides it -- its users and their coins, in :meth:`LedgerServer.round_config`, before any
  silo trains (write-ahead: a round that fails later stays charged; a round decided twice, or
  again after a resume, is charged once);
* with personal budgets (:class:`SamplingServer`) pre-checks the ledger every round against
  ``privacy.adversary`` (a user whose next round would exceed ε_u sits out) and samples user u
  with its own rate q_u;
* reports a typed :class:`~pdpfl.ledger.PrivacySummary` in the unit ``user``
  (:meth:`UldpServer.privacy_summary`).

Spec references: ``docs/uldp_spec.md``, Part A.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pdpfl.fl.api import Aggregate, Params, Scalars
from pdpfl.fl.uldp.mechanism import GroupSetup, UldpSetup, encode_mask
from pdpfl.ledger import (
    PrivacyLedger,
    PrivacySummary,
    nonprivate_summary,
)
from pdpfl.privacy.noise import CentralDiscreteGaussianNoise, GaussianNoise
from pdpfl.privacy.uldp import ORDERS, UserLevelPlan, group_epsilon, record_rdp, user_epsilon
from pdpfl.privacy.uldp_central import DiscreteGroupPlan, discrete_record_rdp, discrete_step_event
from pdpfl.privacy.uldp_discrete import DiscreteUserLevelPlan
from pdpfl.privacy.unit import GroupPlan
from pdpfl.randomness import Randomness

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.fl.aggregation.discrete_shares import ShareEncoding

__all__ = [
    "AvgServer",
    "DefaultServer",
    "GroupServer",
    "LedgerServer",
    "NaiveServer",
    "SamplingServer",
    "SgdServer",
    "UldpServer",
]


class UldpServer(ABC):
    """What every ULDP-FL server shares: the global step, participation, warnings, state.

    Parameters
    ----------
    initial_params
        x⁰, the public initial model.
    setup
        What the server published.
    server_lr
        η_g.
    randomness
        The server's own randomness (user-sampling coins).
    warnings
        Lines the run summary must carry (disclosed histograms, the paper's sensitivity, ...).
    """

    #: The silos' discrete share encoding (ULDP-AVG/SGD, ``privacy.noise_shares: discrete``):
    #: the summation protocols sum and decode the integer shares with it (None: float updates).
    share_encoding: ShareEncoding | None = None
    #: The silos' exact central discrete noise for the run summary (``privacy.central_noise:
    #: discrete``, NAIVE and GROUP: grid, scale, multiplier); None: continuous.
    central_noise: dict[str, Any] | None = None
    #: The private weighting protocol's discrete noise for the run summary (grid P' = 2^m·P,
    #: dither, plaintext bits); None: not private weights with discrete noise.
    weighting_noise: dict[str, Any] | None = None

    public_metrics: ClassVar[frozenset[str]] = frozenset()
    needs_individual_updates: ClassVar[bool] = False
    #: +1: the silos release model deltas; −1: gradients (ULDP-SGD, spec D1).
    sign: ClassVar[float] = 1.0
    #: The user-level ledger (None where ε is not accounted per user).
    ledger: PrivacyLedger | None = None

    def __init__(
        self,
        initial_params: Params,
        setup: UldpSetup,
        *,
        server_lr: float,
        randomness: Randomness,
        warnings: list[str] | None = None,
    ) -> None:
        self._initial = [np.asarray(p, dtype=np.float32).copy() for p in initial_params]
        self.setup = setup
        self.num_silos = int(setup.num_silos)
        self.num_users = int(setup.num_users)
        self.server_lr = float(server_lr)
        self.randomness = randomness
        self.warnings = list(warnings or [])
        self.divisor = float(self.num_silos)
        self.rounds_done = 0
        self.participation: dict[int, int] = {}

    # -- ServerAlgorithm -------------------------------------------------------------------
    def initial_params(self) -> Params:
        return [p.copy() for p in self._initial]

    def select_clients(self, round_index: int, client_ids: list[int]) -> list[int]:
        """Every silo, every round (ULDP-FL's |S| divisor assumes full participation)."""
        return sorted(int(c) for c in client_ids)

    def round_config(self, round_index: int) -> Scalars:
        return {"round": int(round_index)}

    def aggregate(self, round_index: int, global_params: Params, aggregate: Aggregate) -> Params:
        """Alg. 1/2 line 7: x + η_g/|S|·Σ; Alg. 3/4: x ± η_g/(q|S||U|)·Σ (+ AVG, − SGD)."""
        if aggregate.empty:
            return [np.asarray(p).copy() for p in global_params]
        scale = self.sign * self.server_lr / self.divisor
        return [
            (np.asarray(x, dtype=np.float64) + scale * np.asarray(s, dtype=np.float64)).astype(
                np.float32
            )
            for x, s in zip(global_params, aggregate.total, strict=True)
        ]

    def record_round(self, round_index: int, selected: list[int]) -> None:
        for c in selected:
            self.participation[int(c)] = self.participation.get(int(c), 0) + 1
        self.rounds_done += 1

    @abstractmethod
    def privacy_summary(self) -> PrivacySummary:
        """The users' privacy as seen by this server (unit ``user``)."""

    # -- resume ----------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Inverse of :meth:`extra_state`."""

    def state_dict(self) -> dict[str, Any]:
        return {
            "rounds_done": self.rounds_done,
            "participation": {str(k): v for k, v in self.participation.items()},
            "empty_rounds": 0,
            **self.extra_state(),
            # For the run summary (ignored when loading):
            "warnings": list(self.warnings),
            **_shares_summary(self),
            **_noise_summaries(self),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds_done = int(state["rounds_done"])
        self.participation = {int(k): int(v) for k, v in state["participation"].items()}
        self.load_extra_state(state)


class DefaultServer(UldpServer):
    """DEFAULT: FedAvg with two-sided learning rates, no DP -- ε = ∞ for every user.

    ``budgets``: the users' budgets from the ``budgets`` section (empty without
    ``data.options.num_users``); a run without DP exceeds every one of them.
    """

    def __init__(
        self, initial_params: Params, setup: UldpSetup, *, budgets: np.ndarray, **kwargs: Any
    ) -> None:
        super().__init__(initial_params, setup, **kwargs)
        self.budgets = np.asarray(budgets, dtype=np.float64)

    def privacy_summary(self) -> PrivacySummary:
        return nonprivate_summary("user", self.budgets)


class GroupServer(UldpServer):
    """ULDP-GROUP-k: ε of the silos' record-level DP-SGD converted to groups of k (Theorem 4).

    Silos are disjoint, so the record-level RDP is that of one silo's T·τ Poisson-sampled
    Gaussian steps at the public record rate (parallel composition); Lemma 9 (RDP) or Lemma 8
    ((ε, δ)) turns it into the ε of a user with at most k records (spec D4-D6). The users'
    ledger is charged under :class:`~pdpfl.privacy.unit.GroupPlan` (the accountant's
    ``GroupPrivacy`` event), every round for every user, when the server announces the round
    (before any silo trains); both observers see the same releases. Every user's budget is the
    planned ε of T rounds. The two routes' numbers and the record-level ε are reported beside
    it (``info``).
    """

    ledger: PrivacyLedger

    def __init__(
        self,
        initial_params: Params,
        setup: GroupSetup,
        *,
        conversion: str,
        noise: GaussianNoise | CentralDiscreteGaussianNoise | None = None,
        accountant: str = "rdp",
        **kwargs: Any,
    ) -> None:
        super().__init__(initial_params, setup, **kwargs)
        self.group_setup = setup
        self.conversion = conversion
        self._cache: dict[int, dict[str, float]] = {}
        #: The silos' per-step noise (σ, C): the ledger's plan is built from it (the central
        #: discrete Gaussian's event with ``privacy.central_noise: discrete``).
        if noise is None:
            noise = GaussianNoise(setup.noise_multiplier, setup.max_grad_norm)
        self.noise = noise
        self.discrete = isinstance(noise, CentralDiscreteGaussianNoise)
        kind = DiscreteGroupPlan if self.discrete else GroupPlan
        plan: Any = kind(
            self.noise.noise_multiplier,
            setup.local_steps,
            setup.delta,
            setup.rounds,
            setup.group_k,
            conversion,  # type: ignore[arg-type]
        )
        planned = self.group_account(setup.rounds)["epsilon"]
        if self.discrete:  # never below what the ledger's own conversion charges
            from pdpfl.privacy import mechanism_epsilon

            charged, _ = mechanism_epsilon(
                plan, np.array([setup.record_rate]), "third-party", setup.rounds
            )
            planned = max(planned, float(charged[0]))
        users = self.num_users
        self.ledger = PrivacyLedger(
            np.full(users, planned),
            np.full(users, setup.record_rate),
            plan,
            ids=np.arange(users, dtype=np.int64),
            orders=None,  # the group event's own grid
            accountant=accountant,
        )

    @property
    def rounds_charged(self) -> int:
        return int(self.ledger.rounds_recorded)

    def round_config(self, round_index: int) -> Scalars:
        everyone = np.ones(self.num_users, dtype=bool)
        while self.ledger.rounds_recorded <= int(round_index):  # write-ahead, once per round
            self.ledger.record_round(participated=everyone, active=everyone)
        return super().round_config(round_index)

    def group_account(self, rounds: int) -> dict[str, float]:
        """The two routes after ``rounds`` rounds: ``epsilon`` (reported), ``rdp``/``dp`` and
        the record-level ε (``record``)."""
        t = int(rounds)
        if t not in self._cache:
            s = self.group_setup
            steps = t * int(s.local_steps)
            if steps == 0:
                self._cache[t] = {"epsilon": 0.0, "rdp": 0.0, "dp": 0.0, "record": 0.0}
            elif self.discrete:  # the silos' steps are central discrete Gaussians
                sigma = self.noise.noise_multiplier
                rdp = discrete_record_rdp(sigma, s.record_rate, steps)
                res = group_epsilon(rdp, s.delta, s.group_k, self.conversion)
                res["record"] = _discrete_record_epsilon(sigma, s.record_rate, steps, s.delta)
                self._cache[t] = res
            else:
                rdp = record_rdp(s.noise_multiplier, s.record_rate, steps)
                res = group_epsilon(rdp, s.delta, s.group_k, self.conversion)
                res["record"] = user_epsilon(s.noise_multiplier, s.delta, steps, s.record_rate)
                self._cache[t] = res
        return dict(self._cache[t])

    def privacy_summary(self) -> PrivacySummary:
        now = self.group_account(self.rounds_charged)
        return self.ledger.summary().with_info(
            noise_multiplier=self.group_setup.noise_multiplier,
            group_k=float(self.group_setup.group_k),
            group_epsilon_rdp=now["rdp"],
            group_epsilon_dp=now["dp"],
            record_epsilon=now["record"],
        )

    def extra_state(self) -> dict[str, Any]:
        return {"ledger": self.ledger.state_dict()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if "ledger" in state:
            self.ledger.load_state_dict(state["ledger"])


def _discrete_record_epsilon(sigma: float, rate: float, steps: int, delta: float) -> float:
    """Record-level ε of ``steps`` Poisson-sampled central discrete steps (rdp)."""
    from pdpfl.privacy.accountant import RdpAccountant
    from pdpfl.privacy.mechanisms import Composed, PoissonSampled

    event = Composed(PoissonSampled(float(rate), discrete_step_event(sigma)), int(steps))
    eps, _ = RdpAccountant().epsilon(event, delta)
    return float(eps[0])


class LedgerServer(UldpServer):
    """ULDP-NAIVE (and the base of AVG/SGD): the user-level ledger at the server.

    Parameters
    ----------
    plan
        The :class:`~pdpfl.privacy.uldp.UserLevelPlan` (σ_tp, σ_sv, δ, T).
    budgets
        ε per user: personal budgets, or the one planned ε (:func:`~pdpfl.fl.uldp.mechanism.
        planned_budgets`).
    rates
        q_u (1 without sub-sampling; 0 = excluded).
    """

    ledger: PrivacyLedger

    def __init__(
        self,
        initial_params: Params,
        setup: UldpSetup,
        *,
        plan: UserLevelPlan | DiscreteUserLevelPlan,
        budgets: np.ndarray,
        rates: np.ndarray,
        adversary: str = "both",
        accountant: str = "rdp",
        **kwargs: Any,
    ) -> None:
        super().__init__(initial_params, setup, **kwargs)
        self.plan = plan
        self.adversary = adversary
        #: Users sit out a round that would take them over budget (personal budgets only).
        self.enforces_budgets = False
        #: The server draws Bernoulli(q_u) coins and sends the round's user mask.
        self.samples_users = False
        # (typed loosely: the UnitMechanism protocol of this release declares settable
        # attributes, which no frozen description -- TrainingPlan neither -- has statically)
        mechanism: Any = plan
        self.ledger = PrivacyLedger(
            budgets,
            rates,
            mechanism,
            ids=np.arange(self.num_users, dtype=np.int64),
            orders=ORDERS,
            accountant=accountant,
        )
        #: The round whose users are decided (and charged): (t, active, taking).
        self._pending: tuple[int, np.ndarray, np.ndarray] | None = None

    # -- the users of a round --------------------------------------------------------------
    @property
    def rates(self) -> np.ndarray:
        """q_u of every user."""
        return self.ledger.rates

    @property
    def excluded(self) -> np.ndarray:
        """Users with q_u = 0 (never sampled)."""
        return self.ledger.excluded

    @property
    def observer_noise(self) -> dict[str, float]:
        """The noise multiplier each observer sees (σ_tp, σ_sv)."""
        return {o: self.plan.observer_noise(o) for o in self.plan.observers}

    def round_users(self, round_index: int) -> tuple[np.ndarray, np.ndarray]:
        """(active, taking part) users of round ``round_index``, charged on first call.

        Active: not excluded and -- with personal budgets -- passing the pre-check against
        ``privacy.adversary``; taking part: active and its Bernoulli(q_u) coin came up (every
        active user without sub-sampling, and with private sub-sampling, whose coins the
        silos draw by oblivious transfer: the server does not know them, and its plan charges
        both observers on ``active``). The ledger is charged here, once per round, before
        the round's configuration reaches any silo.
        """
        t = int(round_index)
        if self._pending is not None and self._pending[0] == t:
            return self._pending[1], self._pending[2]
        if t != self.ledger.rounds_recorded:
            raise ValueError(
                f"server: round {t} cannot be decided now -- the ledger has charged "
                f"{self.ledger.rounds_recorded} round(s); rounds are charged once, in order"
            )
        active = ~self.excluded
        if self.enforces_budgets:
            active &= ~np.asarray(self.ledger.would_exceed(adversary=self.adversary), dtype=bool)
        if self.samples_users:
            coins = self.randomness.stream("user-sampling", t).uniform(self.num_users)
            taking = active & (coins < self.rates)
        else:
            taking = active.copy()
        self.ledger.record_round(participated=taking, active=active)  # write-ahead
        self._pending = (t, active, taking)
        return active, taking

    def sampled_users(self, round_index: int) -> np.ndarray | None:
        """Algorithm 4's user mask of ``round_index`` for the private weighting protocol (users
        not taking part get weight 0), or None without user sub-sampling."""
        if not self.samples_users:
            return None
        return self.round_users(round_index)[1]

    def round_config(self, round_index: int) -> Scalars:
        _, taking = self.round_users(round_index)
        cfg = super().round_config(round_index)
        if self.samples_users:
            cfg["users"] = encode_mask(taking)
        return cfg

    # -- reporting and state ------------------------------------------------------------------
    def privacy_summary(self) -> PrivacySummary:
        return self.ledger.summary().with_info(
            noise_multiplier_server=self.plan.server_noise_multiplier
        )

    def extra_state(self) -> dict[str, Any]:
        pending = None
        if self._pending is not None:
            t, active, taking = self._pending
            pending = {"round": t, "active": active.copy(), "taking": taking.copy()}
        return {"ledger": self.ledger.state_dict(), "pending": pending}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if state.get("ledger") is None:
            raise ValueError("server state: missing the user-level ledger")
        self.ledger.load_state_dict(state["ledger"])
        pending = state.get("pending")
        self._pending = None
        if pending is not None:
            active = np.asarray(pending["active"], dtype=bool)
            taking = np.asarray(pending["taking"], dtype=bool)
            if active.shape != (self.num_users,) or taking.shape != active.shape:
                raise ValueError(
                    "server state: the pending round's user masks have the wrong shape"
                )
            self._pending = (int(pending["round"]), active, taking)


class NaiveServer(LedgerServer):
    """ULDP-NAIVE (Algorithm 1, Theorem 3): every user every round, x + η_g/|S|·Σ."""


class SamplingServer(LedgerServer):
    """ULDP-AVG/SGD (Algorithms 3-4, Theorem 5): user sub-sampling, divisor |S|·Σ_u q_u.

    Its silos add noise *shares* (σ²C²/t each): ``distributed_noise`` makes plain summation
    refuse a round with fewer than t contributions (no aggregate; the model is kept).

    Parameters (beyond :class:`LedgerServer`'s)
    -------------------------------------------
    personal
        The budgets are the users' own (personal budgets): pre-check every round.
    """

    #: Each silo adds a share σ²C²/t of the noise (pdpfl.fl.aggregation.share_threshold).
    distributed_noise: ClassVar[bool] = True

    def __init__(
        self, initial_params: Params, setup: UldpSetup, *, personal: bool, **kwargs: Any
    ) -> None:
        super().__init__(initial_params, setup, **kwargs)
        self.personal = bool(personal)
        self.enforces_budgets = self.personal
        self.samples_users = bool(getattr(setup, "user_sampling", False))
        p = int(getattr(setup, "ot_items", 0))
        #: (k, P) with private sub-sampling (Sec. 4.1): k = q·P of the P items a silo obtains
        #: by oblivious transfer carry the user's weight; the server draws no coins, sends no
        #: user mask and never learns the sample (None: Algorithm 4 at the server).
        self.private_sampling: tuple[int, int] | None = (
            (round(float(self.rates[0]) * p), p) if p else None
        )
        total_rate = float(self.rates.sum())
        if total_rate <= 0:
            raise ValueError("budgets: no user can be sampled (every q_u = 0)")
        self.divisor = self.num_silos * total_rate  # q·|S|·|U| (a float: spec D24)

    @property
    def budgets(self) -> np.ndarray | None:
        """ε_u of every user with personal budgets (None: one planned ε for everybody)."""
        return self.ledger.budgets if self.personal else None


class AvgServer(SamplingServer):
    """ULDP-AVG: x + η_g/(q|S||U|)·Σ."""


class SgdServer(SamplingServer):
    """ULDP-SGD: x − η_g/(q|S||U|)·Σ (the silos release gradients; spec D1)."""

    sign: ClassVar[float] = -1.0


def _noise_summaries(server: UldpServer) -> dict[str, Any]:
    """``central_noise`` and ``weighting_noise`` for the run summary (derived from the config:
    not loaded back; absent when continuous)."""
    out: dict[str, Any] = {}
    if server.central_noise is not None:
        out["central_noise"] = dict(server.central_noise)
    if server.weighting_noise is not None:
        out["weighting_noise"] = dict(server.weighting_noise)
    return out


def _shares_summary(server: Any) -> dict[str, Any]:
    """``noise_shares``: the discrete share encoding for the run summary (none: {})."""
    encoding = getattr(server, "share_encoding", None)
    return {} if encoding is None else {"noise_shares": encoding.summary()}
