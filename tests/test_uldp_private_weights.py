"""ULDP-AVG/SGD with ``algorithm.weights: private``: the enhanced weights n_{s,u}/N_u computed by
the private weighting protocol (Protocol 1) -- no histogram leaves a silo, the server sees only
the sum, so it is charged the sum's noise -- and the same global step as public enhanced weights.

The protocol's keys here are 1024-bit (``allow_weak_keys``) where the property does not depend
on the key size, and the deployed 3072-bit size in the end-to-end run.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from pdpfl.config import ConfigError, config_from_dict
from pdpfl.fl.aggregation.private_weighting import PrivateWeightedSum
from pdpfl.fl.algorithm import build_federation_algorithms
from pdpfl.fl.api import Aggregate
from pdpfl.runtime.simulation import InProcessTransport, load_federation_for

WEAK = {"paillier_bits": 1024, "n_max": 600, "allow_weak_keys": True, "workers": 1}

BASE = {
    "name": "uldp-private-weights",
    "seed": 5,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 3, "options": {"num_users": 12}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "uldp-avg", "weights": "private"},
    # float shares: the private weighting protocol's own encoding, compared with the public
    # enhanced weights in the clear (which would otherwise use discrete shares)
    "privacy": {"noise_multiplier": 2.0, "delta": 1e-5, "noise_shares": "continuous"},
    "training": {"rounds": 2, "local_steps": 2, "lr": 0.3, "batch_size": 8, "max_grad_norm": 1.0},
}


def _build(*overrides: str):
    config = config_from_dict(BASE, list(overrides))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        federation = load_federation_for(config)
        server, clients = build_federation_algorithms(config, federation)
    return config, server, clients


def test_private_weights_need_no_public_histogram_and_charge_the_server_the_sum() -> None:
    _, private, _ = _build()
    _, enhanced, _ = _build("algorithm.weights=enhanced", "data.public_user_histograms=true")
    # The server sees only Σ_s (the protocol sums before it decrypts): noise multiplier σ,
    # where public enhanced weights under plain aggregation leave it σ/√t per silo (each
    # share sized for t(3) = 2 survivors, issue #22).
    assert private.observer_noise == {"third-party": 2.0, "server": 2.0}
    assert enhanced.observer_noise["server"] == pytest.approx(2.0 / np.sqrt(2))
    assert not private.warnings or all("histogram" not in w for w in private.warnings)


def test_private_weights_only_for_avg_and_sgd() -> None:
    with pytest.raises(ConfigError, match="algorithm.weights"):
        config_from_dict(BASE, ["algorithm.name=uldp-naive"])


@pytest.mark.parametrize("name", ["uldp-avg", "uldp-sgd"])
@pytest.mark.parametrize("user_rate", [None, 0.5])
def test_protocol_equals_the_public_enhanced_weighted_sum(name, user_rate) -> None:
    """Same seeds, same coins: the decrypted protocol sum equals Σ_s Σ_u (n_{s,u}/N_u)·Δ + z_s
    computed in the clear with disclosed histograms, within the protocol's precision."""
    extra = [f"algorithm.name={name}"] + ([f"algorithm.user_rate={user_rate}"] if user_rate else [])
    _, private, pclients = _build(*extra)
    _, public, eclients = _build(
        *extra, "algorithm.weights=enhanced", "data.public_user_histograms=true"
    )
    params = private.initial_params()
    t = 0
    cfg = private.round_config(t)
    assert cfg == public.round_config(t)  # same user coins
    ids = sorted(pclients)
    agg = PrivateWeightedSum(**WEAK).collect(
        InProcessTransport(pclients), ids, params, t, dict(cfg), private
    )
    outs = [eclients[c].fit(params, t, cfg) for c in ids]
    plain = [sum(np.asarray(o.update[i], np.float64) for o in outs) for i in range(len(params))]
    users = 12
    for got, want in zip(agg.total, plain, strict=True):
        # the protocol's fixed point (P/2 per term) and the float32 release of the plain path
        assert np.abs(np.asarray(got, np.float64) - want).max() < 1e-5 + 1e-10 * (users + 3)
    # the global step is the same function of the sum
    step_p = private.aggregate(t, params, agg)
    step_e = public.aggregate(t, params, Aggregate(total=plain, weight=3.0, metrics={}, count=3))
    for a, b in zip(step_p, step_e, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_fit_is_refused_outside_the_protocol() -> None:
    _, server, clients = _build()
    params = server.initial_params()
    with pytest.raises(ValueError, match="private weighting protocol"):
        clients[0].fit(params, 0, server.round_config(0))


def test_histogram_and_updates_stay_at_the_silo() -> None:
    """What a silo supplies to the protocol: its own counts (never sent; only blinded and
    masked), and its users' clipped deltas (norm ≤ C) with noise."""
    _, server, clients = _build()
    params = server.initial_params()
    silo = clients[1]
    hist = silo.user_histogram()
    assert hist.shape == (12,) and hist.sum() == len(silo.y_train)
    up = silo.user_updates(params, 0, server.round_config(0))
    assert set(up.users.tolist()) == set(np.flatnonzero(hist).tolist())
    assert np.all(np.linalg.norm(up.deltas, axis=1) <= 1.0 + 1e-9)
    assert up.noise.shape == (up.deltas.shape[1],) and np.std(up.noise) > 0.1
    with pytest.raises(ValueError, match="already"):
        silo.user_updates(params, 0, server.round_config(0))


@pytest.mark.slow
def test_end_to_end_run_with_3072_bit_keys(tmp_path) -> None:
    from pdpfl.fl.uldp import user_epsilon
    from pdpfl.runtime.simulation import run_simulation

    config = config_from_dict(BASE, ["secure.workers=1", "secure.n_max=600"])
    run_simulation(config, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["completed"] and saved["rounds_completed"] == 2
    assert saved["aggregation"]["protocol"] == "private-weighting"
    assert saved["aggregation"]["server_sees"] == "only the sum of the updates"
    assert saved["over_budget"] == 0
    # user-level ε of 2 rounds at σ = 2 (both observers see the sum's noise)
    assert saved["epsilon"] == pytest.approx(user_epsilon(2.0, 1e-5, 2), rel=1e-6)
    assert saved["final_accuracy"] > 0.15  # it learns (10 classes)
