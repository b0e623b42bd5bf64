"""`pdpfl audit` beyond record-level DP-FedAvg: canary clients (IDP-FedAvg), canary users
(ULDP-AVG/SGD) and PriFedSync's canary records.

For each algorithm a small audit runs in reproducible and in secure randomness, every ε̂ stays
at most the accountant's ε of its group, the never-trained control group gets ε̂ = 0, and a
mechanism that adds a tenth of the noise its ledgers are charged for is caught (ε̂ above the
claimed ε).

Under ``randomness: secure`` the mechanism's noise is fresh in every run, so the audit's own
guarantee is what the test can check: the control group (ε = 0) gets ε̂ > 0 in at most
level/(observers · groups) ≈ 1 % of runs, and then a small one; those runs assert ε̂ < 0.5 there
(a canary that leaked into the control would certify far more) instead of exactly 0, and
allow the budget groups the same 0.5 of chance above their ε, so that CI cannot fail by chance.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from noise_faults import weaken_noise
from pdpfl.audit import AuditSession, AuditSettings, AuditUnsupported
from pdpfl.audit.canaries import CONTROL_LABEL, EVERYWHERE, GroupSpec, plan_canaries
from pdpfl.fl.idp_fedavg import CentralIdpServer, DistributedIdpSilo
from pdpfl.fl.prifedsync import PriFedSyncSilo
from pdpfl.fl.uldp.users import UserLevelSilo
from pdpfl.randomness import SeededRandomness
from pdpfl.testing import toy_config

#: IDP-FedAvg on 6 digits clients, 5 rounds; budgets 2 and 8 (toy overrides).
IDP = ["data.num_clients=6", "training.rounds=5"]
#: IDP-FedAvg with small budgets and fixed clipping (σ ≈ 5, 15 rounds): noise/10 is far off.
IDP_CLAIM = [
    *IDP,
    "algorithm.group_budgets=[0.5,1.0]",
    "training.rounds=15",
    "algorithm.clipping=fixed",
]
#: ULDP at ε = 1 over 5 rounds (q = 1).
#: (continuous noise shares here; the default discrete shares: tests/test_audit_discrete.py)
ULDP = ["privacy.epsilon_max=1.0", "training.rounds=5", "privacy.noise_shares=continuous"]
#: PriFedSync, every client at target ε = 1, 4 rounds of 20 steps on batches of 50.
PRIFEDSYNC = [
    "algorithm.target_epsilon=[1.0,1.0,1.0]",
    "training.batch_size=50",
    "training.local_steps=20",
    "training.rounds=4",
]


def _audit(
    name: str, overrides: list[str], canaries: int = 100, breaks: Any = None
) -> tuple[AuditSession, dict[str, Any]]:
    session = AuditSession.create(
        toy_config(name, overrides), AuditSettings(canaries=canaries, seed=3, space="block")
    )
    if breaks is not None:
        breaks(session)
    return session, session.execute().to_dict()


def _consistent(record: dict[str, Any], observers: tuple[str, ...]) -> None:
    exact = record["randomness"] == "reproducible"  # module docstring
    if exact:
        assert record["verdict"] == "consistent" and not record["violations"]
    assert tuple(record["observers"]) == observers
    for rows in record["observers"].values():
        *groups, control = rows
        assert control["label"] == CONTROL_LABEL
        assert control["epsilon_lower"] == 0.0 if exact else control["epsilon_lower"] < 0.5
        for g in groups:
            # secure: the same chance allowance as the control (a group can exceed its ε by
            # chance in a correct audit, and then by little; a real leak certifies far more)
            slack = 0.0 if exact else 0.5
            if exact:
                assert not g["violated"]
            assert 0.0 <= g["epsilon_lower"] <= g["spent_at_audit_delta"] + slack
            assert g["spent_at_audit_delta"] >= g["spent"] > 0


def _caught(record: dict[str, Any], observer: str) -> None:
    rows = record["observers"][observer]
    assert record["verdict"] == "violation"
    assert any(g["epsilon_lower"] > g["spent_at_audit_delta"] for g in rows[:-1])
    assert rows[-1]["epsilon_lower"] == 0.0  # still nothing from nothing


# ------------------------------------------------------------------------- IDP-FedAvg


@pytest.mark.parametrize(
    ("extra", "observers"),
    [
        (["randomness=reproducible"], ("third-party",)),
        (
            # continuous shares (discrete ones: tests/test_audit_discrete.py)
            [
                "randomness=secure",
                "algorithm.variant=distributed",
                "aggregation=secure",
                "privacy.noise_shares=continuous",
            ],
            ("third-party", "server"),
        ),
    ],
    ids=["central-reproducible", "distributed-secure"],
)
def test_idp_fedavg_canary_clients(extra: list[str], observers: tuple[str, ...]) -> None:
    session, record = _audit("idp-fedavg", [*IDP, *extra], canaries=50)
    assert record["unit"] == "client" and record["randomness"] == extra[0].split("=")[1]
    _consistent(record, observers)
    rows = record["observers"]["third-party"]
    assert [g["label"] for g in rows] == ["2", "8", CONTROL_LABEL]
    server: Any = session.run.server
    setup = server.setup
    assert [g["canary_rate"] for g in rows[:-1]] == pytest.approx(list(setup.rates))
    # the canary clients went through the mechanism: at the trusted aggregator (central) or
    # riding on the clients (distributed), each sampled at its group's rate
    if "algorithm.variant=distributed" in extra:
        clients: list[Any] = list(session.run.clients.values())
        assert all(isinstance(s, DistributedIdpSilo) for s in clients)
        planted = [s.extra_rows for s in clients]
        assert set(session.plan.host.tolist()) <= set(session.run.clients)
    else:
        assert isinstance(session.run.server, CentralIdpServer)
        planted = [server.extra_rows]
        assert set(session.plan.host.tolist()) == {EVERYWHERE}
    counts = np.concatenate([p.counts for p in planted if p is not None])
    assert counts.sum() > 0 and counts.max() <= 5


@pytest.mark.slow
def test_idp_fedavg_broken_noise_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def breaks(session: AuditSession) -> None:  # the server's sampler draws a tenth
        assert isinstance(session.run.server, CentralIdpServer)
        weaken_noise(monkeypatch)

    _, record = _audit("idp-fedavg", IDP_CLAIM, canaries=200, breaks=breaks)
    _caught(record, "third-party")


def test_idp_fedavg_refuses_what_it_cannot_audit() -> None:
    with pytest.raises(AuditUnsupported, match="without differential privacy"):
        AuditSession.create(
            toy_config("idp-fedavg", [*IDP, "algorithm.method=no-dp"]), AuditSettings(canaries=10)
        )
    with pytest.raises(AuditUnsupported, match="scale"):
        AuditSession.create(
            toy_config("idp-fedavg", [*IDP, "algorithm.method=scale"]), AuditSettings(canaries=10)
        )
    # the central variant's guarantee is against third parties: its trusted aggregator is not
    # an observer the run claims anything against
    with pytest.raises(AuditUnsupported, match="third-party only"):
        AuditSession.create(
            toy_config("idp-fedavg", IDP), AuditSettings(canaries=10, observers=("server",))
        )


# ------------------------------------------------------------------------------ ULDP-FL


@pytest.mark.parametrize(
    "extra",
    [
        ["randomness=reproducible"],
        [
            "algorithm.name=uldp-sgd",
            "randomness=secure",
            "algorithm.weights=enhanced",
            "data.public_user_histograms=true",
        ],
    ],
    ids=["avg-uniform-reproducible", "sgd-enhanced-secure"],
)
def test_uldp_canary_users(extra: list[str]) -> None:
    session, record = _audit("uldp-avg", [*ULDP, *extra])
    assert record["unit"] == "user"
    _consistent(record, ("third-party", "server"))
    silos: list[Any] = list(session.run.clients.values())
    assert all(isinstance(s, UserLevelSilo) and s.extra_rows is not None for s in silos)
    if "algorithm.weights=enhanced" in extra:  # one silo holds each canary user, weight 1
        assert set(session.plan.host.tolist()) <= set(session.run.clients)
        assert {s.extra_weight for s in silos} == {1.0}
        assert sum(s.extra_rows.num_rows for s in silos) == int(session.plan.trained().sum())
    else:  # every silo holds every canary user at weight 1/|S|; one coin per user and round
        assert set(session.plan.host.tolist()) == {EVERYWHERE}
        assert {s.extra_weight for s in silos} == {1 / len(silos)}
        counts = [s.extra_rows.counts for s in silos]
        assert all(np.array_equal(c, counts[0]) for c in counts)
        assert counts[0].min() == 5  # q = 1: sampled every round


def test_uldp_broken_noise_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def breaks(session: AuditSession) -> None:  # every silo's sampler draws a tenth
        weaken_noise(monkeypatch)

    _, record = _audit("uldp-avg", [*ULDP, "randomness=reproducible"], canaries=200, breaks=breaks)
    _caught(record, "third-party")
    _caught(record, "server")


@pytest.mark.slow
def test_uldp_half_the_noise_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Half the claimed noise (not a tenth): the f-DP test rejects the accountant's own curve
    with 2000 canaries, where the correct mechanism is consistent."""

    config = toy_config(
        "uldp-avg",
        [
            "privacy.epsilon_max=3.0",
            "training.rounds=5",
            "randomness=reproducible",
            "lifetime.allow_respend=true",  # two audits of the same synthetic data
            "privacy.noise_shares=continuous",  # the continuous path (discrete: its own file)
        ],
    )
    settings = AuditSettings(canaries=2000, seed=3, space="block", observers=("server",))
    fine = AuditSession.create(config, settings).execute().to_dict()
    assert fine["verdict"] == "consistent"
    session = AuditSession.create(config, settings)
    weaken_noise(monkeypatch, 2.0)  # every silo's sampler draws half the std it is asked for
    record = session.execute().to_dict()
    group = record["observers"]["server"][0]
    assert record["verdict"] == "violation" and group["rejects_claim"]
    assert group["statistic"] == "f-dp" and group["epsilon_lower"] >= group["spent_at_audit_delta"]
    assert record["observers"]["server"][-1]["epsilon_lower"] == 0.0  # the control


def test_uldp_refuses_variants_without_user_vectors() -> None:
    with pytest.raises(AuditUnsupported, match="no canary hook.*uldp-avg, uldp-sgd"):
        AuditSession.create(toy_config("uldp-naive", ULDP), AuditSettings(canaries=10))


# --------------------------------------------------------------------------- PriFedSync


@pytest.mark.parametrize(
    "extra",
    [
        ["randomness=reproducible"],
        [
            "randomness=secure",
            "algorithm.sampler=poisson",
            "algorithm.target_epsilon=[2.0,8.0,8.0]",
        ],
    ],
    ids=["wor-reproducible", "poisson-secure"],
)
def test_prifedsync_canary_records(extra: list[str]) -> None:
    session, record = _audit("prifedsync", extra)
    assert record["unit"] == "record"
    _consistent(record, ("third-party", "server"))
    silos = {c: s for c, s in session.run.clients.items() if isinstance(s, PriFedSyncSilo)}
    plan = session.plan
    for c, silo in silos.items():
        rows = silo.extra_rows
        assert rows is not None
        mine = (plan.host == c) & ~np.array([g.control for g in plan.groups])[plan.group]
        if "algorithm.sampler=poisson" in extra:  # add/remove: the included canaries only
            assert rows.num_rows == int((mine & plan.included).sum())
        else:  # replace-one: every canary of the host, the excluded ones as null records
            assert rows.num_rows == int(mine.sum())
            assert int((rows.values[:, 0] > 0).sum()) == int((mine & plan.included).sum())
    if "algorithm.sampler=poisson" in extra:
        # a group's canaries sit at the clients of that target only
        labels = {g.label: g for g in plan.groups}
        assert set(labels) == {"2", "8", CONTROL_LABEL}
        g2 = [i for i, g in enumerate(plan.groups) if g.label == "2"][0]
        assert set(plan.host[plan.group == g2].tolist()) == {0}


def test_prifedsync_broken_noise_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def breaks(session: AuditSession) -> None:  # every client's sampler draws a tenth
        weaken_noise(monkeypatch)

    _, record = _audit(
        "prifedsync", [*PRIFEDSYNC, "algorithm.sampler=poisson"], canaries=200, breaks=breaks
    )
    _caught(record, "server")


# --------------------------------------------------------------------------- the plan


def test_group_hosts_confine_each_group_and_keep_the_default_draw() -> None:
    groups = [GroupSpec("a", 1.0), GroupSpec("b", 2.0), GroupSpec(CONTROL_LABEL, 0.0, True)]
    pool = np.arange(1000)
    plain = plan_canaries(groups, 50, pool, [0, 1, 2], 1.0, SeededRandomness(4))
    same = plan_canaries(
        groups, 50, pool, [0, 1, 2], 1.0, SeededRandomness(4), group_hosts=[[0, 1, 2]] * 3
    )
    assert np.array_equal(plain.host, same.host)
    narrow = plan_canaries(
        groups, 50, pool, [0, 1, 2], 1.0, SeededRandomness(4), group_hosts=[[2], [0, 1], [0, 1, 2]]
    )
    assert set(narrow.host[narrow.group == 0].tolist()) == {2}
    assert set(narrow.host[narrow.group == 1].tolist()) == {0, 1}
    with pytest.raises(ValueError, match="no host for group b"):
        plan_canaries(groups, 50, pool, [0], 1.0, SeededRandomness(4), group_hosts=[[0], [], [0]])
    # null rows: the excluded canaries of the audited groups, value 0 (never the control's)
    narrow.rates[:] = 0.5
    rows = narrow.rows_for(2, nulls=True)
    at2 = np.flatnonzero((narrow.host == 2) & (narrow.group < 2))
    assert rows.num_rows == at2.size
    assert np.array_equal(rows.values[:, 0], np.where(narrow.included[at2], 1.0, 0.0))
    assert narrow.rows_for(2).num_rows == int(narrow.included[at2].sum())
