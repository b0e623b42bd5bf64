"""Budget → sampling-rate estimators (the public façade is :mod:`pdpfl.calibrate`).

* :mod:`.certified` -- grid estimator, no record over budget by construction (default).
* :mod:`.scf` -- rPDP-FL Algorithm 2, Simulation-CurveFitting, as published.
* :mod:`.binary_search` -- Boenisch et al. "Sample" bisection per distinct budget.
* :mod:`.noise` -- choosing σ: (a) q = 1 spends ε_max, (b) uniform rate, (c) IDP-FedAvg Alg. 1.
"""
