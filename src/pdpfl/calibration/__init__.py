"""Budget → sampling-rate estimators (the public façade is :mod:`pdpfl.calibrate`).

* :mod:`.certified` -- grid estimator, no record over budget by construction (default).
* :mod:`.scf` -- rPDP-FL Algorithm 2, Simulation-CurveFitting, as published.
* :mod:`.binary_search` -- Boenisch et al. "Sample" bisection per distinct budget.
* :mod:`.noise` -- choosing σ: (a) q = 1 spends ε_max, (b) uniform rate, (c) IDP-FedAvg Alg. 1.
* :mod:`.parameter` -- one calibration entry point (σ, steps) for every mechanism.
"""

from pdpfl.calibration.noise import noise_for_max_budget, noise_for_uniform_rate
from pdpfl.calibration.parameter import (
    InfeasibleTargetError,
    calibrate_parameter,
    noise_for_epsilon,
    steps_for_epsilon,
)

__all__ = [
    "InfeasibleTargetError",
    "calibrate_parameter",
    "noise_for_epsilon",
    "noise_for_max_budget",
    "noise_for_uniform_rate",
    "steps_for_epsilon",
]
