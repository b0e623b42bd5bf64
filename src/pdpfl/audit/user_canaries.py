"""User-level canaries for ULDP-AVG and ULDP-SGD (the privacy unit is a user in every silo).

Kato et al. (PVLDB 2024), Algorithms 3-4: each round the server samples user u with q_u; every
silo s clips each sampled user's vector Δ_{s,u} to C, sums them weighted by w_{s,u}
(Σ_s w_{s,u} ≤ 1) and adds N(0, σ²C²/|S|); the sum over the silos has user-level sensitivity
C (Theorem 5). A canary is an extra *user* of one budget group whose vector is the Dirac
``∓L·e_j`` (L ≫ C; the sign makes the global step move the coordinate *down*: − for ULDP-AVG's
deltas, + for ULDP-SGD's gradients):

* **where its records are**: with uniform weights (w = 1/|S|) the canary user has records in
  *every* silo (host :data:`~pdpfl.audit.canaries.EVERYWHERE`), so its weighted contributions
  add up to the full sensitivity C; with enhanced weights (w_{s,u} = n_{s,u}/N_u) all its
  records are in one host silo, where its weight is 1;
* **its coin**: Bernoulli(q_u) per round from a stream of the *server*, which samples users
  (Algorithm 4); every silo holding the canary reads the same coin. q_u is the server's map: the
  certified F(ε) of :func:`~pdpfl.fl.uldp.mechanism.user_rates` with personal budgets, else the
  public user rate (1 without sub-sampling);
* **through the mechanism**: in each silo's step 3 (``UserLevelSilo.step``), clipped and
  weighted, added to the weighted sum before the silo's noise (also on the noise-only path);
* **its ledger**: the server's user-level :class:`~pdpfl.privacy.uldp.UserLevelPlan`; third
  parties are charged every round (subsampled Gaussian at q_u), the server every round as well
  -- the plan's worst case (the exact charge is the rounds the coins sampled the canary, which
  only lowers the server's ε).

Refused: ULDP-NAIVE/GROUP/DEFAULT (no per-user vectors) and ``weights: private`` (the canary
users would have to join the encrypted weighting protocol).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from pdpfl.audit.canaries import EVERYWHERE
from pdpfl.audit.hooks import AuditUnsupported, CanaryHookBase, register_canary_hook
from pdpfl.audit.observe import ReleaseLog
from pdpfl.dp.extra_rows import ExtraRows
from pdpfl.fl.algorithm import Assembly
from pdpfl.fl.uldp import UserLevelConfig
from pdpfl.fl.uldp.mechanism import user_rates
from pdpfl.fl.uldp.server import SamplingServer
from pdpfl.fl.uldp.users import UserLevelSilo
from pdpfl.ledger import PrivacyLedger
from pdpfl.privacy.uldp import ORDERS, UserLevelPlan
from pdpfl.randomness import RandomStream

__all__ = ["CANARY_VECTOR_NORM", "UserCanaries"]

#: L: the norm of a canary user's vector before clipping (far above C).
CANARY_VECTOR_NORM = 1e12


def _server(run: Assembly) -> SamplingServer:
    server = run.server
    if not isinstance(server, SamplingServer):
        raise AuditUnsupported(
            f"algorithm.name: {run.config.algorithm.name!r}: user canaries need ULDP-AVG or "
            "ULDP-SGD (per-user vectors and the user-level ledger at the server)"
        )
    return server


def _silos(run: Assembly) -> dict[int, UserLevelSilo]:
    silos = {int(c): s for c, s in run.clients.items() if isinstance(s, UserLevelSilo)}
    if len(silos) != len(run.clients):
        raise AuditUnsupported("uldp: user canaries need ULDP-AVG/SGD silos")
    return silos


class UserCanaries(CanaryHookBase):
    """Canary users of ULDP-AVG/SGD (module docstring)."""

    unit: ClassVar[str] = "user"

    def check(self, run: Assembly) -> None:
        _server(run)
        silos = _silos(run)
        if any(s.user_weights is None for s in silos.values()):
            raise AuditUnsupported(
                "algorithm.weights: private weights run inside the encrypted weighting "
                "protocol, which canary users cannot join; audit weights: uniform or enhanced"
            )

    def observers(self, run: Assembly) -> tuple[str, ...]:
        return tuple(_server(run).plan.observers)

    def _uniform(self, run: Assembly) -> bool:
        return str(_server(run).setup.weights) == "uniform"  # type: ignore[attr-defined]

    def hosts(self, run: Assembly) -> list[int]:
        if self._uniform(run):
            return [EVERYWHERE]  # records in every silo: weights 1/|S| add up to 1
        return sorted(_silos(run))

    def rates(self, run: Assembly, host: int, budgets: np.ndarray) -> np.ndarray:
        server = _server(run)
        if server.personal:
            return user_rates(
                np.asarray(budgets, dtype=np.float64), _plan(server), allow_exclusion=True
            )
        return np.full(len(budgets), float(np.max(server.rates)))

    def plant(self, run: Assembly, host: int, rows: ExtraRows) -> None:
        server = _server(run)
        _plan(server)  # canary users ride on continuous noise shares
        silos = _silos(run)
        value = -server.sign * CANARY_VECTOR_NORM
        randomness = server.randomness

        def coins(t: int) -> RandomStream:
            # the server's coins; the same stream (and so the same coins) in every silo
            # (index host + 1 >= 0: EVERYWHERE is -1)
            return randomness.stream("audit-canary-users", int(t), int(host) + 1)

        targets: list[tuple[Any, float]]
        if host == EVERYWHERE:
            targets = [(s, 1.0 / len(silos)) for s in silos.values()]
        else:
            targets = [(silos[host], 1.0)]
        for silo, weight in targets:
            silo.extra_rows = ExtraRows(
                coords=rows.coords, values=np.full_like(rows.values, value), rates=rows.rates
            )
            silo.extra_weight = weight
            silo.extra_coins = coins

    def ledger(
        self, run: Assembly, host: int, budgets: np.ndarray, rates: np.ndarray, delta: float
    ) -> PrivacyLedger:
        """The server's user-level ledger (UserLevelPlan, its orders) at δ."""
        server = _server(run)
        mechanism: Any = dataclasses.replace(_plan(server), delta=float(delta))
        return PrivacyLedger(
            np.asarray(budgets, dtype=np.float64),
            np.asarray(rates, dtype=np.float64),
            mechanism,
            orders=ORDERS,
            accountant=server.ledger.accountant,
        )

    def release_sign(self, run: Assembly) -> float:
        """ULDP-SGD's silos release gradients (the server steps x − η·Σ): −1."""
        return float(_server(run).sign)

    def participation(
        self, run: Assembly, host: int, log: ReleaseLog, rounds: int, count: int
    ) -> np.ndarray:
        """Every round: the server's worst case (module docstring)."""
        return np.ones((rounds, count), dtype=bool)


register_canary_hook(UserLevelConfig, UserCanaries())


def _plan(server: SamplingServer) -> UserLevelPlan:
    """The server's continuous user-level plan; canary users are planted into float shares, so
    a run with discrete noise shares is refused (ValueError naming the field)."""
    plan = server.plan
    if not isinstance(plan, UserLevelPlan):
        raise ValueError(
            "privacy.noise_shares: a user-level audit plants its canary users into continuous "
            "noise shares; set privacy.noise_shares: continuous"
        )
    return plan
