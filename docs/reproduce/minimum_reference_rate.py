"""The sampling rate behind rPDP-FL's published Minimum (StrongForAll) on Fed-Heart-Disease.

Evidence for docs/reproduce/README.md ("Minimum on Heart: the measured cause"). The script that
wrote Figure 8's results maps a budget ε to a record's sampling rate q through a *fitted* curve:
it evaluates ε(q) of the mechanism (σ = 12.25, τ = 50 steps, T = 15 rounds, λ = 1, δ = 1e-3,
RDP on the integer orders ⌊1.07^i + 1⌋ up to 1000, the Balle et al. 2020 conversion) on the grid
q ∈ {0.001, ..., 0.099} ∪ {0.01, ..., 0.99} ∪ {1}, fits ε(q) ≈ exp(a·q + b) + c by least
squares, and inverts the fit at the record's ε. This re-implements that recipe on pdpfl's RDP
of the Poisson-subsampled Gaussian and prints, for the ThreeLevels budgets, the fitted q, the
exact q (the largest q whose exact ε is the budget), and the ε the fitted q really spends.

    python docs/reproduce/minimum_reference_rate.py
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq, curve_fit

from pdpfl.privacy.conversion import rdp_to_epsilon
from pdpfl.privacy.rdp import poisson_gaussian_rdp

SIGMA, STEPS, ROUNDS, DELTA = 12.2509765625, 50, 15, 1e-3
#: The reference's orders: ⌊1.07^i + 1⌋ for i up to log_1.07(1000), unique, > 1.
ORDERS = np.unique(
    [int(1.07**i + 1) for i in range(int(math.floor(math.log(1000, 1.07))) + 1)]
).astype(float)
ORDERS = ORDERS[ORDERS > 1]
#: Heart's training silos (FLamby split): the reference's expected batch is max(1, ⌊Σ q⌋).
SILOS = (199, 172, 30, 85)


def epsilon(q: float) -> float:
    rdp = poisson_gaussian_rdp(np.array([q]), SIGMA, ORDERS) * STEPS * ROUNDS
    return float(rdp_to_epsilon(rdp, ORDERS, DELTA)[0][0])


def main() -> None:
    grid = np.unique(np.concatenate([np.arange(0, 1.0, 0.01), np.arange(0, 0.1, 0.001), [1.0]]))
    grid = grid[grid > 0]
    eps = np.array([epsilon(float(q)) for q in grid])

    def fit(x: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
        return np.exp(a * x + b) + c

    popt, _ = curve_fit(fit, grid.astype(np.float32), eps.astype(np.float32))
    print(f"sigma {SIGMA}, eps(q=1) = {epsilon(1.0):.4f}; fit a, b, c = {np.round(popt, 5)}")
    for budget in (0.1, 1.0, 5.0):
        q_fit = brentq(lambda x, b=budget: float(fit(np.array(x), *popt)) - b, 1e-9, 1.0)
        q_exact = brentq(lambda x, b=budget: epsilon(x) - b, 1e-7, 1.0)
        batches = [max(1, int(n * q_fit)) for n in SILOS]
        print(
            f"budget {budget:g}: fitted q {q_fit:.5f} (spends eps {epsilon(q_fit):.4f}), "
            f"exact q {q_exact:.5f}, ratio {q_fit / q_exact:.3f}; "
            f"the reference's expected batches max(1, int(n q)) = {batches}"
        )


if __name__ == "__main__":
    main()
