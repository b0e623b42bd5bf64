"""Private hyper-parameter search (Papernot & Steinke, ICLR 2022) and ``pdpfl tune``.

The accounting is checked three independent ways: the distributions against their definitions
(direct summation), the closed forms against the exact Rényi divergence of best-of-K on a toy
mechanism with a finite ordered output (computed from the probability generating function of
K, not from the theorems), and the per-unit trial curves against dp-accounting.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.ledger import PrivacyLedger
from pdpfl.ledger.budget_store import default_store_dir
from pdpfl.ledger.lifetime import lifetime_table
from pdpfl.privacy.tuning import (
    PoissonTrials,
    TruncatedNegativeBinomial,
    capped_pmf,
    mixture_rdp,
    poisson_rdp,
    random_composition_rdp,
    tnb_rdp,
)
from pdpfl.privacy.unit import PrivacyUnit, SampledGaussianPlan
from pdpfl.testing import toy_config
from pdpfl.tune import TuneRefused, parse_grid, plan_search, tune
from pdpfl.tune.accounting import ORDERS, ledger_curves

runner = CliRunner()


# ---------------------------------------------------------------- the distributions
@pytest.mark.parametrize("eta", [-0.5, 0.0, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("gamma", [0.05, 0.3, 0.8])
def test_truncated_negative_binomial_matches_its_definition(eta, gamma):
    d = TruncatedNegativeBinomial(eta, gamma)
    ks = np.arange(1, 4000)
    # P[K=k] = (1-γ)^k / (γ^{-η} - 1) · Π_{ℓ<k} (ℓ+η)/(ℓ+1), the product accumulated directly
    ref, prod = [], 1.0
    for k in ks[:40]:
        if eta == 0.0:
            ref.append((1 - gamma) ** k / (k * math.log(1 / gamma)))
        else:
            ref.append((1 - gamma) ** k / (gamma ** (-eta) - 1) * prod * (k - 1 + eta) / k)
            prod *= (k - 1 + eta) / k
    np.testing.assert_allclose(d.pmf(ks[:40]), ref, rtol=1e-9)
    p = d.pmf(ks)
    assert p.sum() == pytest.approx(1.0, abs=1e-9)
    assert (ks * p).sum() == pytest.approx(d.mean, rel=1e-7)
    assert d.tail(5) == pytest.approx(1 - p[:5].sum(), abs=1e-12)
    if eta == 1.0:  # the geometric distribution
        np.testing.assert_allclose(p[:30], gamma * (1 - gamma) ** (ks[:30] - 1), rtol=1e-9)


def test_with_mean_and_capped_pmf():
    d = TruncatedNegativeBinomial.with_mean(6.0, eta=0.0)
    assert d.mean == pytest.approx(6.0, rel=1e-9)
    p = capped_pmf(d, 10)
    assert p[0] == 0 and p.sum() == pytest.approx(1.0, abs=1e-12)
    assert p[10] == pytest.approx(d.tail(9), rel=1e-12)
    q = capped_pmf(PoissonTrials(3.0), 50)
    assert q[0] == pytest.approx(math.exp(-3.0)) and q.sum() == pytest.approx(1.0)


# ------------------------------------------- the closed forms vs an exact toy computation
def _best_of_k(p: np.ndarray, pgf) -> np.ndarray:
    """Exact distribution of the best (largest) of K draws from ``p`` on 0 < 1 < ... < n-1:
    P[max ≤ y] = E[F(y)^K] = pgf(F(y)); P[K = 0] = pgf(0) is the extra outcome ⊥."""
    cdf = np.cumsum(p)
    cdf[-1] = 1.0
    at = np.array([pgf(c) for c in cdf])
    none = pgf(0.0)
    return np.concatenate([[none], np.diff(np.concatenate([[none], at]))])


def _renyi(p: np.ndarray, q: np.ndarray, lam: float) -> float:
    """D_λ(p || q) of two finite distributions, in log space."""
    from scipy.special import logsumexp

    if np.any((p > 0) & (q <= 0)):
        return math.inf
    m = p > 0
    return float(logsumexp(lam * np.log(p[m]) + (1 - lam) * np.log(q[m]))) / (lam - 1)


def _toy_pair(eps0: float) -> tuple[np.ndarray, np.ndarray]:
    """A 3-outcome score mechanism whose neighbours differ by at most e^{eps0} pointwise."""
    a = np.array([1.0, math.exp(eps0 / 2), math.exp(eps0)])
    b = a[::-1].copy()
    return a / a.sum(), b / b.sum()


@settings(max_examples=25, deadline=None)
@given(
    eps0=st.floats(0.05, 2.0),
    eta=st.sampled_from([-0.5, 0.0, 1.0, 2.0]),
    mean=st.floats(1.5, 12.0),
)
def test_theorem_2_bounds_the_exact_divergence_of_best_of_k(eps0, eta, mean):
    d = TruncatedNegativeBinomial.with_mean(mean, eta=eta)
    p, q = _toy_pair(eps0)
    orders = np.array([1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0])
    rdp_q = np.array([max(_renyi(p, q, a), _renyi(q, p, a)) for a in orders])
    bound = tnb_rdp(rdp_q[None, :], orders, d)[0]

    def pgf(z: float) -> float:  # E[z^K] by direct summation of the pmf
        ks = np.arange(1, 20_000)
        return float(np.sum(d.pmf(ks) * z**ks))

    bp, bq = _best_of_k(p, pgf), _best_of_k(q, pgf)
    for a, b in zip(orders, bound, strict=True):
        exact = max(_renyi(bp, bq, a), _renyi(bq, bp, a))
        assert exact <= b + 1e-9


@settings(max_examples=25, deadline=None)
@given(eps0=st.floats(0.05, 3.0), mu=st.floats(0.1, 30.0))
def test_theorem_3_bounds_the_exact_divergence_of_best_of_k(eps0, mu):
    d = PoissonTrials(mu)
    p, q = _toy_pair(eps0)
    # Theorem 3 needs Q's RDP curve on a grid fine enough to read δ̂ at ε̂ = log(1 + 1/(λ-1))
    orders = np.concatenate([np.linspace(1.05, 3, 40), np.geomspace(3.2, 64, 40)])
    rdp_q = np.array([max(_renyi(p, q, a), _renyi(q, p, a)) for a in orders])
    bound = poisson_rdp(rdp_q[None, :], orders, d)[0]
    bp, bq = (_best_of_k(x, lambda z: math.exp(mu * (z - 1))) for x in (p, q))
    for a, b in zip(orders, bound, strict=True):
        exact = max(_renyi(bp, bq, a), _renyi(bq, bp, a))
        assert exact <= b + 1e-9


def test_theorem_2_direct_formula_on_a_gaussian():
    """ε'(λ) for Q = Gaussian (ε(λ) = λ/(2σ²)), written out from Theorem 2 with λ̂ on the grid."""
    sigma, d = 3.0, TruncatedNegativeBinomial(0.5, 0.1)
    rdp = ORDERS / (2 * sigma**2)
    got = tnb_rdp(rdp, ORDERS, d)
    mean = 0.5 * 0.9 / (0.1 * (1 - 0.1**0.5))
    for i, lam in enumerate(ORDERS[::17]):
        best = min(
            1.5 * (1 - 1 / lh) * lh / (2 * sigma**2) + 1.5 * math.log(10) / lh for lh in ORDERS
        )
        want = lam / (2 * sigma**2) + best + math.log(mean) / (lam - 1)
        assert got[i * 17] == pytest.approx(want, rel=1e-12)


def test_random_composition_against_the_poisson_closed_form():
    """Seen trial by trial, K ~ Poisson(μ) Gaussians: (1/(λ-1)) log E[e^{(λ-1)Kε}] =
    μ(e^{(λ-1)ε} − 1)/(λ − 1) (the Poisson moment generating function)."""
    sigma, mu = 8.0, 3.0
    rdp = ORDERS[:40] / (2 * sigma**2)
    pmf = capped_pmf(PoissonTrials(mu), 400)
    got = random_composition_rdp(rdp, ORDERS[:40], pmf)
    want = mu * np.expm1((ORDERS[:40] - 1) * rdp) / (ORDERS[:40] - 1)
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_mixture_is_at_most_the_worst_candidate():
    c = np.stack([ORDERS / 8.0, ORDERS / 2.0])
    mix = mixture_rdp(c, ORDERS)
    assert np.all(mix <= c.max(axis=0) + 1e-12) and np.all(mix >= c.min(axis=0) - 1e-12)
    np.testing.assert_allclose(mixture_rdp(np.stack([c[0], c[0]]), ORDERS), c[0], rtol=1e-12)


def test_ledger_curves_match_dp_accounting():
    """A client-level ledger's per-unit trial curve is T Poisson-subsampled Gaussians
    (dp-accounting, integer orders)."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    plan = SampledGaussianPlan(PrivacyUnit.CLIENT, 1.3, 1e-5, 20)
    led = PrivacyLedger(np.array([1.0, 2.0]), np.array([0.1, 0.4]), plan, ids=np.array(["a", "b"]))
    curves = ledger_curves({"server": led})
    ints = np.flatnonzero(ORDERS == np.round(ORDERS))[:12]
    for u, q in enumerate((0.1, 0.4)):
        acc = rdp_privacy_accountant.RdpAccountant(orders=ORDERS[ints].tolist())
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.3)), 20)
        np.testing.assert_allclose(curves.rdp["third-party"][u, ints], acc._rdp, rtol=1e-9)


# ------------------------------------------------------------------- the search
def _toy(extra=()):
    """Synthetic-size digits (public data): its budget stores record without enforcing."""
    return toy_config(
        "rpdp",
        ["rounds=2", "privacy.adversary=third-party", "lifetime.allow_respend=true", *extra],
    )


def test_parse_grid():
    grid = parse_grid(["training.lr=0.1,0.3", "algorithm.name=rpdp", "x.y=[1,2],[3]"])
    assert grid["training.lr"] == ["0.1", "0.3"] and grid["x.y"] == ["[1,2]", "[3]"]
    for bad in ["seed=1,2", "data.num_clients=2,3", "budgets.scenario=a", "lr", "=1"] + [
        "lifetime.allow_respend=true,false"
    ]:
        with pytest.raises(ValueError, match="--grid"):
            parse_grid([bad])


@pytest.mark.slow
def test_a_search_at_the_full_budget_is_refused_before_training(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TuneRefused, match="budget"):
            tune(_toy(), ["training.lr=0.1,0.3"], tmp_path / "t", expected_trials=3.0)
    assert not (tmp_path / "t" / "trials").exists()


@pytest.mark.slow
def test_tune_runs_charges_and_releases_the_best(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = tune(
            _toy(),
            ["training.lr=0.05,0.5"],
            tmp_path / "t",
            expected_trials=2.0,
            trial_budget_fraction=0.25,
        )
    saved = json.loads((tmp_path / "t" / "result.json").read_text())
    assert saved["selected"] == res.selected and saved["privacy"]["unit"] == "record"
    assert res.privacy.over_budget_any("third-party") == 0
    ran = [t for t in res.trials if t["final_accuracy"] is not None]
    if res.selected is not None:  # K = 0 is possible under Poisson: nothing is released
        assert res.accuracy == max(t["final_accuracy"] for t in ran)
        trial = json.loads((tmp_path / "t" / res.run_dir / "summary.json").read_text())
        # the whole search costs more than the one released run
        assert res.privacy.spent_max("third-party") > trial["privacy"]["spent_max"]["third-party"]
    with np.load(tmp_path / "t" / "ledgers" / "search.npz", allow_pickle=False) as npz:
        eps, budgets = npz["epsilon_third_party"], npz["budgets"]
        assert np.all(eps <= budgets * (1 + 1e-9))
        extra = npz["rdp_search_third_party"] - npz["rdp_trial_third_party"]
        np.testing.assert_allclose(npz["rdp_extra_third_party"], np.maximum(extra, 0))
    # every trial is a real run: each one charged the silos' lifetime budget stores
    if res.trials:
        table = lifetime_table(default_store_dir())
        charged = {r for ids in table["run_ids"] for r in str(ids).split(";") if r}
        assert len(charged) == len(res.trials)
        assert set(table["party"]) == {"silo-0", "silo-1", "silo-2"}


def test_cli_plan_and_errors(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "data: {dataset: digits, num_clients: 3}\nseed: 7\nthreads: 1\n"
        "budgets: {scenario: three-levels, params: {values: [1.0, 3.0, 8.0], "
        "ratios: [0.5, 0.3, 0.2]}}\nprivacy: {epsilon_max: 8.0, delta: 1.0e-3, "
        "adversary: third-party}\ntraining: {rounds: 2, local_steps: 2, batch_size: 8}\n"
    )
    res = runner.invoke(app, ["tune", str(cfg), "--grid", "training.lr=0.1,0.3", "--plan"])
    assert res.exit_code == 2 and "error: --grid: the search would spend" in res.output
    res = runner.invoke(
        app, ["tune", str(cfg), "--grid", "lr=0.1,0.3", "--out", str(tmp_path / "o")]
    )  # enforced lifetime budgets: the search is checked (and refused) before any trial
    assert res.exit_code == 2 and "error: --grid: the search would spend" in res.output
    assert not (tmp_path / "o" / "trials").exists()
    res = runner.invoke(app, ["tune", str(cfg), "--grid", "seed=1,2", "--plan"])
    assert res.exit_code == 2 and "error: --grid: seed" in res.output
    res = runner.invoke(app, ["tune", str(cfg), "--grid", "lr=1", "--distribution", "x"])
    assert res.exit_code == 2 and "error: --distribution" in res.output
    plan = plan_search(
        _toy(), parse_grid(["training.lr=0.1,0.3"]), trial_budget_fraction=0.2, work_dir=tmp_path
    )
    assert not plan.refused
