"""Scale (individualized DP-SGD by clipping, Boenisch et al. 2023): accounting, clipping, binding.

The conformance checks (``check_algorithm``), the Flower run that must match the simulator and
the example's validation pick the algorithm up from the registry
(``test_algorithm_conformance.py``, ``test_flower_algorithms.py``,
``test_config_validation.py``); this file checks what is Scale's own.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.config import load_config
from pdpfl.fl.idp_sgd import ScaleSetup, ScaleSilo, scale_setup
from pdpfl.ledger import PrivacyLedger
from pdpfl.models import get_params
from pdpfl.privacy.noise import GaussianNoise, NoiseBindingError
from pdpfl.randomness import make_randomness

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "idp_sgd_digits.yaml"

#: A hand-made setup (no calibration): σ = 2, C = 1, groups 1 / 3 / 8 at σ_p = 8, 4, 2.
SETUP = ScaleSetup(
    noise_multiplier=2.0,
    max_grad_norm=1.0,
    sampling_rate=1.0,
    delta=1e-3,
    local_steps=1,
    rounds=3,
    client_rate=1.0,
    group_budgets=[1.0, 3.0, 8.0],
    group_noise=[8.0, 4.0, 2.0],
)


def _dp_accounting(sigma: float, q: float, count: int, delta: float) -> tuple[float, float]:
    """(RDP, PLD) ε of ``count`` Poisson-sampled Gaussians from dp-accounting."""
    import dp_accounting

    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    rdp = dp_accounting.rdp.RdpAccountant(orders=list(range(2, 257)))
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    rdp.compose(event, count)
    pld.compose(event, count)
    return float(rdp.get_epsilon(delta)), float(pld.get_epsilon(delta))


@pytest.mark.slow
def test_each_group_spends_its_budget_at_its_effective_multiplier() -> None:
    """Record of group p: the sampled Gaussian of multiplier σ·C/C_p at rate q, τ·T times
    (λ = 1). The ledger's ε is dp-accounting's RDP ε for that multiplier (within its coarser
    integer-order grid), above dp-accounting's tight PLD ε (an upper bound), and it meets the
    group's budget: at most ε_p and close to it (the calibration spends it)."""
    config = load_config(EXAMPLE, ["training.rounds=3", "training.local_steps=4"])
    setup = scale_setup(config, 0.05, [1.0, 3.0, 8.0], 6)
    sigma, clip = setup.noise_multiplier, setup.max_grad_norm
    budgets = np.array(setup.group_budgets)
    clips = setup.clip_norms(budgets)
    assert clips[-1] == pytest.approx(clip) and np.all(np.diff(clips) > 0)
    ledger = PrivacyLedger(
        budgets,
        setup.record_rates(budgets),
        setup.plan(),
        noise_multipliers=setup.record_noise(budgets),
    )
    for _ in range(3):
        ledger.record_round(participated=np.ones(3, bool), active=np.ones(3, bool))
    for observer in ("third-party", "server"):
        spent = np.asarray(ledger.spent_epsilon(observer))
        for eps_p, c_p, ours in zip(budgets, clips, spent, strict=True):
            rdp, pld = _dp_accounting(sigma * clip / c_p, 0.05, 4 * 3, 1e-3)
            assert ours == pytest.approx(rdp, rel=0.05)
            assert pld <= ours + 1e-2
            assert 0.99 * eps_p <= ours <= eps_p * (1 + 1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.05, 50.0), min_size=1, max_size=30))
def test_every_record_is_clipped_within_c_and_charged_at_most_its_budget(budgets: list) -> None:
    """C_i ≤ C; a record joins the largest group ε_p ≤ ε_i (so it spends ≤ ε_i); its charged
    multiplier is the one noise seen at its sensitivity: σ_i·C_i = σ·C."""
    eps = np.array(budgets)
    clips, sig = SETUP.clip_norms(eps), SETUP.record_noise(eps)
    group = SETUP.groups_of(eps)
    assert np.all(clips <= SETUP.max_grad_norm)
    inside = group >= 0
    assert np.all(np.array(SETUP.group_budgets)[group[inside]] <= eps[inside] * (1 + 1e-9))
    assert np.all(SETUP.record_rates(eps)[~inside] == 0) and np.all(clips[~inside] == 0)
    total = SETUP.noise_multiplier * SETUP.max_grad_norm
    np.testing.assert_allclose(sig[inside] * clips[inside], total, rtol=1e-12)
    order = np.argsort(eps, kind="stable")
    assert np.all(np.diff(clips[order]) >= 0)  # more budget, never a smaller clip


def _silo(x: np.ndarray, budgets: np.ndarray, seed: int = 3) -> ScaleSilo:
    torch.manual_seed(0)
    n = len(x)
    data = SimpleNamespace(
        x_train=x,
        y_train=np.arange(n) % 2,
        x_test=x[:2],
        y_test=np.array([0, 1]),
        record_ids=np.arange(n),
    )
    return ScaleSilo(
        0,
        torch.nn.Linear(x.shape[1], 2),
        data,
        budgets,
        SETUP,
        randomness=make_randomness("reproducible", seed),
        normalizer=1.0,
        lr=1.0,
    )


def _update(x: np.ndarray, budgets: np.ndarray) -> np.ndarray:
    silo = _silo(x, budgets)
    params = get_params(silo.model)
    out = silo.fit(params, 0, {"round": 0})
    return np.concatenate([np.ravel(u) for u in out.update]).astype(np.float64)


@pytest.mark.parametrize("victim_group", [0, 2])
def test_one_record_moves_the_release_by_at_most_twice_its_clip(victim_group: int) -> None:
    """Replace one record by an adversarial one (gradient ×10⁴): with the same coins and noise
    the release moves by ≤ lr·2·C_p/B for the record's own C_p -- and the bound is tight enough
    to tell the groups apart (a top-group record moves it by more than the low group's bound)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 4))
    budgets = np.array([8.0] * 6)
    budgets[0] = SETUP.group_budgets[victim_group]
    evil = x.copy()
    evil[0] *= -1e4
    moved = float(np.linalg.norm(_update(x, budgets) - _update(evil, budgets)))
    c_p = float(SETUP.clip_norms(budgets[:1])[0])
    assert moved <= 2 * c_p * (1 + 1e-5)
    if victim_group == 2:
        low = float(SETUP.clip_norms(np.array([1.0]))[0])
        assert moved > 2 * low


def test_a_silo_whose_noise_was_weakened_releases_nothing() -> None:
    """The noise drawn must be what the ledger charges every record at its own C_i: a silo
    with σ/10 refuses before drawing (the round stays charged: over-counting is safe)."""
    silo = _silo(np.random.default_rng(2).normal(size=(6, 4)), np.array([1.0, 3.0, 8.0] * 2))
    silo.noise = GaussianNoise(SETUP.noise_multiplier / 10, SETUP.max_grad_norm)
    with pytest.raises(NoiseBindingError):
        silo.fit(get_params(silo.model), 0, {"round": 0})
    assert silo.ledger is not None and silo.ledger.rounds_recorded == 1


def test_budgets_below_every_group_are_refused_unless_excluded() -> None:
    x = np.random.default_rng(3).normal(size=(4, 4))
    with pytest.raises(ValueError, match="below the smallest group"):
        _silo(x, np.array([0.5, 1.0, 3.0, 8.0]))


def test_config_problems_name_the_field() -> None:
    from pdpfl.config import ConfigError

    with pytest.raises(ConfigError, match="privacy.epsilon_max"):
        load_config(EXAMPLE, ["privacy.epsilon_max=null", "privacy.noise_multiplier=1.0"])
    with pytest.raises(ValueError, match="algorithm.groups"):
        scale_setup(load_config(EXAMPLE), 0.05, [1.0, 9.0], 6)


@pytest.mark.slow
def test_pdpfl_run_and_audit_the_example(tmp_path: Path) -> None:
    """``pdpfl run`` on the example (1 round) and a small audit: no ε̂ above the claim."""
    from typer.testing import CliRunner

    from pdpfl.audit import AuditSettings, run_audit
    from pdpfl.cli import app

    out = tmp_path / "run"
    res = CliRunner().invoke(
        app, ["run", str(EXAMPLE), "--set", f"output_dir={out}", "--set", "training.rounds=1"]
    )
    assert res.exit_code == 0, res.output
    assert (out / "summary.json").exists()
    config = load_config(EXAMPLE, ["randomness=reproducible", "training.rounds=2"])
    result = run_audit(config, AuditSettings(canaries=40, seed=5, space="block"))
    assert result.violations == []
