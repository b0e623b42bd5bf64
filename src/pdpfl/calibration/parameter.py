"""One calibration entry point for continuous and integer mechanism parameters.

In the style of dp-accounting's ``mechanism_calibration.calibrate_dp_mechanism(
make_fresh_accountant, make_event_from_param, target_epsilon, target_delta, bracket_interval,
discrete=...)``: the search knows nothing about the mechanism it tunes. It is given ε as a
function of the parameter -- or an *event factory* (parameter → mechanism as data,
:mod:`pdpfl.privacy.mechanisms`) plus δ and an accountant -- and returns

* ``discrete=False`` (σ, a rate): the extreme parameter meeting the target to a relative
  ``tolerance``, rounded to the safe side (the result always meets the target);
* ``discrete=True`` (local steps, rounds): the largest (ε increasing) or smallest (ε
  decreasing) integer meeting the target.

The searches are :func:`pdpfl.privacy.search.monotone_search` and
:func:`~pdpfl.privacy.search.integer_search`, whose invariants are written down there.

Named helpers for the algorithms (each a thin call of :func:`calibrate_parameter` on a
:class:`~pdpfl.privacy.unit.UnitMechanism` through
:func:`~pdpfl.privacy.accountant.mechanism_epsilon`, the ledger's path):

* :func:`noise_for_epsilon` -- σ for a target ε (IDP-FedAvg's getNoise, ULDP-FL's σ from
  ε_max, PriFedSync's per-client σ, rPDP-FL's σ at q = 1);
* :func:`steps_for_epsilon` -- PriFedSync's local steps K for a target ε.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, Protocol, overload

import numpy as np

from pdpfl.privacy.accountant import mechanism_epsilon
from pdpfl.privacy.adversary import Adversary, as_adversary
from pdpfl.privacy.mechanisms import Mechanism, is_mechanism
from pdpfl.privacy.registry import Accountant, make_accountant
from pdpfl.privacy.search import NoFeasibleValueError, integer_search, monotone_search
from pdpfl.privacy.unit import UnitMechanism

__all__ = [
    "InfeasibleTargetError",
    "calibrate_parameter",
    "noise_for_epsilon",
    "steps_for_epsilon",
]

#: Default σ bracket and widening limits of the noise searches (those of rPDP-FL's σ search).
NOISE_BRACKET = (0.1, 100.0)
NOISE_LIMITS = (1e-3, 1e6)
#: Relative tolerance of the noise searches.
NOISE_TOLERANCE = 1e-4
#: A result that fails re-evaluation is nudged this much (relative) towards the safe side.
_NUDGE = 1e-6
_MAX_NUDGES = 200


class InfeasibleTargetError(ValueError):
    """No parameter in the bracket (within its limits) meets the target ε."""


EpsilonOf = Callable[[float], float] | Callable[[float], Mechanism]


@overload
def calibrate_parameter(
    epsilon_of: EpsilonOf,
    target_epsilon: float,
    *,
    bracket: tuple[float, float],
    discrete: Literal[False] = False,
    increasing: bool = False,
    tolerance: float = NOISE_TOLERANCE,
    limits: tuple[float, float] | None = None,
    slack: float = 0.0,
    delta: float | None = None,
    accountant: str | Accountant = "rdp",
    **accountant_options: object,
) -> float: ...


@overload
def calibrate_parameter(
    epsilon_of: EpsilonOf,
    target_epsilon: float,
    *,
    bracket: tuple[float, float],
    discrete: Literal[True],
    increasing: bool = False,
    tolerance: float = NOISE_TOLERANCE,
    limits: tuple[float, float] | None = None,
    slack: float = 0.0,
    delta: float | None = None,
    accountant: str | Accountant = "rdp",
    **accountant_options: object,
) -> int: ...


def calibrate_parameter(
    epsilon_of: EpsilonOf,
    target_epsilon: float,
    *,
    bracket: tuple[float, float],
    discrete: bool = False,
    increasing: bool = False,
    tolerance: float = NOISE_TOLERANCE,
    limits: tuple[float, float] | None = None,
    slack: float = 0.0,
    delta: float | None = None,
    accountant: str | Accountant = "rdp",
    **accountant_options: object,
) -> float | int:
    """The parameter that spends at most ``target_epsilon`` (closest to the boundary).

    Parameters
    ----------
    epsilon_of
        ε as a function of the parameter (non-increasing in it unless ``increasing``), or an
        event factory ``param -> Mechanism`` (then ``delta`` is required and ε is the largest
        over the event's rows of ``accountant``'s ε at ``delta``). NaN counts as not meeting
        the target.
    target_epsilon
        ε > 0.
    bracket
        ``(lo, hi)``: where to search (``0 < lo < hi`` for a continuous parameter, integers
        ``lo <= hi`` for a discrete one).
    discrete
        Integer parameter (local steps, rounds).
    increasing
        ε increases with the parameter (steps, rounds, rates): the *largest* parameter meeting
        the target is returned. Default: ε decreases (noise σ): the *smallest*.
    tolerance
        Relative tolerance of a continuous result (the boundary lies within ``1 + tolerance``
        of it, on the other side).
    limits
        Continuous only: the bracket may be widened by factors of 10 up to these limits;
        None: never widened (the bracket is strict).
    slack
        A value meets the target when ε ≤ target·(1 + slack) (default exactly the target).
    delta, accountant, accountant_options
        For an event factory: δ, and the accountant (``make_accountant(accountant, **opts)``).

    Returns
    -------
    float or int
        Always meeting the target: a continuous result is re-evaluated and, should the
        re-evaluation disagree (last-bit differences), nudged towards the safe side.

    Raises
    ------
    InfeasibleTargetError
        (a ValueError) if nothing in the bracket (within ``limits``) meets the target.
    ValueError
        Invalid target, bracket, tolerance, slack, or an event factory without ``delta``.
    """
    target = float(target_epsilon)
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"target_epsilon: must be a finite number > 0, got {target_epsilon!r}")
    if not (math.isfinite(slack) and slack >= 0):
        raise ValueError(f"slack: must be a finite number >= 0, got {slack!r}")
    threshold = target * (1.0 + slack) if slack else target
    eps_of = _as_epsilon_function(epsilon_of, delta, accountant, accountant_options)

    def ok(x: float) -> bool:
        value = float(eps_of(x))
        return not math.isnan(value) and value <= threshold

    lo, hi = bracket
    try:
        if discrete:
            if int(lo) != lo or int(hi) != hi:
                raise ValueError(f"bracket: a discrete parameter needs integers, got {bracket!r}")
            return integer_search(
                lambda x: ok(float(x)), int(lo), int(hi), feasible_above=not increasing
            )
        result = monotone_search(
            ok, float(lo), float(hi), tol=tolerance, feasible_above=not increasing, limits=limits
        )
    except NoFeasibleValueError as exc:
        raise InfeasibleTargetError(
            f"target_epsilon: ε = {target:g} cannot be met in {bracket!r}"
            + ("" if limits is None or discrete else f" widened up to {limits!r}")
            + f" ({exc})"
        ) from None
    # Never return a value that overspends, whatever the search's stopping rule.
    step = (1.0 - _NUDGE) if increasing else (1.0 + _NUDGE)
    for _ in range(_MAX_NUDGES):
        if ok(result):
            return result
        result *= step
    raise InfeasibleTargetError(  # pragma: no cover - needs a non-deterministic ε
        f"target_epsilon: the search's result does not meet ε = {target:g} on re-evaluation"
    )


def _as_epsilon_function(
    epsilon_of: EpsilonOf,
    delta: float | None,
    accountant: str | Accountant,
    options: dict[str, Any],
) -> Callable[[float], float]:
    """ε(x) from either form of ``epsilon_of`` (an event factory needs ``delta``)."""
    acc: list[Accountant] = []

    def eps(x: float) -> float:
        value = epsilon_of(x)
        if is_mechanism(value):
            if delta is None:
                raise ValueError("delta: an event factory needs the target δ (delta=...)")
            if not acc:
                acc.append(make_accountant(accountant, **options))
            return float(np.max(acc[0].epsilon(value, float(delta))[0]))
        return float(value)  # type: ignore[arg-type]

    return eps


# ------------------------------------------------------------------ named helpers


class _WithSteps(Protocol):
    """A unit mechanism whose number of local steps can be changed (``LocalStepsPlan``)."""

    local_steps: int

    def with_steps(self, local_steps: int) -> UnitMechanism: ...


def _epsilon_of_mechanism(
    mechanism: UnitMechanism,
    observer: Adversary | str,
    rounds: int | None,
    accountant: str | Accountant,
    rate: float,
    options: dict[str, Any],
) -> Callable[[UnitMechanism], float]:
    """ε(mechanism) after ``rounds`` charged rounds at ``rate`` (``both``: the larger)."""
    adv = as_adversary(observer)
    observers = tuple(mechanism.observers) if adv is Adversary.BOTH else (adv.value,)
    q = np.array([float(rate)])

    def eps(mech: UnitMechanism) -> float:
        return max(
            float(mechanism_epsilon(mech, q, obs, rounds, accountant=accountant, **options)[0][0])
            for obs in observers
        )

    return eps


def noise_for_epsilon(
    mechanism: UnitMechanism,
    epsilon: float,
    observer: Adversary | str = "third-party",
    rounds: int | None = None,
    accountant: str | Accountant = "rdp",
    *,
    rate: float = 1.0,
    bracket: tuple[float, float] = NOISE_BRACKET,
    limits: tuple[float, float] | None = NOISE_LIMITS,
    tolerance: float = NOISE_TOLERANCE,
    **options: object,
) -> float:
    """Smallest σ (to ``tolerance``, rounded up) with ε ≤ ``epsilon`` for ``mechanism``.

    ε is :func:`~pdpfl.privacy.accountant.mechanism_epsilon` of
    ``mechanism.with_noise(σ)`` for a unit sampled at ``rate`` over ``rounds`` charged rounds
    (default the mechanism's planned rounds), against ``observer`` (``both``: the larger of its
    observers). The σ of ``mechanism`` itself is ignored.

    Replaces, with equal results (tests): IDP-FedAvg's ``noise_for_rate(ε, q, δ, I)`` =
    ``noise_for_epsilon(SampledGaussianPlan("client", 1, δ, I), ε, rate=q)``; ULDP-FL's σ from
    ε_max = ``noise_for_epsilon(SampledGaussianPlan("user", 1, δ, T), ε_max, rate=q)``;
    PriFedSync's ``calibrate_noise(m, ε, R, accounting)`` =
    ``noise_for_epsilon(LocalStepsPlan(...), ε, rounds=R, accountant="rdp" | "gdp-clt",
    rate=B/n, bracket=(1e-3, 1e4), limits=None)``.
    """

    def eps_of_sigma(sigma: float) -> float:
        return eps(mechanism.with_noise(sigma))

    eps = _epsilon_of_mechanism(mechanism, observer, rounds, accountant, rate, options)
    return calibrate_parameter(
        eps_of_sigma, epsilon, bracket=bracket, limits=limits, tolerance=tolerance
    )


def steps_for_epsilon(
    mechanism: _WithSteps,
    epsilon: float,
    observer: Adversary | str = "third-party",
    rounds: int | None = None,
    accountant: str | Accountant = "rdp",
    *,
    rate: float = 1.0,
    max_steps: int | None = None,
    slack: float = 0.0,
    **options: object,
) -> int:
    """Largest K in [1, ``max_steps``] (default the mechanism's K) with ε ≤ ``epsilon``.

    ``mechanism`` has ``with_steps`` (:class:`~pdpfl.privacy.unit.LocalStepsPlan`). PriFedSync's
    ``calibrate_steps(m, ε, R, accounting)`` is ``steps_for_epsilon(LocalStepsPlan(...), ε,
    rounds=R, accountant="rdp" | "gdp-clt", rate=B/n, slack=1e-9)``. InfeasibleTargetError if
    even one step per round overspends.
    """
    top = int(mechanism.local_steps if max_steps is None else max_steps)
    if top < 1:
        raise ValueError(f"max_steps: must be an integer >= 1, got {top}")
    base = mechanism.with_steps(1)
    eps = _epsilon_of_mechanism(base, observer, rounds, accountant, rate, options)

    def eps_of_steps(k: float) -> float:
        return eps(mechanism.with_steps(int(k)))

    return calibrate_parameter(
        eps_of_steps, epsilon, bracket=(1, top), discrete=True, increasing=True, slack=slack
    )
