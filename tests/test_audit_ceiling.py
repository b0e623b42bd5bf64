"""Ideal canaries (pdpfl.audit.ceiling): their scores are exact log-likelihood ratios of the
accounted mechanism, and the ceiling they give is a valid audit of it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from pdpfl.audit import AuditSession, AuditSettings
from pdpfl.audit.canaries import CONTROL_LABEL
from pdpfl.audit.ceiling import ideal_audit, ideal_scores, session_ceilings
from pdpfl.audit.fdp import MechanismFamily
from pdpfl.audit.ideal import _llr
from pdpfl.privacy.accountant import mechanism_epsilon
from pdpfl.privacy.mechanisms import (
    Composed,
    GaussianMechanism,
    PoissonSampled,
    SampledWithoutReplacement,
    TwoStageRound,
)
from pdpfl.privacy.unit import PrivacyUnit, SampledGaussianPlan
from pdpfl.testing import toy_config


def _family(sigma: float, rounds: int, rate: float = 1.0) -> MechanismFamily:
    mech = SampledGaussianPlan(
        PrivacyUnit.CLIENT, noise_multiplier=sigma, delta=1e-5, rounds=rounds
    )

    def epsilon(factor: float) -> float:
        e, _ = mechanism_epsilon(
            mech.with_noise(sigma * factor), [rate], "third-party", [rounds], accountant="rdp"
        )
        return float(e[0])

    return MechanismFamily(mech, "third-party", rate, rounds, sigma, epsilon)


def test_gaussian_scores_are_the_exact_likelihood_ratio() -> None:
    """T Gaussian rounds at σ are μ-GDP with μ = √T/σ: the log-likelihood ratio is N(±μ²/2, μ²)
    (in / out); Kolmogorov-Smirnov against the closed form."""
    sigma, rounds = 1.5, 9
    mu = math.sqrt(rounds) / sigma
    scores, inc = ideal_scores(_family(sigma, rounds), 20_000, np.random.default_rng(1))
    for sign, part in ((1.0, scores[inc]), (-1.0, scores[~inc])):
        assert stats.kstest(part, stats.norm(sign * mu * mu / 2, mu).cdf).pvalue > 1e-3


@pytest.mark.parametrize(
    "event",
    [
        PoissonSampled(0.3, GaussianMechanism(1.0)),
        TwoStageRound(0.5, Composed(PoissonSampled(0.2, GaussianMechanism(0.8)), 4)),
        Composed(PoissonSampled(0.6, GaussianMechanism(2.0)), 5),
    ],
    ids=["poisson", "two-stage", "composed"],
)
def test_sampled_scores_are_likelihood_ratios(event: object) -> None:
    """Whatever the structure, e^ℓ is a likelihood ratio: its mean under "out" is 1, and e^{-ℓ}'s
    under "in" is 1 (a wrong mixture weight or a sign error moves either by far more than the
    tolerance)."""
    rng = np.random.default_rng(2)
    n = 200_000
    out = _llr(event, np.zeros(n, dtype=bool), rng)  # type: ignore[arg-type]
    inn = _llr(event, np.ones(n, dtype=bool), rng)  # type: ignore[arg-type]
    for values in (np.exp(out), np.exp(-inn)):
        mean, se = values.mean(), values.std() / math.sqrt(n)
        assert abs(mean - 1.0) < 5 * se + 1e-3
    assert inn.mean() > 0 > out.mean()  # KL divergences in both directions are positive


def test_unsupported_events_are_named() -> None:
    with pytest.raises(ValueError, match="cannot simulate SampledWithoutReplacement"):
        _llr(
            SampledWithoutReplacement(0.5, GaussianMechanism(1.0)),
            np.ones(3, dtype=bool),
            np.random.default_rng(0),
        )
    with pytest.raises(ValueError, match="m: must be an integer >= 2"):
        ideal_scores(_family(1.0, 1), 1, np.random.default_rng(0))


@pytest.mark.slow
def test_the_ceiling_is_a_valid_audit_with_power() -> None:
    """Ideal canaries of the claimed mechanism certify a positive ε̂ below the accountant's ε;
    generated at half the noise (ν = 0.5) they exceed it: the ceiling is an audit like any
    other (4000 canaries, the f-DP family of ten Gaussian rounds)."""
    family = _family(2.25, 10)
    level = 0.05 / 16
    fine = ideal_audit(family, 4000, 1e-6, level, seed=3)
    assert 0.0 < fine.epsilon <= fine.claimed and 0.0 < fine.ratio <= 1.0
    assert fine.claimed == pytest.approx(family.epsilon(1.0))
    broken = ideal_audit(family, 4000, 1e-6, level, seed=3, noise_factor=0.5)
    assert broken.epsilon > broken.claimed and broken.evidence.violated


@pytest.mark.slow
def test_session_ceilings_test_the_audits_own_claim() -> None:
    """On a planned audit (ULDP-AVG, every user in every round): one ceiling per budget group,
    its claim the ε the real audit compares its ε̂ with (the canaries' ledger at δ_audit), and
    an observer the audit does not test is refused."""
    config = toy_config(
        "uldp-avg",
        [
            "privacy.epsilon_max=1.0",
            "training.rounds=5",
            "randomness=reproducible",
            "privacy.noise_shares=continuous",  # canary users are planted into float shares
        ],
    )
    settings = AuditSettings(canaries=200, seed=3, space="block", observers=("server",))
    record = AuditSession.create(config, settings).execute().to_dict()
    session = AuditSession.create(config, settings)
    out = session_ceilings(session, "server", seed=1)
    groups = [g for g in record["observers"]["server"] if g["label"] != CONTROL_LABEL]
    assert sorted(out) == sorted(g["label"] for g in groups)
    for g in groups:
        ceiling = out[g["label"]]
        assert ceiling.claimed == pytest.approx(g["spent_at_audit_delta"], rel=1e-9)
        assert 0.0 <= ceiling.epsilon <= ceiling.claimed
        assert ceiling.evidence.m == 200
    with pytest.raises(ValueError, match="observer: expected one of server"):
        session_ceilings(session, "third-party")
