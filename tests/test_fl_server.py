"""rPDP-FL server (Algorithm 3): Poisson client sampling from the server's own randomness,
averaging of the summed contributions, Type I view; publication; summation protocols."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.fl.aggregation import PlainSum, check_compatible, sum_contributions
from pdpfl.fl.api import Contribution, PrivacyBoundaryError, ServerAlgorithm, check_contribution
from pdpfl.fl.rpdp import DpFedAvgSetup as Publication
from pdpfl.fl.rpdp import FedAvgServer
from pdpfl.ledger import budget_groups
from pdpfl.randomness import SecureRandomness, SeededRandomness


def _server(rate: float = 0.5, seed: int = 1, randomness=None, **kw) -> FedAvgServer:
    return FedAvgServer(
        [np.zeros(3, np.float32), np.ones((2, 2), np.float32)],
        client_rate=rate,
        randomness=randomness or SeededRandomness(seed),
        **kw,
    )


def test_server_satisfies_the_protocol() -> None:
    assert isinstance(_server(), ServerAlgorithm)


def test_full_participation_selects_everyone() -> None:
    assert _server(1.0).select_clients(0, [3, 1, 2]) == [1, 2, 3]


def test_secure_sampling_is_not_determined_by_the_config() -> None:
    """Two servers with the same configuration draw different client coins (fresh keys)."""
    ids = list(range(64))
    a, b = _server(0.5, randomness=SecureRandomness()), _server(0.5, randomness=SecureRandomness())
    picks_a = [a.select_clients(t, ids) for t in range(5)]
    assert picks_a != [b.select_clients(t, ids) for t in range(5)]


def test_sampling_is_deterministic_per_seed_and_round_and_order_free() -> None:
    s = _server(0.5, seed=7)
    ids = list(range(20))
    assert s.select_clients(4, ids) == s.select_clients(4, ids[::-1])
    assert s.select_clients(4, ids) == _server(0.5, seed=7).select_clients(4, ids)
    rounds = {tuple(s.select_clients(t, ids)) for t in range(10)}
    assert len(rounds) > 1


@settings(max_examples=20)
@given(st.floats(0.05, 0.95), st.integers(0, 2**31))
def test_client_sampling_frequency_matches_lambda(rate: float, seed: int) -> None:
    s = _server(rate, seed=seed)
    ids = list(range(50))
    picks = sum(len(s.select_clients(t, ids)) for t in range(100))
    n = 50 * 100
    # Binomial(5000, λ): 6 standard deviations
    assert abs(picks / n - rate) <= 6 * np.sqrt(rate * (1 - rate) / n)


def test_empty_rounds_happen_and_count() -> None:
    s = _server(0.05, seed=3)
    ids = [0, 1]
    empty = 0
    for t in range(50):
        sel = s.select_clients(t, ids)
        s.record_round(t, sel)
        empty += not sel
    assert empty > 0
    assert s.empty_rounds == empty and s.rounds_done == 50
    assert sum(s.participation.values()) == sum(len(s.select_clients(t, ids)) for t in range(50))


def _contribution(scale: float, weight: float = 1.0) -> Contribution:
    return Contribution(
        [np.full(3, weight * scale, np.float32), np.full((2, 2), -weight * scale, np.float32)],
        weight=weight,
    )


def test_simple_average_and_server_lr() -> None:
    s = _server(server_lr=0.5)
    g = s.initial_params()
    agg = sum_contributions([_contribution(1.0), _contribution(3.0)], g)
    assert agg.count == 2 and agg.weight == 2.0 and agg.contributions is None
    new = s.aggregate(0, g, agg)
    np.testing.assert_allclose(new[0], 0.5 * 2.0)
    np.testing.assert_allclose(new[1], 1.0 - 0.5 * 2.0)


def test_public_weights_give_a_weighted_mean() -> None:
    s = _server()
    g = s.initial_params()
    agg = sum_contributions([_contribution(1.0, 10.0), _contribution(3.0, 30.0)], g)
    new = s.aggregate(0, g, agg)
    np.testing.assert_allclose(new[0], (10 * 1 + 30 * 3) / 40)


class _Transport:
    def __init__(self, replies):
        self.replies = replies

    def fit(self, selected, params, round_index, config):
        return [self.replies[c] for c in selected]


def test_plain_sum_rejects_a_release_with_undeclared_fields() -> None:
    s = _server()
    g = s.initial_params()
    ok = _contribution(1.0)
    leaky = _contribution(1.0)
    leaky.metrics["num_examples"] = 120.0  # a silo size: not declared public
    agg = PlainSum().collect(_Transport({0: ok}), [0], g, 0, {}, s)
    assert agg.count == 1
    with pytest.raises(PrivacyBoundaryError, match="num_examples"):
        PlainSum().collect(_Transport({0: ok, 1: leaky}), [0, 1], g, 0, {}, s)
    extra = _contribution(1.0)
    extra.mean_loss = 0.3  # an attribute smuggled onto the object
    with pytest.raises(PrivacyBoundaryError, match="undeclared fields"):
        check_contribution(extra, frozenset(), 2)
    with pytest.raises(PrivacyBoundaryError, match="only a Contribution"):
        check_contribution({"update": g}, frozenset(), 2)


def test_servers_needing_individual_updates_are_refused_with_hiding_protocols() -> None:
    class Central(FedAvgServer):
        needs_individual_updates = True

    class Hiding(PlainSum):
        name = "hiding"
        hides_individual_updates = True

    central = Central([np.zeros(2, np.float32)], client_rate=1.0, randomness=SeededRandomness(0))
    check_compatible(central, PlainSum())
    with pytest.raises(ValueError, match="needs each silo's update"):
        check_compatible(central, Hiding())
    agg = PlainSum().collect(
        _Transport({0: Contribution([np.ones(2, np.float32)])}),
        [0],
        central.initial_params(),
        0,
        {},
        central,
    )
    assert agg.contributions is not None and len(agg.contributions) == 1


def test_empty_round_keeps_the_model() -> None:
    s = _server()
    g = s.initial_params()
    new = s.aggregate(0, g, sum_contributions([], g))
    for a, b in zip(new, g, strict=True):
        np.testing.assert_array_equal(a, b)
    assert new[0] is not g[0]


def test_server_state_round_trip() -> None:
    s = _server(0.5)
    for t in range(5):
        s.record_round(t, s.select_clients(t, [0, 1, 2]))
    t2 = _server(0.5)
    t2.load_state_dict(s.state_dict())
    assert t2.state_dict() == s.state_dict()


def test_bad_server_arguments() -> None:
    with pytest.raises(ValueError, match="client_rate"):
        _server(0.0)


def test_budget_groups_levels_and_bins() -> None:
    idx, labels = budget_groups(np.array([5.0, 0.1, 1.0, 0.1]))
    assert labels == ["0.1", "1", "5"]
    assert idx.tolist() == [2, 0, 1, 0]
    cont = np.linspace(0.1, 12, 100)
    idx, labels = budget_groups(cont)
    assert len(labels) == 7 and idx.min() >= 0 and idx.max() < 7
    assert np.all(np.diff(idx) >= 0)  # bins are ordered by budget


def _pub(**kw) -> Publication:
    base = dict(
        mode="uniform",
        noise_multiplier=1.0,
        delta=1e-5,
        local_steps=2,
        rounds=3,
        client_rate=1.0,
        max_grad_norm=1.0,
    )
    return Publication(**{**base, **kw})


def test_uniform_publication_drops_records_below_epsilon() -> None:
    pub = _pub(uniform_epsilon=1.0, uniform_rate=0.3)
    q = pub.record_rates(np.array([0.1, 1.0, 5.0]))
    assert q.tolist() == [0.0, 0.3, 0.3]


def test_publication_round_trip_and_non_private_has_no_rates() -> None:
    pub = _pub(uniform_epsilon=2.0, uniform_rate=0.1)
    assert Publication.from_dict(pub.to_dict()) == pub
    with pytest.raises(ValueError, match="non-private"):
        _pub(mode="non-private").record_rates(np.ones(2))
