"""The Rényi-DP accountant and :func:`mechanism_epsilon`, the one ε path of pdpfl.

Accountants interpret mechanisms described as data (:mod:`pdpfl.privacy.mechanisms`); they are
registered in :mod:`pdpfl.privacy.registry` (``rdp`` here; ``pld`` in :mod:`pdpfl.privacy.pld`;
``gdp-clt`` in :mod:`pdpfl.privacy.gdp_clt`, an approximation). Like Opacus' and dp-accounting's
accountants each declares which events it can interpret (``supports``); every ε ``rdp`` returns
is an upper bound.

:class:`RdpAccountant` maps each event onto the fast vectorized functions:

* ``GaussianMechanism(σ)`` → α/(2σ²) (Mironov 2017), one row;
* ``PoissonSampled(q, GaussianMechanism(σ))`` → :func:`~pdpfl.privacy.rdp.poisson_gaussian_rdp`
  (rPDP-FL Lemma 4), one row per rate;
* ``SampledWithoutReplacement(γ, GaussianMechanism(σ))`` → Wang, Balle & Kasiviswanathan
  2019, Theorem 9 (:func:`~pdpfl.privacy.wor.wor_gaussian_rdp_any_order`), one row per ratio;
* ``Composed(e, n)`` → n·ρ_e (RDP composition, Mironov 2017 Prop. 1);
* ``TwoStageRound(λ, local)`` → :func:`~pdpfl.privacy.rdp.two_stage_rdp` (rPDP-FL Lemma 6;
  by joint convexity of exp((α−1)D_α) the bound holds for any local mechanism);
* ``Sequence(e_1, …)`` → Σ ρ_{e_i} (rows broadcast: all rate arrays must have equal length);
* ``DistributedDiscreteGaussian`` (a sum of discrete Gaussian shares, integer units) →
  :func:`~pdpfl.privacy.discrete.distributed_discrete_gaussian_rdp` (Kairouz, Liu & Steinke
  2021 with explicit constants), one row;
* ``SampledWithoutReplacement(γ, DistributedDiscreteGaussian)`` with one share (the central
  discrete Gaussian) → Theorem 9 at σ = √(σ_s²/N): the theorem bounds any base mechanism from
  its RDP at integer orders, which for one discrete Gaussian are exactly the Gaussian's
  (Canonne, Kamath & Steinke 2020), one row per ratio;
* ``PoissonSampled(q, DistributedDiscreteGaussian)`` → the sub-sampling bound of
  :func:`~pdpfl.privacy.subsampled.poisson_subsampled_rdp` (Zhu & Wang 2019's binomial
  expansion; the removal direction is dominated for this symmetric mechanism, proved there),
  one row per rate;
* ``GroupPrivacy(e, k, conversion)`` (outermost, possibly inside ``Composed``) → the group
  conversion of e's RDP curve: Lemma 9 (``rdp``), Lemma 4 + Lemma 8 with the optimal inner δ'
  (``dp``) or the smaller (``best``) (:mod:`pdpfl.privacy.group`).

The distributed discrete Gaussian is refused by the ``pld`` and ``gdp-clt`` accountants
(``supports`` is False there; :func:`mechanism_epsilon` raises
:class:`~pdpfl.privacy.registry.UnsupportedEventError`).

Anything else (e.g. subsampling a composition) is not supported: ``supports`` is False and every
computation raises :class:`~pdpfl.privacy.registry.UnsupportedEventError` (a ValueError) naming
the structure. Both come from one traversal of the event (:meth:`RdpAccountant._compile`), as in
dp-accounting, so they cannot drift.

Orders. ``RdpAccountant()`` (no ``orders``) uses each event family's own grid: pdpfl's
:data:`~pdpfl.privacy.orders.DEFAULT_ORDERS` for Poisson/Gaussian events, the integer
:data:`~pdpfl.privacy.wor.WOR_ORDERS` for without-replacement events (Theorem 9 is stated for
integer orders), and :func:`~pdpfl.privacy.group.group_orders` for group events. Orders that are
given are used exactly as given (fractional orders of a without-replacement event are bounded by
ρ(⌈α⌉)). ``refine`` (default True) refines the best order continuously for Poisson chains.

One mechanism description feeds everything: :func:`mechanism_epsilon` charges ``counts_i`` rounds
of a :class:`~pdpfl.privacy.unit.UnitMechanism`'s ``round_event`` to unit i; it is what
:func:`~pdpfl.privacy.two_stage.plan_epsilon`, the calibration and the ledger all call, so they
agree exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy._search_orders import min_epsilon
from pdpfl.privacy.adversary import Adversary, as_adversary
from pdpfl.privacy.conversion import rdp_to_delta, rdp_to_epsilon
from pdpfl.privacy.discrete import distributed_discrete_gaussian_rdp
from pdpfl.privacy.group import group_epsilon_dp, group_epsilon_from_rdp, group_orders
from pdpfl.privacy.mechanisms import (
    Composed,
    DistributedDiscreteGaussian,
    GaussianMechanism,
    GroupPrivacy,
    Mechanism,
    PoissonSampled,
    SampledWithoutReplacement,
    Sequence,
    TwoStageRound,
    outline,
)
from pdpfl.privacy.orders import DEFAULT_ORDERS, check_orders
from pdpfl.privacy.rdp import check_rates, poisson_gaussian_rdp, two_stage_rdp
from pdpfl.privacy.registry import (
    Accountant,
    UnsupportedEventError,
    accountant_names,
    as_accountant_name,
    check_counts,
    make_accountant,
    register_accountant,
)
from pdpfl.privacy.subsampled import poisson_subsampled_rdp
from pdpfl.privacy.wor import WOR_ORDERS, wor_gaussian_rdp_any_order

if TYPE_CHECKING:  # pragma: no cover
    from pdpfl.privacy.unit import UnitMechanism

__all__ = [
    "Accountant",
    "RdpAccountant",
    "UnsupportedEventError",
    "register_accountant",
    "make_accountant",
    "accountant_names",
    "as_accountant_name",
    "mechanism_epsilon",
]

#: f(rho_step, alphas) -> total RDP of the event (monotone in rho_step).
_Compose = Callable[[np.ndarray, np.ndarray], np.ndarray]
#: (q, σ, f): a chain of monotone compositions around one Poisson-sampled Gaussian.
_Chain = tuple[np.ndarray, float, _Compose]


def _strip_composed(event: Mechanism) -> tuple[Mechanism, int]:
    """(innermost non-Composed event, product of the Composed counts around it)."""
    mult = 1
    while isinstance(event, Composed):
        mult *= event.count
        event = event.inner
    return event, mult


@dataclass(frozen=True)
class _Curve:
    """An event compiled for the RDP accountant: how to evaluate its curve, its fast path, and
    which order grid it needs (``wor``: whether without-replacement leaves occur; ``wor_only``:
    whether every Gaussian leaf sits in one)."""

    rdp: Callable[[np.ndarray], np.ndarray]
    chain: _Chain | None
    wor: bool
    wor_only: bool


@dataclass(frozen=True)
class _Group:
    """``mult`` repetitions of a group conversion (outermost) of ``inner``'s curve."""

    inner: _Curve
    size: int
    conversion: str
    mult: int


def _identity(rho: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    return rho


class RdpAccountant:
    """Rényi-DP accountant over a grid of orders, with continuous refinement of the optimum.

    Every event is first *compiled* (:meth:`_compile`, the one traversal of the event): into
    the closures that evaluate its curve, its fast path and its order family, or into an
    :class:`~pdpfl.privacy.registry.UnsupportedEventError` naming the node it cannot interpret.
    :meth:`supports` is "compiles" (as dp-accounting's ``supports`` is ``_maybe_compose(event,
    0, False) is None``), so what is supported and what is computed cannot drift.

    Parameters
    ----------
    orders
        Rényi orders α > 1; default (None): each event family's own grid (module docstring).
        Given orders are used exactly.
    refine
        Refine the best grid order of a Poisson chain continuously (never looser than the
        grid; default True). An explicit option, independent of ``orders``.

    Examples
    --------
    >>> from pdpfl.privacy.mechanisms import Composed, GaussianMechanism, PoissonSampled
    >>> acc = RdpAccountant()
    >>> ev = Composed(PoissonSampled([0.01, 0.1], GaussianMechanism(1.0)), 100)
    >>> eps, order = acc.epsilon(ev, 1e-5)   # one ε per rate, and the order that attains it
    """

    name = "rdp"
    #: Every ε is an upper bound.
    approximate: ClassVar[bool] = False

    def __init__(self, orders: ArrayLike | None = None, refine: bool = True) -> None:
        a = check_orders(DEFAULT_ORDERS if orders is None else orders).copy()
        a.setflags(write=False)
        self.orders = a
        #: True when ``orders`` was given (then every event uses exactly those orders).
        self.explicit_orders = orders is not None
        self.refine = bool(refine)

    def __repr__(self) -> str:
        return f"RdpAccountant(n_orders={self.orders.size}, refine={self.refine})"

    # ------------------------------------------------------------------ the one traversal
    def _compile(self, event: Mechanism) -> _Curve | _Group:
        """``event`` compiled (module docstring); UnsupportedEventError naming the node."""
        base, mult = _strip_composed(event)
        if isinstance(base, GroupPrivacy):
            return _Group(self._curve(base.inner), base.group_size, base.conversion, mult)
        return self._curve(event)

    def _curve(self, event: Mechanism) -> _Curve:
        if isinstance(event, GaussianMechanism):
            sigma = event.noise_multiplier
            return _Curve(
                lambda a: (a / (2.0 * sigma**2))[None, :],
                (np.ones(1), sigma, _identity),
                False,
                False,
            )
        if isinstance(event, DistributedDiscreteGaussian):
            ddg = _ddg_curve(event)
            return _Curve(lambda a: ddg(a)[None, :], None, False, False)
        if isinstance(event, PoissonSampled) and isinstance(
            event.inner, DistributedDiscreteGaussian
        ):
            # symmetric pairs: the removal direction is dominated (subsampled.py lemma); no
            # subsampled-Gaussian fast path
            curve, rates = _ddg_curve(event.inner), event.rates
            return _Curve(
                lambda a: poisson_subsampled_rdp(rates, curve, a, symmetric=True),
                None,
                False,
                False,
            )
        if (
            isinstance(event, SampledWithoutReplacement)
            and isinstance(event.inner, DistributedDiscreteGaussian)
            and event.inner.shares == 1
        ):
            # one exact discrete Gaussian (central noise): its RDP at integer orders is the
            # Gaussian's at σ = √(σ²/N) and Theorem 9 needs only those (any base mechanism)
            one, ratios = event.inner, event.rates
            s = float(np.nextafter(np.sqrt(one.share_variance / one.l2_sensitivity_sq), 0))
            return _Curve(lambda a: _wor_rows(ratios, s, a), None, True, True)
        if isinstance(event, PoissonSampled | SampledWithoutReplacement):
            inner = event.inner
            if not isinstance(inner, GaussianMechanism):
                raise UnsupportedEventError(
                    f"RdpAccountant cannot interpret {outline(event, 1)}: sampling is supported "
                    "only directly around a GaussianMechanism (Poisson sampling also around a "
                    "DistributedDiscreteGaussian)"
                )
            q, sigma = event.rates, inner.noise_multiplier
            if isinstance(event, PoissonSampled):
                return _Curve(
                    lambda a: poisson_gaussian_rdp(q, sigma, a), (q, sigma, _identity), False, False
                )
            return _Curve(lambda a: _wor_rows(q, sigma, a), None, True, True)
        if isinstance(event, Composed):
            return self._composed(self._curve(event.inner), event.count)
        if isinstance(event, TwoStageRound):
            return self._two_stage(event)
        if isinstance(event, Sequence):
            parts = [self._curve(e) for e in event.events]
            return _Curve(
                lambda a: _sum_rows([p.rdp(a) for p in parts]),
                None,
                any(p.wor for p in parts),
                all(p.wor_only for p in parts),
            )
        if isinstance(event, GroupPrivacy):
            raise UnsupportedEventError(
                "RdpAccountant cannot interpret GroupPrivacy inside another event: the group "
                "conversion applies to the whole mechanism (use it outermost)"
            )
        raise UnsupportedEventError(f"event: expected a mechanism, got {type(event).__name__}")

    @staticmethod
    def _composed(inner: _Curve, n: int) -> _Curve:
        chain = None
        if inner.chain is not None:
            q, sigma, f = inner.chain
            chain = (q, sigma, lambda rho, alphas: n * f(rho, alphas))
        return _Curve(lambda a: n * inner.rdp(a), chain, inner.wor, inner.wor_only)

    def _two_stage(self, event: TwoStageRound) -> _Curve:
        """rPDP-FL Lemma 6: τ Poisson steps (or any local mechanism, once) behind λ."""
        local, lam = event.local, event.client_rate
        if isinstance(local, Composed) and isinstance(local.inner, PoissonSampled):
            step, tau = self._curve(local.inner), local.count
            chain = None
            if step.chain is not None and tau != 0:
                q, sigma, f = step.chain
                chain = (q, sigma, lambda rho, al: two_stage_rdp(f(rho, al), tau, lam, al))

            def rdp(a: np.ndarray) -> np.ndarray:
                rho = step.rdp(a)
                return np.zeros_like(rho) if tau == 0 else two_stage_rdp(rho, tau, lam, a)

            return _Curve(rdp, chain, step.wor, step.wor_only)
        inner = self._curve(local)
        chain = None
        if inner.chain is not None:
            q, sigma, f = inner.chain
            chain = (q, sigma, lambda rho, al: two_stage_rdp(f(rho, al), 1, lam, al))
        return _Curve(
            lambda a: two_stage_rdp(inner.rdp(a), 1, lam, a), chain, inner.wor, inner.wor_only
        )

    def supports(self, event: Mechanism) -> bool:
        """True if ``event`` compiles: every node has an RDP rule here (module docstring)."""
        try:
            self._compile(event)
        except UnsupportedEventError:
            return False
        return True

    # ------------------------------------------------------------------ orders
    def orders_for(self, event: Mechanism) -> np.ndarray:
        """The orders used for ``event`` (the given ones, or its family's default grid)."""
        return self._orders(self._compile(event))

    def _orders(self, program: _Curve | _Group) -> np.ndarray:
        if self.explicit_orders:
            return self.orders
        if isinstance(program, _Group):
            return group_orders(program.size, self.orders)
        if program.wor:
            if program.wor_only:
                return np.asarray(WOR_ORDERS)
            return np.union1d(self.orders, WOR_ORDERS)  # mixed: both families' grids
        return self.orders

    # ------------------------------------------------------------------ RDP curves
    def rdp(self, event: Mechanism) -> np.ndarray:
        """RDP curve of ``event`` at :meth:`orders_for` ``(event)``: shape ``(n_rates, n_orders)``
        (1 row without per-record rates). Group events have no curve at these orders."""
        program = self._compile(event)
        if isinstance(program, _Group):
            raise ValueError(
                "RdpAccountant cannot interpret GroupPrivacy inside another event: the group "
                "conversion applies to the whole mechanism (use it outermost)"
            )
        return program.rdp(self._orders(program))

    # ------------------------------------------------------------------ conversions
    def epsilon(self, event: Mechanism, delta: float) -> tuple[np.ndarray, np.ndarray]:
        """ε per rate at ``delta`` and the order that attains it (both shape ``(n_rates,)``).

        Chains of compositions around one Poisson-sampled Gaussian (every training plan) use the
        certified branch-and-bound over :attr:`orders` plus the continuous refinement; other
        events the exact minimum over their orders of the Balle et al. 2020 conversion.
        """
        return self.composed_epsilon(event, 1, delta)

    def composed_epsilon(
        self, event: Mechanism, counts: ArrayLike, delta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """ε of ``counts[i]`` repetitions of row i of ``event`` (broadcast; 0 → ε = 0)."""
        program = self._compile(event)
        if isinstance(program, _Group):
            return self._group_epsilon(program, counts, delta)
        if program.chain is None:
            a = self._orders(program)
            base, mult = _strip_composed(event)
            if isinstance(base, SampledWithoutReplacement):
                # n·(m·ρ) as (n·m)·ρ: the same float operations as "steps × per-step RDP"
                rdp = self._curve(base).rdp(a)
                k = check_counts(counts, rdp.shape[0]) * mult
            else:
                rdp = program.rdp(a)
                k = check_counts(counts, rdp.shape[0])
            eps, order = rdp_to_epsilon(k[:, None] * rdp, a, delta)
            return np.where(k > 0, eps, 0.0), order
        q, sigma, f = program.chain
        k = check_counts(counts, q.size)
        eps = np.zeros(q.size)
        order = np.full(q.size, np.nan)
        live = np.flatnonzero(k > 0)
        if live.size == 0:
            return eps, order
        # distinct (q, k) pairs only; q in [0, 1] and k ≥ 1 integer map to distinct keys.
        key = q[live] + 2.0 * k[live]
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        uk = k[live][first].astype(np.float64)
        uq = q[live][first]

        def compose(rho: np.ndarray, rows: np.ndarray, alphas: np.ndarray) -> np.ndarray:
            return uk[rows, None] * f(rho, alphas)

        e, o = min_epsilon(uq, sigma, self.orders, delta, compose, refine=self.refine)
        inv = inv.reshape(-1)
        eps[live] = e[inv]
        order[live] = o[inv]
        return eps, order

    def _group_epsilon(
        self, program: _Group, counts: ArrayLike, delta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Group conversion of ``counts·mult`` repetitions of the inner event (per row)."""
        a = self._orders(program)
        curve = program.inner.rdp(a)
        k = check_counts(counts, curve.shape[0]) * program.mult
        total = k[:, None] * curve
        route, size = program.conversion, program.size
        eps = np.full(k.size, np.inf)
        order = np.full(k.size, np.nan)
        if route in ("rdp", "best"):
            eps, order = group_epsilon_from_rdp(total, a, delta, size)
        if route in ("dp", "best"):
            e_dp, o_dp, _ = group_epsilon_dp(total, a, delta, size)
            take = e_dp < eps
            eps, order = np.where(take, e_dp, eps), np.where(take, o_dp, order)
        return np.where(k > 0, eps, 0.0), np.where(k > 0, order, np.nan)

    def delta(self, event: Mechanism, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
        """δ per rate at ``epsilon`` and the optimal grid order (shape ``(n_rates,)``)."""
        return rdp_to_delta(self.rdp(event), self.orders_for(event), epsilon)


def _ddg_curve(event: DistributedDiscreteGaussian) -> Callable[[np.ndarray], np.ndarray]:
    """The RDP curve of a distributed discrete Gaussian event, as a function of the orders."""

    def curve(orders: np.ndarray) -> np.ndarray:
        return distributed_discrete_gaussian_rdp(
            orders,
            event.share_variance,
            event.shares,
            event.l2_sensitivity_sq,
            event.dimension,
            event.l1_sensitivity,
        )

    return curve


def _sum_rows(parts: list[np.ndarray]) -> np.ndarray:
    """Σ of RDP curves whose rows broadcast (all rate arrays of equal length)."""
    rows = {p.shape[0] for p in parts} - {1}
    if len(rows) > 1:
        raise ValueError(
            f"events: per-record rate arrays of different lengths {sorted(rows)} cannot be composed"
        )
    result: np.ndarray = np.sum(np.broadcast_arrays(*parts), axis=0)
    return result


def _wor_rows(ratios: np.ndarray, sigma: float, a: np.ndarray) -> np.ndarray:
    """One Theorem 9 curve per ratio (computed once per distinct ratio)."""
    uniq, inverse = np.unique(ratios, return_inverse=True)
    rows = np.stack([wor_gaussian_rdp_any_order(float(g), sigma, a) for g in uniq])
    return rows[inverse.reshape(-1)]


register_accountant("rdp", RdpAccountant)


# ------------------------------------------------------------------ unit mechanisms → ε


def mechanism_epsilon(
    mechanism: UnitMechanism,
    rates: ArrayLike,
    observer: Adversary | str,
    counts: ArrayLike | None = None,
    *,
    accountant: str | Accountant = "rdp",
    **options: object,
) -> tuple[np.ndarray, np.ndarray]:
    """ε of ``counts[i]`` charged rounds of ``mechanism.round_event`` for unit i (rate q_i).

    The one conversion path of pdpfl: ``plan_epsilon``, the calibration and the ledger all call
    it, so they agree exactly.

    Parameters
    ----------
    mechanism
        A :class:`~pdpfl.privacy.unit.UnitMechanism` (``TrainingPlan``, ``SampledGaussianPlan``,
        ``LocalStepsPlan``, ``GroupPlan``).
    rates
        Sampling rate per unit, in [0, 1] (the without-replacement ratio B/n for
        ``LocalStepsPlan(sampler="wor")``).
    observer
        ``third-party`` or ``server`` (must be one of ``mechanism.observers``).
    counts
        Charged rounds per unit (scalar or per rate); default the planned rounds T.
    accountant
        A registered accountant name (``rdp``, ``pld``, ``gdp-clt``) or an :class:`Accountant`;
        ``options`` build it (e.g. ``orders=`` for ``rdp``: leave it out for each event's
        default grid). Check ``make_accountant(name).approximate`` before calling the result an
        upper bound (``gdp-clt`` is a central-limit approximation).

    Returns
    -------
    (epsilon, detail)
        Shape ``(n_rates,)`` each; ε is 0 for q = 0 or 0 rounds. ``detail`` is the RDP order
        (``rdp``; NaN for 0 rounds, and with ``pld`` where the PLD bound was the smaller one),
        or the CLT μ (``gdp-clt``).

    Raises
    ------
    UnsupportedEventError
        (a ValueError) if the accountant cannot interpret the mechanism's event.
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
    k = check_counts(mechanism.planned_rounds if counts is None else counts, q.size)
    acc = make_accountant(accountant, **options)
    eps = np.zeros(q.size)
    detail = np.full(q.size, np.nan)
    live = np.flatnonzero(k > 0)
    if live.size == 0:
        return eps, detail
    event = mechanism.round_event(q[live], adv.value)
    if not acc.supports(event):
        raise UnsupportedEventError(
            f"accountant: {acc.name} cannot interpret {outline(event)} (this "
            f"{getattr(mechanism.unit, 'value', mechanism.unit)}-level mechanism); registered "
            f"accountants: {', '.join(accountant_names())}"
        )
    e, d = acc.composed_epsilon(event, k[live], mechanism.delta)
    eps[live] = e
    detail[live] = d
    return eps, detail
