"""Centralized rPDP-SGD and the Feldman–Zrnic Filter baseline."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.dp.centralized import train_rpdp_sgd
from pdpfl.dp.filter import filter_step, squared_norm_budgets, train_filter_gd
from pdpfl.models import create_model, loss_fn

torch.set_num_threads(2)


def _blobs(n: int, seed: int = 0, k: int = 3, d: int = 5):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    centers = torch.randn(k, d, generator=torch.Generator().manual_seed(99)) * 3
    x = centers[y] + torch.randn(n, d, generator=g)
    return x, y


def test_rpdp_sgd_learns_and_reports_per_class_and_per_group():
    x, y = _blobs(300)
    xt, yt = _blobs(150, seed=1)
    budgets = np.where(np.arange(300) % 10 < 7, 1.0, 5.0)  # two budget groups
    calls = []

    def calibrator(eps):
        calls.append(eps.copy())
        return np.where(eps > 2, 0.3, 0.1)  # stand-in for pdpfl.calibration.calibrate

    torch.manual_seed(0)
    res = train_rpdp_sgd(
        create_model("logreg", (5,), 3),
        (x, y),
        (xt, yt),
        budgets=budgets,
        calibrator=calibrator,
        noise_multiplier=0.5,
        max_grad_norm=1.0,
        steps=60,
        lr=0.5,
        test_groups=(yt.numpy() == 0).astype(int),
        eval_every=20,
        seed=3,
        normalizer=48.0,
    )
    assert len(calls) == 1 and np.array_equal(calls[0], budgets)
    assert res.steps == 60 and len(res.realized_batch_sizes) == 60
    assert res.expected_batch_size == pytest.approx(210 * 0.1 + 90 * 0.3)
    assert res.test["accuracy"] > 0.8 and set(res.test["per_class_accuracy"]) == {0, 1, 2}
    assert set(res.per_group_accuracy) == {"0", "1"}
    assert [h["step"] for h in res.history] == [20, 40, 60]
    low, high = res.train_groups["1.0"], res.train_groups["5.0"]
    assert (low["n"], high["n"]) == (210, 90)
    assert low["selection_frequency"] == pytest.approx(0.1, abs=0.03)
    assert high["selection_frequency"] == pytest.approx(0.3, abs=0.04)
    assert res.to_dict()["test"]["n"] == 150
    assert res.normalizer == 48.0 and "reproducible" in res.to_dict()["randomness"]


def test_rpdp_sgd_rate_arguments_are_exclusive():
    x, y = _blobs(10)
    kw = dict(noise_multiplier=1.0, max_grad_norm=1.0, steps=1, normalizer=5.0)
    model = create_model("logreg", (5,), 3)
    with pytest.raises(ValueError, match="either rates= or both budgets= and calibrator="):
        train_rpdp_sgd(model, (x, y), (x, y), **kw)
    with pytest.raises(ValueError, match="not both"):
        train_rpdp_sgd(
            model, (x, y), (x, y), rates=np.full(10, 0.5), budgets=np.ones(10),
            calibrator=lambda e: e, **kw,
        )  # fmt: skip


def _loop_grads(model, x, y):
    params = list(model.parameters())
    rows = []
    for i in range(x.shape[0]):
        g = torch.autograd.grad(loss_fn(model(x[i : i + 1]), y[i : i + 1]), params)
        rows.append(torch.cat([t.flatten() for t in g]))
    return torch.stack(rows)


def test_filter_step_matches_manual_truncated_clipping():
    x, y = _blobs(8)
    x = x.double()
    model = create_model("mlp", (5,), 3, hidden=[4]).double()
    C = 0.5
    budgets = np.array([0.0, 0.01, 0.1, 10.0, 0.3, 1e-4, 2.0, 0.05])
    spent = np.array([0.0, 0.0, 0.09, 1.0, 0.3, 0.0, 0.5, 0.01])
    active = budgets - spent > 0
    step = filter_step(
        model, x, y, budgets=budgets, spent=spent, active=active, noise_multiplier=0.0,
        max_grad_norm=C, stream=torch.Generator(), physical_batch_size=3,
    )  # fmt: skip
    g = _loop_grads(model, x, y)
    norms = g.norm(dim=1).numpy()
    bound = np.minimum(C, np.sqrt(np.maximum(budgets - spent, 0)) * (1 - 1e-5))
    factor = np.where(active, np.minimum(1, bound / (norms + 1e-6)), 0.0)
    expected = (g * torch.as_tensor(factor)[:, None]).sum(0) / 8
    torch.testing.assert_close(torch.cat([t.flatten() for t in step.grads]), expected)
    np.testing.assert_allclose(step.sq_norms, (factor * norms) ** 2, rtol=1e-9, atol=1e-15)
    assert step.active == int(active.sum())
    assert np.all(spent + step.sq_norms <= budgets + 1e-15)
    assert not step.exhausted[~active].any()


@settings(max_examples=15)
@given(
    st.lists(st.floats(0.0, 0.5), min_size=6, max_size=6),
    st.floats(0.05, 2.0),
    st.integers(0, 1000),
)
def test_filter_never_exceeds_squared_norm_budgets(budget_list, C, seed):
    x, y = _blobs(6, seed=seed)
    model = create_model("logreg", (5,), 3).double()
    budgets = np.array(budget_list)
    res = train_filter_gd(
        model, (x.double(), y), (x.double(), y), squared_norm_budgets=budgets,
        noise_multiplier=0.3, max_grad_norm=C, steps=12, lr=0.5, seed=seed,
    )  # fmt: skip
    assert np.all(res.spent <= budgets)
    assert len(res.active_counts) == 12
    assert all(a >= b for a, b in zip(res.active_counts, res.active_counts[1:], strict=False))
    assert res.active_counts[0] == int((budgets > 0).sum())
    # records with no budget never take part; the others are counted until the step they leave
    assert np.all(res.exit_step[budgets == 0] == 0) and np.all(res.spent[budgets == 0] == 0)
    for t, count in enumerate(res.active_counts, start=1):
        still = (budgets > 0) & ((res.exit_step == -1) | (res.exit_step >= t))
        assert count == int(still.sum())


def test_filter_budget_groups_leave_in_order_and_report():
    x, y = _blobs(60)
    xt, yt = _blobs(30, seed=1)
    C = 1.0
    budgets = np.where(np.arange(60) < 40, 2.0, 20.0)  # ~ 2 resp. 20 full-norm steps
    res = train_filter_gd(
        create_model("logreg", (5,), 3), (x * 10, y), (xt * 10, yt),
        squared_norm_budgets=budgets, noise_multiplier=0.1, max_grad_norm=C, steps=10, lr=0.1,
        test_groups=yt.numpy(),
    )  # fmt: skip
    assert res.active_counts[0] == 60 and res.active_counts[-1] < 60
    low, high = res.train_groups["2.0"], res.train_groups["20.0"]
    assert low["first_exit_step"] != -1 and low["active_at_end"] < 40
    assert high["active_at_end"] == 20
    assert low["mean_spent"] <= 2.0 and high["mean_spent"] <= 20.0
    assert set(res.per_group_accuracy) == {"0", "1", "2"}
    assert "active_counts" in res.to_dict()


def test_squared_norm_budgets_formula_and_errors():
    eps = np.array([2.0, 4.7, 11.8])
    sigma, C, delta, alpha = 1.1, 0.8, 1e-5, 20.0
    B = squared_norm_budgets(eps, delta=delta, noise_multiplier=sigma, max_grad_norm=C, alpha=alpha)
    # inverse: ε = α B / (2σ²C²) + log(1/δ)/(α−1)
    back = alpha * B / (2 * sigma**2 * C**2) + math.log(1 / delta) / (alpha - 1)
    np.testing.assert_allclose(back, eps)
    with pytest.raises(ValueError, match="every budget must exceed"):
        squared_norm_budgets([0.1], delta=delta, noise_multiplier=sigma, max_grad_norm=C, alpha=2)
    with pytest.raises(ValueError, match="alpha"):
        squared_norm_budgets([5.0], delta=delta, noise_multiplier=sigma, max_grad_norm=C, alpha=1)


@pytest.mark.slow
def test_rpdp_sgd_with_the_certified_calibrator_honours_every_budget():
    """Centralized rPDP-SGD wired to the real calibrator: every record's exact ε ≤ its budget."""
    from pdpfl.calibration import calibrate
    from pdpfl.privacy import TrainingPlan, plan_epsilon

    x, y = _blobs(400, seed=4)
    xt, yt = _blobs(200, seed=5)
    budgets = np.where(np.arange(400) % 10 < 7, 0.5, 3.0)
    plan = TrainingPlan(noise_multiplier=1.0, delta=1e-5, steps=40)  # centralized: 40 steps

    def calibrator(eps: np.ndarray) -> np.ndarray:
        return calibrate(eps, plan).rates

    res = train_rpdp_sgd(
        create_model("logreg", (5,), 3),
        (x, y),
        (xt, yt),
        budgets=budgets,
        calibrator=calibrator,
        noise_multiplier=plan.noise_multiplier,
        max_grad_norm=1.0,
        steps=plan.steps,
        lr=0.5,
        seed=7,
        normalizer=6.0,  # the public expected batch size this experiment declares
    )
    rates = calibrator(budgets)
    eps, _ = plan_epsilon(rates, plan)
    assert np.all(eps <= budgets)
    assert rates[budgets == 3.0].min() > rates[budgets == 0.5].max()  # bigger budget, larger q
    assert res.expected_batch_size == pytest.approx(float(rates.sum()))
    assert res.test["accuracy"] > 0.6


def test_centralized_trainers_use_secure_randomness_and_a_public_normalizer():
    """Secure by default, seeds only on request; the normaliser is a declared public constant."""
    from pdpfl.randomness import REPRODUCIBLE_LABEL, SECURE_LABEL, SecureRandomness

    x, y = _blobs(40)
    kw = dict(rates=np.full(40, 0.25), noise_multiplier=1.0, max_grad_norm=1.0, steps=2)

    def run(**extra):
        torch.manual_seed(0)
        model = create_model("logreg", (5,), 3)
        res = train_rpdp_sgd(model, (x, y), (x, y), **{**kw, **extra})
        return res, torch.cat([p.detach().flatten() for p in model.parameters()])

    with pytest.raises(ValueError, match="normalizer: required under DP"):
        run()
    with pytest.raises(ValueError, match="normalizer: must be a finite number > 0"):
        run(normalizer=0.0)
    with pytest.raises(ValueError, match="at most one of stream= and seed="):
        run(normalizer=10.0, seed=1, stream=torch.Generator())
    a, pa = run(normalizer=10.0)
    b, pb = run(normalizer=10.0)
    assert a.randomness == SECURE_LABEL and not torch.equal(pa, pb)  # fresh key every run
    c, pc = run(normalizer=10.0, seed=3)
    d, pd = run(normalizer=10.0, stream=torch.Generator().manual_seed(5))
    _, pc2 = run(normalizer=10.0, seed=3)
    assert c.randomness == d.randomness == REPRODUCIBLE_LABEL and torch.equal(pc, pc2)
    e, _ = run(normalizer=10.0, stream=SecureRandomness().stream("mine"))
    assert e.randomness == SECURE_LABEL and e.to_dict()["normalizer"] == 10.0
    # the filter: same randomness choices, default normaliser = the public n
    f = train_filter_gd(
        create_model("logreg", (5,), 3), (x, y), (x, y), squared_norm_budgets=np.full(40, 5.0),
        noise_multiplier=1.0, max_grad_norm=1.0, steps=1,
    )  # fmt: skip
    assert f.randomness == SECURE_LABEL and f.normalizer == 40.0


def test_filter_step_divides_by_the_given_public_normalizer():
    x, y = _blobs(8)
    model = create_model("logreg", (5,), 3).double()
    common = dict(
        budgets=np.full(8, 10.0), spent=np.zeros(8), active=np.ones(8, dtype=bool),
        noise_multiplier=0.0, max_grad_norm=0.5, stream=torch.Generator(),
    )  # fmt: skip
    by_n = filter_step(model, x.double(), y, **common)
    by_b = filter_step(model, x.double(), y, normalizer=2.0, **common)
    for a, b in zip(by_n.grads, by_b.grads, strict=True):
        torch.testing.assert_close(a * 8, b * 2)
