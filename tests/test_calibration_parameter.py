"""One calibration entry point (dp-accounting's ``calibrate_dp_mechanism`` style).

``calibrate_parameter`` and its named helpers replace, with equal results, the σ / step
searches the algorithms wrote themselves: IDP-FedAvg's ``noise_for_rate`` and ULDP-FL's σ from
ε_max (values computed on main before the rewiring, ``GOLDEN``) and rPDP-FL's
``noise_for_max_budget`` (rewired onto it; same golden values). PriFedSync's former
``calibrate_noise`` / ``calibrate_steps`` are compared with their golden values in
``tests/test_prifedsync_ledger.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.calibration import (
    InfeasibleTargetError,
    calibrate_parameter,
    noise_for_epsilon,
    noise_for_max_budget,
    steps_for_epsilon,
)
from pdpfl.privacy import (
    Composed,
    GaussianMechanism,
    LocalStepsPlan,
    PoissonSampled,
    SampledGaussianPlan,
    TrainingPlan,
)
from pdpfl.privacy.search import find_noise_multiplier

#: Computed on main (d80a4f6) with the algorithms' own functions: (ε, q, δ, rounds, σ).
GOLDEN_IDP = [  # fl.idp_fedavg.noise_for_rate(ε, q, δ, I)
    (1.0, 0.05, 1e-05, 100, 2.319623396129299),
    (5.0, 0.3, 0.0001, 420, 5.367529933754018),
    (0.5, 0.01, 1e-05, 50, 1.4034648433866248),
    (10.0, 1.0, 0.001, 20, 1.958706205836044),
]
GOLDEN_ULDP = [  # fl.uldp.noise_multiplier: noise_for_uniform_rate(ε_max, q, user plan)
    (2.0, 1.0, 1e-05, 30, 11.771486227237995),
    (8.0, 0.1, 1e-05, 100, 0.9933989995027299),
    (0.3, 0.5, 1e-06, 10, 22.53153773521089),
]
GOLDEN_MAX_BUDGET = [  # calibrate.noise_for_max_budget(ε_max, TrainingPlan(*plan), adversary)
    (10.0, (1.0, 0.001, 5, 20, 0.5), "third-party", 3.3658876020526374),
    (3.0, (1.0, 1e-05, 50, 15, 0.2), "both", 40.89367950357591),
    (1.0, (1.0, 1e-05, 100, None, 1.0), "third-party", 40.45211406227251),
]


@pytest.mark.parametrize(("eps", "q", "delta", "rounds", "sigma"), GOLDEN_IDP)
def test_idp_fedavg_get_noise_equals_main(eps, q, delta, rounds, sigma) -> None:
    plan = SampledGaussianPlan("client", 1.0, delta, rounds)  # type: ignore[arg-type]
    assert noise_for_epsilon(plan, eps, rate=q) == sigma


@pytest.mark.parametrize(("eps", "q", "delta", "rounds", "sigma"), GOLDEN_ULDP)
def test_uldp_sigma_from_epsilon_max_equals_main(eps, q, delta, rounds, sigma) -> None:
    plan = SampledGaussianPlan("user", 1.0, delta, rounds)  # type: ignore[arg-type]
    assert noise_for_epsilon(plan, eps, rate=q) == sigma


@pytest.mark.parametrize(("eps", "plan", "adversary", "sigma"), GOLDEN_MAX_BUDGET)
def test_noise_for_max_budget_equals_main(eps, plan, adversary, sigma) -> None:
    tp = TrainingPlan(*plan)
    assert noise_for_max_budget(eps, tp, adversary) == sigma
    assert noise_for_epsilon(tp, eps, adversary) == sigma  # the unit-mechanism helper agrees


def test_find_noise_multiplier_is_the_same_search() -> None:
    def eps(sigma: float) -> float:
        return 3.0 / sigma

    ours = calibrate_parameter(eps, 0.7, bracket=(0.1, 100.0), limits=(1e-3, 1e6), tolerance=1e-3)
    assert ours == find_noise_multiplier(0.7, eps)
    assert eps(ours) <= 0.7 and eps(ours / (1 + 1e-3)) > 0.7


@settings(max_examples=40, deadline=None)
@given(
    target=st.floats(0.05, 50.0),
    scale=st.floats(0.01, 100.0),
    tol=st.sampled_from([1e-2, 1e-4, 1e-6]),
)
def test_continuous_result_meets_the_target_and_is_within_tolerance(target, scale, tol) -> None:
    def eps(x: float) -> float:
        return scale / x  # decreasing (noise)

    x = calibrate_parameter(eps, target, bracket=(0.1, 100.0), limits=(1e-6, 1e9), tolerance=tol)
    assert eps(x) <= target
    exact = scale / target
    assert exact <= x <= exact * (1 + tol) * (1 + 1e-12) or x == 1e-6

    def inc(q: float) -> float:
        return scale * q  # increasing (a rate)

    y = calibrate_parameter(
        inc, target, bracket=(1e-3, 1.0), increasing=True, limits=(1e-12, 1.0), tolerance=tol
    )
    assert inc(y) <= target
    assert y == 1.0 or y * (1 + tol) * (1 + 1e-12) >= target / scale


@settings(max_examples=40, deadline=None)
@given(target=st.floats(0.5, 500.0), per_step=st.floats(0.01, 10.0), top=st.integers(1, 400))
def test_discrete_returns_the_extreme_feasible_integer(target, per_step, top) -> None:
    def eps(k: float) -> float:
        return per_step * math.sqrt(k)

    best = int(min(top, math.floor((target / per_step) ** 2)))
    if best < 1:
        with pytest.raises(InfeasibleTargetError):
            calibrate_parameter(eps, target, bracket=(1, top), discrete=True, increasing=True)
        return
    k = calibrate_parameter(eps, target, bracket=(1, top), discrete=True, increasing=True)
    assert isinstance(k, int) and eps(k) <= target
    assert k == top or eps(k + 1) > target
    assert abs(k - best) <= 1  # float rounding of the square at the boundary

    def dec(k: float) -> float:
        return per_step * 100.0 / k

    s = calibrate_parameter(dec, target, bracket=(1, 10_000), discrete=True)
    assert dec(s) <= target and (s == 1 or dec(s - 1) > target)


def test_event_factory_form() -> None:
    def event(sigma: float) -> Composed:
        return Composed(PoissonSampled([0.01, 0.05], GaussianMechanism(sigma)), 1000)

    sigma = calibrate_parameter(event, 2.0, bracket=(0.1, 100.0), delta=1e-5)
    from pdpfl.privacy.accountant import RdpAccountant

    worst = float(np.max(RdpAccountant().epsilon(event(sigma), 1e-5)[0]))
    assert worst <= 2.0
    assert float(np.max(RdpAccountant().epsilon(event(sigma / 1.001), 1e-5)[0])) > 2.0
    with pytest.raises(ValueError, match="delta"):
        calibrate_parameter(event, 2.0, bracket=(0.1, 100.0))

    def steps_event(k: float) -> Composed:
        return Composed(PoissonSampled(0.01, GaussianMechanism(2.0)), int(k))

    steps = calibrate_parameter(
        steps_event,
        1.0,
        bracket=(1, 100_000),
        discrete=True,
        increasing=True,
        delta=1e-5,
        accountant="rdp",
        refine=False,
    )
    acc = RdpAccountant(refine=False)
    assert acc.epsilon(steps_event(steps), 1e-5)[0][0] <= 1.0
    assert acc.epsilon(steps_event(steps + 1), 1e-5)[0][0] > 1.0


def test_bad_input_and_infeasible_targets() -> None:
    with pytest.raises(ValueError, match="target_epsilon"):
        calibrate_parameter(lambda s: 1.0 / s, 0.0, bracket=(0.1, 10.0))
    with pytest.raises(ValueError, match="bracket"):
        calibrate_parameter(lambda s: 1.0 / s, 1.0, bracket=(10.0, 0.1))
    with pytest.raises(InfeasibleTargetError, match="target_epsilon"):
        calibrate_parameter(lambda s: 1.0 / s, 1e-3, bracket=(0.1, 10.0))  # strict bracket
    # widening within limits finds it
    assert (
        calibrate_parameter(lambda s: 1.0 / s, 1e-3, bracket=(0.1, 10.0), limits=(1e-3, 1e6)) >= 1e3
    )
    # a strict bracket whose low end already meets the target returns it
    assert calibrate_parameter(lambda s: 1.0 / s, 100.0, bracket=(0.1, 10.0)) == 0.1
    plan = LocalStepsPlan("wor", 0.3, 50, 1e-5, 100)
    with pytest.raises(InfeasibleTargetError):
        steps_for_epsilon(plan, 0.01, rate=0.5)
