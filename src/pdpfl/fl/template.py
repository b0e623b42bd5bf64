"""The silo template: one base class owns the round duties of every algorithm's silo.

Every algorithm's silo does the same bookkeeping around its own mechanism (rPDP-FL §6.2's
budget accountant; IDP-FedAvg's and PriFedSync's stop rules are the same duty for other units):

1. **which round is next** -- a silo is told the round index; it refuses a round it already
   accounted (no double charge after a retry or a resume);
2. **catch-up** -- rounds the silo was not asked in still cost third parties (who do not see
   who took part) for every active unit: they are charged, in order, before anything else;
3. **pre-check** -- units that would exceed their budget if charged once more sit the round out,
   and so do units whose budget *for life* would be exceeded (earlier runs on the same data,
   from the ledger's budget store, :mod:`pdpfl.ledger.lifetime`), whatever the algorithm's own
   pre-check is;
4. **participation** -- the server's selection (default) or the silo's own coin (hidden
   participation, IDP-FedAvg's distributed variant);
5. **charge before release** -- the round is charged to the ledger *before* the algorithm's step
   runs, so no contribution can leave before its cost is on the books (a step that fails leaves
   the charge: over-counting is safe, under-counting never happens);
6. **release** -- the step's :class:`~pdpfl.fl.api.Contribution` is checked against the privacy
   boundary (the gate of :mod:`pdpfl.fl.messages`: only declared fields, float32 arrays of the
   model's shapes, finite numbers) before it is returned;
7. **resume** -- :meth:`Silo.state_dict`/:meth:`Silo.load_state_dict` carry the counters, the
   ledger and the algorithm's own state (:meth:`Silo.extra_state`).

An algorithm overrides one step, :meth:`Silo.step` ("given the global parameters and the round
plan -- active units, participation -- produce the Contribution"), in the manner of Opacus'
``DPOptimizer.pre_step`` hooks; variants are subclasses. An algorithm that can train many silos
at once in one process also implements the two-phase API of :class:`BatchedSilo` (prepare →
train in a batch → finish); the in-process simulator's transport uses it, so nothing in ``fl/``
holds threads, locks or process-global caches.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from pdpfl.errors import TrainingDiverged
from pdpfl.fl.api import Contribution, Params, Scalars, check_contribution
from pdpfl.fl.messages import nonfinite_metric_cause, nonfinite_update_cause
from pdpfl.ledger import PrivacyLedger, PrivacySummary, observers_of

if TYPE_CHECKING:  # the encoding's module builds on the contract, not the other way round
    from pdpfl.fl.aggregation.discrete_shares import ShareEncoding

__all__ = ["BatchedSilo", "NonFiniteError", "RoundPlan", "Silo"]

J = TypeVar("J")
R = TypeVar("R")


class NonFiniteError(TrainingDiverged):
    """A silo's update or metric is not finite: nothing is released (the run stops)."""


def _nonfinite(value: object) -> bool:
    return (
        isinstance(value, int | float | np.number)
        and not isinstance(value, bool)
        and not math.isfinite(float(value))
    )


@dataclass(frozen=True)
class RoundPlan:
    """What the template decided for one round before the algorithm's step runs.

    Attributes
    ----------
    round_index
        t (0-based).
    active
        Per unit: passed the pre-check (and has a positive rate). All True without a ledger.
    participates
        Whether this silo's data enters the round's release (selected by the server, or its
        own coin came up). A silo that does not participate still releases a contribution of
        the same shape when the protocol asks it to (e.g. noise only, or zeros).
    config
        The server's public round configuration.
    """

    round_index: int
    active: np.ndarray
    participates: bool
    config: Scalars


class Silo(ABC):
    """Round duties of a silo (see the module docstring); subclasses implement :meth:`step`.

    Parameters
    ----------
    client_id
        The silo's index in the federation.
    ledger
        The ledger of this silo's own units, or None when the silo accounts nothing itself
        (no DP, or a unit whose ledger another party keeps, e.g. ULDP-FL's users at the server).
    adversary
        The observer(s) the budgets are enforced against in the pre-check (``third-party``,
        ``server`` or ``both``).
    """

    #: The :class:`~pdpfl.fl.api.Contribution` metric keys this silo may release.
    public_metrics: ClassVar[frozenset[str]] = frozenset()
    #: Units that would exceed their budget sit out (the pre-check): a run on data whose
    #: lifetime budgets are partly spent goes ahead without them (:mod:`pdpfl.fl.lifetime`).
    enforces_budgets: ClassVar[bool] = True
    #: The discrete share encoding of the silo's training reply
    #: (:class:`~pdpfl.fl.aggregation.discrete_shares.ShareEncoding`; None: float updates).
    share_encoding: ShareEncoding | None = None

    def __init__(
        self, client_id: int, ledger: PrivacyLedger | None, *, adversary: str = "both"
    ) -> None:
        self.client_id = int(client_id)
        self.ledger = ledger
        self.adversary = adversary
        #: The next round whose accounting has not been recorded yet.
        self.next_round = 0
        #: Rounds in which this silo's data entered a release.
        self.participations = 0

    # ---------------------------------------------------------------- units
    @property
    def num_units(self) -> int:
        """Units this silo accounts (0 without a ledger)."""
        return 0 if self.ledger is None else self.ledger.n

    def _precheck(self) -> np.ndarray:
        """Units allowed in the next round: not over budget once charged, rate > 0."""
        if self.ledger is None:
            return np.ones(0, dtype=bool)
        exceed = np.asarray(self.ledger.would_exceed(adversary=self.adversary), dtype=bool)
        return ~exceed & (self.ledger.rates > 0)

    def _allowed(self) -> np.ndarray:
        """The algorithm's pre-check (:meth:`_precheck`), and the lifetime budgets: a unit whose
        lifetime ε would exceed its budget after one more round sits out too (enforced unless
        ``lifetime.allow_respend``)."""
        active = self._precheck()
        ledger = self.ledger
        if (
            ledger is not None
            and ledger.lifetime is not None
            and ledger.lifetime.enforce
            and any(o in ledger.observers for o in observers_of(self.adversary))
        ):
            over = ledger.lifetime_spent(self.adversary, extra=1) > ledger.budgets
            active = active & ~np.asarray(over, dtype=bool)
        return active

    def _account(self, active: np.ndarray, participates: bool) -> None:
        if self.ledger is not None:
            self.ledger.record_round(participated=active & participates, active=active)
        self.participations += int(participates)
        self.next_round += 1

    def catch_up(self, until: int) -> None:
        """Charge rounds ``next_round .. until-1`` in which this silo was not asked."""
        while self.next_round < until:
            self._account(self._allowed(), False)

    # ---------------------------------------------------------------- the round
    def participates(self, round_index: int, config: Scalars) -> bool:
        """Whether this silo's data enters round ``round_index`` (default: it was asked)."""
        return True

    def begin_round(self, round_index: int, config: Scalars) -> RoundPlan:
        """Steps 1-5: catch up, pre-check, participation, and the charge (before any release)."""
        t = int(round_index)
        if t < self.next_round:
            raise ValueError(f"silo {self.client_id}: round {t} was already accounted")
        self.catch_up(t)
        active = self._allowed()
        joins = bool(self.participates(t, config))
        self._account(active, joins)  # write-ahead: charged before the step runs
        return RoundPlan(t, active, joins, dict(config))

    def release(self, contribution: Contribution, params: Params | None = None) -> Contribution:
        """Step 6: only a finite :class:`Contribution` with declared metrics leaves the silo.

        A non-finite update or declared metric is :class:`NonFiniteError` (the run stops,
        nothing is released); everything else is the gate of the training reply
        (:func:`~pdpfl.fl.api.check_contribution`; ``params``: the round's global model, whose
        shapes the update must have).
        """
        if type(contribution) is Contribution and isinstance(contribution.update, list):
            for k, u in enumerate(contribution.update):
                if isinstance(u, np.ndarray) and u.dtype.kind == "f" and not np.isfinite(u).all():
                    raise NonFiniteError(
                        nonfinite_update_cause(k),
                        round_index=self.next_round - 1,
                        silo=self.client_id,
                    )
            for key, value in dict(contribution.metrics).items():
                if key in self.public_metrics and _nonfinite(value):
                    raise NonFiniteError(
                        nonfinite_metric_cause(key),
                        round_index=self.next_round - 1,
                        silo=self.client_id,
                    )
        return check_contribution(
            contribution,
            self.public_metrics,
            params=params,
            silo=self.client_id,
            round_index=self.next_round - 1,
            encoding=self.share_encoding,
        )

    def fit(self, global_params: Params, round_index: int, config: Scalars) -> Contribution:
        """The round: :meth:`begin_round`, the algorithm's :meth:`step`, :meth:`release`."""
        plan = self.begin_round(round_index, config)
        return self.release(self.step(global_params, plan), global_params)

    @abstractmethod
    def step(self, global_params: Params, plan: RoundPlan) -> Contribution:
        """The algorithm's mechanism for one round (already charged): the contribution."""

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, params: Params, round_index: int, config: Scalars) -> Scalars:
        """Catch up through ``round_index``, then the test metrics of ``params``."""
        self.catch_up(int(round_index) + 1)
        return self.test(params)

    @abstractmethod
    def test(self, params: Params) -> Scalars:
        """``loss``, ``accuracy``, ``n`` of ``params`` on this silo's test split."""

    # ---------------------------------------------------------------- reports and state
    def privacy_summary(self) -> PrivacySummary | None:
        """This silo's units' privacy (stays at the silo); None if it accounts nothing."""
        return None if self.ledger is None else self.ledger.summary()

    def extra_state(self) -> dict[str, Any]:
        """The algorithm's own resumable state (override; JSON/array values only)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Inverse of :meth:`extra_state` (default: the algorithm keeps no state of its own)."""

    def state_dict(self) -> dict[str, Any]:
        return {
            "next_round": self.next_round,
            "participations": self.participations,
            "ledger": None if self.ledger is None else self.ledger.state_dict(),
            "extra": self.extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        next_round = int(state["next_round"])
        if next_round < 0:
            raise ValueError("silo state: next_round must be >= 0")
        self.next_round = next_round
        self.participations = int(state["participations"])
        if self.ledger is not None:
            if state.get("ledger") is None:
                raise ValueError("silo state: missing the ledger")
            self.ledger.load_state_dict(state["ledger"])
        self.load_extra_state(dict(state.get("extra") or {}))


class BatchedSilo(Silo, Generic[J, R]):
    """A silo whose step can run for many silos at once (the optional two-phase API).

    :meth:`prepare` turns the round plan into a job (no training), :meth:`train_batch` trains
    many silos' jobs together (one call per batch, e.g. a vectorized model over silos), and
    :meth:`finish` turns the job's result into the contribution (e.g. clipping and noise).
    Silos are batched together only when their :meth:`batch_key` is equal.
    """

    def step(self, global_params: Params, plan: RoundPlan) -> Contribution:
        job = self.prepare(global_params, plan)
        return self.finish(job, type(self).train_batch([job])[0])

    def batch_key(self) -> Hashable:
        """Silos with equal keys can share one :meth:`train_batch` call."""
        return type(self)

    @abstractmethod
    def prepare(self, global_params: Params, plan: RoundPlan) -> J:
        """The job of this round (after the charge; nothing is released)."""

    @classmethod
    @abstractmethod
    def train_batch(cls, jobs: Sequence[J]) -> list[R]:
        """Train every job (results in the same order)."""

    @abstractmethod
    def finish(self, job: J, result: R) -> Contribution:
        """The contribution of this silo from its trained result."""

    @classmethod
    def test_batch(cls, silos: Sequence[BatchedSilo[J, R]], params: Params) -> list[Scalars]:
        """Test metrics of ``params`` on each silo's test split (override to batch them)."""
        return [s.test(params) for s in silos]
