"""`pdpfl audit` of ULDP-AVG/SGD on exact discrete noise shares (the default
``privacy.noise_shares: discrete``, issue #39).

Canary users go through the silos' integer pipeline like users (clipped, weighted, rounded on
their own at their part bound, + the one discrete noise share, modulo 2^b); the encoding's
contributor count includes them, and their ledger charges the server's
:class:`~pdpfl.privacy.uldp_discrete.DiscreteUserLevelPlan`. A correct run is consistent with
the control at ε̂ = 0; a discrete sampler drawing less noise than charged is caught.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from pdpfl.audit import AuditSession, AuditSettings
from pdpfl.audit.canaries import CONTROL_LABEL
from pdpfl.dp import noise as noise_module
from pdpfl.fl.uldp.users import UserLevelSilo
from pdpfl.privacy.uldp_discrete import DiscreteUserLevelPlan
from pdpfl.testing import toy_config

#: ULDP-AVG at ε = 1 over 5 rounds (q = 1), default discrete shares, reproducible randomness.
ULDP = [
    "privacy.epsilon_max=1.0",
    "training.rounds=5",
    "randomness=reproducible",
    "lifetime.allow_respend=true",  # several audits of the same synthetic data
]


def _weaken_discrete(monkeypatch: pytest.MonkeyPatch, factor: int) -> None:
    """The exact discrete sampler's draws divided by ``factor`` (std / factor): a broken
    sampler that releases less noise than the ledger charges."""
    original = noise_module._SAMPLERS["discrete-gaussian"]

    def weak(targets: Any, noise: Any, std: float, stream: Any, shapes: Any) -> None:
        drawn = [torch.zeros_like(t) for t in targets]
        original(drawn, noise, std, stream, shapes)
        for t, z in zip(targets, drawn, strict=True):
            t.add_(torch.div(z, factor, rounding_mode="trunc"))

    monkeypatch.setitem(noise_module._SAMPLERS, "discrete-gaussian", weak)


def _session(overrides: list[str], canaries: int, observers: tuple[str, ...]) -> AuditSession:
    return AuditSession.create(
        toy_config("uldp-avg", overrides),
        AuditSettings(canaries=canaries, seed=3, space="block", observers=observers),
    )


@pytest.mark.parametrize(
    "extra",
    [
        [],
        [
            "algorithm.name=uldp-sgd",
            "algorithm.weights=enhanced",
            "data.public_user_histograms=true",
            "secure.rotation=on",
        ],
    ],
    ids=["avg-uniform", "sgd-enhanced-rotated"],
)
def test_discrete_canary_users_are_consistent(extra: list[str]) -> None:
    session = _session([*ULDP, *extra], 60, ("third-party", "server"))
    server: Any = session.run.server
    assert isinstance(server.plan, DiscreteUserLevelPlan)
    users = int(server.setup.num_users)
    planted = int(session.plan.trained().sum())  # the included canaries
    params = server.share_encoding.params
    # no rotation: one canary per coordinate (K = |U| + 1); rotation: every canary counts
    assert params.contributors == users + (planted if params.rotation else 1)
    silos: list[Any] = list(session.run.clients.values())
    assert all(
        isinstance(s, UserLevelSilo) and s.share_encoding is server.share_encoding for s in silos
    )
    record = session.execute().to_dict()
    assert record["unit"] == "user" and record["verdict"] == "consistent"
    assert not record["violations"]
    for rows in record["observers"].values():
        *groups, control = rows
        assert control["label"] == CONTROL_LABEL and control["epsilon_lower"] == 0.0
        for g in groups:
            assert not g["violated"]
            assert 0.0 <= g["epsilon_lower"] <= g["spent_at_audit_delta"]
            assert g["spent_at_audit_delta"] >= g["spent"] > 0
    counts = [s.extra_rows.counts for s in silos]
    assert sum(int(c[c > 0].size) for c in counts) > 0
    assert all(int(c.max()) <= 5 for c in counts)  # at most once a round


def test_discrete_canary_users_reach_the_release() -> None:
    """A sampled canary user moves its own coordinate of the decoded sum by about −C, the
    unsampled control coordinates do not move beyond the noise."""
    session = _session(ULDP, 40, ("third-party",))
    server: Any = session.run.server
    silos: list[Any] = list(session.run.clients.values())
    params = server.share_encoding.params
    trained = session.plan.trained()
    coords = session.plan.coords[:, 0] if session.plan.coords.ndim == 2 else session.plan.coords
    totals = sum(s.rounded_canaries(0).astype(np.float64) for s in silos) / params.scale
    clip = float(params.clip)
    assert np.allclose(totals[coords[trained]], -clip, atol=len(silos) / params.scale)
    assert not np.any(totals[coords[~trained]])


def test_discrete_broken_noise_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    session = _session(ULDP, 200, ("third-party", "server"))
    _weaken_discrete(monkeypatch, 10)
    record = session.execute().to_dict()
    assert record["verdict"] == "violation"
    for rows in record["observers"].values():
        assert any(g["epsilon_lower"] > g["spent_at_audit_delta"] for g in rows[:-1])
        assert rows[-1]["epsilon_lower"] == 0.0


def test_discrete_half_the_noise_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Half the claimed noise: the f-DP test rejects the accountant's own curve with 2000
    canaries, where the correct mechanism is consistent."""
    overrides = [*ULDP, "privacy.epsilon_max=3.0"]
    fine = _session(overrides, 2000, ("server",)).execute().to_dict()
    assert fine["verdict"] == "consistent"
    session = _session(overrides, 2000, ("server",))
    _weaken_discrete(monkeypatch, 2)
    record = session.execute().to_dict()
    group = record["observers"]["server"][0]
    assert record["verdict"] == "violation" and group["rejects_claim"]
    assert group["epsilon_lower"] >= group["spent_at_audit_delta"]
    assert record["observers"]["server"][-1]["epsilon_lower"] == 0.0  # the control


def test_discrete_refuses_canaries_that_would_change_the_encoding() -> None:
    """With the rotation every canary user counts against wrapping: at b = 24 the 2000
    canaries would lower the scale the ledger's plan was built with, so the audit is refused
    naming ``secure.bits`` (the run itself is unchanged)."""
    overrides = [*ULDP, "secure.rotation=on", "secure.bits=24"]
    with pytest.raises(ValueError, match=r"^secure\.bits: the audit's \d+ canary users"):
        _session(overrides, 2000, ("third-party",))
    assert _session(overrides, 10, ("third-party",)).run.server.share_encoding is not None
