"""Discrete noise shares wired into the silos, the summation protocols and the ledgers
(issue #33, item 3; ``privacy.noise_shares: discrete``, the default).

* end to end, through the real ULDP-AVG silos and the secure sum at exactly t survivors: the
  released integer sum of zero updates has the law of t i.i.d. exact discrete Gaussian shares
  (χ² against the exact convolution pmf), and every upload the server receives is an integer
  vector below 2^b;
* the ledgers charge the distributed discrete Gaussian (ULDP's user ledger, IDP-FedAvg's client
  ledgers), σ from ε_max is calibrated against it, and the noise drawn is the description the
  plan was built from;
* the gate: a float update or a value ≥ 2^b where a share is declared is refused before it
  leaves; a server cannot make a silo encode at another size;
* a bit width that cannot work is refused up front (exit 2, the field named, nothing written).

The fault matrix (dropouts at every stage, late replies, lone survivor) with discrete shares is
in ``tests/test_secure_sum.py`` and ``tests/test_noise_shares.py`` (parametrized).
"""

from __future__ import annotations

import copy
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from scipy import signal, stats
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.config import config_from_dict
from pdpfl.discrete_noise import discrete_gaussian_pmf
from pdpfl.dp import noise as noise_module
from pdpfl.fl.algorithm import build_federation_algorithms
from pdpfl.fl.api import Contribution, PrivacyBoundaryError, check_contribution
from pdpfl.fl.uldp import UserLevelSilo
from pdpfl.privacy import mechanism_epsilon
from pdpfl.privacy.discrete_plan import SampledDiscreteGaussianPlan
from pdpfl.privacy.mechanisms import DistributedDiscreteGaussian
from pdpfl.privacy.uldp_discrete import DiscreteUserLevelPlan
from pdpfl.runtime.loop import run_federation
from pdpfl.runtime.simulation import InProcessTransport, load_federation_for
from pdpfl.testing import toy_config

pytestmark = pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning")

ULDP = {
    "name": "discrete-shares",
    "seed": 5,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 5, "options": {"num_users": 8}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "uldp-avg"},
    "privacy": {"noise_multiplier": 1.0, "delta": 1e-5},
    "aggregation": "secure",
    # a small ring: shares of σ_s ≈ 2400, an enumerable exact pmf; n = 5, t = 3 and the
    # consistency quorum q = ⌈(n + t)/2⌉ = 4: the fewest survivors a secure sum releases
    "secure": {"bits": 17, "threshold": 0.51},
    "training": {"rounds": 3, "local_steps": 1, "lr": 0.1, "batch_size": 8, "max_grad_norm": 1.0},
}


def _build(base: dict, *overrides: str) -> tuple[Any, Any, dict[int, Any]]:
    config = config_from_dict(base, list(overrides))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server, clients = build_federation_algorithms(config, load_federation_for(config))
    return config, server, clients


class LoseAtUpload(InProcessTransport):
    """Silo ``victim`` dies computing its masked upload every round; every reply of every stage
    is recorded (what the server receives)."""

    def __init__(self, clients: dict[int, Any], victim: int) -> None:
        super().__init__(clients)
        self.victim = victim
        self.received: list[tuple[str, dict[str, Any]]] = []

    def exchange(self, protocol, stage, requests, round_index):
        if stage == "upload":
            requests = {c: r for c, r in requests.items() if c != self.victim}
        replies = super().exchange(protocol, stage, requests, round_index)
        self.received += [(stage, dict(r)) for r in replies.values()]
        return replies


def test_the_released_sum_at_t_survivors_has_the_accounted_law_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five ULDP-AVG silos (shares sized for t = 3), one lost at the upload every round: the
    round is released with the fewest survivors the secure sum allows (its consistency quorum,
    4); the users' updates are zero, so the decoded sum × γ is the noise alone: χ² against the
    exact pmf of a sum of 4 i.i.d. N_Z(0, σ_s²) (t of them are the accounted law, the rest
    post-processing), and the server saw only integers below 2^17. Plain summation at exactly
    t shares: ``tests/test_noise_shares.py``."""

    def zeros(self, global_params, positions, round_index):
        return [
            torch.zeros((len(positions), *np.shape(p)), dtype=torch.float64) for p in global_params
        ]

    monkeypatch.setattr(UserLevelSilo, "clipped_vectors", zeros)
    config, server, clients = _build(ULDP)
    enc = server.share_encoding
    assert enc is not None and enc.bits == 17 and enc.dtype == np.uint32
    assert all(c.share_encoding == enc for c in clients.values())
    t = server.setup.survivors
    assert t == 3 and enc.params.survivors == t
    m = 4  # survivors released: the quorum
    released: list[np.ndarray] = []
    original = server.aggregate

    def aggregate(r, params, agg):
        released.append(np.concatenate([np.asarray(a, np.float64).ravel() for a in agg.total]))
        assert agg.count == m
        return original(r, params, agg)

    server.aggregate = aggregate
    transport = LoseAtUpload(clients, victim=4)
    result = run_federation(config, server, transport, tmp_path, progress=False)
    assert [r["contributions"] for r in result["metrics"]] == [m, m, m]
    # integers only: every masked upload is uint32 below 2^17 (+ its zero check words)
    uploads = [r for s, r in transport.received if s == "upload"]
    assert len(uploads) == 3 * m
    for r in uploads:
        assert set(r) == {"masked", "weight"}
        assert r["masked"].dtype == np.uint32 and r["masked"].shape == (enc.upload_length,)
        assert int(r["masked"].max()) < 2**17
    # the released noise: integers (the decoded sum × γ), the exact law of 3 shares
    noise = np.concatenate(released) * enc.params.scale
    assert np.array_equal(noise, np.rint(noise))
    spec = enc.params.share
    half = int(14 * math.sqrt(float(spec.variance)))
    one = discrete_gaussian_pmf(np.arange(-half, half + 1), spec)
    law = one
    for _ in range(m - 1):
        law = signal.fftconvolve(law, one)
    law = np.clip(law, 0.0, None)
    support = np.arange(-m * half, m * half + 1)
    cdf = np.cumsum(law) / law.sum()
    edges = [support[np.searchsorted(cdf, q)] for q in np.linspace(0, 1, 17)[1:-1]]
    bins = np.digitize(noise, edges, right=True)
    observed = np.bincount(bins, minlength=16)
    expected = np.diff(np.concatenate([[0.0], cdf[np.searchsorted(support, edges)], [1.0]]))
    assert stats.chisquare(observed, expected * noise.size).pvalue > 1e-4
    assert noise.var() == pytest.approx(m * float(spec.variance), rel=0.15)
    # the user ledger charged the distributed discrete Gaussian of t shares, every round
    plan = server.ledger.mechanism
    assert isinstance(plan, DiscreteUserLevelPlan)
    event = plan.round_event(np.array([1.0]), "third-party").inner
    assert isinstance(event, DistributedDiscreteGaussian) and event.shares == t
    assert event.share_variance <= float(spec.variance)
    assert event.l2_sensitivity_sq == enc.params.l2_sensitivity_sq
    summary = result["server_state"]["noise_shares"]
    assert summary["bits"] == 17 and summary["bits_per_coordinate"] == 32


@pytest.mark.slow
def test_the_noise_drawn_is_the_description_the_plan_charges(monkeypatch) -> None:
    """Every silo's share is drawn by the one noise adder from ``params.noise()``: the variance
    the ledger's event is built from (σ_s² = σ²N/t), sized for t; a protocol announcing fewer
    survivors than t is refused before anything is drawn."""
    seen: list[Any] = []
    original = noise_module._SAMPLERS["discrete-gaussian"]

    def record(targets, noise, std, stream, shapes):
        seen.append(noise)
        original(targets, noise, std, stream, shapes)

    monkeypatch.setitem(noise_module._SAMPLERS, "discrete-gaussian", record)
    config, server, clients = _build(ULDP, "aggregation=plain")
    params = server.initial_params()
    outs = [clients[c].fit(params, 0, server.round_config(0)) for c in sorted(clients)]
    enc = server.share_encoding
    assert len(seen) == len(clients)
    assert {n.variance for n in seen} == {enc.params.share.requested}
    plan = server.ledger.mechanism
    assert plan.released.shares == {n.shares for n in seen}.pop() == server.setup.survivors
    assert plan.released.share_variance <= float(enc.params.share.variance)
    for o in outs:  # integers only on the wire (plain summation)
        assert len(o.update) == 1 and o.update[0].dtype == np.uint32 and not o.metrics
    # plain summation: the server sees each share, charged as their composition (one share,
    # Σ_s N_p of the user's parts): with uniform weights σ√(|S|/t), as for float shares
    assert plan.server_view.shares == 1
    assert plan.server_noise_multiplier == pytest.approx(math.sqrt(5 / 3), rel=0.05)
    from pdpfl.fl.aggregation import SURVIVORS_KEY
    from pdpfl.privacy.noise import NoiseBindingError

    with pytest.raises(NoiseBindingError, match="announced"):
        clients[0].fit(params, 1, {**server.round_config(1), SURVIVORS_KEY: 2})


def test_sigma_from_epsilon_max_is_calibrated_against_the_discrete_plan() -> None:
    """Same ε_max, continuous and discrete: each run's planned ε is at most ε_max and within
    0.1 % of it -- the discrete σ is recalibrated (the discrete bound is a little larger)."""
    extra = ["privacy.noise_multiplier=null", "privacy.epsilon_max=3.0", "algorithm.user_rate=0.5"]
    sigmas = {}
    for shares in ("discrete", "continuous"):
        _, server, _ = _build(ULDP, *extra, f"privacy.noise_shares={shares}")
        eps = server.plan.planned_epsilon(np.array([0.5]), "third-party")[0]
        assert 3.0 * (1 - 1e-3) <= eps <= 3.0 * (1 + 1e-9)
        sigmas[shares] = server.setup.noise_multiplier
    assert sigmas["discrete"] >= sigmas["continuous"] * (1 - 1e-3)


def test_idp_clients_charge_the_discrete_shares_they_add() -> None:
    """IDP-FedAvg distributed: each client's ledger is the distributed discrete Gaussian of the
    shares it adds over its group's rounding bound; the update and the count travel as one
    uint32 share; the server decodes the count (÷λ) and the update (×C_t)."""
    config = toy_config("idp-fedavg", ["algorithm.variant=distributed", "aggregation=secure"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server, clients = build_federation_algorithms(config, load_federation_for(config))
    enc = server.share_encoding
    assert enc is not None and enc.metrics == ("clip_count",)
    for silo in clients.values():
        assert silo.share_encoding == enc
        if silo.ledger is not None:
            plan = silo.ledger.mechanism
            assert isinstance(plan, SampledDiscreteGaussianPlan)
            assert plan.shares == enc.params.survivors
            assert plan.share_variance <= float(enc.params.share.variance)
            # SAMPLE's rate re-fitted: T rounds of the discrete plan stay within the budget
            assigned = server.setup.assigned[silo.group]
            for obs in plan.observers:
                eps, _ = mechanism_epsilon(plan, np.array([silo.rate]), obs, plan.rounds)
                assert eps[0] <= assigned
    params = server.initial_params()
    out = clients[0].fit(params, 0, server.round_config(0))
    assert len(out.update) == 1 and out.update[0].dtype == np.uint32
    assert out.update[0].shape == (enc.length,) and not out.metrics


def test_the_gate_refuses_floats_or_out_of_ring_values_where_a_share_is_declared() -> None:
    _, server, clients = _build(ULDP, "aggregation=plain")
    enc = server.share_encoding
    params = server.initial_params()
    good = clients[0].fit(params, 0, server.round_config(0))
    check_contribution(good, frozenset(), params=params, encoding=enc)
    floats = Contribution(update=[np.asarray(p, np.float32) for p in params])
    with pytest.raises(PrivacyBoundaryError):
        check_contribution(floats, frozenset(), params=params, encoding=enc)
    big = good.update[0].copy()
    big[0] = 2**17  # outside Z_{2^17}
    with pytest.raises(PrivacyBoundaryError, match="2\\^17"):
        check_contribution(Contribution(update=[big]), frozenset(), params=params, encoding=enc)
    longer = np.append(good.update[0], np.uint32(0))
    with pytest.raises(PrivacyBoundaryError, match="shape"):
        check_contribution(Contribution(update=[longer]), frozenset(), params=params, encoding=enc)
    with pytest.raises(PrivacyBoundaryError):  # an integer share where floats are declared
        check_contribution(good, frozenset(), params=params)


def test_a_bit_width_that_cannot_work_is_refused_up_front(tmp_path: Path) -> None:
    raw = {**copy.deepcopy(ULDP), "lifetime": {"allow_respend": True}}
    raw["secure"] = {"bits": 12}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--quiet"])
    assert res.exit_code == 2, res.output
    assert "secure.bits" in res.output and "allowed" in res.output
    assert "Traceback" not in res.output and not out.exists()
