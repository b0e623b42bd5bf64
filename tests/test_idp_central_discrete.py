"""IDP-FedAvg central with exact discrete noise (issue #33 item 4; ``privacy.central_noise:
discrete``; :mod:`pdpfl.fl.idp_fedavg.central_discrete`).

* the joint event (value on its grid + count on Z): RDP at integer orders, with and without
  Poisson sub-sampling, against divergences summed over the exact two-dimensional pmf (an
  independent computation, both directions, 1e-6), and the charged event bounds every group's
  worst integer shift;
* the released value and count through the server: chi-square against the exact pmf;
* SAMPLE calibrated against the discrete event: every group within budget under its ledger's
  plan, which is the calibration's event; the pool ledger charges it; the binding check;
* a run: summary.json's ``central_noise`` block, no client over budget; refusals exit 2;
  the continuous path keeps its plan and rates.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml
from scipy import special, stats
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.config import ConfigError
from pdpfl.discrete_noise import discrete_gaussian_spec
from pdpfl.fl import idp_fedavg as idp
from pdpfl.fl.api import Aggregate, Contribution
from pdpfl.fl.idp_fedavg import central_discrete as cd
from pdpfl.privacy import mechanism_epsilon
from pdpfl.privacy.accountant import RdpAccountant
from pdpfl.privacy.discrete_plan import SampledDiscreteGaussianPlan
from pdpfl.privacy.mechanisms import DistributedDiscreteGaussian, PoissonSampled
from pdpfl.privacy.noise import NoiseBindingError, central_event_variance
from pdpfl.privacy.unit import SampledGaussianPlan
from pdpfl.randomness import SeededRandomness
from pdpfl.testing import TOY_CONFIG, _build, toy_config

DISCRETE = ["privacy.central_noise=discrete"]


def _setup(**overrides: object) -> idp.IdpSetup:
    """A hand-made central publication with discrete noise (unit tests of the server)."""
    base: dict[str, object] = dict(
        method="individual",
        variant="central",
        delta=1e-3,
        rounds=10,
        num_clients=6,
        clients_per_round=2.0,
        budgets=(1.0, 2.0),
        sizes=(3.0, 3.0),
        assigned=(1.0, 2.0),
        rates=(0.2, 0.5),
        clip_factors=(1.0, 1.0),
        noise_multiplier=0.9,
        value_noise_multiplier=1.0,
        count_noise_std=1.0,
        denominator=1.0,
        clipping="adaptive",
        initial_clip=1.0,
        target_quantile=0.5,
        clip_lr=0.2,
        server_lr=1.0,
        asked_per_round=0,
        survivors=0,
        local=idp.LocalTraining(epochs=1, batch_size=4, optimizer="sgd", lr=0.1, strategy="loop"),
        rate_fractions="realized",
        observers=("third-party",),
        model_size=1,
        central_noise="discrete",
    )
    base.update(overrides)
    return idp.IdpSetup(**base)  # type: ignore[arg-type]


# ------------------------------------------------------------------------- the joint event


def _log_pmf(x: np.ndarray, variance: float) -> np.ndarray:
    """log N_Z(0, σ²) at x, normalised over ±(60σ + 10) (independent of pdpfl's sampler)."""
    half = int(60 * math.sqrt(variance)) + 10
    support = np.arange(-half, half + 1, dtype=np.float64)
    log_norm = float(special.logsumexp(-(support**2) / (2 * variance)))
    result: np.ndarray = -(x**2) / (2 * variance) - log_norm
    return result


def _joint_rdp(
    q: float, var_v: float, var_c: float, k_v: int, k_c: int, alpha: int
) -> tuple[float, float]:
    """Both directions of D_α between (1−q)·P + q·P_k and P, P = N_Z(0, var_v) ⊗ N_Z(0, var_c),
    k = (k_v, k_c), summed over the two-dimensional integer grid (log space)."""
    sv, sc = math.sqrt(var_v), math.sqrt(var_c)
    xv = np.arange(-int(14 * sv) - abs(k_v) * alpha, int(14 * sv) + abs(k_v) * alpha + 1.0)
    xc = np.arange(-int(14 * sc) - abs(k_c) * alpha - 2, int(14 * sc) + abs(k_c) * alpha + 3.0)
    p0 = _log_pmf(xv, var_v)[:, None] + _log_pmf(xc, var_c)[None, :]
    p1 = _log_pmf(xv - k_v, var_v)[:, None] + _log_pmf(xc - k_c, var_c)[None, :]
    mix = p1 if q >= 1.0 else np.logaddexp(math.log1p(-q) + p0, math.log(q) + p1)
    add = float(special.logsumexp(alpha * mix + (1 - alpha) * p0)) / (alpha - 1)
    rem = float(special.logsumexp(alpha * p0 + (1 - alpha) * mix)) / (alpha - 1)
    return add, rem


@pytest.mark.parametrize(
    ("q", "sigma_v", "count_std", "k_v"),
    [(1.0, 1.2, 0.8, 2), (0.3, 1.5, 1.0, 3), (0.05, 1.0, 1.5, 1)],
)
def test_joint_event_rdp_matches_exact_pmf_sums_at_integer_orders(
    q: float, sigma_v: float, count_std: float, k_v: int
) -> None:
    """Value N_Z(0, σ_Z²) shifted by k_v and count N_Z(0, (2σ_b)²) shifted by 1, released
    together: the event DDG(σ², 1, 1, 1) with σ⁻² = k_v²/σ_Z² + 1/(2σ_b)² gives exactly their
    divergence at integer orders (sub-sampled too), both directions within 1e-6."""
    var_v = (sigma_v * k_v) ** 2
    var_c = (2.0 * count_std) ** 2
    sigma = (k_v**2 / var_v + 1.0 / var_c) ** -0.5
    orders = np.array([2.0, 3.0, 5.0, 8.0])
    event = PoissonSampled(q, DistributedDiscreteGaussian(sigma**2, 1, 1.0, 1))
    got = RdpAccountant(orders=orders).rdp(event).reshape(-1)
    for a, bound in zip(orders, got, strict=True):
        add, rem = _joint_rdp(q, var_v, var_c, k_v, 1, int(a))
        exact = max(add, rem)
        assert bound >= exact * (1 - 1e-9) - 1e-12
        assert bound <= exact * (1 + 1e-6) + 1e-9


@pytest.mark.parametrize("factors", [(1.0, 1.0), (0.5, 1.0)])
def test_charged_event_bounds_every_groups_worst_integer_shift(
    factors: tuple[float, float],
) -> None:
    """d = 1: the worst integer shift of group g is (⌊γf_g + 1⌋, 1); its exact divergence (pmf
    sums, the noise as drawn) never exceeds the group's charged event, and the drawn multiplier
    is at least the charged one (SCALE factors included)."""
    setup = _setup(clip_factors=factors, value_noise_multiplier=0.05, count_noise_std=1.0)
    value = cd.value_noise(setup)
    count = cd.count_noise(setup)
    assert count is not None
    cd.check_drawn(setup)
    orders = np.array([2.0, 4.0])
    for g, f in enumerate(factors):
        plan = cd.group_plan(setup, g)
        assert cd.group_multiplier(setup, g) >= plan.noise_multiplier
        k_v = math.floor(value.scale * f + 1.0)
        charged = RdpAccountant(orders=orders).rdp(plan.round_event(np.array([0.5]), "third-party"))
        for a, bound in zip(orders, charged.reshape(-1), strict=True):
            add, rem = _joint_rdp(0.5, float(value.variance), float(count.variance), k_v, 1, int(a))
            assert bound >= max(add, rem)


# ------------------------------------------------------------------ the law of the release


class _Seen:
    def __init__(self) -> None:
        self.values: list[float] = []

    def __call__(self, unclipped: float) -> None:
        self.values.append(unclipped)


@pytest.mark.slow
def test_released_value_and_count_have_the_exact_discrete_law() -> None:
    """Through the central server (d = 2, C_t = 1, denominator 1): the value release is
    (round(γS) + Z_v)/γ and the count (2·below + Z_c)/2; Z_v and Z_c follow the exact pmf of
    the variances the sampler draws (chi-square)."""
    setup = _setup(model_size=2, value_noise_multiplier=0.001, count_noise_std=1.0)
    value = cd.value_noise(setup)
    count = cd.count_noise(setup)
    assert count is not None
    server = idp.CentralIdpServer(
        [np.zeros(2, np.float32)],
        setup,
        client_groups=np.zeros(6, dtype=np.int64),
        randomness=SeededRandomness(5),
    )
    seen = _Seen()
    server._adapt = seen  # type: ignore[method-assign]  # the raw noisy fraction, unclipped
    updates = [np.array([0.3, -0.2], np.float32), np.array([2.0, 1.0], np.float32)]
    updates.append(np.array([0.1, 0.1], np.float32))  # 2·below = 1 + (−1) + 1 = 1
    s = np.zeros(2)
    for u in updates:
        u64 = u.astype(np.float64)
        s += u64 * min(1.0, 1.0 / float(np.linalg.norm(u64)))
    grid = np.round(s * value.scale)
    z_v, z_c = [], []
    for t in range(400):
        server.clip_norm = 1.0
        server.select_clients(t, list(range(6)))
        agg = Aggregate(
            total=[np.zeros(2, np.float32)],
            weight=3,
            metrics={},
            count=3,
            contributions=[Contribution(update=[u]) for u in updates],
        )
        new = server.aggregate(t, [np.zeros(2, np.float32)], agg)
        released = new[0].astype(np.float64) * value.scale
        assert np.array_equal(released, np.round(released))  # on the grid
        z_v.extend((released - grid).tolist())
        z_c.append(round((seen.values[-1] - 0.5) * 2.0) - 1)  # minus 2·below = 1
    for draws, variance in (
        (np.array(z_v), discrete_gaussian_spec(value.variance).variance),
        (np.array(z_c), discrete_gaussian_spec(count.variance).variance),
    ):
        sd = math.sqrt(float(variance))
        support = np.arange(-int(2.2 * sd), int(2.2 * sd) + 1)
        pmf = np.exp(_log_pmf(support.astype(np.float64), float(variance)))
        observed = np.array([(draws == x).sum() for x in support], dtype=float)
        observed[0] += (draws < support[0]).sum()
        observed[-1] += (draws > support[-1]).sum()
        expected = pmf * draws.size
        expected[0] += (1 - pmf.sum()) / 2 * draws.size
        expected[-1] += (1 - pmf.sum()) / 2 * draws.size
        assert stats.chisquare(observed, expected).pvalue > 1e-4


def test_binding_refuses_less_noise_than_charged(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value noise below what the ledgers charge is refused before anything is drawn."""
    setup = _setup(model_size=2)
    server = idp.CentralIdpServer(
        [np.zeros(2, np.float32)],
        setup,
        client_groups=np.zeros(6, dtype=np.int64),
        randomness=SeededRandomness(1),
    )
    monkeypatch.setattr(cd, "MARGIN", -1e-3)
    agg = Aggregate(
        total=[np.zeros(2, np.float32)], weight=0, metrics={}, count=0, contributions=[]
    )
    with pytest.raises(NoiseBindingError, match="privacy group 0"):
        server.aggregate(0, [np.zeros(2, np.float32)], agg)
    assert server.clip_history == []  # nothing released, C_t unchanged


# ------------------------------------------------------------------ calibration and ledgers


@pytest.mark.slow
def test_sample_fits_the_discrete_event_and_the_ledger_charges_it() -> None:
    """SAMPLE with noise="discrete": each group's ε under its ledger's plan is within its budget
    and equals the calibration's ε; the mean rate is still c/N."""
    kw = dict(delta=1e-3, rounds=20)
    disc = idp.sample_group_rates([1.0, 3.0], [6, 4], 0.25, noise="discrete", **kw)
    assert disc.noise_multiplier is not None
    assert abs(disc.mean_rate - 0.25) <= 0.25 * 1e-3 + 1e-6
    for g, (budget, rate) in enumerate(zip(disc.budgets, disc.rates, strict=True)):
        plan = SampledDiscreteGaussianPlan(
            "client",
            central_event_variance(float(disc.noise_multiplier)),
            1,
            1.0,
            1,
            1e-3,
            20,
            ("third-party",),
        )
        eps, _ = mechanism_epsilon(plan, np.array([rate]), "third-party")
        assert eps[0] <= budget
        assert eps[0] == pytest.approx(disc.epsilons[g], rel=1e-12)


@pytest.mark.slow
def test_central_silos_charge_the_discrete_plan_and_continuous_keeps_the_gaussian() -> None:
    """The config's setup: central discrete with the model's d; every client's ledger charges
    the discrete plan at no more than the multiplier drawn for its group; the continuous setup
    keeps the Gaussian plan (and no grid)."""
    server, clients, _ = _build(toy_config("idp-fedavg", DISCRETE))
    setup = server.setup  # type: ignore[attr-defined]
    assert setup.central_noise == "discrete" and setup.model_size == 650
    for silo in clients.values():
        plan = silo.ledger.mechanism  # type: ignore[attr-defined]
        assert isinstance(plan, SampledDiscreteGaussianPlan)
        assert plan.noise_multiplier <= cd.group_multiplier(setup, silo.group)  # type: ignore[attr-defined]
    server_c, clients_c, _ = _build(toy_config("idp-fedavg"))
    setup_c = server_c.setup  # type: ignore[attr-defined]
    assert setup_c.central_noise == "continuous" and setup_c.model_size == 0
    for silo in clients_c.values():
        assert isinstance(silo.ledger.mechanism, SampledGaussianPlan)  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------- a run


def _toy_yaml(tmp_path) -> str:  # type: ignore[no-untyped-def]
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(dict(TOY_CONFIG)))
    return str(path)


_IDP = ["algorithm.name=idp-fedavg", "algorithm.clients_per_round=2"]
_IDP += ["algorithm.group_budgets=[2.0,8.0]", "algorithm.group_ratios=[0.5,0.5]"]
_IDP += ["algorithm.assignment=exact", "algorithm.local_epochs=1"]
_IDP += ["algorithm.local_batch_size=8", "algorithm.count_noise_ratio=1.0"]


def _sets(items: list[str]) -> list[str]:
    return [a for item in items for a in ("--set", item)]


@pytest.mark.slow
def test_run_shows_both_grids_and_keeps_every_client_within_budget(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    args = ["run", _toy_yaml(tmp_path), "--out", str(out), "--quiet"]
    args += _sets([*_IDP, "training.rounds=3", *DISCRETE])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    block = summary["central_noise"]
    assert block["kind"] == "discrete" and block["sensitivity_inflation"] <= 2.0**-10
    assert block["dimension"] == 650 and block["count"]["noise_multiplier"] > 0
    assert all(g["drawn_multiplier"] >= g["charged_multiplier"] for g in block["groups"])
    privacy = summary["privacy"]
    assert privacy["over_budget"]["third-party"] == 0
    for group in privacy["groups"]:
        assert group["spent_max"]["third-party"] <= group["budget_max"]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["algorithm.variant=distributed", "aggregation=secure"], "privacy.central_noise"),
        (["privacy.accountant=pld"], "privacy.accountant"),
    ],
)
def test_unsupported_combinations_are_refused(extra: list[str], field: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=field):
        toy_config("idp-fedavg", [*extra, *DISCRETE])


def test_cli_refusal_exits_2(tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = ["run", _toy_yaml(tmp_path), "--out", str(tmp_path / "run")]
    args += _sets([*_IDP, "privacy.accountant=pld", *DISCRETE])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "error: privacy.accountant" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_calibrate_cli_client_unit_accepts_discrete() -> None:
    """``pdpfl calibrate --unit client --central-noise discrete``: σ from --epsilon-max under
    the discrete rounds, no client over budget, rates at most the continuous ones."""
    base = ["calibrate", "--scenario", "bounded-mix-gauss", "--n", "50", "--unit", "client"]
    base += ["--epsilon-max", "8", "--rounds", "20", "--delta", "1e-5", "--json"]
    base += ["--allow-exclusion"]
    reports = {}
    for noise in ("continuous", "discrete"):
        result = CliRunner().invoke(app, [*base, "--central-noise", noise])
        assert result.exit_code == 0, result.output
        reports[noise] = json.loads(result.output)
    assert reports["discrete"]["over_budget"] == 0
    assert reports["discrete"]["sigma"] >= reports["continuous"]["sigma"]


@pytest.mark.parametrize(
    "overrides",
    [
        {"central_noise": "fractional"},
        {"variant": "distributed", "asked_per_round": 6, "survivors": 6},
    ],
)
def test_a_setup_with_an_unknown_or_distributed_central_noise_is_refused(
    overrides: dict[str, object],
) -> None:
    with pytest.raises(ValueError, match="central_noise"):
        _setup(**overrides)
