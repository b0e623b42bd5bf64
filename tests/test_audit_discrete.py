"""`pdpfl audit` of ULDP-AVG/SGD and IDP-FedAvg ``distributed`` on exact discrete noise shares
(the default ``privacy.noise_shares: discrete``, issue #39).

Canary users go through the silos' integer pipeline like users (clipped, weighted, rounded on
their own at their part bound, + the one discrete noise share, modulo 2^b); the encoding's
contributor count includes them, and their ledger charges the server's
:class:`~pdpfl.privacy.uldp_discrete.DiscreteUserLevelPlan`. A correct run is consistent with
the control at ε̂ = 0; a discrete sampler drawing less noise than charged is caught. Canary
clients of IDP-FedAvg ride on host clients' integer vectors the same way (their ledger: the
clients' discrete ``group_plan``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pdpfl.audit import AuditSession, AuditSettings
from pdpfl.audit.canaries import CONTROL_LABEL, stacked_rows
from pdpfl.audit.client_canaries import ClientCanaries
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
    with pytest.raises(ValueError, match=r"^secure\.bits: the audit's canary users \(\d+ planted"):
        _session(overrides, 2000, ("third-party",))
    assert _session(overrides, 10, ("third-party",)).run.server.share_encoding is not None


#: IDP-FedAvg distributed on 6 digits clients under secure summation, 5 rounds, discrete shares.
IDP = [
    "data.num_clients=6",
    "training.rounds=5",
    "algorithm.variant=distributed",
    "aggregation=secure",
    "randomness=reproducible",
    "lifetime.allow_respend=true",
]


def _idp(extra: list[str], canaries: int) -> AuditSession:
    return AuditSession.create(
        toy_config("idp-fedavg", [*IDP, *extra]),
        AuditSettings(canaries=canaries, seed=3, space="block"),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "one_per_coordinate"),
    [
        (["algorithm.clipping=fixed", "secure.rotation=off"], True),
        # adaptive clipping: every canary client is counted on the one count coordinate
        (["secure.rotation=off", "secure.bits=40"], False),
    ],
    ids=["fixed", "adaptive"],
)
def test_discrete_canary_clients_are_consistent(extra: list[str], one_per_coordinate: bool) -> None:
    """Without the rotation each canary client is rounded on its own coordinates (and the count
    coordinate); K = clients + 1 when no coordinate holds two canaries, else + every canary.
    The ledger charges the clients' discrete group plan."""
    from pdpfl.fl.idp_fedavg.discrete import group_plan

    session = _idp(extra, 100)
    server: Any = session.run.server
    params = server.share_encoding.params
    planted = 1 if one_per_coordinate else int(session.plan.trained().sum())
    assert params.contributors == int(server.setup.asked_per_round) + planted
    assert not params.rotation
    assert all(c.share_encoding is server.share_encoding for c in session.run.clients.values())
    setup, host = server.setup, int(next(iter(session.run.clients)))
    ledger = ClientCanaries().ledger(session.run, host, np.array([8.0]), np.array([0.5]), 1e-6)
    expected = dataclasses.replace(group_plan(setup, setup.group_of(8.0)), delta=1e-6)
    assert ledger.mechanism == expected  # the shares actually added, not the float Gaussian
    record = session.execute().to_dict()
    assert record["unit"] == "client" and record["verdict"] == "consistent"
    for rows in record["observers"].values():
        *groups, control = rows
        assert control["epsilon_lower"] == 0.0
        assert all(0.0 <= g["epsilon_lower"] <= g["spent_at_audit_delta"] for g in groups)
    counts = [c.extra_rows.counts for c in session.run.clients.values() if c.extra_rows is not None]
    assert sum(int(c.sum()) for c in counts) > 0


@pytest.mark.slow
def test_discrete_canary_clients_broken_noise_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the rotation (IDP-FedAvg's default) every canary client counts against wrapping
    (K = clients + canaries) and is rotated like a client's vector; small budgets, fixed
    clipping, 15 rounds: a sampler drawing a tenth of the noise is far off."""
    session = _idp(
        ["algorithm.group_budgets=[0.5,1.0]", "training.rounds=15", "algorithm.clipping=fixed"],
        200,
    )
    params = session.run.server.share_encoding.params
    planted = int(session.plan.trained().sum())
    assert params.rotation and params.contributors == 6 + planted
    _weaken_discrete(monkeypatch, 10)
    record = session.execute().to_dict()
    assert record["verdict"] == "violation"
    rows = record["observers"]["third-party"]
    assert any(g["epsilon_lower"] > g["spent_at_audit_delta"] for g in rows[:-1])
    assert rows[-1]["epsilon_lower"] == 0.0


@given(
    st.lists(
        st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=3, unique=True), max_size=6),
        max_size=4,
    )
)
def test_stacked_rows_is_the_most_rows_on_one_coordinate(hosts: list[list[list[int]]]) -> None:
    """Against a plain count over every row of every host (rows of equal length per host)."""
    coords = []
    for rows in hosts:
        width = min((len(r) for r in rows), default=1)
        coords.append(np.array([r[:width] for r in rows], dtype=np.int64).reshape(-1, width))
    counts = Counter(int(j) for c in coords for row in c for j in row)
    assert stacked_rows(coords) == max(counts.values(), default=0)
