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
  weighted, added to the weighted sum before the silo's noise (also on the noise-only path).
  With exact discrete shares (``privacy.noise_shares: discrete``, the default;
  ``UserLevelSilo.discrete_step``) each sampled canary is a unit of the integer vector like a
  user: clipped, weighted, rotated if the rotation is on, scaled and rounded on its own at its
  part bound N_p(w), summed with the users' integer vectors before the one discrete noise share,
  modulo 2^b. The encoding's contributor count K, which sizes the scale γ against wrapping, is
  re-derived with the canaries (:func:`_discrete_encoding`): without the rotation it bounds
  each coordinate's signal by K·√N, so K = |U| + the most canaries on one coordinate
  (:func:`~pdpfl.audit.canaries.stacked_rows`; 1 for Dirac canaries on coordinates of their
  own: K = |U| + 1); with the rotation every
  canary spreads over every coordinate (K = |U| + the canaries). A K that would change the
  encoding (its scale, N or shares: the ledger's event) is refused;
* **its ledger**: the server's user-level plan -- :class:`~pdpfl.privacy.uldp.UserLevelPlan`,
  or with discrete shares :class:`~pdpfl.privacy.uldp_discrete.DiscreteUserLevelPlan` (the
  distributed discrete Gaussian that is released); third parties are charged every round
  (sub-sampled at q_u), the server every round as well -- the plan's worst case (the exact
  charge is the rounds the coins sampled the canary, which only lowers the server's ε).

The score is the Gaussian one of every audit (the standardized per-round sums): the one-run
bound is valid whatever the score (Steinke, Nasr & Jagielski 2023, Theorem 3.1 holds for any
score of the output), so on discrete shares a Gaussian score can only cost power, never
validity.

Refused: ULDP-NAIVE/GROUP/DEFAULT (no per-user vectors) and ``weights: private`` (the canary
users would have to join the encrypted weighting protocol).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from pdpfl.audit.canaries import EVERYWHERE, check_unchanged_encoding, stacked_rows
from pdpfl.audit.hooks import AuditUnsupported, CanaryHookBase, register_canary_hook
from pdpfl.audit.observe import ReleaseLog
from pdpfl.dp.extra_rows import ExtraRows
from pdpfl.fl.aggregation.discrete_shares import ShareEncoding
from pdpfl.fl.algorithm import Assembly
from pdpfl.fl.uldp import UserLevelConfig
from pdpfl.fl.uldp.mechanism import user_rates
from pdpfl.fl.uldp.server import SamplingServer
from pdpfl.fl.uldp.users import UserLevelSilo
from pdpfl.ledger import PrivacyLedger
from pdpfl.privacy.uldp import ORDERS, UserLevelPlan
from pdpfl.privacy.uldp_discrete import DiscreteUserLevelPlan
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
            plan: Any = _plan(server)  # user_rates takes either plan (as_training_plan)
            return user_rates(
                np.asarray(budgets, dtype=np.float64),
                plan,
                allow_exclusion=True,
                accountant=server.ledger.accountant,
            )
        return np.full(len(budgets), float(np.max(server.rates)))

    def plant(self, run: Assembly, host: int, rows: ExtraRows) -> None:
        server = _server(run)
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
        if server.share_encoding is not None:  # discrete shares: K counts the canaries too
            if host == EVERYWHERE:  # the same rows in every silo: one canary user each
                coords = [rows.coords]
            else:  # one host silo per call: every silo's canaries so far
                coords = [s.extra_rows.coords for s in silos.values() if s.extra_rows is not None]
            encoding = _discrete_encoding(
                run, server.share_encoding, sum(len(c) for c in coords), stacked_rows(coords)
            )
            server.share_encoding = encoding
            for s in silos.values():
                s.share_encoding = encoding

    def ledger(
        self, run: Assembly, host: int, budgets: np.ndarray, rates: np.ndarray, delta: float
    ) -> PrivacyLedger:
        """The server's user-level ledger (UserLevelPlan, its orders) at δ."""
        server = _server(run)
        plan = _plan(server)
        mechanism: Any
        if isinstance(plan, DiscreteUserLevelPlan):
            mechanism = DiscreteUserLevelPlan(
                dataclasses.replace(plan.released, delta=float(delta)),
                dataclasses.replace(plan.server_view, delta=float(delta)),
                plan.server_knows_sampling,
            )
        else:
            mechanism = dataclasses.replace(plan, delta=float(delta))
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


def _plan(server: SamplingServer) -> UserLevelPlan | DiscreteUserLevelPlan:
    """The server's user-level plan: continuous or discrete shares (the event released)."""
    plan = server.plan
    if not isinstance(plan, UserLevelPlan | DiscreteUserLevelPlan):
        raise AuditUnsupported(
            f"privacy: the server's plan {type(plan).__name__} is not a user-level plan of "
            "ULDP-AVG/SGD"
        )
    return plan


def _discrete_encoding(
    run: Assembly, encoding: ShareEncoding, canaries: int, stacked: int
) -> ShareEncoding:
    """The run's share encoding re-derived with its ``canaries`` canary users among the
    contributors K (module docstring; without the rotation only the ``stacked`` most that share
    a coordinate); ValueError naming ``secure.bits`` when they would change the encoding (scale,
    N, shares), which the ledger's plan was built from."""
    from pdpfl.fl.aggregation.discrete_shares import ShareEncoding
    from pdpfl.fl.uldp.discrete import share_params

    old = encoding.params
    users = int(_server(run).setup.num_users)
    extra = int(canaries) if old.rotation else int(stacked)
    try:
        params = share_params(
            run.config,
            sigma=old.noise_multiplier,
            silos=old.silos,
            survivors=old.survivors,
            users=users + extra,
            size=old.dimension,
        )
    except ValueError as err:
        raise ValueError(f"{err} (with the audit's {canaries} canary users)") from None
    check_unchanged_encoding(
        old,
        params,
        f"canary users ({canaries} planted so far)",
        "raise secure.bits (at most 62), turn secure.rotation off or plant fewer --canaries",
    )
    return ShareEncoding(params, encoding.model_size, encoding.metrics, encoding.metric_factors)
