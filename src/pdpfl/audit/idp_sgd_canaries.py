"""Record-level canaries for Scale (:mod:`pdpfl.fl.idp_sgd`): each clipped at its group's C_p.

A canary of budget ε is an extra record of a host silo: its rate is q (every record's), its
Dirac row ``C·e_j`` is clipped to the C_p of the group the silo would put a record of budget ε
in (the row becomes ``C_p·e_j``, which the silo's step adds to its clipped sum before the one
noise σC), and its ledger charges it the multiplier σ·C/C_p -- what the silo claims for such a
record. The hook is told a host's canary budgets (:meth:`ScaleCanaries.rates`) just before it
plants that host's rows (:meth:`ScaleCanaries.plant`); it asks for the excluded canaries too
(:meth:`null_canaries`, rows of value 0, which add nothing under Poisson sampling), so that the
rows line up with those budgets one to one.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from pdpfl.audit.hooks import AuditUnsupported, CanaryHookBase, register_canary_hook
from pdpfl.dp.extra_rows import ExtraRows
from pdpfl.fl.algorithm import Assembly
from pdpfl.fl.idp_sgd import ScaleConfig, ScaleSilo
from pdpfl.ledger import PrivacyLedger

__all__ = ["ScaleCanaries"]


def _silo(run: Assembly, host: int) -> ScaleSilo:
    silo = run.clients[host]
    if not isinstance(silo, ScaleSilo):
        raise AuditUnsupported(f"silo {host}: {type(silo).__name__} is not a Scale silo")
    return silo


class ScaleCanaries(CanaryHookBase):
    """Canary records of Scale (module docstring)."""

    unit: ClassVar[str] = "record"

    def __init__(self) -> None:
        self._budgets: dict[tuple[int, int], np.ndarray] = {}

    def check(self, run: Assembly) -> None:
        for host in self.hosts(run):
            _silo(run, host)

    def null_canaries(self, run: Assembly) -> bool:
        return True  # every audited canary of a host is a row: they line up with its budgets

    def rates(self, run: Assembly, host: int, budgets: np.ndarray) -> np.ndarray:
        self._budgets[(id(run), host)] = np.asarray(budgets, dtype=np.float64)
        return np.asarray(_silo(run, host).setup.record_rates(budgets), dtype=np.float64)

    def plant(self, run: Assembly, host: int, rows: ExtraRows) -> None:
        silo = _silo(run, host)
        budgets = self._budgets.pop((id(run), host), np.zeros(0))
        if budgets.size != rows.num_rows:
            raise AuditUnsupported(f"silo {host}: {rows.num_rows} canaries, {budgets.size} budgets")
        clips = silo.setup.clip_norms(budgets, getattr(silo.noise, "dimension", None))
        norms = np.sqrt(np.sum(rows.values * rows.values, axis=1))
        scale = np.where(norms > clips, clips / np.maximum(norms, 1e-300), 1.0)
        silo.extra_rows = ExtraRows(rows.coords, rows.values * scale[:, None], rows.rates)

    def ledger(
        self, run: Assembly, host: int, budgets: np.ndarray, rates: np.ndarray, delta: float
    ) -> PrivacyLedger:
        """The host's record ledger (plan, accountant) at δ, each canary at σ·C/C_p."""
        silo = _silo(run, host)
        own = silo.ledger
        assert own is not None
        return PrivacyLedger(
            np.asarray(budgets, dtype=np.float64),
            np.asarray(rates, dtype=np.float64),
            dataclasses.replace(silo.setup.plan(), delta=float(delta)),
            noise_multipliers=silo.setup.record_noise(
                budgets, getattr(silo.noise, "dimension", None)
            ),
            accountant=own.accountant,
        )


register_canary_hook(ScaleConfig, ScaleCanaries())
