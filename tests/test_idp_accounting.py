"""IDP-FedAvg's accounting on the privacy core: one ledger per client, named by its data.

Each client keeps one :class:`pdpfl.ledger.PrivacyLedger` of one unit -- itself -- charged by
the silo template; SCALE's per-group σ in those ledgers is checked against dp-accounting (the
reference code's accountant) and against the SCALE formulas (spec B.2).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from pdpfl.config import config_from_dict
from pdpfl.fl import idp_fedavg as idp
from pdpfl.ledger import PrivacyLedger, PrivacySummary
from pdpfl.privacy.unit import PrivacyUnit, SampledGaussianPlan

BASE = {
    "name": "idp-ledger",
    "seed": 5,
    "randomness": "reproducible",
    "threads": 1,
    "data": {"dataset": "digits", "num_clients": 40, "partition": "iid"},
    "model": {"name": "logreg"},
    "algorithm": {
        "name": "idp-fedavg",
        "clients_per_round": 10,
        "group_budgets": [1.0, 2.0, 3.0],
        "group_ratios": [0.5, 0.3, 0.2],
        "assignment": "exact",
        "local_epochs": 1,
        "local_batch_size": 16,
        "count_noise_ratio": 0.5,
    },
    "privacy": {"delta": 1e-3},
    "training": {"rounds": 4, "local_steps": 1, "optimizer": "sgd", "lr": 0.5},
}


def _build(**algo):
    from pdpfl.fl.algorithm import as_algorithm
    from pdpfl.runtime.simulation import load_federation_for

    config = config_from_dict({**BASE, "algorithm": {**BASE["algorithm"], **algo}})
    federation = load_federation_for(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server, clients = as_algorithm(config.algorithm).build(config, federation)
    return config, federation, server, clients


def dp_accounting_epsilon(q: float, sigma: float, rounds: int, delta: float) -> float:
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), rounds
        )
    )
    return float(acc.get_epsilon(delta))


@pytest.mark.slow
def test_each_client_keeps_one_ledger_of_itself_named_by_its_data():
    config, federation, _, clients = _build()
    setup = clients[0].setup
    for cid, silo in clients.items():
        ledger = silo.ledger
        assert isinstance(ledger, PrivacyLedger) and ledger.n == 1 and ledger.unit == "client"
        assert ledger.ids.tolist() == [federation.clients[cid].name]
        g = setup.group_of(silo.budget)
        assert (
            ledger.budgets[0]
            == silo.budget
            == idp.client_budget(config.algorithm, config.seed, len(clients), cid)
        )
        assert ledger.rates[0] == setup.rates[g]
        assert ledger.noise_multipliers[0] == setup.noise_multipliers[g]
        assert ledger.observers == ("third-party",)  # central: the aggregator is trusted
        assert isinstance(ledger.mechanism, SampledGaussianPlan)
        assert ledger.mechanism.unit is PrivacyUnit.CLIENT
    # the template charges each client every round it is active (third parties do not see
    # who was sampled): after catching up T rounds each spent what SAMPLE certified
    for silo in clients.values():
        silo.catch_up(setup.rounds)
    merged = PrivacySummary.merge(s.privacy_summary() for s in clients.values())
    assert merged.unit == "client" and merged.units == 40 and merged.over_budget("third-party") == 0
    for group in merged.groups:
        b = float(group.label)
        assert 0.99 * b <= group.spent_max["third-party"] <= b
        assert group.info["rate"] == setup.rates[setup.group_of(b)]
        assert group.info["noise_multiplier"] == setup.noise_multiplier
    assert merged.info["noise_multiplier"] == setup.noise_multiplier


def test_distributed_secure_clients_are_accounted_against_the_server_too():
    _, _, _, clients = _build(variant="distributed")
    assert clients[0].ledger.observers == ("third-party",)  # plain summation: shares visible
    config = config_from_dict(
        {
            **BASE,
            "aggregation": "secure",
            "algorithm": {**BASE["algorithm"], "variant": "distributed"},
        }
    )
    from pdpfl.fl.algorithm import as_algorithm
    from pdpfl.runtime.simulation import load_federation_for

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, secure = as_algorithm(config.algorithm).build(config, load_federation_for(config))
    ledger = secure[3].ledger
    assert ledger.observers == ("third-party", "server")
    secure[3].catch_up(2)
    spent = secure[3].spent()
    assert spent["server"] == spent["third-party"] > 0


def test_scale_per_group_sigma_in_the_ledger_equals_the_accountants():
    """SCALE (spec B.2) with adaptive clipping: each client's ledger charges its group's
    effective σ (value σ̄_v·σ_p/σ̄ composed with the count query 2σ_b), which is at least the
    getNoise σ_p of its budget; after T rounds the ledger's ε equals dp-accounting's ε of the
    Poisson-subsampled Gaussian at that σ (up to its coarser order grid) and fits the budget."""
    config, _, _, clients = _build(method="scale")
    setup = clients[0].setup
    q, rounds, delta = 10 / 40, setup.rounds, setup.delta
    sig_p = [idp.noise_for_rate(b, q, delta, rounds) for b in setup.budgets]
    bar, bar_v, factors, eff = idp.scale_noise(sig_p, setup.sizes, setup.count_noise_std)
    assert setup.noise_multiplier == pytest.approx(bar)
    assert list(setup.noise_multipliers) == pytest.approx(eff)
    assert list(setup.clip_factors) == pytest.approx(factors)
    seen = set()
    for silo in clients.values():
        g = setup.group_of(silo.budget)
        ledger = silo.ledger
        assert ledger.noise_multipliers[0] == setup.noise_multipliers[g] >= sig_p[g] * (1 - 1e-12)
        assert ledger.rates[0] == pytest.approx(q)
        if g in seen:
            continue
        seen.add(g)
        silo.catch_up(rounds)
        mine = silo.spent()["third-party"]
        reference = dp_accounting_epsilon(q, float(ledger.noise_multipliers[0]), rounds, delta)
        assert mine <= reference * (1 + 1e-9)  # pdpfl's refined RDP order is at least as tight
        assert mine >= reference * (1 - 2e-2)
        assert mine <= silo.budget
    assert seen == {0, 1, 2}


def test_relaxed_charges_to_eps_max_and_reports_the_clients_own_budget():
    """relaxed accounts everyone against ε_max: a client whose own ε is 1 keeps training after
    it spent 1 (the pre-check enforces ε_max) and is reported over its own budget; strict
    enforces ε_min, so a client with ε = 3 stops at 1 when run past the planned rounds."""
    _, _, _, relaxed = _build(method="relaxed")
    low = next(s for s in relaxed.values() if s.budget == 1.0)
    low.catch_up(low.setup.rounds)
    assert not low.stopped and low.spent()["third-party"] > 1.0
    summary = low.privacy_summary()
    assert summary.over_budget("third-party") == 1 and summary.groups[0].label == "1"
    _, _, _, strict = _build(method="strict")
    high = next(s for s in strict.values() if s.budget == 3.0)
    high.catch_up(3 * high.setup.rounds)
    assert high.stopped and high.spent()["third-party"] <= 1.0
    assert high.privacy_summary().over_budget("third-party") == 0


def test_nonprivate_clients_report_infinite_epsilon_and_are_never_over_their_budget():
    """ε = ∞ clients keep no ledger; the merged summary stays private, with an "inf" group."""
    _, _, _, clients = _build(
        group_budgets=[1.0, math.inf], group_ratios=[0.8, 0.2], clients_per_round=8
    )
    free = [s for s in clients.values() if math.isinf(s.budget)]
    assert len(free) == 8 and all(s.ledger is None and s.rate == 1.0 for s in free)
    merged = PrivacySummary.merge(s.privacy_summary() for s in clients.values())
    assert merged.private and [g.label for g in merged.groups] == ["1", "inf"]
    inf_group = merged.groups[1]
    assert inf_group.spent_max["third-party"] == math.inf and inf_group.over_budget == {
        "third-party": 0
    }
    assert merged.groups[0].spent_max["third-party"] <= 1.0
    back = PrivacySummary.from_dict(merged.to_dict())
    assert back.groups[1].spent_max["third-party"] == math.inf
    # no-dp: nobody is accounted; every finite-budget client is over budget (ε = ∞)
    _, _, _, nodp = _build(method="no-dp")
    merged = PrivacySummary.merge(s.privacy_summary() for s in nodp.values())
    assert not merged.private and merged.over_budget("third-party") == 40


def test_one_unit_ledgers_share_conversions_and_match_a_batched_ledger():
    """Thousands of one-client ledgers convert each (q, σ, count) once per process, with the
    same ε as one ledger of all those units (the same accountant call)."""
    plan = SampledGaussianPlan("client", 1.3, 1e-4, 50)
    rates = np.array([0.02, 0.05, 0.4])
    big = PrivacyLedger(np.full(3, 50.0), rates, plan)
    ones = [
        PrivacyLedger(np.array([50.0]), rates[i : i + 1], plan, ids=np.array([f"c{i}"]))
        for i in range(3)
    ]
    for _ in range(9):
        big.record_round(np.ones(3, bool), np.ones(3, bool))
        for one in ones:
            one.record_round(np.ones(1, bool), np.ones(1, bool))
    np.testing.assert_array_equal(
        big.spent_epsilon(), [float(one.spent_epsilon()[0]) for one in ones]
    )
    # the pre-check may enforce another limit than the unit's own budget
    eps_next = ones[2].spent_epsilon()[0]
    assert not ones[2].would_exceed()[0]
    assert ones[2].would_exceed(budgets=np.array([eps_next]))[0]
    with pytest.raises(ValueError, match="budgets"):
        ones[2].would_exceed(budgets=np.array([1.0, 2.0]))
