"""Record-level canaries for PriFedSync (Zheng et al., AISTATS 2021; local DP-SGD per client).

Algorithm 2 at client j: K DP-SGD steps per participation, each on a batch of B of its n records
(``sampler: wor``: exactly B without replacement; ``poisson``: a Bernoulli(γ = B/n) coin per
record), per-record clipping to C, noise σ_j·C, division by B. Every record of client j is
charged one :class:`~pdpfl.privacy.unit.LocalStepsPlan` event per participation at γ; the
client's budget group is its target ε (``no target``: the planned ε). A canary is an extra
*record* of a host client of its group (group_hosts: the clients whose records are in that
group), with the Dirac gradient ``C·e_j``:

* ``sampler: wor`` -- the neighbouring relation is *replace one record*: every canary of the
  host (included or not) joins the pool the batches are drawn from, ``wor_sample(n + m, B)``;
  an excluded canary is a null record (gradient 0), so included and excluded differ by one
  replacement. A drawn canary's row is clipped and added to the clipped sum before the noise.
  Its true rate B/(n + m) is below the γ = B/n its ledger is charged at: the claim stays an
  upper bound;
* ``sampler: poisson`` -- add/remove one record: the included canaries get their own
  Bernoulli(γ) coin per step (``train_steps(extra=…)``).

Ledger: the host's own (LocalStepsPlan, its accountant and orders) at γ, charged every round the
host took part (released an update of positive weight). Observers: those of the host's ledger;
the server sees each client's released local model (plain summation) or only their sum.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from pdpfl.audit.hooks import AuditUnsupported, CanaryHookBase, register_canary_hook
from pdpfl.audit.observe import ReleaseLog
from pdpfl.dp.extra_rows import ExtraRows
from pdpfl.fl.algorithm import Assembly
from pdpfl.fl.prifedsync import PriFedSyncConfig, PriFedSyncSilo
from pdpfl.ledger import PrivacyLedger

__all__ = ["PriFedSyncCanaries"]


def _silo(run: Assembly, host: int) -> PriFedSyncSilo:
    silo = run.clients[host]
    if not isinstance(silo, PriFedSyncSilo):
        raise AuditUnsupported(f"client {host}: {type(silo).__name__} is not a PriFedSync client")
    return silo


class PriFedSyncCanaries(CanaryHookBase):
    """Canary records of PriFedSync (module docstring)."""

    unit: ClassVar[str] = "record"

    def check(self, run: Assembly) -> None:
        for host in self.hosts(run):
            _silo(run, host)

    def observers(self, run: Assembly) -> tuple[str, ...]:
        first = _silo(run, self.hosts(run)[0])
        return tuple(first.ledger.observers)

    def group_hosts(self, run: Assembly, label: str) -> list[int]:
        """The clients whose records form the budget group ``label`` (their target)."""
        return [
            h
            for h in self.hosts(run)
            if any(g.label == label for g in _silo(run, h).privacy_summary().groups)
        ]

    def null_canaries(self, run: Assembly) -> bool:
        return str(run.config.algorithm.sampler) == "wor"  # type: ignore[attr-defined]

    def rates(self, run: Assembly, host: int, budgets: np.ndarray) -> np.ndarray:
        return np.full(len(budgets), float(_silo(run, host).rate))

    def plant(self, run: Assembly, host: int, rows: ExtraRows) -> None:
        _silo(run, host).extra_rows = rows

    def ledger(
        self, run: Assembly, host: int, budgets: np.ndarray, rates: np.ndarray, delta: float
    ) -> PrivacyLedger:
        """The host's records' ledger (mechanism, accountant, orders) at δ."""
        own = _silo(run, host).ledger
        mechanism: Any = dataclasses.replace(own.mechanism, delta=float(delta))  # type: ignore[type-var]
        return PrivacyLedger(
            np.asarray(budgets, dtype=np.float64),
            np.asarray(rates, dtype=np.float64),
            mechanism,
            orders=own.orders,
            accountant=own.accountant,
        )

    def participation(
        self, run: Assembly, host: int, log: ReleaseLog, rounds: int, count: int
    ) -> np.ndarray:
        """The rounds the host joined: it released its local model with weight 1 (a client
        that sits a round out releases zeros of weight 0)."""
        joined = np.array([log.weights.get((t, int(host)), 0.0) > 0 for t in range(rounds)])
        return np.repeat(joined[:, None], count, axis=1)


register_canary_hook(PriFedSyncConfig, PriFedSyncCanaries())
