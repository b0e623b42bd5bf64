"""IDP-FedAvg's canary clients scored by the law they are observed under: each round one
sampling coin of the group's q_p, then the clipped update under the value noise -- the exact
likelihood ratio (pdpfl.audit.observe.sampled_gaussian_scores) -- and half the claimed noise
caught in a real run (issue #39)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from noise_faults import weaken_noise
from pdpfl.audit import AuditSession, AuditSettings, write_audit
from pdpfl.audit.ceiling import session_ceilings
from pdpfl.audit.observe import sampled_gaussian_scores
from pdpfl.testing import toy_config


@settings(max_examples=60, deadline=None)
@given(
    q=st.floats(0.0, 1.0),
    mu=st.floats(0.05, 8.0),
    z=st.lists(st.floats(-30.0, 30.0), min_size=1, max_size=6),
)
def test_score_is_the_mixture_likelihood_ratio(q: float, mu: float, z: list[float]) -> None:
    """Against the densities themselves (scipy): Σ_t log[((1 − q)φ(z) + qφ(z − μ)) / φ(z)]."""
    zz = np.array(z)[:, None]
    got = sampled_gaussian_scores(zz, np.array([q]), mu)[0]
    inside = (1 - q) * stats.norm.pdf(zz) + q * stats.norm.pdf(zz - mu)
    with np.errstate(divide="ignore"):
        want = float(np.sum(np.log(inside) - stats.norm.logpdf(zz)))
    if math.isfinite(want):  # the densities underflow far in the tail; the score does not
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
    else:
        assert math.isfinite(got)


def test_score_edges_and_bad_input() -> None:
    rng = np.random.default_rng(0)
    z = rng.standard_normal((5, 50))
    always = sampled_gaussian_scores(z, np.ones(50), 0.7)
    np.testing.assert_allclose(always, 0.7 * z.sum(axis=0) - 5 * 0.7**2 / 2)  # q = 1: linear
    assert not sampled_gaussian_scores(z, np.zeros(50), 0.7).any()  # q = 0: nothing to see
    with pytest.raises(ValueError, match="signal"):
        sampled_gaussian_scores(z, np.ones(50), 0.0)
    with pytest.raises(ValueError, match="rates"):
        sampled_gaussian_scores(z, np.full(50, 1.5), 0.7)


def test_the_ratio_ranks_better_than_the_sum_under_sampling() -> None:
    """At q = 0.1 a canary is seen in a round or two: the likelihood ratio keeps the rounds
    without it from drowning them (more correct among the top guesses than the plain sum)."""
    rng = np.random.default_rng(3)
    m, rounds, q, mu = 20_000, 20, 0.1, 2.0
    inc = rng.random(m) < 0.5
    z = rng.standard_normal((rounds, m)) + mu * ((rng.random((rounds, m)) < q) & inc)

    def top(s: np.ndarray) -> int:
        return int(inc[np.argsort(-s)[:500]].sum())

    assert top(sampled_gaussian_scores(z, np.full(m, q), mu)) > top(z.sum(axis=0)) + 10


#: IDP-FedAvg on 6 digits clients, every client every round (c = N: q = 1), 5 rounds, adaptive
#: clipping (the toy's σ_b = c: σ_v = 1.05·σ_p).
HALF = [
    "data.num_clients=6",
    "training.rounds=5",
    "algorithm.clients_per_round=6",
    "lifetime.allow_respend=true",  # two audits of the same public data
]


@pytest.mark.slow
def test_round_signal_is_the_value_noise() -> None:
    """μ = 1/σ_v: the canary's clipped update over the value noise (not the charged σ_p, which
    also counts the count query no single canary can be seen on); the ceiling's "seen"
    canaries are generated there."""
    session = AuditSession.create(toy_config("idp-fedavg", HALF), AuditSettings(canaries=50))
    setup = session.run.server.setup
    mu = session.hook.round_signal(session.run, "third-party")
    assert mu == pytest.approx(1.0 / setup.value_noise_multiplier)
    assert setup.value_noise_multiplier > setup.noise_multiplier  # σ_v > σ_p
    seen = session_ceilings(session, "third-party", noise_factor="seen")
    factor = setup.value_noise_multiplier / setup.noise_multiplier
    assert all(c.noise_factor == pytest.approx(factor) for c in seen.values())


@pytest.mark.slow
def test_idp_fedavg_half_the_noise_is_caught(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The aggregator's sampler drawing half the std it is asked for (value and count noise):
    the f-DP test rejects the accountant's own curve with 1000 canaries, where the correct
    mechanism is consistent (third party, central IDP-FedAvg, likelihood-ratio scores)."""
    config = toy_config("idp-fedavg", HALF)
    audit = AuditSettings(canaries=1000, seed=3, space="block")
    fine = AuditSession.create(config, audit).execute().to_dict()
    assert fine["verdict"] == "consistent"
    assert fine["scores"]["third-party"].startswith("likelihood ratio")
    write_audit(fine, tmp_path)
    assert "Canary scores (third-party): likelihood ratio" in (tmp_path / "AUDIT.md").read_text()
    session = AuditSession.create(config, audit)
    weaken_noise(monkeypatch, 2.0)
    record = session.execute().to_dict()
    *groups, control = record["observers"]["third-party"]
    assert record["verdict"] == "violation"
    assert any(g["rejects_claim"] and g["statistic"] == "f-dp" for g in groups)
    assert control["epsilon_lower"] == 0.0
