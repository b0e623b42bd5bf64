"""PriFedSync's published setup, each client's mechanism and its calibration.

What the server publishes before round 1 (:class:`PriFedSyncSetup`) is configuration only: the
sampler, α, η, p, K, R, C, σ (if configured), δ, m and how targets are met. Each client turns it
into its own record-level mechanism, a :class:`~pdpfl.privacy.unit.LocalStepsPlan` -- K noisy
steps per participation on batches of B of its n records (Algorithm 2), charged once per
participation to every observer (Lemma 3.7) -- at its own ratio γ = B/n, from its own n (nothing
about it leaves the silo):

* a client with a target ε (``algorithm.target_epsilon``, ``target_mu`` as the ε that μ-GDP
  implies at δ, or ``privacy.epsilon_max``) calibrates its σ_j
  (:func:`pdpfl.calibration.noise_for_epsilon`) or its K_j
  (:func:`pdpfl.calibration.steps_for_epsilon`) so that ``planned_rounds`` participations spend
  at most the target, under the rigorous accountant ``privacy.accountant`` (``rdp``: Wang et al.
  2019 Theorem 9 for WOR batches; ``pld`` for Poisson batches) or the paper's Theorem 2 CLT
  (``gdp-clt``, ``budget_accounting: clt``);
* the same description is charged by the client's :class:`~pdpfl.ledger.PrivacyLedger`, so a
  client charged ``planned_rounds`` participations has exactly the ε its calibration certified.

The CLT figures of the paper (Theorem 2's μ_j, its ε, the strong notion's √(m − 1)·μ) come from
the ``gdp-clt`` accountant on the same description and are always labelled approximate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from pdpfl.fl.algorithm import PublicSetup
from pdpfl.privacy.accountant import mechanism_epsilon
from pdpfl.privacy.mechanisms import Mechanism
from pdpfl.privacy.noise import CentralDiscreteGaussianNoise, GaussianNoise, central_noise
from pdpfl.privacy.unit import LocalStepsPlan

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.config import ExperimentConfig
    from pdpfl.fl.api import FederationInfo

__all__ = [
    "ACCOUNTANTS",
    "Accounting",
    "PriFedSyncSetup",
    "Sampler",
    "client_plan",
    "client_target",
    "client_events",
    "clt_mu",
    "epsilon",
    "neighbouring",
    "planned_epsilon",
    "public_setup",
    "strong_epsilon",
    "target_as_epsilon",
]

Sampler = Literal["wor", "poisson"]
Accounting = Literal["rigorous", "clt"]

#: ``budget_accounting`` → the accountant that calibrates and enforces a target (``rigorous``:
#: the default; a setup uses its ``rigorous_accountant``, i.e. ``privacy.accountant``).
ACCOUNTANTS: dict[str, str] = {"rigorous": "rdp", "clt": "gdp-clt"}

#: The σ search of a client's noise calibration: never widened (Algorithm 2's σ_j in it).
NOISE_BRACKET = (1e-3, 1e4)


@dataclass(frozen=True)
class PriFedSyncSetup(PublicSetup):
    """What the server publishes to every client (configuration only; no data read).

    Attributes
    ----------
    sampler
        ``wor`` (batches of exactly B drawn without replacement) or ``poisson``.
    alpha, server_lr
        α of the elastic sync (Eq. 2.1) and η of the aggregation.
    client_rate
        p: each client's own join probability per round.
    local_steps, local_epoch
        K, and whether a client caps it at one local epoch ⌈n_j/B⌉.
    rounds, planned_rounds
        R, and the participations a target is calibrated for.
    max_grad_norm, noise_multiplier, delta
        C, σ (None: every client calibrates its own) and δ.
    num_clients
        m (for the paper's strong notion √(m − 1)·μ).
    calibrate, budget_accounting, evaluate
        What a client with a target adjusts (``noise``/``steps``), how a target is enforced
        (``rigorous``/``clt``), and what an evaluation reply measures (``local``/``global``).
    rigorous_accountant
        ``privacy.accountant``: every ledger's, and the calibration's unless
        ``budget_accounting: clt``.
    """

    sampler: str
    alpha: float
    server_lr: float
    client_rate: float
    local_steps: int
    local_epoch: bool
    rounds: int
    planned_rounds: int
    max_grad_norm: float
    noise_multiplier: float | None
    delta: float
    num_clients: int
    calibrate: str = "noise"
    budget_accounting: str = "rigorous"
    evaluate: str = "local"
    rigorous_accountant: str = "rdp"
    #: ``privacy.central_noise``: ``discrete`` -- every local step adds the exact central
    #: discrete Gaussian on a grid (the plans' ``noise``; rdp only, no CLT figures).
    central_noise: str = "continuous"

    @property
    def accountant(self) -> str:
        """The accountant that calibrates and enforces targets (the rigorous one, or
        ``gdp-clt``)."""
        if self.budget_accounting == "rigorous":
            return self.rigorous_accountant
        return ACCOUNTANTS[self.budget_accounting]

    def noise(
        self, plan: LocalStepsPlan, dimension: int | None = None
    ) -> GaussianNoise | CentralDiscreteGaussianNoise:
        """What each of a client's steps adds under its (calibrated) ``plan``: N(0, σ_j²C²), or
        with ``central_noise: discrete`` the exact discrete Gaussian on the grid of the model's
        ``dimension`` trainable coordinates (multiplier σ_j over γC + √d)."""
        return central_noise(
            self.central_noise, plan.noise_multiplier, self.max_grad_norm, dimension
        )


def public_setup(config: ExperimentConfig, info: FederationInfo) -> PriFedSyncSetup:
    """The published setup (Algorithm 1's public parameters; config values only)."""
    tr, pv = config.training, config.privacy
    algo: Any = config.algorithm  # the prifedsync section (PriFedSyncConfig)
    return PriFedSyncSetup(
        sampler=str(algo.sampler),
        alpha=float(algo.alpha),
        server_lr=float(algo.server_lr),
        client_rate=float(tr.client_rate),
        local_steps=int(tr.local_steps),
        local_epoch=bool(algo.local_epoch),
        rounds=int(tr.rounds),
        planned_rounds=int(algo.planned_rounds or tr.rounds),
        max_grad_norm=float(tr.max_grad_norm),
        noise_multiplier=None if pv.noise_multiplier is None else float(pv.noise_multiplier),
        delta=float(pv.delta),
        num_clients=int(info.num_clients),
        calibrate=str(algo.calibrate),
        budget_accounting=str(algo.budget_accounting),
        evaluate=str(algo.evaluate),
        rigorous_accountant=str(pv.accountant),
        central_noise=str(pv.central_noise),
    )


def client_events(config: ExperimentConfig) -> list[Mechanism]:
    """The event a client's records are charged per participation (nominal σ and ratio)."""
    algo: Any = config.algorithm
    plan = LocalStepsPlan(
        _sampler(str(algo.sampler)),
        1.0,
        int(config.training.local_steps),
        float(config.privacy.delta),
        int(config.training.rounds),
        noise="discrete" if config.privacy.central_noise == "discrete" else "continuous",
    )
    return [plan.round_event(np.array([0.5]), obs) for obs in plan.observers]


def neighbouring(sampler: str) -> str:
    """PriFedSync's neighbouring relation: replace-one (WOR batches) or add/remove (Poisson)."""
    if sampler == "wor":
        return "replace one record of one client (batches without replacement)"
    return "add/remove one record of one client (Poisson batches)"


def target_as_epsilon(
    target_epsilon: float | None, target_mu: float | None, delta: float
) -> float | None:
    """A client's target as ε at δ (a μ target becomes the ε that μ-GDP implies at δ)."""
    if target_epsilon is not None:
        return float(target_epsilon)
    if target_mu is not None:
        from pdpfl.privacy.gdp import gdp_epsilon

        return float(gdp_epsilon(float(target_mu), delta))
    return None


def client_target(config: ExperimentConfig, client_id: int) -> float | None:
    """The client's target as ε at δ: its own entry, else ``privacy.epsilon_max``, else None."""
    algo = config.algorithm
    for field in ("target_epsilon", "target_mu"):
        value = getattr(algo, field, None)
        if isinstance(value, list):
            if not 0 <= client_id < len(value):
                raise ValueError(
                    f"algorithm.{field}: {len(value)} values given but client {client_id} exists"
                )
            value = value[client_id]
        if value is not None:
            eps = float(value) if field == "target_epsilon" else None
            mu = float(value) if field == "target_mu" else None
            return target_as_epsilon(eps, mu, config.privacy.delta)
    if config.privacy.epsilon_max is not None:
        return float(config.privacy.epsilon_max)
    return None


def _sampler(value: str) -> Sampler:
    if value == "wor":
        return "wor"
    if value == "poisson":
        return "poisson"
    raise ValueError(f"algorithm.sampler: expected wor or poisson, got {value!r}")


def _ratio(batch_size: float, n_records: int) -> float:
    if not (n_records >= 1):
        raise ValueError(f"n_records: must be >= 1, got {n_records}")
    if not (0 < batch_size <= n_records):
        raise ValueError(
            f"training.batch_size: B = {batch_size:g} must be in (0, n] for a client "
            f"with n = {n_records} training records"
        )
    return float(batch_size) / float(n_records)


def epsilon(
    plan: LocalStepsPlan,
    rate: float,
    participations: int,
    accounting: str = "rigorous",
    rigorous: str = "rdp",
) -> float:
    """ε at δ of one client's records after ``participations`` (the ledger's path): under the
    ``rigorous`` accountant, or Theorem 2's CLT (``accounting="clt"``)."""
    count = int(participations)
    if count == 0 or plan.local_steps == 0:
        return 0.0
    acc = rigorous if accounting == "rigorous" else ACCOUNTANTS[accounting]
    eps, _ = mechanism_epsilon(plan, [rate], "server", count, accountant=acc)
    return float(eps[0])


def clt_mu(plan: LocalStepsPlan, rate: float, participations: int) -> float:
    """Theorem 2's CLT μ_j (WOR) or Bu et al.'s (Poisson) after ``participations``
    (an approximation, not a bound)."""
    count = int(participations)
    if count == 0 or plan.local_steps == 0:
        return 0.0
    _, mu = mechanism_epsilon(plan, [rate], "server", count, accountant="gdp-clt")
    return float(mu[0])


def strong_epsilon(
    plan: LocalStepsPlan,
    rate: float,
    participations: int,
    num_clients: int,
    rigorous: str = "rdp",
) -> float:
    """Rigorous ε of the paper's strong notion: the (m − 1)-fold composition (Theorem 1)."""
    count = int(participations) * max(int(num_clients) - 1, 0)
    return epsilon(plan, rate, count, rigorous=rigorous)


def client_plan(
    setup: PriFedSyncSetup,
    n_records: int,
    batch_size: float,
    target_epsilon: float | None,
    *,
    client_id: int = 0,
) -> tuple[LocalStepsPlan, float]:
    """One client's mechanism and its ratio γ = B/n, calibrated at the silo to its target.

    ``calibrate: noise``: the smallest σ_j (relative 1e-4, rounded up, searched in
    [1e-3, 1e4]) with ε(``planned_rounds``) ≤ target; ``calibrate: steps``: the largest
    K_j ≤ K at the configured σ. Both under ``budget_accounting`` (``rdp`` or ``gdp-clt``).
    The rigorous Poisson search minimizes over the order grid (``refine=False``), as it always
    has; the ledger's refined ε is never larger, so a calibrated client is never stopped early.
    """
    from pdpfl.calibration import InfeasibleTargetError, noise_for_epsilon, steps_for_epsilon

    n = int(n_records)
    rate = _ratio(batch_size, n)
    steps = int(setup.local_steps)
    if setup.local_epoch:
        steps = min(steps, math.ceil(n / batch_size))
    sigma = setup.noise_multiplier
    planned = int(setup.planned_rounds)
    plan = LocalStepsPlan(
        _sampler(setup.sampler),
        1.0 if sigma is None else float(sigma),
        steps,
        float(setup.delta),
        planned,
        noise="discrete" if setup.central_noise == "discrete" else "continuous",
    )
    if target_epsilon is None:
        if sigma is None:
            raise ValueError(
                f"privacy.noise_multiplier: required for client {client_id}, which has no target"
            )
        return plan, rate
    target = float(target_epsilon)
    acc = setup.accountant
    options: dict[str, Any] = (
        {"refine": False} if (setup.sampler, acc) == ("poisson", "rdp") else {}
    )
    if setup.calibrate == "noise":
        try:
            sigma_j = noise_for_epsilon(
                plan,
                target,
                rounds=planned,
                accountant=acc,
                rate=rate,
                bracket=NOISE_BRACKET,
                limits=None,
                **options,
            )
        except InfeasibleTargetError:
            raise ValueError(
                f"algorithm.target_epsilon: ε = {target:g} cannot be met with σ ≤ "
                f"{NOISE_BRACKET[1]:g} over {planned} rounds (client {client_id}); raise the "
                "target or lower training.rounds / algorithm.planned_rounds"
            ) from None
        return plan.with_noise(sigma_j), rate
    if sigma is None:
        raise ValueError("privacy.noise_multiplier: required with algorithm.calibrate: steps")
    try:
        # (a frozen LocalStepsPlan: its local_steps is read-only, which the helper's protocol
        # does not need; with_steps makes a new plan)
        k = steps_for_epsilon(
            cast(Any, plan), target, rounds=planned, accountant=acc, rate=rate, **options
        )
    except InfeasibleTargetError:
        raise ValueError(
            f"algorithm.target_epsilon: ε = {target:g} cannot be met even with one local step "
            f"per round at σ = {plan.noise_multiplier:g} over {planned} rounds (client "
            f"{client_id}); raise σ (privacy.noise_multiplier) or the target, or use "
            "algorithm.calibrate: noise"
        ) from None
    return plan.with_steps(k), rate


def planned_epsilon(plan: LocalStepsPlan, rate: float, rounds: int, rigorous: str = "rdp") -> float:
    """The rigorous ε of ``rounds`` participations: the budget of a client without a target
    (what its configured σ and K promise over every round of the run)."""
    eps = epsilon(plan, rate, rounds, rigorous=rigorous)
    return eps if eps > 0 else float(np.finfo(np.float64).tiny)
