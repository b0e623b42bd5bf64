"""The canary plan: m Dirac canaries per budget group (and a never-trained control group).

One-run auditing (Steinke, Nasr & Jagielski 2023, §3; federated form: Andrew et al., ICLR 2024,
"One-shot empirical privacy estimation for federated learning") needs, per audited group:

* m canaries, each **included independently with probability ½** (its coin ``included``);
* each with its own coordinate j (distinct over all canaries, drawn at random in the audit
  space, :mod:`pdpfl.audit.space`): an included canary is a unit whose clipped per-example
  gradient is ``C·e_j``, trained through the host's real mechanism at the rate its group's
  budget gets (the host's own ε → q map);
* a host (a silo, for record-level canaries), drawn at random among the algorithm's hosts.

The **control group** has m more canaries with coins and coordinates but is never trained: the
auditor must be at chance on it (ε̂ ≈ 0), in every run.

The coins come from the audit's own :class:`~pdpfl.randomness.Randomness` (a CSPRNG unless a
seed is given); the mechanism's noise and sampling coins stay those of each party.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pdpfl.dp.extra_rows import ExtraRows
from pdpfl.randomness import Randomness

__all__ = ["CONTROL_LABEL", "CanaryPlan", "GroupSpec", "plan_canaries"]

#: Label of the never-trained control group.
CONTROL_LABEL = "control"


@dataclass(frozen=True)
class GroupSpec:
    """One audited group: its label and the budget its canaries get (the group's largest)."""

    label: str
    budget: float
    control: bool = False


@dataclass
class CanaryPlan:
    """Every canary of one audit (arrays of length N = m · number of groups).

    ``group`` indexes :attr:`groups`; ``rates`` are filled in by the algorithm's hook
    (0 for the control group); ``order`` is a random permutation used to break score ties.
    """

    groups: list[GroupSpec]
    group: np.ndarray
    coords: np.ndarray
    host: np.ndarray
    included: np.ndarray
    order: np.ndarray
    value: float
    rates: np.ndarray

    @property
    def size(self) -> int:
        return int(self.group.size)

    def members(self, g: int) -> np.ndarray:
        """Indices of the canaries of group ``g``."""
        return np.flatnonzero(self.group == g)

    def trained(self) -> np.ndarray:
        """Canaries planted in the mechanism: included and not in the control group."""
        control = np.array([s.control for s in self.groups], dtype=bool)[self.group]
        return self.included & ~control

    def rows_for(self, host: int) -> ExtraRows:
        """The host's planted canaries as Dirac rows ``value · e_j`` with their rates."""
        sel = np.flatnonzero(self.trained() & (self.host == host))
        return ExtraRows(
            coords=self.coords[sel].reshape(-1, 1),
            values=np.full((sel.size, 1), self.value, dtype=np.float64),
            rates=self.rates[sel],
        )


def _permutation(randomness: Randomness, purpose: str, n: int) -> np.ndarray:
    return np.argsort(randomness.stream(purpose).uniform(n), kind="stable")


def plan_canaries(
    groups: list[GroupSpec],
    per_group: int,
    pool: np.ndarray,
    hosts: list[int],
    value: float,
    randomness: Randomness,
) -> CanaryPlan:
    """Draw the coins, coordinates (distinct, from ``pool``) and hosts of every canary."""
    m = int(per_group)
    if m < 2:
        raise ValueError(f"--canaries: at least 2 per group, got {per_group}")
    if not hosts:
        raise ValueError("canaries: the algorithm offers no host for canaries")
    n = m * len(groups)
    pool = np.asarray(pool, dtype=np.int64)
    if n > pool.size:
        raise ValueError(f"--canaries: {n} canaries need {n} coordinates, {pool.size} available")
    coords = pool[_permutation(randomness, "audit-coordinates", pool.size)[:n]]
    included = randomness.stream("audit-inclusion").uniform(n) < 0.5
    pick = np.floor(randomness.stream("audit-hosts").uniform(n) * len(hosts)).astype(np.int64)
    host = np.asarray(hosts, dtype=np.int64)[np.minimum(pick, len(hosts) - 1)]
    return CanaryPlan(
        groups=list(groups),
        group=np.repeat(np.arange(len(groups), dtype=np.int64), m),
        coords=coords,
        host=host,
        included=included,
        order=_permutation(randomness, "audit-ties", n),
        value=float(value),
        rates=np.zeros(n, dtype=np.float64),
    )
