"""ULDP-FL's user-level mechanism when the silos add *discrete* noise shares (issue #33).

:class:`DiscreteUserLevelPlan` is :class:`~pdpfl.privacy.uldp.UserLevelPlan`'s counterpart for
ULDP-AVG/SGD with ``privacy.noise_shares: discrete``: each silo rounds its users' weighted
clipped vectors to integers (per user, conditional randomized rounding; a user's total over the
silos has squared L2 norm ≤ N, :mod:`pdpfl.dp.discrete_params`) and adds one exact discrete
Gaussian share of variance σ_s² (Kairouz, Liu & Steinke, ICML 2021). Per observer:

* **third party** (and the server under secure summation, which sees only the sum):
  ``PoissonSampled(q_u, DistributedDiscreteGaussian(σ_s², t, N, d))`` -- the released sum of at
  least t shares, the user sampled with its rate q_u (Algorithm 4; q = 1 without sampling),
  charged every round the user is active;
* **server under plain summation**: it sees each silo's share on its own -- the composition over
  the silos of one-share discrete Gaussians, each of the user's part in that silo. Their RDP adds
  with the squared part norms, so the view is ``DistributedDiscreteGaussian(σ_s², 1, N_sv, d)``
  with N_sv ≥ Σ_s N_{p,s} (:func:`pdpfl.dp.discrete_params.DiscreteShareParams.
  server_view_sq`); the server knows the coins, so a round it sampled the user in is charged
  without amplification (q = 1), only on the rounds the user took part in (as
  :class:`~pdpfl.privacy.uldp.UserLevelPlan`).

Only the ``rdp`` accountant interprets the distributed discrete Gaussian (``pld`` and
``gdp-clt`` refuse it). Per-user rates (personal budgets) are calibrated against the released
sum's event itself (:meth:`as_training_plan`: a
:class:`~pdpfl.privacy.plan.TrainingPlan` whose step is that distributed discrete Gaussian).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.accountant import mechanism_epsilon
from pdpfl.privacy.adversary import as_adversary
from pdpfl.privacy.discrete_plan import SampledDiscreteGaussianPlan
from pdpfl.privacy.mechanisms import Composed, Mechanism, PoissonSampled
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.rdp import check_rates
from pdpfl.privacy.uldp import ORDERS
from pdpfl.privacy.unit import Charge, PrivacyUnit

__all__ = ["DiscreteUserLevelPlan"]

_OBSERVERS = ("third-party", "server")


@dataclass(frozen=True)
class DiscreteUserLevelPlan:
    """The user-level ledger's mechanism with discrete noise shares (module docstring).

    Parameters
    ----------
    released
        The plan of the released sum (unit ``user``): t shares, sensitivity N.
    server_view
        What the server sees per round: ``released`` under secure summation, the one-share
        plan of sensitivity N_sv under plain summation.
    server_knows_sampling
        The server drew the users' coins (Algorithm 4): it is charged without amplification,
        on the rounds the user took part in.
    """

    released: SampledDiscreteGaussianPlan
    server_view: SampledDiscreteGaussianPlan
    server_knows_sampling: bool = True

    unit: ClassVar[PrivacyUnit] = PrivacyUnit.USER

    def __post_init__(self) -> None:
        for plan in (self.released, self.server_view):
            if not isinstance(plan, SampledDiscreteGaussianPlan) or plan.unit is not self.unit:
                raise ValueError("plans: expected user-level SampledDiscreteGaussianPlan")
        if (self.released.delta, self.released.rounds) != (
            self.server_view.delta,
            self.server_view.rounds,
        ):
            raise ValueError("plans: the released sum and the server's view disagree on δ or T")

    # -- the UnitMechanism description ----------------------------------------------------
    @property
    def delta(self) -> float:
        return self.released.delta

    @property
    def rounds(self) -> int:
        return self.released.rounds

    @property
    def planned_rounds(self) -> int:
        return self.released.rounds

    @property
    def observers(self) -> tuple[str, ...]:
        return _OBSERVERS

    @property
    def noise_multiplier(self) -> float:
        """σ_tp = √(t·σ_s²/N) of the released sum."""
        return self.released.noise_multiplier

    @property
    def server_noise_multiplier(self) -> float:
        """σ_sv of the server's view."""
        return self.server_view.noise_multiplier

    def _observer(self, observer: str) -> str:
        obs = as_adversary(observer).value
        if obs not in _OBSERVERS:
            raise ValueError(f"adversary: expected third-party or server, got {obs}")
        return obs

    def observer_noise(self, observer: str) -> float:
        """The noise multiplier ``observer`` sees."""
        obs = self._observer(observer)
        return self.noise_multiplier if obs == "third-party" else self.server_noise_multiplier

    def round_event(self, rates: ArrayLike, observer: str) -> Mechanism:
        """third party: ``PoissonSampled(q_u, DDG(σ_s², t, N, d))``; server: its view, at q = 1
        when it knows the coins."""
        obs = self._observer(observer)
        q = check_rates(rates)
        plan = self.released if obs == "third-party" else self.server_view
        if obs == "server" and self.server_knows_sampling:
            q = np.ones_like(q)
        rate = q if np.ndim(rates) else float(q[0])
        return PoissonSampled(rate, plan.base_event())

    def charged_on(self, observer: str) -> Charge:
        if self._observer(observer) == "third-party" or not self.server_knows_sampling:
            return "active"
        return "participated"

    def total_event(self, rates: ArrayLike, observer: str, rounds: int | None = None) -> Mechanism:
        k = self.rounds if rounds is None else int(rounds)
        return Composed(self.round_event(rates, observer), k)

    def with_noise(self, noise_multiplier: float) -> DiscreteUserLevelPlan:
        """The same shares seen with σ_tp = ``noise_multiplier`` (the sensitivities rescaled,
        :meth:`SampledDiscreteGaussianPlan.with_noise`); the server's view keeps its ratio."""
        sigma = float(noise_multiplier)
        ratio = self.server_noise_multiplier / self.noise_multiplier
        return DiscreteUserLevelPlan(
            self.released.with_noise(sigma),
            self.server_view.with_noise(sigma * ratio),
            self.server_knows_sampling,
        )

    def as_training_plan(self) -> TrainingPlan:
        """The third party's view as a :class:`~pdpfl.privacy.plan.TrainingPlan` for the
        certified rate calibrator (personal budgets): T rounds of one Poisson-sampled step,
        λ = 1, whose step is the released sum's ``DistributedDiscreteGaussian(σ_s², t, N, d)``
        itself -- the calibration and the ledger charge one event."""
        return TrainingPlan(
            noise_multiplier=self.released.noise_multiplier,
            delta=self.delta,
            steps=1,
            rounds=self.rounds,
            client_rate=1.0,
            noise="discrete",
            discrete_step=self.released.base_event(),
        )

    def planned_epsilon(
        self,
        rates: ArrayLike,
        observer: str,
        orders: ArrayLike = ORDERS,
        accountant: str = "rdp",
    ) -> np.ndarray:
        """ε of T charged rounds per rate against ``observer`` (rdp only)."""
        eps, _ = mechanism_epsilon(
            self, rates, observer, self.rounds, accountant=accountant, orders=orders
        )
        return eps
