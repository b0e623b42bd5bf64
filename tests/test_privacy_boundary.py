"""Issue #10 attacks, reproduced and shown to fail against the defaults.

* predictable noise: with randomness derived from the configured seed, the server regenerates a
  silo's noise and coins, subtracts them and recovers a training record from one update; with
  the default secure randomness the same attack recovers nothing;
* what leaves a silo: every message of a simulated run is inspected; only Contributions (update,
  public weight, declared metrics) and aggregate test metrics cross;
* checkpoints: a crafted pickle or a truncated file is a clear error, never code execution.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pdpfl.config import config_from_dict
from pdpfl.fl.algorithm import build_federation_algorithms
from pdpfl.fl.api import EVALUATION_METRICS, Contribution
from pdpfl.fl.rpdp import DpFedAvgClient
from pdpfl.fl.rpdp import DpFedAvgSetup as Publication
from pdpfl.models import create_model, get_params
from pdpfl.randomness import SecureRandomness, SeededRandomness
from pdpfl.runtime.loop import run_federation
from pdpfl.runtime.simulation import InProcessTransport, load_federation_for

SEED, CLIENT, ROUND, SIGMA, C, B, LR = 11, 2, 4, 1.0, 1.0, 1.0, 0.5


def _victim(randomness) -> tuple[DpFedAvgClient, np.ndarray]:
    """A silo holding one secret record x (label 1), trained for one DP-SGD step with q = 1."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 6)).astype(np.float32) * 0.05
    data = SimpleNamespace(
        x_train=x, y_train=np.array([1]), x_test=x, y_test=np.array([1]), name="victim"
    )
    pub = Publication(
        mode="uniform",
        noise_multiplier=SIGMA,
        delta=1e-5,
        local_steps=1,
        rounds=10,
        client_rate=1.0,
        max_grad_norm=C,
        adversary="both",
        uniform_epsilon=1.0,
        uniform_rate=1.0,
    )
    client = DpFedAvgClient(
        CLIENT,
        create_model("logreg", (6,), 2),
        data,
        np.array([100.0]),
        pub,
        randomness=randomness,
        normalizer=B,
        lr=LR,
    )
    return client, x[0]


def _attack(update: list[np.ndarray]) -> np.ndarray:
    """The server knows the config (seed, σ, C, B, lr, round, silo id) and assumes one record.

    It regenerates the silo's stream, skips the Poisson coin, subtracts the noise from
    Δ = −lr·(clip(g) + σC·z)/B and reads x off the logistic-regression gradient
    g = (p − y)·[x, 1] as g_w / g_b.
    """
    stream = SeededRandomness(SEED).stream("local-training", ROUND, CLIENT)
    stream.uniform(1)  # the record's Poisson coin
    z = [stream.normal(u.shape).numpy() for u in update]
    g = [-B * u.astype(np.float64) / LR - SIGMA * C * zz for u, zz in zip(update, z, strict=True)]
    g_w, g_b = g[0].reshape(-1), float(g[1].reshape(-1)[0])
    return g_w / g_b


def test_predictable_noise_attack_succeeds_only_in_the_reproducible_mode() -> None:
    victim, x = _victim(SeededRandomness(SEED))
    recovered = _attack(victim.fit(get_params(victim.model), ROUND, {}).update)
    assert np.max(np.abs(recovered - x)) < 1e-4  # the attack works when noise derives from seed

    victim, x = _victim(SecureRandomness())  # the default
    recovered = _attack(victim.fit(get_params(victim.model), ROUND, {}).update)
    assert np.max(np.abs(recovered - x)) > 10 * np.max(np.abs(x))  # nothing recovered


TINY = {
    "name": "boundary",
    "seed": 3,
    "threads": 1,
    "data": {"dataset": "digits", "num_clients": 3},
    "model": {"name": "logreg"},
    "budgets": {
        "scenario": "three-levels",
        "params": {"values": [0.5, 2.0, 8.0], "ratios": [0.5, 0.3, 0.2]},
    },
    "privacy": {"epsilon_max": 8.0, "delta": 1e-3},
    "training": {"rounds": 3, "local_steps": 2, "client_rate": 0.7, "batch_size": 8},
}


class RecordingTransport(InProcessTransport):
    """The in-process transport, recording every object that leaves a silo."""

    def __init__(self, clients):
        super().__init__(clients)
        self.sent: list[tuple[str, object]] = []

    def fit(self, selected, params, round_index, config):
        out = super().fit(selected, params, round_index, config)
        self.sent += [("fit", c) for c in out]
        return out

    def evaluate(self, client_ids, params, round_index, config):
        out = super().evaluate(client_ids, params, round_index, config)
        self.sent += [("evaluate", e) for e in out.values()]
        return out


@pytest.mark.parametrize("algorithm", ["rpdp", "minimum", "dropout", "privacy-free"])
def test_only_contributions_and_aggregate_test_metrics_leave_a_silo(tmp_path: Path, algorithm):
    cfg = config_from_dict(TINY, [f"algorithm.name={algorithm}"])
    server, clients = build_federation_algorithms(cfg, load_federation_for(cfg))
    transport = RecordingTransport(clients)
    run_federation(cfg, server, transport, tmp_path, progress=False)
    fits = [obj for kind, obj in transport.sent if kind == "fit"]
    evals = [obj for kind, obj in transport.sent if kind == "evaluate"]
    assert fits and evals
    for c in fits:
        assert type(c) is Contribution and set(vars(c)) == {"update", "weight", "metrics"}
        assert c.metrics == {} and c.weight == 1.0  # nothing but the noisy update
        assert all(isinstance(u, np.ndarray) and u.dtype == np.float32 for u in c.update)
    for e in evals:
        assert set(e) == EVALUATION_METRICS


def test_a_crafted_pickle_checkpoint_is_refused_without_running_it(tmp_path: Path) -> None:
    import pickle

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    (tmp_path / "checkpoint.pkl").write_bytes(pickle.dumps(Payload()))
    cfg = config_from_dict(TINY)
    server, clients = build_federation_algorithms(cfg, load_federation_for(cfg))
    with pytest.raises(ValueError, match="pickle"):
        run_federation(
            cfg, server, InProcessTransport(clients), tmp_path, resume=True, progress=False
        )
    assert not marker.exists()


@pytest.mark.slow
def test_a_truncated_or_tampered_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    cfg = config_from_dict(TINY, ["rounds=2"])
    fed = load_federation_for(cfg)
    server, clients = build_federation_algorithms(cfg, fed)
    run_federation(cfg, server, InProcessTransport(clients), tmp_path, progress=False, stop_after=1)
    ckpt = tmp_path / "checkpoint.npz"
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2])
    server, clients = build_federation_algorithms(cfg, fed)
    # checkpoints are sealed (pdpfl.integrity): a truncated one fails its integrity tag
    with pytest.raises(ValueError, match="does not verify|truncated"):
        run_federation(
            cfg, server, InProcessTransport(clients), tmp_path, resume=True, progress=False
        )
    ckpt.write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    with pytest.raises(ValueError, match="not sealed"):
        run_federation(
            cfg, server, InProcessTransport(clients), tmp_path, resume=True, progress=False
        )
