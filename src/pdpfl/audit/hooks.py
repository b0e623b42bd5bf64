"""The per-algorithm canary hook: how ``pdpfl audit`` plants canaries in an algorithm's units.

The audit is generic (plan canaries, run the federation, observe, bound); what depends on the
algorithm is small and lives in one :class:`CanaryHook` per algorithm family, registered for
its config class with :func:`register_canary_hook` (an ``Algorithm.canary_*`` extension point
kept beside the auditor, so that ``fl/`` does not depend on it):

``hosts(run)``
    the parties that can hold a canary unit (silo ids for record-level canaries);
``rates(run, host, budgets)``
    the sampling rate the algorithm gives a unit with these budgets at that host -- the same
    map ε → q it uses for its own units (rPDP-FL: q = F(ε), Algorithm 3 line 4);
``plant(run, host, rows)``
    install the canaries (:class:`~pdpfl.dp.extra_rows.ExtraRows`, rows ``C·e_j``) so that
    they are sampled, clipped and noised with the host's units in every DP step;
``ledger(run, host, budgets, rates, delta)``
    a :class:`~pdpfl.ledger.PrivacyLedger` for the canaries with the mechanism and accountant
    of the host's own ledger -- what the host *claims* -- at ``delta``, charged by the auditor
    round by round like the host's own units.

Built in: the DP-FedAvg family on the silo template (rPDP-FL, Minimum, Dropout, Uniform,
centralized; record-level, :class:`RecordCanaries`). What IDP-FedAvg (client canaries),
ULDP-FL (user canaries) and PriFedSync need is described in ``docs/audit.md``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Protocol

import numpy as np

from pdpfl.dp.extra_rows import ExtraRows
from pdpfl.fl.algorithm import Algorithm, Assembly
from pdpfl.fl.rpdp import DpFedAvgConfig
from pdpfl.ledger import PrivacyLedger

__all__ = [
    "AuditUnsupported",
    "CanaryHook",
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

    def hosts(self, run: Assembly) -> list[int]: ...

    def rates(self, run: Assembly, host: int, budgets: np.ndarray) -> np.ndarray: ...

    def plant(self, run: Assembly, host: int, rows: ExtraRows) -> None: ...

    def ledger(
        self, run: Assembly, host: int, budgets: np.ndarray, rates: np.ndarray, delta: float
    ) -> PrivacyLedger: ...


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
        f"algorithm.name: {algorithm.name!r} has no canary hook yet; the audit supports "
        "rpdp, minimum, dropout, uniform and centralized (see docs/audit.md for the hook an "
        "algorithm needs)"
    )


class RecordCanaries:
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

    def hosts(self, run: Assembly) -> list[int]:
        return sorted(int(c) for c in run.clients)

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
            budgets, rates, dataclasses.replace(own.mechanism, delta=float(delta)),
            accountant=own.accountant,
        )


register_canary_hook(DpFedAvgConfig, RecordCanaries())
