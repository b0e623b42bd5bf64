"""The per-algorithm canary hook: how ``pdpfl audit`` plants canaries in an algorithm's units.

The audit is generic (plan canaries, run the federation, observe, bound); what depends on the
algorithm is small and lives in one :class:`CanaryHook` per algorithm family, registered for
its config class with :func:`register_canary_hook` (an ``Algorithm.canary_*`` extension point
kept beside the auditor, so that ``fl/`` does not depend on it). A canary is one *unit* of the
algorithm's own privacy unit -- a record, a client or a user -- whose contribution is a Dirac
``C·e_j``:

``hosts(run)``
    the parties that can hold a canary unit: silo ids, or :data:`EVERYWHERE` for a unit that
    is not one silo's (a canary client at the trusted aggregator, a canary user with records
    in every silo);
``group_hosts(run, label)``
    the hosts the canaries of one budget group may have (default: every host);
``rates(run, host, budgets)``
    the sampling rate the algorithm gives a unit with these budgets at that host -- the same
    map ε → q it uses for its own units (rPDP-FL: q = F(ε), Algorithm 3 line 4; IDP-FedAvg:
    the group's q_p of SAMPLE; ULDP-FL: the user rate q_u);
``plant(run, host, rows)``
    install the canaries (:class:`~pdpfl.dp.extra_rows.ExtraRows`, rows ``C·e_j`` with their
    rates) so that they are sampled, clipped and noised with the host's units;
``ledger(run, host, budgets, rates, delta)``
    a :class:`~pdpfl.ledger.PrivacyLedger` for the canaries with the mechanism and accountant
    of the host's own ledger -- what the algorithm *claims* for such a unit -- at ``delta``,
    charged by the auditor round by round like the algorithm's own units;
``participation(run, host, log, rounds, count)``
    per round and canary, whether that ledger charges the round as one the canary's host took
    part in (default: the rounds its host released an update; every round for
    :data:`EVERYWHERE`);
``null_canaries(run)``
    True when the algorithm's neighbouring relation is *replace one* unit (PriFedSync's batches
    of a fixed size without replacement): the excluded canaries are then planted too, as null
    units of value 0, so that included and excluded differ by one replacement;
``release_sign(run)``
    +1 when the silos release model deltas (the canary's coordinate goes *down* in them), −1
    when they release gradients (ULDP-SGD): the server observer's score is multiplied by it;
``observers(run)``
    the observers the algorithm states a guarantee against (the audit compares ε̂ with the
    accountant's ε for these; default both);
``round_signal(run, observer)``
    μ when the observer sees each canary once per round behind one sampling coin (an
    IDP-FedAvg canary client: its clipped update over the round's value noise std), so that the
    canaries are scored by that law's exact likelihood ratio; None (default) for rounds that
    sum several steps' coins (scored by the standardized sum).

:class:`CanaryHookBase` has the defaults. Built in: the DP-FedAvg family on the silo template
(rPDP-FL, Minimum, Dropout, Uniform, centralized; record-level, :class:`RecordCanaries`);
IDP-FedAvg (client canaries, :mod:`pdpfl.audit.client_canaries`), ULDP-AVG/SGD (user canaries,
:mod:`pdpfl.audit.user_canaries`) and PriFedSync (record canaries,
:mod:`pdpfl.audit.prifedsync_canaries`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Protocol

import numpy as np

from pdpfl.audit.canaries import EVERYWHERE
from pdpfl.audit.observe import ReleaseLog
from pdpfl.dp.extra_rows import ExtraRows
from pdpfl.fl.algorithm import Algorithm, Assembly
from pdpfl.fl.rpdp import DpFedAvgConfig
from pdpfl.ledger import OBSERVERS, PrivacyLedger

__all__ = [
    "EVERYWHERE",
    "AuditUnsupported",
    "CanaryHook",
    "CanaryHookBase",
    "RecordCanaries",
    "canary_hook",
    "register_canary_hook",
]


class AuditUnsupported(ValueError):
    """The configured algorithm cannot be audited (no hook, or no differential privacy)."""


class CanaryHook(Protocol):
    """What an algorithm provides so that canaries can be planted in it (module docstring)."""

    unit: ClassVar[str]

    def check(self, run: Assembly) -> None:
        """Raise :class:`AuditUnsupported` when this run cannot be audited."""
        ...

    def observers(self, run: Assembly) -> tuple[str, ...]: ...

    def hosts(self, run: Assembly) -> list[int]: ...

    def group_hosts(self, run: Assembly, label: str) -> list[int]: ...

    def rates(self, run: Assembly, host: int, budgets: np.ndarray) -> np.ndarray: ...

    def plant(self, run: Assembly, host: int, rows: ExtraRows) -> None: ...

    def ledger(
        self, run: Assembly, host: int, budgets: np.ndarray, rates: np.ndarray, delta: float
    ) -> PrivacyLedger: ...

    def participation(
        self, run: Assembly, host: int, log: ReleaseLog, rounds: int, count: int
    ) -> np.ndarray: ...

    def release_sign(self, run: Assembly) -> float: ...

    def null_canaries(self, run: Assembly) -> bool: ...

    def round_signal(self, run: Assembly, observer: str) -> float | None: ...


class CanaryHookBase:
    """The defaults of :class:`CanaryHook`'s optional parts (module docstring)."""

    def observers(self, run: Assembly) -> tuple[str, ...]:
        return OBSERVERS

    def hosts(self, run: Assembly) -> list[int]:
        return sorted(int(c) for c in run.clients)

    def group_hosts(self, run: Assembly, label: str) -> list[int]:
        return self.hosts(run)

    def release_sign(self, run: Assembly) -> float:
        return 1.0

    def null_canaries(self, run: Assembly) -> bool:
        return False

    def round_signal(self, run: Assembly, observer: str) -> float | None:
        """μ when ``observer`` sees each canary at most once per round, sampled by one coin of
        its rate and adding μ (its clipped contribution over the round's noise std) to its
        coordinate: the canaries are then scored by that law's exact likelihood ratio
        (:func:`pdpfl.audit.observe.sampled_gaussian_scores`). None (the default): a round
        sums several steps' coins, scored by the standardized sum."""
        return None

    def participation(
        self, run: Assembly, host: int, log: ReleaseLog, rounds: int, count: int
    ) -> np.ndarray:
        """``(rounds, count)``: the rounds the host released in (every round: EVERYWHERE)."""
        if host == EVERYWHERE:
            took_part = np.ones(rounds, dtype=bool)
        else:
            took_part = log.released(host, rounds)
        return np.repeat(took_part[:, None], count, axis=1)


_HOOKS: list[tuple[type, CanaryHook]] = []


def register_canary_hook(config_class: type, hook: CanaryHook) -> None:
    """Use ``hook`` for ``config_class`` (an :class:`~pdpfl.fl.algorithm.Algorithm` config
    class) and its subclasses; the latest registration wins."""
    if not (isinstance(config_class, type) and issubclass(config_class, Algorithm)):
        raise TypeError(f"register_canary_hook: expected an Algorithm class, got {config_class!r}")
    _HOOKS.insert(0, (config_class, hook))


def canary_hook(algorithm: Algorithm) -> CanaryHook:
    """The hook registered for ``algorithm``'s config class (AuditUnsupported if none)."""
    for cls, hook in _HOOKS:
        if isinstance(algorithm, cls):
            return hook
    raise AuditUnsupported(
        f"algorithm.name: {algorithm.name!r} has no canary hook; the audit supports rpdp, "
        "minimum, dropout, uniform, centralized, idp-fedavg, uldp-avg, uldp-sgd and prifedsync "
        "(see docs/audit.md for the hook an algorithm needs)"
    )


class RecordCanaries(CanaryHookBase):
    """Record-level canaries for the DP-FedAvg family (rPDP-FL and its baselines).

    A canary is an extra record of one silo: its rate is the silo's published map of its
    budget (``setup.record_rates``: F(ε) for rPDP-FL, the uniform q or 0 for the baselines), it
    enters every local DP-SGD step through ``DpFedAvgSilo.extra_rows`` and its ledger is the
    silo's record-level :class:`~pdpfl.privacy.plan.TrainingPlan`.
    """

    unit: ClassVar[str] = "record"

    @staticmethod
    def _silo(run: Assembly, host: int) -> Any:
        silo = run.clients[host]
        if not hasattr(silo, "extra_rows") or not hasattr(silo, "setup"):
            raise AuditUnsupported(
                f"silo {host}: {type(silo).__name__} does not take canaries (extra_rows)"
            )
        return silo

    def check(self, run: Assembly) -> None:
        for host in self.hosts(run):
            if not self._silo(run, host).setup.private:
                raise AuditUnsupported(
                    f"algorithm.name: {run.config.algorithm.name!r} trains without differential "
                    "privacy (ε = ∞): there is no guarantee to audit"
                )

    def rates(self, run: Assembly, host: int, budgets: np.ndarray) -> np.ndarray:
        return np.asarray(self._silo(run, host).setup.record_rates(budgets), dtype=np.float64)

    def plant(self, run: Assembly, host: int, rows: ExtraRows) -> None:
        self._silo(run, host).extra_rows = rows

    def ledger(
        self, run: Assembly, host: int, budgets: np.ndarray, rates: np.ndarray, delta: float
    ) -> PrivacyLedger:
        """The host's own ledger's mechanism and accountant (what the silo *claims*), at δ."""
        own = self._silo(run, host).ledger
        return PrivacyLedger(
            budgets,
            rates,
            dataclasses.replace(own.mechanism, delta=float(delta)),
            accountant=own.accountant,
        )


register_canary_hook(DpFedAvgConfig, RecordCanaries())
