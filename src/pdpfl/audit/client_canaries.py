"""Client-level canaries for IDP-FedAvg (the privacy unit is a whole client).

Lange, Borchardt & Rahm (arXiv 2501.17634), Algorithm 2: each round every client i is sampled
with its group's rate q_p (SAMPLE, Algorithm 1), its update Δ_i is clipped to the public C_t
and the sum gets N(0, σ_v²C_t²) before the division by the public denominator; one client's
guarantee is ε_p at δ under I rounds of the Poisson-subsampled Gaussian (spec B.4). A canary is
an extra *client* of one budget group (Andrew et al., ICLR 2024: canary clients):

* its update is the Dirac ``−L·e_j`` with L ≫ C_t, so that the mechanism clips it to
  ``−C_t·e_j`` (the server adds the mean update: the coordinate moves *down*, as for the
  record-level canaries) and it counts as clipped in the adaptive-clipping query;
* it is sampled with its group's q_p by the party that samples clients: the **central**
  variant's trusted aggregator (host :data:`~pdpfl.audit.canaries.EVERYWHERE`; the server's
  ``extra_rows``, coins from its stream, added to the clipped sum before its noise); in the
  **distributed** variant it rides on a host client (its own coin from that client's stream,
  added to the host's clipped update before the host's noise share: the total noise is the
  one every client's ledger is charged for);
* its ledger is the clients' own: :func:`~pdpfl.fl.idp_fedavg.mechanism.client_mechanism` at
  the group's q_p and σ, charged every round (third parties: Poisson-subsampled Gaussian).

**The score** (:meth:`ClientCanaries.round_signal`): each round a canary client is sampled by
one coin and, when it is, adds its clipped update C_t to its coordinate under the value noise
σ_v·C_t (the distributed variant: N noise shares each sized for t survivors, std
σ_v·C_t·√(N/t)); in units of that noise it adds μ = 1/σ_v (√(t/N)/σ_v), whatever C_t, the
server's learning rate or the denominator. The canaries are therefore scored by the exact
likelihood ratio of that law, Σ_t log(1 − q_p + q_p·e^{μz_t − μ²/2})
(:func:`~pdpfl.audit.observe.sampled_gaussian_scores`), as the ideal canaries of
:mod:`~pdpfl.audit.ceiling` are. The adaptive-clipping count query is not in it: it is one
number per round, shared by every client and every canary -- a canary's ±½ on it is buried
under every other canary's (M·q_p/2 of them per round), so no per-canary score can use it,
although each client's ledger is charged for it (σ_p: 1/σ_p² = 1/σ_v² + 1/(2σ_b)²). That is
why a one-run audit of adaptive clipping sees σ_v > σ_p (``docs/audit.md``).

Observers: those of the published setup -- third parties for the central variant (the trusted
aggregator sees every update) and for the distributed one under plain summation; the server
too under secure summation (it sees only each round's sum). The ``scale`` method (a clip bound
per group) and ``no-dp`` are refused.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np

from pdpfl.audit.canaries import EVERYWHERE, check_unchanged_encoding, stacked_rows
from pdpfl.audit.hooks import AuditUnsupported, CanaryHookBase, register_canary_hook
from pdpfl.dp.extra_rows import ExtraRows
from pdpfl.fl.algorithm import Assembly
from pdpfl.fl.idp_fedavg import IdpFedAvgConfig, IdpSetup, client_mechanism
from pdpfl.ledger import PrivacyLedger

__all__ = ["CANARY_UPDATE_NORM", "ClientCanaries"]

#: L: the norm of a canary client's update before clipping (far above any C_t).
CANARY_UPDATE_NORM = 1e12

#: The ledger's budget for a non-private group (ε = ∞ is no finite budget; the ledger needs one).
_NO_BUDGET = 1e300


def _setup(run: Assembly) -> IdpSetup:
    setup = getattr(run.server, "setup", None)
    if not isinstance(setup, IdpSetup):
        raise AuditUnsupported("idp-fedavg: the server publishes no IdpSetup")
    return setup


class ClientCanaries(CanaryHookBase):
    """Canary clients of IDP-FedAvg (module docstring)."""

    unit: ClassVar[str] = "client"

    def check(self, run: Assembly) -> None:
        setup = _setup(run)
        if not setup.private or setup.noise_multiplier is None:
            raise AuditUnsupported(
                f"algorithm.method: {setup.method!r} trains without differential privacy "
                "(ε = ∞): there is no guarantee to audit"
            )
        if any(f != 1.0 for f in setup.clip_factors):
            raise AuditUnsupported(
                "algorithm.method: scale clips each group to its own bound C_p; the audit "
                "supports individual, strict and relaxed"
            )

    def observers(self, run: Assembly) -> tuple[str, ...]:
        return tuple(_setup(run).observers)

    def round_signal(self, run: Assembly, observer: str) -> float | None:
        """μ = 1/σ_v per round (distributed: √(t/N)/σ_v; module docstring)."""
        setup = _setup(run)
        sigma = setup.value_noise_multiplier
        if sigma is None or sigma <= 0:
            return None
        if setup.variant == "distributed":
            return math.sqrt(setup.survivors / setup.asked_per_round) / float(sigma)
        return 1.0 / float(sigma)

    def hosts(self, run: Assembly) -> list[int]:
        if _setup(run).variant == "central":
            return [EVERYWHERE]  # the trusted aggregator samples, clips and noises
        return sorted(int(c) for c in run.clients)

    def rates(self, run: Assembly, host: int, budgets: np.ndarray) -> np.ndarray:
        setup = _setup(run)
        return np.array([setup.rates[setup.group_of(float(b))] for b in budgets])

    def plant(self, run: Assembly, host: int, rows: ExtraRows) -> None:
        clients = ExtraRows(
            coords=rows.coords,
            values=np.full_like(rows.values, -CANARY_UPDATE_NORM),
            rates=rows.rates,
        )
        target: Any = run.server if host == EVERYWHERE else run.clients[host]
        if not hasattr(target, "extra_rows"):
            raise AuditUnsupported(f"{type(target).__name__} does not take canary clients")
        target.extra_rows = clients
        if getattr(target, "share_encoding", None) is not None:  # discrete shares: K counts them
            _recount(run)

    @staticmethod
    def _discrete_plan(setup: IdpSetup, budgets: np.ndarray) -> Any:
        """The clients' discrete plan (one for every group the canaries are in), or None."""
        if setup.variant != "distributed" or setup.noise_shares != "discrete":
            return None
        from pdpfl.fl.idp_fedavg.discrete import group_plan

        plans = [group_plan(setup, g) for g in sorted({setup.group_of(float(b)) for b in budgets})]
        if any(p != plans[0] for p in plans):
            raise AuditUnsupported(
                "algorithm.method: the groups' discrete plans differ; audit one group at a time"
            )
        return plans[0] if plans else None

    def ledger(
        self, run: Assembly, host: int, budgets: np.ndarray, rates: np.ndarray, delta: float
    ) -> PrivacyLedger:
        """Each canary as one client of its group: SampledGaussianPlan(σ_p, δ, I) at q_p."""
        setup = _setup(run)
        finite = np.array([b if math.isfinite(b) else _NO_BUDGET for b in budgets])
        discrete = self._discrete_plan(setup, budgets)
        if discrete is not None:  # the shares actually added (group_plan), at δ
            return PrivacyLedger(
                finite,
                np.asarray(rates, dtype=np.float64),
                dataclasses.replace(discrete, delta=float(delta)),
                accountant=setup.accountant,
            )
        sigmas = [setup.noise_multipliers[setup.group_of(float(b))] for b in budgets]
        described: Any = client_mechanism(setup)  # a frozen SampledGaussianPlan
        mechanism = dataclasses.replace(described, delta=float(delta))
        return PrivacyLedger(
            finite,
            np.asarray(rates, dtype=np.float64),
            mechanism,
            noise_multipliers=np.array(
                [setup.noise_multiplier if s is None else s for s in sigmas], dtype=np.float64
            ),
            accountant=setup.accountant,
        )


register_canary_hook(IdpFedAvgConfig, ClientCanaries())


def _recount(run: Assembly) -> None:
    """Discrete shares: re-derive the clients' encoding with the canary clients among its
    contributors K (module docstring) and give it to every client and the server; ValueError
    naming ``secure.bits`` when that would change the encoding (scale, N, shares: what the
    clients' ledgers charge)."""
    from pdpfl.dp.discrete_params import discrete_share_params
    from pdpfl.fl.aggregation.discrete_shares import ShareEncoding
    from pdpfl.fl.idp_fedavg.discrete import count_factor

    setup = _setup(run)
    parties: list[Any] = [run.server, *run.clients.values()]
    planted = [r.coords for c in parties[1:] if (r := getattr(c, "extra_rows", None)) is not None]
    canaries = sum(len(c) for c in planted)
    enc: ShareEncoding = parties[1].share_encoding
    old = enc.params
    # without the rotation nor a count coordinate: the most canaries on one coordinate
    extra = canaries if old.rotation or count_factor(setup) is not None else stacked_rows(planted)
    try:
        params = discrete_share_params(
            clip=old.clip,
            noise_multiplier=old.noise_multiplier,
            silos=old.silos,
            survivors=old.survivors,
            dimension=old.dimension,
            bits=old.bits,
            rotation=old.rotation,
            contributors=int(setup.asked_per_round) + extra,
            parts=old.parts,
            beta=old.beta,
            max_wrap=float(setup.share_max_wrap),
            max_inflation=float(setup.share_max_inflation),
        )
    except ValueError as err:
        raise ValueError(f"{err} (with the audit's {canaries} canary clients)") from None
    check_unchanged_encoding(
        old,
        params,
        f"canary clients ({canaries} planted so far)",
        "raise secure.bits (at most 62) or plant fewer --canaries",
    )
    encoding = ShareEncoding(params, enc.model_size, enc.metrics, enc.metric_factors)
    for party in parties:
        party.share_encoding = encoding
