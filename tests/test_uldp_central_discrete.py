"""Exact central discrete noise in ULDP-FL (issue #33 item 4; ``privacy.central_noise: discrete``).

* ULDP-NAIVE: every silo adds the central discrete Gaussian of sensitivity 2C; the users' ledger
  charges the joint view of the |S| releases -- checked against Rényi divergences summed over the
  exact pmf (1e-6 at integer orders);
* ULDP-GROUP-k: the silos' DP-SGD steps are central discrete steps; the group event's ε is an
  upper bound of the exact ε of a k-record shift (hockey stick from the pmf) and never below the
  continuous plan's;
* ULDP-AVG/SGD: every noise is already an exact discrete share (``noise_shares: discrete``);
  ``central_noise: discrete`` asks for that and refuses continuous shares;
* one tiny run per kind (NAIVE, GROUP, AVG): the releases lie on the grid, ``summary.json`` shows
  the grid, the reported ε is the discrete plan's; the private weighting protocol's grid, dither
  and bits in ``summary.json``; refusals exit 2 naming the field.
"""

from __future__ import annotations

import json
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.config import ConfigError
from pdpfl.discrete_noise import discrete_gaussian_pmf
from pdpfl.privacy import mechanism_epsilon
from pdpfl.privacy.accountant import RdpAccountant
from pdpfl.privacy.noise import CentralDiscreteGaussianNoise, GaussianNoise
from pdpfl.privacy.uldp_central import (
    DiscreteGroupPlan,
    joint_event_variance,
    naive_discrete_plan,
)
from pdpfl.privacy.uldp_discrete import DiscreteUserLevelPlan
from pdpfl.privacy.unit import GroupPlan
from pdpfl.testing import TOY_CONFIG, _build, toy_config

DISCRETE = ["privacy.central_noise=discrete"]


def _toy(name: str, extra: list[str] | None = None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _build(toy_config(name, [*DISCRETE, *(extra or [])]))


# ----------------------------------------------------------------------------- exact pmf sums


def _log_pmf(variance: Fraction, shift: int, half: int) -> np.ndarray:
    """log N_Z(shift, σ²) on [−half, half] (normalised with the exact pmf's constant)."""
    x = np.arange(-half, half + 1, dtype=np.float64)
    log_norm = math.log(float(discrete_gaussian_pmf(np.array([0]), variance)[0]))
    return -((x - shift) ** 2) / (2.0 * float(variance)) + log_norm


def _divergence(variance: Fraction, shift: int, alpha: int) -> float:
    """D_α(N_Z(shift, σ²) ‖ N_Z(0, σ²)) summed over the exact pmf (the mass beyond ±40σ + 4k
    is below e^-800)."""
    half = int(40 * math.sqrt(float(variance))) + 4 * abs(shift) + 50
    log_p, log_q = _log_pmf(variance, shift, half), _log_pmf(variance, 0, half)
    return float(special.logsumexp(alpha * log_p + (1 - alpha) * log_q)) / (alpha - 1)


@pytest.mark.parametrize(("silos", "sigma"), [(3, 0.9), (5, 2.0)])
def test_naive_joint_event_against_exact_pmf_sums(silos: int, sigma: float) -> None:
    """Every silo adds N_Z(0, σ_silo²Δ'²) to its own integer vector, which one user moves by at
    most Δ' = γ·2C + √d: the joint view's Rényi divergence (a product over the silos, summed
    over the exact pmf) equals the event the ledger charges at integer orders (1e-6), and is
    below it when the user is absent from some silos."""
    noise = CentralDiscreteGaussianNoise(sigma * math.sqrt(silos), 2.0, 1)
    shift = math.floor(noise.grid_sensitivity)  # the largest integer shift of one silo
    plan = naive_discrete_plan(noise, silos, 1e-5, 10)
    orders = np.array([2.0, 3.0, 6.0, 11.0])
    for observer in plan.observers:
        event = plan.round_event(np.array([1.0]), observer)
        charged = RdpAccountant(orders=orders).rdp(event).reshape(-1)
        for a, bound in zip(orders, charged, strict=True):
            per_silo = _divergence(noise.variance, shift, int(a))
            joint = silos * per_silo  # independent noises: the divergences add
            assert bound >= joint * (1 - 1e-9)
            assert bound <= joint * (1 + 1e-6) + 1e-12
    # the continuous plan's multiplier σκ/2 = σ (κ = 2), up to the float rounding of √|S|
    assert plan.noise_multiplier == pytest.approx(sigma, rel=1e-12)
    assert Fraction(plan.released.share_variance) <= Fraction(noise.noise_multiplier) ** 2 / silos


@settings(max_examples=50, deadline=None)
@given(sigma=st.floats(1e-3, 1e3), silos=st.integers(1, 500))
def test_joint_variance_is_rounded_down(sigma: float, silos: int) -> None:
    v = joint_event_variance(sigma, silos)
    exact = Fraction(sigma) ** 2 / silos
    assert Fraction(v) <= exact
    assert Fraction(math.nextafter(v, math.inf)) > exact  # the largest float below


def _hockey_epsilon(variance: Fraction, shift: int, delta: float) -> float:
    """The exact ε(δ) of one discrete Gaussian release shifted by ``shift`` (both directions)."""
    half = int(40 * math.sqrt(float(variance))) + 4 * shift + 50
    p, q = np.exp(_log_pmf(variance, shift, half)), np.exp(_log_pmf(variance, 0, half))

    def hockey(eps: float) -> float:
        return max(
            float(np.sum(np.maximum(p - math.exp(eps) * q, 0))),
            float(np.sum(np.maximum(q - math.exp(eps) * p, 0))),
        )

    lo, hi = 0.0, 200.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if hockey(mid) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize(("k", "conversion"), [(2, "best"), (4, "rdp"), (3, "dp")])
def test_group_event_bounds_the_exact_k_record_shift(k: int, conversion: str) -> None:
    """One step at q = 1: a user with k records moves the rounded clipped sum by at most kΔ';
    the group plan's ε is ≥ the exact ε of that shift (hockey stick over the pmf), and never
    below the continuous group plan's."""
    sigma, delta = 3.0, 1e-5
    noise = CentralDiscreteGaussianNoise(sigma, 1.0, 1)
    shift = k * math.floor(noise.grid_sensitivity)
    exact = _hockey_epsilon(noise.variance, shift, delta)
    plan = DiscreteGroupPlan(sigma, 1, delta, 1, k, conversion)  # type: ignore[arg-type]
    eps, _ = mechanism_epsilon(plan, np.array([1.0]), "third-party", 1)
    assert float(eps[0]) >= exact
    cont, _ = mechanism_epsilon(
        GroupPlan(sigma, 1, delta, 1, k, conversion),  # type: ignore[arg-type]
        np.array([1.0]),
        "third-party",
        1,
    )
    assert float(eps[0]) >= float(cont[0]) * (1 - 1e-12)


def test_group_plan_with_sampling_stays_within_the_continuous_plus_a_few_per_cent() -> None:
    kw = dict(noise_multiplier=1.5, local_steps=5, delta=1e-5, rounds=20, group_size=4)
    rate = np.array([0.1])
    disc, _ = mechanism_epsilon(DiscreteGroupPlan(**kw), rate, "server", 20)  # type: ignore[arg-type]
    cont, _ = mechanism_epsilon(GroupPlan(**kw), rate, "server", 20)  # type: ignore[arg-type]
    assert cont[0] * (1 - 1e-12) <= disc[0] <= cont[0] * 1.1


# ----------------------------------------------------------------------------- the wiring


def test_naive_silos_and_ledger_share_one_discrete_description() -> None:
    server, clients, config = _toy("uldp-naive")
    noise = clients[0].noise
    assert isinstance(noise, CentralDiscreteGaussianNoise)
    silos = len(clients)
    assert noise.sensitivity == 2.0 * config.training.max_grad_norm  # spec D29's 2C
    plan = server.ledger.mechanism
    assert isinstance(plan, DiscreteUserLevelPlan)
    assert plan == naive_discrete_plan(noise, silos, config.privacy.delta, config.training.rounds)
    # σ from ε_max against the discrete plan: the planned ε is at most ε_max
    assert server.ledger.budgets.max() <= config.privacy.epsilon_max
    assert server.central_noise["accounted_noise_multiplier"] == plan.noise_multiplier
    dimension = sum(p.numel() for p in clients[0].model.parameters() if p.requires_grad)
    assert noise.dimension == dimension


def test_group_silos_step_with_the_discrete_noise_the_ledger_charges() -> None:
    server, clients, _ = _toy("uldp-group")
    noise = clients[0].noise
    assert isinstance(noise, CentralDiscreteGaussianNoise)
    assert isinstance(server.ledger.mechanism, DiscreteGroupPlan)
    assert server.ledger.mechanism.noise_multiplier == noise.noise_multiplier
    planned, _ = mechanism_epsilon(
        server.ledger.mechanism,
        np.array([server.group_setup.record_rate]),
        "third-party",
        server.group_setup.rounds,
    )
    assert server.ledger.budgets[0] >= planned[0]


def test_continuous_noise_is_unchanged() -> None:
    for name in ("uldp-naive", "uldp-group"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server, clients, _ = _build(toy_config(name))
        assert type(getattr(clients[0], "noise", None)) is GaussianNoise
        assert getattr(server, "central_noise", 0) is None
        assert "central_noise" not in server.state_dict()


def test_naive_release_lies_on_the_grid() -> None:
    """A silo's update is (round(γ·Clip(Δ_s)) + Z)/γ: γ·update is an integer vector."""
    import torch

    server, clients, _ = _toy("uldp-naive")
    silo = clients[0]
    g = torch.Generator().manual_seed(0)
    clipped = [
        0.01 * torch.randn(np.shape(p), generator=g, dtype=torch.float64)
        for p in server.initial_params()
    ]
    out = silo.privatize(clipped, 0)  # what NaiveSilo.step releases after clipping
    flat = np.concatenate([np.asarray(u, dtype=np.float64).ravel() for u in out])
    scaled = flat * silo.noise.scale
    np.testing.assert_array_equal(scaled, np.round(scaled))
    # the noise dominates: its std is σ_silo·Δ'/γ per coordinate
    assert float(np.std(flat)) == pytest.approx(silo.noise.std(), rel=0.2)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["uldp-naive", "uldp-group", "uldp-avg"])
def test_tiny_run_reports_the_discrete_grid(name: str, tmp_path) -> None:
    from pdpfl.runtime.simulation import run_simulation

    config = toy_config(name, [*DISCRETE, "training.rounds=1", "lifetime.allow_respend=true"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = run_simulation(config, tmp_path / "run", progress=False)
    assert summary["rounds_completed"] == 1
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    if name == "uldp-avg":  # the silos' discrete shares (noise_shares: discrete)
        assert written["aggregation"]["discrete_shares"]["bits"] > 0
        assert "central_noise" not in written
    else:
        grid = written["central_noise"]
        assert grid["kind"] == "discrete" and grid["sensitivity_inflation"] <= 2.0**-10
        assert grid["added_to"]
    plan = written["epsilon"]
    if config.privacy.epsilon_max is not None:  # σ calibrated against the discrete plan
        assert 0 < plan <= config.privacy.epsilon_max


def test_private_weighting_summary_describes_its_grid() -> None:
    from pdpfl.fl.aggregation.private_weighting_core import (
        discrete_sensitivity_sq,
        divisor,
        grid_bits,
    )
    from pdpfl.fl.uldp.discrete import private_weighting_noise
    from pdpfl.runtime.outputs import build_summary

    extra = ["algorithm.weights=private", "secure.precision=1e-8"]
    server, _, config = _toy("uldp-avg", extra)
    block = server.state_dict()["weighting_noise"]
    m = grid_bits(config.training.max_grad_norm, 1e-8)
    assert block["grid_log2"] == m == 7
    assert block["grid"] == pytest.approx(1e-8 * 2**7)
    assert block["clip_on_grid"] <= 2**20
    d = block["dimension"]
    noise, _ = private_weighting_noise(
        config, sigma=server.setup.noise_multiplier, survivors=block["survivors"], size=d
    )
    assert block["share_variance"] == float(noise.variance)
    assert block["l2_sensitivity_sq"] == discrete_sensitivity_sq(1.0, 1e-8, d)
    assert block["divisor_bits"] == divisor(config.secure.n_max).bit_length()
    assert f"2^{m}·DIV" in block["dither"]
    assert block["value_bits"] == config.secure.paillier_bits - 66 - block["divisor_bits"]
    result = {"metrics": [], "server_state": server.state_dict(), "seconds": 0.0, "params": []}
    summary = build_summary(config, result)
    assert summary["aggregation"]["private_weighting_noise"] == block


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("name", "extra", "field"),
    [
        ("uldp-avg", ["privacy.noise_shares=continuous"], "privacy.central_noise"),
        ("uldp-sgd", ["privacy.noise_shares=continuous"], "privacy.central_noise"),
        ("uldp-naive", ["privacy.accountant=pld"], "privacy.accountant"),
        ("uldp-group", ["privacy.accountant=pld"], "privacy.accountant"),
    ],
)
def test_unsupported_combinations_are_refused(name: str, extra: list[str], field: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=field):
        toy_config(name, [*DISCRETE, *extra])


def test_cli_refusal_exits_2(tmp_path) -> None:
    import yaml

    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(dict(TOY_CONFIG)))
    args = ["run", str(path), "--out", str(tmp_path / "run"), "--set", "algorithm.name=uldp-avg"]
    args += ["--set", "data.options.num_users=12", "--set", "privacy.noise_shares=continuous"]
    result = CliRunner().invoke(app, [*args, "--set", "privacy.central_noise=discrete"])
    assert result.exit_code == 2, result.output
    assert "error: privacy.central_noise: discrete" in result.output
    assert "Traceback" not in result.output
