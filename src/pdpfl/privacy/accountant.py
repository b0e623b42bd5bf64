"""Accountants that interpret mechanisms-as-data (:mod:`pdpfl.privacy.mechanisms`), a registry.

An *accountant* turns an event into ε at a given δ. Like Opacus' and dp-accounting's accountants
it declares which events it can interpret (:meth:`Accountant.supports`); every ε it returns is an
upper bound. Registered accountants (:func:`make_accountant`, :func:`accountant_names`):

* ``rdp`` -- :class:`RdpAccountant`, Rényi DP over a grid of orders with a certified
  branch-and-bound and a continuous refinement of the optimal order (fast, vectorized);
* ``pld`` -- :class:`pdpfl.privacy.pld.PldAccountant`, privacy-loss distributions (dp-accounting's
  PLD machinery, pessimistic), including the rPDP-FL two-stage round that dp-accounting rejects;
  tighter, slower (needs the optional ``dp-accounting`` package).

:class:`RdpAccountant` maps each event onto the fast vectorized functions:

* ``GaussianMechanism(σ)`` → α/(2σ²) (Mironov 2017), one row;
* ``PoissonSampled(q, GaussianMechanism(σ))`` → :func:`~pdpfl.privacy.rdp.poisson_gaussian_rdp`
  (rPDP-FL Lemma 4), one row per rate;
* ``Composed(e, n)`` → n·ρ_e (RDP composition, Mironov 2017 Prop. 1);
* ``TwoStageRound(λ, local)`` → :func:`~pdpfl.privacy.rdp.two_stage_rdp` (rPDP-FL Lemma 6;
  by joint convexity of exp((α−1)D_α) the bound holds for any local mechanism);
* ``Sequence(e_1, …)`` → Σ ρ_{e_i} (rows broadcast: all rate arrays must have equal length).

Anything else (e.g. subsampling a composition) is not supported (``supports`` is False, and
:meth:`RdpAccountant.rdp` raises a ValueError naming the structure).

One mechanism description feeds everything: :func:`mechanism_epsilon` charges ``counts_i`` rounds
of a :class:`~pdpfl.privacy.unit.UnitMechanism`'s ``round_event`` to unit i; it is what
:func:`~pdpfl.privacy.two_stage.plan_epsilon`, the calibration and the ledger all call, so they
agree exactly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy._search_orders import min_epsilon
from pdpfl.privacy.adversary import Adversary, as_adversary
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
from pdpfl.privacy.rdp import check_rates, poisson_gaussian_rdp, two_stage_rdp

__all__ = [
    "Accountant",
    "RdpAccountant",
    "register_accountant",
    "make_accountant",
    "accountant_names",
    "as_accountant_name",
    "mechanism_epsilon",
]

#: f(rho_step, alphas) -> total RDP of the event (monotone in rho_step).
_Compose = Callable[[np.ndarray, np.ndarray], np.ndarray]


@runtime_checkable
class Accountant(Protocol):
    """What every registered accountant provides (all ε are upper bounds)."""

    name: str

    def supports(self, event: Mechanism) -> bool:
        """True if :meth:`epsilon` can interpret ``event``."""
        ...

    def epsilon(self, event: Mechanism, delta: float) -> tuple[np.ndarray, np.ndarray]:
        """ε per row (rate) of ``event`` at ``delta``, and a per-row detail (the RDP order)."""
        ...

    def composed_epsilon(
        self, event: Mechanism, counts: ArrayLike, delta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """ε of ``counts[i]`` adaptive repetitions of row i of ``event`` (0 repetitions: 0)."""
        ...


# ---------------------------------------------------------------------------------- registry

_REGISTRY: dict[str, Callable[..., Accountant]] = {}
_LOCK = threading.Lock()
_INSTANCES: dict[tuple, Accountant] = {}
_MAX_INSTANCES = 16


def register_accountant(name: str, factory: Callable[..., Accountant]) -> None:
    """Register ``factory(**options) -> Accountant`` under ``name`` (lower case, unique)."""
    key = str(name).strip().lower()
    if not key or key in _REGISTRY:
        raise ValueError(f"accountant: {name!r} is empty or already registered")
    _REGISTRY[key] = factory


def accountant_names() -> tuple[str, ...]:
    """Names of the registered accountants (``rdp``, ``pld``, ...)."""
    return tuple(_REGISTRY)


def as_accountant_name(name: str) -> str:
    """Validate an accountant name; ValueError names ``accountant`` and the allowed values."""
    key = str(name).strip().lower()
    if key not in _REGISTRY:
        raise ValueError(
            f"accountant: expected one of {', '.join(_REGISTRY)}, got {name!r}"
        )
    return key


def make_accountant(name: str | Accountant = "rdp", **options: Any) -> Accountant:
    """The accountant ``name`` built with ``options`` (shared instances: they cache results).

    An :class:`Accountant` instance is returned unchanged.
    """
    if not isinstance(name, str):
        if isinstance(name, Accountant):
            return name
        raise ValueError(f"accountant: expected a name or an Accountant, got {name!r}")
    key = as_accountant_name(name)
    norm = tuple(sorted((k, _freeze(v)) for k, v in options.items()))
    with _LOCK:
        inst = _INSTANCES.get((key, norm))
        if inst is None:
            inst = _REGISTRY[key](**options)
            if len(_INSTANCES) >= _MAX_INSTANCES:
                _INSTANCES.pop(next(iter(_INSTANCES)))
            _INSTANCES[(key, norm)] = inst
    return inst


def _freeze(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


# ---------------------------------------------------------------------------- RDP accountant


class RdpAccountant:
    """Rényi-DP accountant over a grid of orders, with continuous refinement of the optimum.

    Parameters
    ----------
    orders
        Rényi orders α > 1 (default :data:`~pdpfl.privacy.orders.DEFAULT_ORDERS`).
    refine
        Refine the best grid order continuously (never looser than the grid; default True).

    Examples
    --------
    >>> from pdpfl.privacy.mechanisms import Composed, GaussianMechanism, PoissonSampled
    >>> acc = RdpAccountant()
    >>> ev = Composed(PoissonSampled([0.01, 0.1], GaussianMechanism(1.0)), 100)
    >>> eps, order = acc.epsilon(ev, 1e-5)   # one ε per rate, and the order that attains it
    """

    name = "rdp"

    def __init__(self, orders: ArrayLike = DEFAULT_ORDERS, refine: bool = True) -> None:
        a = check_orders(orders).copy()
        a.setflags(write=False)
        self.orders = a
        self.refine = bool(refine)

    def __repr__(self) -> str:
        return f"RdpAccountant(n_orders={self.orders.size}, refine={self.refine})"

    # ------------------------------------------------------------------ RDP curves
    def supports(self, event: Mechanism) -> bool:
        """True if every node of ``event`` has an RDP rule here (see the module docstring)."""
        if isinstance(event, GaussianMechanism):
            return True
        if isinstance(event, PoissonSampled):
            return isinstance(event.inner, GaussianMechanism)
        if isinstance(event, Composed):
            return self.supports(event.inner)
        if isinstance(event, TwoStageRound):
            return self.supports(event.local)
        if isinstance(event, Sequence):
            return all(self.supports(e) for e in event.events)
        return False

    def rdp(self, event: Mechanism) -> np.ndarray:
        """RDP curve of ``event``: shape ``(n_rates, n_orders)`` (1 row without per-record rates)."""
        return self._rdp(event)

    def _rdp(self, event: Mechanism) -> np.ndarray:
        a = self.orders
        if isinstance(event, GaussianMechanism):
            return (a / (2.0 * event.noise_multiplier**2))[None, :]
        if isinstance(event, PoissonSampled):
            if isinstance(event.inner, GaussianMechanism):
                return poisson_gaussian_rdp(event.rates, event.inner.noise_multiplier, a)
            raise self._unsupported(event)
        if isinstance(event, Composed):
            return event.count * self._rdp(event.inner)
        if isinstance(event, TwoStageRound):
            local = event.local
            if isinstance(local, Composed) and isinstance(local.inner, PoissonSampled):
                step = self._rdp(local.inner)
                if local.count == 0:
                    return np.zeros_like(step)
                return two_stage_rdp(step, local.count, event.client_rate, a)
            return two_stage_rdp(self._rdp(local), 1, event.client_rate, a)
        if isinstance(event, Sequence):
            parts = [self._rdp(e) for e in event.events]
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
        """ε per rate at ``delta`` and the order that attains it (both shape ``(n_rates,)``).

        Chains of compositions around one Poisson-sampled Gaussian (every training plan) use the
        certified branch-and-bound over :attr:`orders` plus the continuous refinement; other
        events the exact minimum over :attr:`orders` of the Balle et al. 2020 conversion.
        """
        return self.composed_epsilon(event, 1, delta)

    def composed_epsilon(
        self, event: Mechanism, counts: ArrayLike, delta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """ε of ``counts[i]`` repetitions of row i of ``event`` (broadcast; 0 → ε = 0)."""
        chain = self._chain(event)
        if chain is None:
            rdp = self.rdp(event)
            k = _counts(counts, rdp.shape[0])
            eps, order = rdp_to_epsilon(k[:, None] * rdp, self.orders, delta)
            return np.where(k > 0, eps, 0.0), order
        q, sigma, f = chain
        k = _counts(counts, q.size)
        eps = np.zeros(q.size)
        order = np.full(q.size, np.nan)
        live = np.flatnonzero(k > 0)
        if live.size == 0:
            return eps, order
        # distinct (q, k) pairs only; q in [0, 1] and k ≥ 1 integer map to distinct keys.
        key = q[live] + 2.0 * k[live]
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        uq = q[live][first]
        uk = k[live][first].astype(np.float64)

        def compose(rho: np.ndarray, rows: np.ndarray, alphas: np.ndarray) -> np.ndarray:
            return uk[rows, None] * f(rho, alphas)

        e, o = min_epsilon(uq, sigma, self.orders, delta, compose, refine=self.refine)
        inv = inv.reshape(-1)
        eps[live] = e[inv]
        order[live] = o[inv]
        return eps, order

    def delta(self, event: Mechanism, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
        """δ per rate at ``epsilon`` and the optimal grid order (shape ``(n_rates,)``)."""
        return rdp_to_delta(self.rdp(event), self.orders, epsilon)

    def _chain(self, event: Mechanism) -> tuple[np.ndarray, float, _Compose] | None:
        """(q, σ, f) if ``event`` wraps a single PoissonSampled(q, Gaussian(σ)) in monotone
        compositions (Composed / TwoStageRound), else None.

        ``f(rho, alphas)`` maps per-step RDP at the orders ``alphas`` (broadcastable) to the
        event's total, with the same float operations as :meth:`rdp`.
        """
        if isinstance(event, PoissonSampled):
            if not isinstance(event.inner, GaussianMechanism):
                raise self._unsupported(event)
            return event.rates, event.inner.noise_multiplier, lambda rho, alphas: rho
        if isinstance(event, GaussianMechanism):
            return np.ones(1), event.noise_multiplier, lambda rho, alphas: rho
        if isinstance(event, Composed):
            sub = self._chain(event.inner)
            if sub is None:
                return None
            q, sigma, f = sub
            n = event.count
            return q, sigma, lambda rho, alphas: n * f(rho, alphas)
        if isinstance(event, TwoStageRound):
            local, lam = event.local, event.client_rate
            if isinstance(local, Composed) and isinstance(local.inner, PoissonSampled):
                sub = self._chain(local.inner)
                tau = local.count
                if sub is None or tau == 0:
                    return None
                q, sigma, f = sub
                return q, sigma, lambda rho, alphas: two_stage_rdp(f(rho, alphas), tau, lam, alphas)
            sub = self._chain(local)
            if sub is None:
                return None
            q, sigma, f = sub
            return q, sigma, lambda rho, alphas: two_stage_rdp(f(rho, alphas), 1, lam, alphas)
        return None


def _counts(counts: ArrayLike, n: int) -> np.ndarray:
    k = np.asarray(counts, dtype=np.float64)
    if np.any(np.isnan(k)) or np.any(k != np.floor(k)) or np.any(k < 0):
        raise ValueError("counts: every repetition count must be an integer >= 0")
    try:
        return np.broadcast_to(k.astype(np.int64), (n,)).copy()
    except ValueError:
        raise ValueError(
            f"counts: expected a scalar or {n} values, got shape {k.shape}"
        ) from None


register_accountant("rdp", RdpAccountant)


def _pld_factory(**options: Any) -> Accountant:
    from pdpfl.privacy.pld import PldAccountant

    return PldAccountant(**options)


register_accountant("pld", _pld_factory)


# ------------------------------------------------------------------ unit mechanisms → ε


def mechanism_epsilon(
    mechanism: Any,
    rates: ArrayLike,
    observer: Adversary | str,
    counts: ArrayLike | None = None,
    *,
    accountant: str | Accountant = "rdp",
    **options: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """ε of ``counts[i]`` charged rounds of ``mechanism.round_event`` for unit i (rate q_i).

    The one conversion path of pdpfl: ``plan_epsilon``, the calibration and the ledger all call
    it, so they agree exactly.

    Parameters
    ----------
    mechanism
        A :class:`~pdpfl.privacy.unit.UnitMechanism` (``TrainingPlan``, ``SampledGaussianPlan``).
    rates
        Sampling rate per unit, in [0, 1].
    observer
        ``third-party`` or ``server`` (must be one of ``mechanism.observers``).
    counts
        Charged rounds per unit (scalar or per rate); default the planned rounds T.
    accountant
        A registered accountant name (``rdp``, ``pld``) or an :class:`Accountant`; ``options``
        build it (e.g. ``orders=`` for ``rdp``).

    Returns
    -------
    (epsilon, detail)
        Shape ``(n_rates,)`` each; ε is 0 for q = 0 or 0 rounds. ``detail`` is the RDP order
        (NaN for 0 rounds, and with ``pld`` where the PLD bound was the smaller one).
    """
    adv = as_adversary(observer)
    if adv is Adversary.BOTH:
        raise ValueError("adversary: 'both' has no single event; account each observer")
    if adv.value not in tuple(mechanism.observers):
        raise ValueError(
            f"adversary: this {getattr(mechanism.unit, 'value', mechanism.unit)}-level mechanism "
            f"is accounted against {', '.join(mechanism.observers)}, not {adv.value}"
        )
    q = check_rates(rates)
    k = _counts(mechanism.planned_rounds if counts is None else counts, q.size)
    acc = make_accountant(accountant, **options)
    eps = np.zeros(q.size)
    detail = np.full(q.size, np.nan)
    live = np.flatnonzero(k > 0)
    if live.size == 0:
        return eps, detail
    event = mechanism.round_event(q[live], adv.value)
    e, d = acc.composed_epsilon(event, k[live], mechanism.delta)
    eps[live] = e
    detail[live] = d
    return eps, detail
