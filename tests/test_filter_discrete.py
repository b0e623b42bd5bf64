"""The Filter baseline with exact discrete noise (``centralized-filter``,
``privacy.central_noise: discrete``; issue #33 item 4).

Each filtered GD step releases round(γS) + Z, Z an exact discrete Gaussian of variance σ²Δ'²
(Δ' = γC + √d). Record i's individual Rényi divergence of the step is the discrete Gaussian's
for the integer shift round(γS) − round(γ(S − ḡ_i)), which the filter charges as
α(‖ḡ_i‖ + √d/γ)²/(2σ²C'²), C' = Δ'/γ:

* the shift, measured from two real steps with and without the record (same noise draw), and its
  Rényi divergence summed over the exact pmf, stay below the charge;
* spent budgets never exceed B_i, and a record whose budget cannot pay √d/γ sits out and leaves;
* a tiny run: every record within its ε, ``summary.json`` shows the grid (Gaussian noise keeps
  its arithmetic: ``tests/test_dp_centralized.py``).
"""

from __future__ import annotations

import json
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import special

from pdpfl.discrete_noise import discrete_gaussian_pmf
from pdpfl.dp.filter import accounting_clip, filter_step
from pdpfl.models import create_model
from pdpfl.privacy.noise import CentralDiscreteGaussianNoise, GaussianNoise
from pdpfl.testing import toy_config


def _blobs(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    centers = torch.randn(3, 5, generator=torch.Generator().manual_seed(99)) * 3
    return (centers[y] + torch.randn(n, 5, generator=g)).double(), y


def _divergence(variance: Fraction, shift: int, alpha: int) -> float:
    """D_α(N_Z(shift, σ²) ‖ N_Z(0, σ²)) summed over the exact pmf (α ≤ 5: the terms beyond
    ±(15σ + 4α|shift|) are below e^-100 of the sum)."""
    half = int(15 * math.sqrt(float(variance))) + 4 * alpha * abs(shift) + 50
    x = np.arange(-half, half + 1, dtype=np.float64)
    log_norm = math.log(float(discrete_gaussian_pmf(np.array([0]), variance)[0]))
    log_p = -((x - shift) ** 2) / (2.0 * float(variance)) + log_norm
    log_q = -(x**2) / (2.0 * float(variance)) + log_norm
    return float(special.logsumexp(alpha * log_p + (1 - alpha) * log_q)) / (alpha - 1)


def _step(model, x, y, noise, active, budgets, spent):
    return filter_step(
        model, x, y, budgets=budgets, spent=spent, active=active, noise=noise,
        stream=torch.Generator().manual_seed(7), normalizer=1.0,
    )  # fmt: skip


def test_charge_bounds_the_released_shift_and_its_exact_divergence() -> None:
    x, y = _blobs(6)
    model = create_model("logreg", (5,), 3).double()
    d = sum(p.numel() for p in model.parameters())
    sigma, clip = 0.05, 0.5  # a small σ keeps the pmf sums short
    noise = CentralDiscreteGaussianNoise(sigma, clip, d)
    c_acc = accounting_clip(noise)
    assert c_acc == pytest.approx(clip + math.sqrt(d) / noise.scale, rel=1e-12)
    assert c_acc >= clip + math.sqrt(d) / noise.scale
    assert accounting_clip(GaussianNoise(sigma, clip)) == clip  # Gaussian: no grid term
    budgets, spent = np.array([10.0, 10.0, 0.04, 10.0, 10.0, 10.0]), np.zeros(6)
    everyone = np.ones(6, dtype=bool)
    with_all = _step(model, x, y, noise, everyone, budgets, spent)
    for i in (0, 2, 4):  # record 2's budget binds its clip bound
        without = everyone.copy()
        without[i] = False
        other = _step(model, x, y, noise, without, budgets, spent)
        # float64 model, normalizer 1: the released gradient times γ is the integer vector
        a = torch.cat([g.flatten() for g in with_all.grads]).numpy() * noise.scale
        b = torch.cat([g.flatten() for g in other.grads]).numpy() * noise.scale
        np.testing.assert_array_equal(a, np.round(a))
        shift = np.round(a - b).astype(np.int64)  # the same Z cancels
        charged_sq = with_all.sq_norms[i] * noise.scale**2  # (γ‖ḡ‖ + √d)²
        assert float(shift @ shift) <= charged_sq * (1 + 1e-12)
        exact = sum(_divergence(noise.variance, int(k), 2) for k in shift if k)
        charge = 2 * with_all.sq_norms[i] / (2 * sigma**2 * c_acc**2)
        assert 0 < exact <= charge * (1 + 1e-9)
    assert np.all(spent + with_all.sq_norms <= budgets)


def test_records_that_cannot_pay_the_grid_term_sit_out() -> None:
    x, y = _blobs(4)
    model = create_model("logreg", (5,), 3).double()
    d = sum(p.numel() for p in model.parameters())
    noise = CentralDiscreteGaussianNoise(1.0, 1.0, d)
    pad = math.sqrt(d) / noise.scale
    budgets = np.array([pad**2 / 4, 10.0, (3 * pad) ** 2, 10.0])
    spent = np.zeros(4)
    step = _step(model, x, y, noise, np.ones(4, dtype=bool), budgets, spent)
    assert step.active == 3 and step.sq_norms[0] == 0.0 and step.exhausted[0]
    assert np.all(step.sq_norms[1:] >= pad**2 * (1 - 1e-12))  # every participant pays √d/γ
    assert np.all(step.sq_norms <= budgets)
    assert step.exhausted[2]  # its clip bound binds: it leaves after the step


@pytest.mark.slow
def test_tiny_filter_run_keeps_every_record_within_budget(tmp_path) -> None:
    from pdpfl.runtime.simulation import run_simulation

    extra = ["privacy.central_noise=discrete", "training.rounds=2", "lifetime.allow_respend=true"]
    config = toy_config("centralized-filter", extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_simulation(config, tmp_path / "run", progress=False)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["central_noise"]["kind"] == "discrete"
    assert summary["over_budget"] == 0
    assert 0 < summary["epsilon"] <= config.privacy.epsilon_max
