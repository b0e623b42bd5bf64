"""Exact central discrete noise (issue #33 item 4; ``privacy.central_noise: discrete``).

* the grid: γ = 2^k is the smallest power of two with inflation ≤ 2^-10, and the rounded sums of
  any two neighbours differ by at most the accounted grid sensitivity γC + √d (property test);
* the law of one released noisy sum through the DP-SGD engine (zero gradient): chi-square
  against the exact discrete Gaussian pmf;
* the accountant: the sub-sampled central discrete Gaussian's RDP at integer orders against
  divergences summed numerically over the exact pmf (both directions), ε an upper bound of the
  exact single-step ε (hockey-stick divergence from the pmf), never below the continuous plan;
* the rPDP-FL silo's ledger charges the discrete plan; summary.json shows the grid;
* refused combinations exit 2 naming the field.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.config import ConfigError
from pdpfl.discrete_noise import discrete_gaussian_pmf, discrete_gaussian_spec
from pdpfl.dp.engine import PersonalizedDPSGD
from pdpfl.dp.noise import add_noise
from pdpfl.privacy.accountant import RdpAccountant
from pdpfl.privacy.mechanisms import DistributedDiscreteGaussian, PoissonSampled
from pdpfl.privacy.noise import CentralDiscreteGaussianNoise, central_scale_log2
from pdpfl.privacy.plan import TrainingPlan
from pdpfl.privacy.two_stage import plan_epsilon
from pdpfl.randomness import SecureRandomness
from pdpfl.testing import TOY_CONFIG, _build, toy_config

DISCRETE = ["privacy.central_noise=discrete"]


# ----------------------------------------------------------------------------- the grid


@settings(max_examples=60, deadline=None)
@given(
    c=st.floats(1e-3, 1e3, allow_nan=False),
    d=st.integers(1, 10**7),
)
def test_scale_is_the_smallest_power_of_two_within_the_inflation(c: float, d: int) -> None:
    k = central_scale_log2(c, d)
    # exact: 2^(2k)·C² ≥ 2^20·d, and k − 1 fails it
    assert Fraction(2) ** (2 * k) * Fraction(c) ** 2 >= Fraction(2) ** 20 * d
    assert Fraction(2) ** (2 * (k - 1)) * Fraction(c) ** 2 < Fraction(2) ** 20 * d
    noise = CentralDiscreteGaussianNoise(1.0, c, d)
    assert noise.grid_sensitivity >= noise.scale * c + math.sqrt(d)
    assert 0 < noise.inflation <= 2.0**-10 * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(
    d=st.integers(1, 64),
    k=st.integers(-3, 12),
    seed=st.integers(0, 2**32 - 1),
    shift=st.floats(0.0, 1.0),
)
def test_rounded_neighbours_differ_by_at_most_the_grid_sensitivity(
    d: int, k: int, seed: int, shift: float
) -> None:
    """Neighbouring clipped sums S, S' = S + g (‖g‖ ≤ C): the released integer vectors'
    centres differ by at most Δ' = γC + √d, adversarial rounding included."""
    rng = np.random.default_rng(seed)
    c = 1.0
    noise = CentralDiscreteGaussianNoise(1.0, c, d, scale_log2=k)
    gamma = noise.scale
    s = rng.normal(size=d) * 10
    g = rng.normal(size=d)
    g *= shift * c / max(np.linalg.norm(g), 1e-300)
    # push coordinates to the rounding boundary: the worst case for the √d term
    s = (np.floor(s * gamma) + 0.5 - 1e-9) / gamma
    a = np.round(s * gamma)
    b = np.round((s + g) * gamma)
    assert np.linalg.norm(a - b) <= noise.grid_sensitivity


# ----------------------------------------------------------------------------- the law


def _engine(noise: CentralDiscreteGaussianNoise) -> PersonalizedDPSGD:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)  # 10 trainable coordinates
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    return PersonalizedDPSGD(model, opt, noise=noise)


@pytest.mark.slow
def test_released_noisy_sum_has_the_exact_discrete_law() -> None:
    """Zero gradient, γ = 1 (k = 0): the DP-SGD step's released gradient is Z/B with Z the
    exact discrete Gaussian of variance σ²Δ'² (rounded up by the sampler): chi-square."""
    noise = CentralDiscreteGaussianNoise(0.5, 1.0, 10, scale_log2=0)
    engine = _engine(noise)
    zeros = [torch.zeros_like(p, dtype=torch.float64) for p in engine.params]
    stream = SecureRandomness().stream("central-law", 0, 0)
    draws = np.concatenate(
        [
            torch.cat([t.reshape(-1) for t in engine.noisy_gradient(zeros, 1.0, stream)])
            .double()
            .numpy()
            for _ in range(300)
        ]
    )
    assert np.array_equal(draws, np.round(draws))  # integers: γ = 1, exact in float32
    variance = discrete_gaussian_spec(noise.variance).variance
    support = np.arange(-6, 7)  # |x| ≥ 6 pooled into the end bins (expected ≥ 5 per bin)
    pmf = discrete_gaussian_pmf(support, variance)
    observed = np.array([(draws == x).sum() for x in support], dtype=float)
    observed[0] += (draws < support[0]).sum()
    observed[-1] += (draws > support[-1]).sum()
    expected = pmf * draws.size
    expected[0] += (1 - pmf.sum()) / 2 * draws.size
    expected[-1] += (1 - pmf.sum()) / 2 * draws.size
    assert stats.chisquare(observed, expected).pvalue > 1e-4


def test_noise_is_refused_on_another_dimension() -> None:
    """The grid sensitivity depends on d: a description for d coordinates adds nothing to a
    vector of another size."""
    noise = CentralDiscreteGaussianNoise(1.0, 1.0, 10)
    with pytest.raises(ValueError, match="dimension 10"):
        add_noise(torch.zeros(11, dtype=torch.float64), noise, SecureRandomness().stream("x", 0))


def test_clipped_sum_is_kept_on_the_grid() -> None:
    """A non-zero sum is released as (round(γS) + Z)/γ: its mean is S up to 1/(2γ)."""
    noise = CentralDiscreteGaussianNoise(0.01, 1.0, 1000)
    s = torch.linspace(-3, 3, 1000, dtype=torch.float64)
    out = add_noise(s.clone(), noise, SecureRandomness().stream("grid", 0))
    assert torch.equal(out * noise.scale, torch.round(out * noise.scale))
    assert float((out - s).std()) == pytest.approx(noise.std(), rel=0.1)


# ----------------------------------------------------------------------------- the accountant


def _log_pmfs(sigma_z: float, k: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    """log Q and log P on |x| ≤ 40σ_Z + 4k + 50 (the rest is below e^{-800} of the mass):
    Q = N_Z(0, σ_Z²), P = (1 − q)Q + q·N_Z(k, σ_Z²) (integer shift k), in log space."""
    half = int(40 * sigma_z) + 4 * k + 50
    x = np.arange(-half, half + 1, dtype=np.float64)
    log_norm = math.log(float(discrete_gaussian_pmf(np.array([0]), Fraction(sigma_z**2))[0]))
    log_q0 = -(x * x) / (2 * sigma_z**2) + log_norm
    log_q1 = -((x - k) ** 2) / (2 * sigma_z**2) + log_norm
    if q >= 1.0:
        return log_q0, log_q1
    log_p = np.logaddexp(math.log1p(-q) + log_q0, math.log(q) + log_q1)
    return log_q0, log_p


def _numeric_rdp(q: float, sigma_z: float, k: int, alpha: int) -> tuple[float, float]:
    """D_α(P ‖ Q) and D_α(Q ‖ P) summed over the exact pmf (log space)."""
    log_q0, log_p = _log_pmfs(sigma_z, k, q)
    add = float(special.logsumexp(alpha * log_p + (1 - alpha) * log_q0)) / (alpha - 1)
    rem = float(special.logsumexp(alpha * log_q0 + (1 - alpha) * log_p)) / (alpha - 1)
    return add, rem


@pytest.mark.parametrize(("q", "sigma", "k"), [(0.05, 1.0, 3), (0.3, 2.0, 2), (1.0, 1.5, 4)])
def test_sampled_central_discrete_rdp_against_exact_pmf_sums(
    q: float, sigma: float, k: int
) -> None:
    """The event the ledger charges, PoissonSampled(q, DDG(σ², 1, 1, 1)), bounds both
    directions of the sub-sampled discrete Gaussian of sensitivity k, σ_Z = σk, at integer
    orders, and is tight there (the integer moments are the continuous Gaussian's)."""
    orders = np.array([2.0, 3.0, 5.0, 8.0])
    noise = CentralDiscreteGaussianNoise(sigma, 1.0, 1)
    event = PoissonSampled(q, noise.event())
    got = RdpAccountant(orders=orders).rdp(event).reshape(-1)
    for a, bound in zip(orders, got, strict=True):
        add, rem = _numeric_rdp(q, sigma * k, k, int(a))
        assert bound >= max(add, rem) * (1 - 1e-9) - 1e-12
        assert bound <= max(add, rem) * (1 + 1e-6) + 1e-9


def _exact_single_step_epsilon(q: float, sigma: float, k: int, delta: float) -> float:
    """The exact ε(δ) of one sub-sampled discrete Gaussian step (hockey-stick divergence from
    the pmf, both directions), by bisection."""
    log_q0, log_p = _log_pmfs(sigma * k, k, q)
    q0, p = np.exp(log_q0), np.exp(log_p)

    def hockey(eps: float) -> float:
        return max(
            float(np.sum(np.maximum(p - math.exp(eps) * q0, 0))),
            float(np.sum(np.maximum(q0 - math.exp(eps) * p, 0))),
        )

    lo, hi = 0.0, 50.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if hockey(mid) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize(("q", "sigma"), [(0.1, 1.0), (1.0, 2.0), (0.5, 0.8)])
def test_epsilon_is_an_upper_bound_of_the_exact_epsilon(q: float, sigma: float) -> None:
    plan = TrainingPlan(sigma, 1e-5, 1, noise="discrete")
    eps, _ = plan_epsilon(np.array([q]), plan, "third-party")
    exact = _exact_single_step_epsilon(q, sigma, 3, 1e-5)
    assert float(eps[0]) >= exact
    assert float(eps[0]) <= 3 * exact  # RDP → (ε, δ) loses a bounded factor, not more


@pytest.mark.parametrize("q", [0.01, 0.1, 1.0])
def test_discrete_plan_never_below_the_continuous(q: float) -> None:
    """The discrete plan's ε is ≥ the continuous one's (a few per cent above where the optimal
    order is fractional): calibrating against it never overspends."""
    for observer in ("third-party", "server"):
        kw = dict(noise_multiplier=1.0, delta=1e-5, steps=10, rounds=20, client_rate=0.5)
        cont, _ = plan_epsilon(np.array([q]), TrainingPlan(**kw), observer)
        disc, _ = plan_epsilon(np.array([q]), TrainingPlan(**kw, noise="discrete"), observer)
        assert disc[0] >= cont[0] * (1 - 1e-12)
        assert disc[0] <= cont[0] * 1.25


# ----------------------------------------------------------------------------- the wiring


@pytest.mark.slow
def test_rpdp_silo_ledger_charges_the_discrete_plan() -> None:
    _, clients, config = _build(toy_config("rpdp", DISCRETE))
    silo = clients[0]
    assert isinstance(silo.noise, CentralDiscreteGaussianNoise)
    plan = silo.ledger.mechanism
    assert isinstance(plan, TrainingPlan) and plan.noise == "discrete"
    step = plan.round_event(np.array([0.5]), "server").inner.inner
    assert isinstance(step, DistributedDiscreteGaussian)
    assert step.share_variance <= silo.noise.noise_multiplier**2
    dimension = sum(p.numel() for p in silo.model.parameters() if p.requires_grad)
    assert silo.noise.dimension == dimension


@pytest.mark.slow
def test_run_shows_the_grid_in_summary_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    import yaml

    cfg = dict(TOY_CONFIG)
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "run",
            str(path),
            "--out",
            str(out),
            "--quiet",
            "--set",
            "algorithm.name=rpdp",
            "--set",
            "training.rounds=1",
            "--set",
            "privacy.central_noise=discrete",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    grid = summary["central_noise"]
    assert grid["kind"] == "discrete" and grid["sensitivity_inflation"] <= 2.0**-10
    assert summary["config"]["privacy"]["central_noise"] == "discrete"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (
            ["algorithm.name=idp-fedavg", "algorithm.variant=distributed", "aggregation=secure"],
            "privacy.central_noise",
        ),
        (["algorithm.name=rpdp", "privacy.accountant=pld"], "privacy.accountant"),
    ],
)
def test_unsupported_combinations_are_refused(extra: list[str], field: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=field):
        toy_config(extra[0].split("=")[1], [*extra[1:], *DISCRETE])


def test_cli_refusal_exits_2(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import yaml

    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(dict(TOY_CONFIG)))
    result = CliRunner().invoke(
        app,
        [
            "run",
            str(path),
            "--out",
            str(tmp_path / "run"),
            "--set",
            "algorithm.name=idp-fedavg",
            "--set",
            "algorithm.variant=distributed",
            "--set",
            "algorithm.clients_per_round=2",
            "--set",
            "aggregation=secure",
            "--set",
            "privacy.central_noise=discrete",
        ],
    )
    assert result.exit_code == 2
    assert "error: privacy.central_noise: discrete" in result.output
    assert "Traceback" not in result.output


_CALIBRATE = ["calibrate", "--scenario", "bounded-mix-gauss", "--n", "100", "--sigma", "2.0"]
_CALIBRATE += ["--steps", "5", "--rounds", "10", "--delta", "1e-5", "--allow-exclusion"]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--accountant", "pld"], "--accountant"),
        (["--unit", "user"], "--central-noise"),
        (["--central-noise", "fractional"], "--central-noise"),
    ],
)
def test_calibrate_cli_refuses_discrete_where_it_cannot(extra: list[str], field: str) -> None:
    args = [*_CALIBRATE, *extra]
    if "--central-noise" not in extra:
        args += ["--central-noise", "discrete"]
    if "--unit" in extra:  # a user-level plan takes --rounds only
        i = args.index("--steps")
        del args[i : i + 2]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"error: {field}" in result.output


def test_calibrate_cli_accepts_discrete_and_keeps_every_record_within_budget() -> None:
    import json

    result = CliRunner().invoke(app, [*_CALIBRATE, "--central-noise", "discrete", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["over_budget"] == 0


def _residue_tv(a: np.ndarray, b: np.ndarray, bits: int) -> float:
    m = (1 << bits) - 1
    ha = np.bincount(a & m, minlength=1 << bits) / a.size
    hb = np.bincount(b & m, minlength=1 << bits) / b.size
    return 0.5 * float(np.abs(ha - hb).sum())


def test_central_discrete_release_resists_float_attacks() -> None:
    """Jin et al. 2022-style attacks on the released gradient of neighbouring sums S₀ = 0 and
    S₁ (‖S₁‖ = C): the reachable set cannot tell them apart (every release is on the grid
    Z/γ under both inputs, the noise has full support there), and the low-order bits of γ·o
    have the same law under both (excess total variation over a same-input baseline < 0.05 for
    1..12 bits)."""
    n = 20_000
    noise = CentralDiscreteGaussianNoise(1.0, 1.0, n)
    s1 = np.zeros(n)
    s1[: n // 4] = 2.0 / math.sqrt(n)

    def release(s: np.ndarray, index: int) -> np.ndarray:
        out = add_noise(
            torch.from_numpy(s.copy()), noise, SecureRandomness().stream("attack", index)
        )
        return out.numpy()

    out0, base, out1 = release(np.zeros(n), 0), release(np.zeros(n), 1), release(s1, 2)
    grids = []
    for out in (out0, base, out1):
        g = out * noise.scale
        assert np.array_equal(g, np.round(g))  # attack A: on the grid under both inputs
        grids.append(np.round(g).astype(np.int64))
    g0, gb, g1 = grids
    excess = max(_residue_tv(g0, g1, k) - _residue_tv(g0, gb, k) for k in range(1, 13))
    assert excess < 0.05


@pytest.mark.slow
def test_idp_sgd_scale_clips_each_group_within_its_discrete_charge() -> None:
    """IDP-SGD's Scale on discrete central noise: group p clips at C_p = (σΔ'/σ_p − √d)/γ,
    so the one noise charges every record at least its group's σ_p (its ledger multiplier);
    the plan is the discrete one and the records' ledgers hold those multipliers."""
    _, clients, _ = _build(toy_config("idp-sgd-scale", DISCRETE))
    silo = clients[0]
    noise = silo.noise
    assert isinstance(noise, CentralDiscreteGaussianNoise)
    assert silo.ledger.mechanism.noise == "discrete"
    groups = silo.setup.groups_of(silo.budgets)
    charged = np.asarray(silo.ledger.noise_multipliers)
    for p, sigma_p in enumerate(silo.setup.group_noise):
        mine = groups == p
        if not mine.any():
            continue
        clip = float(silo.clips[mine][0])
        assert 0 < clip <= silo.setup.max_grad_norm
        # the grid sensitivity of a record clipped at C_p is charged at least σ_p
        grid = noise.scale * clip + math.sqrt(noise.dimension)
        assert noise.noise_multiplier * noise.grid_sensitivity / grid >= sigma_p
        assert np.all(charged[mine] >= sigma_p)
        # and the clip is the largest such (within 10^-9): nothing is given away
        assert noise.multiplier_for(clip * (1 + 1e-9)) < sigma_p or clip == noise.sensitivity
