"""Server optimizers (FedAvgM, FedAdam, FedYogi; Reddi et al. 2021, Algorithm 2).

The steps are checked against the paper's update rules written out element by element in plain
Python floats (an independent re-statement, not the module's vectorised code); the privacy
claim -- post-processing, so every ledger and privacy summary is unchanged -- is checked on real
runs of every algorithm family with reproducible randomness.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.config import ConfigError, config_hash, run_fingerprint
from pdpfl.fl.server_optimizer import ServerOptimizer, ServerOptimizerSpec
from pdpfl.ledger.table import load_ledgers
from pdpfl.runtime.simulation import run_simulation
from pdpfl.testing import toy_config


def _reference(name, eta, b1, b2, tau, x0, proposals):
    """Algorithm 2 of Reddi et al. per coordinate in Python floats, x̂_{t+1} = ``proposals[t]``
    (Δ_t = x̂ − x_t); the model is rounded to float32 after every round, as a published model."""
    x = list(x0)
    m = [0.0] * len(x)
    v = [tau * tau] * len(x)
    for prop in proposals:
        for i in range(len(x)):
            d = prop[i] - x[i]
            if name == "fedavgm":
                m[i] = b1 * m[i] + d
                x[i] = float(np.float32(x[i] + eta * m[i]))
                continue
            m[i] = b1 * m[i] + (1 - b1) * d
            if name == "fedadam":
                v[i] = b2 * v[i] + (1 - b2) * d * d
            else:
                s = (v[i] > d * d) - (v[i] < d * d)
                v[i] = v[i] - (1 - b2) * d * d * s
            x[i] = float(np.float32(x[i] + eta * m[i] / (math.sqrt(v[i]) + tau)))
    return x


def test_hand_computed_first_steps():
    """One step from x = 1 with x̂ = 1.5 (Δ = 0.5), η = 0.1, β₁ = 0.9, β₂ = 0.99, τ = 0.01,
    worked out by hand: FedAvgM m = 0.5 → 1.05; FedAdam m = 0.05, v = 0.99·1e-4 + 0.01·0.25
    = 0.002599 → 1 + 0.1·0.05/(0.0509804 + 0.01); FedYogi v = 1e-4 + 0.01·0.25 (v < Δ²)."""
    spec = dict(eta=0.1, beta1=0.9, beta2=0.99, tau=0.01)
    x, prop = [np.array([1.0])], [np.array([1.5])]
    got = {
        n: ServerOptimizer(ServerOptimizerSpec(n, **spec)).apply(x, prop)[0][0]
        for n in ("fedavgm", "fedadam", "fedyogi")
    }
    assert got["fedavgm"] == pytest.approx(1.05, rel=1e-6)
    assert got["fedadam"] == pytest.approx(1 + 0.1 * 0.05 / (math.sqrt(0.002599) + 0.01), rel=1e-6)
    assert got["fedyogi"] == pytest.approx(1 + 0.1 * 0.05 / (math.sqrt(0.0026) + 0.01), rel=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(["fedavgm", "fedadam", "fedyogi"]),
    eta=st.floats(1e-3, 2.0),
    b1=st.floats(0.0, 0.99),
    b2=st.floats(0.0, 0.999),
    tau=st.floats(1e-2, 1.0),
    steps=st.lists(st.lists(st.floats(-3, 3), min_size=3, max_size=3), min_size=1, max_size=4),
)
def test_matches_algorithm_2_elementwise(name, eta, b1, b2, tau, steps):
    opt = ServerOptimizer(ServerOptimizerSpec(name, eta=eta, beta1=b1, beta2=b2, tau=tau))
    x0 = [0.5, -1.0, 2.0]
    x = [np.array(x0, np.float32)]
    for prop in steps:
        x = opt.apply(x, [np.array(prop)])
    assert x[0].dtype == np.float32 and opt.steps == len(steps)
    ref = _reference(name, eta, b1, b2, tau, x0, steps)
    np.testing.assert_allclose(x[0], ref, rtol=1e-4, atol=1e-4)


def test_fedavgm_without_momentum_is_the_algorithms_own_step():
    opt = ServerOptimizer(ServerOptimizerSpec("fedavgm", eta=1.0, beta1=0.0))
    prop = [np.array([0.25, -4.0], np.float32), np.array([[3.0]], np.float32)]
    out = opt.apply([np.zeros(2), np.ones((1, 1))], prop)
    for a, b in zip(out, prop, strict=True):
        np.testing.assert_array_equal(a, b)


def test_state_round_trips_and_refuses_another_optimizer():
    a = ServerOptimizer(ServerOptimizerSpec("fedyogi", eta=0.1))
    a.apply([np.zeros(3)], [np.ones(3)])
    b = ServerOptimizer(ServerOptimizerSpec("fedyogi", eta=0.1))
    b.load_state_dict(a.state_dict())
    x, p = [np.full(3, 0.5)], [np.full(3, -1.0)]
    np.testing.assert_array_equal(a.apply(x, p)[0], b.apply(x, p)[0])
    with pytest.raises(ValueError, match="fedyogi"):
        ServerOptimizer(ServerOptimizerSpec("fedadam", eta=0.1)).load_state_dict(a.state_dict())


def test_config_section_validation_and_stable_hash():
    base = toy_config("rpdp")
    assert config_hash(base) == config_hash(toy_config("rpdp", ["server_optimizer.name=none"]))
    assert run_fingerprint(base) != run_fingerprint(
        toy_config("rpdp", ["server_optimizer.name=fedadam"])
    )
    with pytest.raises(ConfigError, match=r"server_optimizer\.beta1"):
        toy_config("rpdp", ["server_optimizer.name=fedadam", "server_optimizer.beta1=1.0"])
    with pytest.raises(ConfigError, match=r"server_optimizer\.name"):
        toy_config("rpdp", ["server_optimizer.name=sgd"])
    cfg = toy_config("rpdp", ["server_optimizer.name=fedadam", "tau=0.1"])  # short key
    assert cfg.server_optimizer.tau == 0.1 and cfg.server_optimizer.server_lr() == 0.01


def _run(tmp_path, name, algorithm, extra=(), **kwargs):
    """Each run charges its own budget store: both start with every lifetime budget unspent."""
    store = tmp_path / f"budgets-{name}"
    cfg = toy_config(algorithm, ["rounds=3", f"lifetime.store={store}", *extra])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_simulation(cfg, tmp_path / name, progress=False, overwrite=True, **kwargs)


def _ledger_counts(path):
    return {
        name: {k: np.asarray(v).tolist() for k, v in ledger.state_dict().items()}
        for name, ledger in load_ledgers(path).items()
    }


@pytest.mark.parametrize(
    "algorithm",
    [
        pytest.param("rpdp", marks=pytest.mark.slow),
        pytest.param("idp-fedavg", marks=pytest.mark.slow),
        pytest.param("uldp-avg", marks=pytest.mark.slow),
        pytest.param("prifedsync", marks=pytest.mark.slow),
    ],
)
def test_ledgers_and_privacy_unchanged(tmp_path, algorithm):
    """Same seeds, same reproducible noise: the optimizer changes the model, never a charge."""
    plain = _run(tmp_path, "plain", algorithm)
    adam = _run(tmp_path, "adam", algorithm, ["server_optimizer.name=fedadam", "eta=0.05"])
    assert plain["privacy"] == adam["privacy"]
    assert _ledger_counts(tmp_path / "plain") == _ledger_counts(tmp_path / "adam")
    assert (
        plain["final_accuracy"] != adam["final_accuracy"]
        or plain["final_loss"] != adam["final_loss"]
    )


@pytest.mark.slow
def test_resume_continues_the_optimizer_exactly(tmp_path):
    extra = ["server_optimizer.name=fedavgm", "eta=0.7"]
    whole = _run(tmp_path, "whole", "rpdp", extra)
    cfg = toy_config("rpdp", ["rounds=3", *extra])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pdpfl.runtime.simulation import simulate_into

        simulate_into(cfg, tmp_path / "split", progress=False, stop_after=1)
        split = run_simulation(cfg, tmp_path / "split", progress=False, resume=True)
    assert split["final_accuracy"] == whole["final_accuracy"]
    assert split["final_loss"] == pytest.approx(whole["final_loss"], rel=1e-6)
