"""RDP accountant that interprets mechanisms-as-data (:mod:`pdpfl.privacy.mechanisms`).

Each event is mapped onto the fast vectorized functions:

* ``GaussianMechanism(σ)`` → α/(2σ²) (Mironov 2017), one row;
* ``PoissonSampled(q, GaussianMechanism(σ))`` → :func:`~pdpfl.privacy.rdp.poisson_gaussian_rdp`
  (rPDP-FL Lemma 4), one row per rate;
* ``Composed(e, n)`` → n·ρ_e (RDP composition, Mironov 2017 Prop. 1);
* ``TwoStageRound(λ, local)`` → :func:`~pdpfl.privacy.two_stage.round_rdp` (rPDP-FL Lemma 6;
  by joint convexity of exp((α−1)D_α) the bound holds for any local mechanism);
* ``Sequence(e_1, …)`` → Σ ρ_{e_i} (rows broadcast: all rate arrays must have equal length).

Anything else (e.g. subsampling a composition) raises a ValueError naming the structure.

:meth:`RdpAccountant.epsilon` uses the certified branch-and-bound over orders of
:func:`~pdpfl.privacy._search_orders.min_epsilon` when the event is a chain of compositions
around a single Poisson-sampled Gaussian (every training plan is), so it returns exactly what
:func:`~pdpfl.privacy.two_stage.plan_epsilon` returns; otherwise the full-grid minimum.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy._search_orders import min_epsilon
from pdpfl.privacy.conversion import rdp_to_delta, rdp_to_epsilon
from pdpfl.privacy.mechanisms import (
    Composed,
    GaussianMechanism,
    Mechanism,
    PoissonSampled,
    Sequence,
    TwoStageRound,
    outline,
)
from pdpfl.privacy.orders import DEFAULT_ORDERS, check_orders
from pdpfl.privacy.rdp import poisson_gaussian_rdp
from pdpfl.privacy.two_stage import round_rdp

__all__ = ["RdpAccountant"]

_Compose = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (rho_step, orders) -> total


class RdpAccountant:
    """Rényi-DP accountant over a fixed grid of orders.

    Parameters
    ----------
    orders
        Rényi orders α > 1 (default :data:`~pdpfl.privacy.orders.DEFAULT_ORDERS`).

    Examples
    --------
    >>> from pdpfl.privacy.mechanisms import Composed, GaussianMechanism, PoissonSampled
    >>> acc = RdpAccountant()
    >>> ev = Composed(PoissonSampled([0.01, 0.1], GaussianMechanism(1.0)), 100)
    >>> eps, order = acc.epsilon(ev, 1e-5)   # one ε per rate
    """

    def __init__(self, orders: ArrayLike = DEFAULT_ORDERS) -> None:
        a = check_orders(orders).copy()
        a.setflags(write=False)
        self.orders = a

    def __repr__(self) -> str:
        return f"RdpAccountant(n_orders={self.orders.size})"

    # ------------------------------------------------------------------ RDP curves
    def rdp(self, event: Mechanism) -> np.ndarray:
        """RDP curve of ``event``: shape ``(n_rates, n_orders)`` (1 row without per-record rates)."""
        return self._rdp(event, event)

    def _rdp(self, event: Mechanism, root: Mechanism) -> np.ndarray:
        a = self.orders
        if isinstance(event, GaussianMechanism):
            return (a / (2.0 * event.noise_multiplier**2))[None, :]
        if isinstance(event, PoissonSampled):
            if isinstance(event.inner, GaussianMechanism):
                return poisson_gaussian_rdp(event.rates, event.inner.noise_multiplier, a)
            raise self._unsupported(event)
        if isinstance(event, Composed):
            inner = event.inner
            if isinstance(inner, Composed):  # fold nested counts: (n·m)·ρ, not n·(m·ρ)
                return self._rdp(Composed(inner.inner, event.count * inner.count), root)
            return event.count * self._rdp(inner, root)
        if isinstance(event, TwoStageRound):
            local = event.local
            if isinstance(local, Composed) and isinstance(local.inner, PoissonSampled):
                step = self._rdp(local.inner, root)
                if local.count == 0:
                    return np.zeros_like(step)
                return round_rdp(step, local.count, event.client_rate, a)
            return round_rdp(self._rdp(local, root), 1, event.client_rate, a)
        if isinstance(event, Sequence):
            parts = [self._rdp(e, root) for e in event.events]
            rows = {p.shape[0] for p in parts} - {1}
            if len(rows) > 1:
                raise ValueError(
                    f"events: per-record rate arrays of different lengths {sorted(rows)} "
                    "cannot be composed"
                )
            return np.sum(np.broadcast_arrays(*parts), axis=0)
        raise ValueError(f"event: expected a mechanism, got {type(event).__name__}")

    @staticmethod
    def _unsupported(event: Mechanism) -> ValueError:
        return ValueError(
            f"RdpAccountant cannot interpret {outline(event, 1)}: Poisson sampling is supported "
            "only directly around a GaussianMechanism"
        )

    # ------------------------------------------------------------------ conversions
    def epsilon(self, event: Mechanism, delta: float) -> tuple[np.ndarray, np.ndarray]:
        """ε per rate at ``delta`` and the optimal order (both shape ``(n_rates,)``).

        Exact minimum over :attr:`orders` of the Balle et al. 2020 conversion (see
        :func:`~pdpfl.privacy.conversion.rdp_to_epsilon`).
        """
        chain = self._chain(event)
        if chain is None:
            return rdp_to_epsilon(self.rdp(event), self.orders, delta)
        q, sigma, compose = chain
        uq, inv = np.unique(q, return_inverse=True)
        eps, order = min_epsilon(
            uq, sigma, self.orders, delta, lambda rho, rows, cols: compose(rho, cols)
        )
        inv = inv.reshape(-1)
        return eps[inv], order[inv]

    def delta(self, event: Mechanism, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
        """δ per rate at ``epsilon`` and the optimal order (shape ``(n_rates,)``)."""
        return rdp_to_delta(self.rdp(event), self.orders, epsilon)

    def _chain(self, event: Mechanism) -> tuple[np.ndarray, float, Callable] | None:
        """(q, σ, compose) if ``event`` wraps a single PoissonSampled(q, Gaussian(σ)) in
        monotone compositions (Composed / TwoStageRound), else None.

        ``compose(rho, cols)`` maps per-step RDP at ``sorted(orders)[cols]`` to the total, with
        the same float operations as :meth:`rdp` (so both paths agree bit for bit).
        """
        srt = np.sort(self.orders)
        if isinstance(event, PoissonSampled):
            if not isinstance(event.inner, GaussianMechanism):
                raise self._unsupported(event)
            return event.rates, event.inner.noise_multiplier, lambda rho, cols: rho
        if isinstance(event, GaussianMechanism):
            return np.ones(1), event.noise_multiplier, lambda rho, cols: rho
        if isinstance(event, Composed):
            inner = event.inner
            if isinstance(inner, Composed):
                return self._chain(Composed(inner.inner, event.count * inner.count))
            sub = self._chain(inner)
            if sub is None:
                return None
            q, sigma, f = sub
            n = event.count
            return q, sigma, lambda rho, cols: n * f(rho, cols)
        if isinstance(event, TwoStageRound):
            local, lam = event.local, event.client_rate
            if isinstance(local, Composed) and isinstance(local.inner, PoissonSampled):
                sub = self._chain(local.inner)
                tau = local.count
                if sub is None or tau == 0:
                    return None
                q, sigma, f = sub
                return q, sigma, lambda rho, cols: round_rdp(f(rho, cols), tau, lam, srt[cols])
            sub = self._chain(local)
            if sub is None:
                return None
            q, sigma, f = sub
            return q, sigma, lambda rho, cols: round_rdp(f(rho, cols), 1, lam, srt[cols])
        return None
