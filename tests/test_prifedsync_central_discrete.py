"""PriFedSync with exact central discrete noise (issue #33 item 4; ``privacy.central_noise:
discrete``; ``LocalStepsPlan(noise="discrete")``).

* WOR batches (replace-one): the rounded sums of neighbours differ by at most 2γC + √d, so the
  grid's multiplier over it is at least σ/2 (property test); the charged event (Theorem 9 at
  σ/2) bounds the exact divergence of the discrete point pair summed over the pmf (integer
  orders, both directions); Poisson batches: the sub-sampling bound;
* the discrete plans are never below the continuous ones; pld and gdp-clt cannot interpret them;
* a toy run: every step adds the grid noise its ledger charges, no CLT/GDP figure is stated,
  summary.json shows the grid; the CLT budget accounting and pld are refused (exit 2).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.config import ConfigError
from pdpfl.privacy import mechanism_epsilon
from pdpfl.privacy.accountant import RdpAccountant
from pdpfl.privacy.mechanisms import DistributedDiscreteGaussian
from pdpfl.privacy.noise import CentralDiscreteGaussianNoise
from pdpfl.privacy.registry import make_accountant
from pdpfl.privacy.unit import LocalStepsPlan
from pdpfl.testing import TOY_CONFIG, _build, toy_config

DISCRETE = ["privacy.central_noise=discrete"]


@settings(max_examples=60, deadline=None)
@given(
    sigma=st.floats(0.05, 50.0, allow_nan=False),
    c=st.floats(1e-3, 1e3, allow_nan=False),
    d=st.integers(1, 10**7),
)
def test_replace_one_grid_multiplier_is_at_least_half_sigma(sigma: float, c: float, d: int) -> None:
    """Replace-one neighbours' rounded sums differ by ≤ 2γC + √d; the noise σ·(γC + √d) has a
    multiplier over it ≥ σ/2: the WOR event at σ/2 is charged at most what is added."""
    noise = CentralDiscreteGaussianNoise(sigma, c, d)
    replace_one = noise.scale * 2.0 * c + math.sqrt(d)
    assert noise.variance >= (sigma / 2.0) ** 2 * replace_one**2 * (1 - 1e-12)


def _log_pmf(x: np.ndarray, variance: float) -> np.ndarray:
    half = int(60 * math.sqrt(variance)) + 10
    support = np.arange(-half, half + 1, dtype=np.float64)
    result: np.ndarray = -(x**2) / (2 * variance) - float(
        special.logsumexp(-(support**2) / (2 * variance))
    )
    return result


@pytest.mark.parametrize(("gamma", "sigma", "k"), [(0.1, 1.0, 2), (0.3, 2.0, 3), (0.05, 0.8, 1)])
def test_wor_event_bounds_the_discrete_point_pair(gamma: float, sigma: float, k: int) -> None:
    """d = 1, one step, γC = k/2 (so the replace-one shift 2γC + 1 ≥ k + 1 ≥ k): the point pair
    (1 − γ)·P + γ·P_k against P, P = N_Z(0, σ_Z²), σ_Z = σ(γC + 1), summed over the exact pmf,
    never exceeds the charged WOR event at σ/2 (integer orders, both directions)."""
    sigma_z = sigma * (k / 2.0 + 1.0)
    shift = k + 1
    x = np.arange(-int(20 * sigma_z) - 10 * shift, int(20 * sigma_z) + 10 * shift + 1.0)
    p0, p1 = _log_pmf(x, sigma_z**2), _log_pmf(x - shift, sigma_z**2)
    mix = np.logaddexp(math.log1p(-gamma) + p0, math.log(gamma) + p1)
    plan = LocalStepsPlan("wor", sigma, 1, 1e-5, 1, noise="discrete")
    orders = np.array([2.0, 3.0, 5.0, 8.0])
    bound = RdpAccountant(orders=orders).rdp(plan.round_event(np.array([gamma]), "server"))
    for a, b in zip(orders, bound.reshape(-1), strict=True):
        add = float(special.logsumexp(a * mix + (1 - a) * p0)) / (a - 1)
        rem = float(special.logsumexp(a * p0 + (1 - a) * mix)) / (a - 1)
        assert b >= max(add, rem)


@pytest.mark.parametrize("sampler", ["wor", "poisson"])
def test_discrete_plans_are_never_below_the_continuous_and_rdp_only(sampler: str) -> None:
    cont = LocalStepsPlan(sampler, 1.0, 8, 1e-5, 10)  # type: ignore[arg-type]
    disc = LocalStepsPlan(sampler, 1.0, 8, 1e-5, 10, noise="discrete")  # type: ignore[arg-type]
    assert disc.with_noise(2.0).noise == "discrete" and disc.with_steps(3).noise == "discrete"
    event = disc.round_event(np.array([0.1]), "server")
    step = event.inner.inner  # type: ignore[attr-defined]
    assert isinstance(step, DistributedDiscreteGaussian)
    for q in (0.02, 0.1, 0.5):
        e_c, _ = mechanism_epsilon(cont, [q], "server")
        e_d, _ = mechanism_epsilon(disc, [q], "server")
        assert e_d[0] >= e_c[0] * (1 - 1e-12)
        assert e_d[0] <= e_c[0] * 1.25
    assert make_accountant("rdp").supports(event)
    assert not make_accountant("pld").supports(event)
    assert not make_accountant("gdp-clt").supports(event)


@pytest.mark.slow
def test_toy_silos_add_the_grid_noise_their_ledgers_charge() -> None:
    """Every client's step noise is the grid noise at the σ_j its ledger charges; no CLT/GDP
    figure is stated; the server's state (summary.json's ``central_noise``) shows the grid."""
    from pdpfl.fl.prifedsync import federation_report

    server, clients, _ = _build(toy_config("prifedsync", DISCRETE))
    for silo in clients.values():
        assert isinstance(silo.noise, CentralDiscreteGaussianNoise)  # type: ignore[attr-defined]
        plan = silo.ledger.mechanism  # type: ignore[attr-defined]
        assert isinstance(plan, LocalStepsPlan) and plan.noise == "discrete"
        assert plan.noise_multiplier == silo.noise.noise_multiplier  # type: ignore[attr-defined]
        assert silo.privacy_summary().approximate == {}  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="no proven μ-GDP bound"):
            silo.clt_mu()  # type: ignore[attr-defined]
    report = federation_report(clients)
    assert report["clt_mu_weak"] is None and report["clt_eps_strong"] is None
    grid = server.state_dict()["central_noise"]
    assert grid["kind"] == "discrete" and grid["sensitivity_inflation"] <= 2.0**-10


def _toy(name: str) -> list[str]:
    from pdpfl.config import ALGORITHMS

    return list(ALGORITHMS.get(name).toy_overrides)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["algorithm.budget_accounting=clt"], "algorithm.budget_accounting"),
        (["privacy.accountant=pld", "algorithm.sampler=poisson"], "privacy.accountant"),
    ],
)
def test_gdp_and_pld_are_refused_with_discrete_noise(extra: list[str], field: str) -> None:
    toy_config("prifedsync", extra)  # fine with continuous noise
    with pytest.raises((ConfigError, ValueError), match=field):
        toy_config("prifedsync", [*extra, *DISCRETE])


def test_cli_refusal_exits_2(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(dict(TOY_CONFIG)))
    overrides = ["algorithm.name=prifedsync", *_toy("prifedsync")]
    overrides += ["algorithm.budget_accounting=clt", *DISCRETE]
    args = ["run", str(path), "--out", str(tmp_path / "run")]
    args += [a for o in overrides for a in ("--set", o)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "error: algorithm.budget_accounting" in result.output
    assert "Traceback" not in result.output
