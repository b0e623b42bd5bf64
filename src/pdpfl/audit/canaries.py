"""The canary plan: m Dirac canaries per budget group (and a never-trained control group).

One-run auditing (Steinke, Nasr & Jagielski 2023, §3; federated form: Andrew et al., ICLR 2024,
"One-shot empirical privacy estimation for federated learning") needs, per audited group:

* m canaries, each **included independently with probability ½** (its coin ``included``);
* each with its own coordinate j (distinct over all canaries, drawn at random in the audit
  space, :mod:`pdpfl.audit.space`): an included canary is a unit whose clipped per-example
  gradient is ``C·e_j``, trained through the host's real mechanism at the rate its group's
  budget gets (the host's own ε → q map);
* a host (a silo, for record-level canaries), drawn at random among the hosts the algorithm
  offers its group (every host, unless the hook narrows it: PriFedSync's records of one budget
  live at the clients with that target); :data:`EVERYWHERE` for a canary unit that is not one
  silo's (an IDP-FedAvg canary client at the trusted aggregator, a ULDP-FL canary user with
  records in every silo).

The **control group** has m more canaries with coins and coordinates but is never trained: the
auditor must be at chance on it (ε̂ ≈ 0), in every run.

The coins come from the audit's own :class:`~pdpfl.randomness.Randomness` (a CSPRNG unless a
seed is given); the mechanism's noise and sampling coins stay those of each party.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pdpfl.dp.discrete_params import DiscreteShareParams
from pdpfl.dp.extra_rows import ExtraRows
from pdpfl.randomness import Randomness

__all__ = [
    "check_unchanged_encoding",
    "CONTROL_LABEL",
    "EVERYWHERE",
    "CanaryPlan",
    "GroupSpec",
    "plan_canaries",
    "stacked_rows",
]

#: Label of the never-trained control group.
CONTROL_LABEL = "control"

#: The host of a canary unit that is not one silo's: planted at the server (a canary client of
#: central IDP-FedAvg) or in every silo (a ULDP-FL canary user with records everywhere). The
#: server observer scores it on every silo's release.
EVERYWHERE = -1


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
        out: np.ndarray = self.included & ~control
        return out

    def rows_for(self, host: int, *, nulls: bool = False) -> ExtraRows:
        """The host's planted canaries as Dirac rows ``value · e_j`` with their rates.

        ``nulls``: also the host's *excluded* canaries (of the audited groups), as rows of value
        0 -- null units that occupy their slot without contributing, so that included and
        excluded differ by replacing one unit (the neighbouring relation of a mechanism that
        samples batches of a fixed size without replacement)."""
        audited = ~np.array([s.control for s in self.groups], dtype=bool)[self.group]
        chosen = audited & (self.host == host)
        if not nulls:
            chosen &= self.included
        sel = np.flatnonzero(chosen)
        values = np.where(self.included[sel], self.value, 0.0)
        return ExtraRows(
            coords=self.coords[sel].reshape(-1, 1),
            values=values.reshape(-1, 1).astype(np.float64),
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
    *,
    group_hosts: Sequence[Sequence[int]] | None = None,
) -> CanaryPlan:
    """Draw the coins, coordinates (distinct, from ``pool``) and hosts of every canary.

    ``group_hosts`` (one list per group) narrows the hosts a group's canaries may have;
    without it every group draws among ``hosts``."""
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
    if group_hosts is not None and len(group_hosts) != len(groups):
        raise ValueError("canaries: group_hosts needs one list of hosts per group")
    u = randomness.stream("audit-hosts").uniform(n)
    host = np.empty(n, dtype=np.int64)
    for g, spec in enumerate(groups):
        options = np.asarray(hosts if group_hosts is None else group_hosts[g], dtype=np.int64)
        if options.size == 0:
            raise ValueError(f"canaries: the algorithm offers no host for group {spec.label}")
        part = slice(g * m, (g + 1) * m)
        pick = np.floor(u[part] * options.size).astype(np.int64)
        host[part] = options[np.minimum(pick, options.size - 1)]
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


def check_unchanged_encoding(
    old: DiscreteShareParams, new: DiscreteShareParams, who: str, hint: str
) -> None:
    """Refuse (ValueError naming ``secure.bits``) a share encoding re-derived with the audit's
    canaries among the contributors when it would change what the ledger's plan was built from:
    the scale, the sensitivity N, the share and the padded dimension. ``who`` names the
    canaries ("12 canary users"), ``hint`` the ways out."""
    same = (new.scale_log2, new.l2_sensitivity_sq, new.share, new.padded_dimension)
    if same != (old.scale_log2, old.l2_sensitivity_sq, old.share, old.padded_dimension):
        raise ValueError(
            f"secure.bits: the audit's {who} (contributors {old.contributors} -> "
            f"{new.contributors}) need the scale 2^{new.scale_log2} instead of the run's "
            f"2^{old.scale_log2} at b = {old.bits}; {hint}"
        )


def stacked_rows(coords: list[np.ndarray]) -> int:
    """The most canary rows any one coordinate holds among the planted rows' ``coords``
    (each row's coordinates are distinct; 0 without rows): what a discrete share encoding's
    per-coordinate wrap bound must count (:mod:`pdpfl.audit.user_canaries`)."""
    parts = [np.asarray(c, dtype=np.int64).reshape(-1) for c in coords]
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return int(np.bincount(flat).max()) if flat.size else 0
