"""Noise shares that never fall short of what the ledgers charge (issue #22, item 2).

ULDP-AVG/SGD silos and IDP-FedAvg's distributed clients each add only a *share* of the Gaussian
noise. The published algorithms size it for every share to arrive (σ²C²/|S|, σ_v²C²/M), so a
dropout released less noise than the ledgers charge (the review measured σ 4.27 instead of 5
with one of four silos lost). Each share is now σ²C²/t with t = ``share_threshold(config, n)``,
and a round releases a sum only with at least t shares. Checked here:

* exactly: every admissible set of survivors (≥ t of n) sums to at least the accounted
  variance, and the old sizing does not;
* statistically: the noise of a round that lost silos, read from the released sum (χ² bounds,
  false-alarm probability 1e-6 per check, power to see the old sizing);
* the ledgers' ε is that of the noise floor σ, never below the ε of the noise a round with
  dropouts really released;
* in-process faults: a silo that raises mid-round is dropped; the round releases with ≥ t
  shares or produces no aggregate (model and C_t kept), under plain and secure summation.

The Flower half (real SIGKILLs) is in ``tests/test_flower_noise_shares.py``.
"""

from __future__ import annotations

import itertools
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from pdpfl.config import ConfigError, config_from_dict
from pdpfl.fl.aggregation import (
    PlainSum,
    protocol_from_config,
    share_std,
    share_threshold,
    survivor_threshold,
    threshold_of,
)
from pdpfl.fl.algorithm import build_federation_algorithms
from pdpfl.fl.idp_fedavg import DistributedIdpSilo
from pdpfl.fl.uldp import UserLevelSilo
from pdpfl.privacy.uldp import user_epsilon
from pdpfl.privacy.uldp_discrete import DiscreteUserLevelPlan
from pdpfl.runtime.loop import run_federation
from pdpfl.runtime.simulation import InProcessTransport, load_federation_for

pytestmark = pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning")

SIGMA, CLIP, DELTA = 2.0, 1.0, 1e-5

ULDP = {
    "name": "uldp-shares",
    "seed": 5,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 4, "options": {"num_users": 16}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "uldp-avg"},
    "privacy": {"noise_multiplier": SIGMA, "delta": DELTA},
    "training": {"rounds": 3, "local_steps": 1, "lr": 0.3, "batch_size": 8, "max_grad_norm": CLIP},
}

#: The continuous option's arithmetic (σ²C²/t float shares); discrete shares, the default, are
#: sized by their integer encoding (tests/test_discrete_shares.py) and run the fault tests below.
ULDP_CONTINUOUS = {**ULDP, "privacy": {**ULDP["privacy"], "noise_shares": "continuous"}}

IDP = {
    "name": "idp-shares",
    "seed": 5,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "digits", "num_clients": 6, "partition": "iid"},
    "model": {"name": "logreg"},
    "algorithm": {
        "name": "idp-fedavg",
        "variant": "distributed",
        "clients_per_round": 3,
        "group_budgets": [4.0, 8.0],
        "group_ratios": [0.5, 0.5],
        "assignment": "exact",
        "local_epochs": 1,
        "local_batch_size": 16,
        "count_noise_ratio": 1.0,
    },
    "privacy": {"delta": 1e-3},
    "training": {"rounds": 3, "local_steps": 1, "optimizer": "sgd", "lr": 0.5},
}


IDP_CONTINUOUS = {**IDP, "privacy": {**IDP["privacy"], "noise_shares": "continuous"}}


def _build(base: dict, *overrides: str) -> tuple[Any, Any, dict[int, Any]]:
    config = config_from_dict(base, list(overrides))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server, clients = build_federation_algorithms(config, load_federation_for(config))
    return config, server, clients


class Losing(InProcessTransport):
    """Each silo's ``fit`` alone; a silo in ``lost[round]`` is dropped after it computed (its
    template duties ran, the ledger charged), as if its reply never arrived; a silo whose
    ``fit`` raises is dropped the same way (a crash mid-round)."""

    def __init__(self, clients: dict[int, Any], lost: dict[int, set[int]] | None = None) -> None:
        super().__init__(clients)
        self.lost = lost or {}
        self.crashed: list[tuple[int, int]] = []

    def fit(self, selected, params, round_index, config):
        out = []
        for c in selected:
            try:
                contribution = self.clients[c].fit(params, round_index, config)
            except SiloCrash:
                self.crashed.append((int(round_index), int(c)))
                continue
            if c not in self.lost.get(int(round_index), set()):
                out.append(contribution)
        return out


class SiloCrash(RuntimeError):
    """A silo process dying in the middle of its round (after its charge)."""


# ----------------------------------------------------------------------- the rule itself


def test_share_threshold_is_t_capped_at_the_silos_asked() -> None:
    config = config_from_dict(ULDP, [])
    assert [share_threshold(config, n) for n in (1, 2, 3, 4, 10, 100)] == [1, 2, 2, 3, 7, 67]
    assert all(share_threshold(config, n) == threshold_of(config, n) for n in range(2, 50))
    strict = config_from_dict(ULDP, ["secure.threshold=1.0"])
    assert share_threshold(strict, 7) == 7
    with pytest.raises(ValueError, match="n:"):
        share_threshold(config, 0)
    assert share_std(6.0, 4) == pytest.approx(3.0)
    assert share_std(6.0, 4, announced=9) == pytest.approx(3.0)  # never less noise
    assert share_std(6.0, 4, announced=1) == pytest.approx(6.0)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 9])
def test_plain_summation_refuses_fewer_shares_than_they_were_sized_for(n: int) -> None:
    """PlainSum releases a distributed-noise sum exactly when it holds ≥ share_threshold
    contributions (a lone silo asked adds all the noise, so it is released)."""
    config = config_from_dict(ULDP, [])
    t = share_threshold(config, n)

    class Shares:
        public_metrics: frozenset[str] = frozenset()
        needs_individual_updates = False
        distributed_noise = True

    class Stub:
        def fit(self, params, round_index, config):
            from pdpfl.fl.api import Contribution

            return Contribution(update=[np.ones(2, np.float32)])

    params = [np.zeros(2, np.float32)]
    server: Any = Shares()
    for m in range(n + 1):
        transport = Losing({c: Stub() for c in range(n)}, {0: set(range(m, n))})
        agg = PlainSum().collect(transport, list(range(n)), params, 0, {}, server)
        assert agg.count == (m if m >= t else 0)


# ------------------------------------------------------------ exact: every admissible set


def test_every_admissible_set_of_uldp_survivors_carries_the_accounted_noise() -> None:
    """|S| = 4, t = 3: any 3 or 4 shares sum to ≥ σ²C²; the old σ²C²/|S| shares did not."""
    config, server, clients = _build(ULDP_CONTINUOUS)
    n, t = len(clients), server.setup.survivors
    assert t == share_threshold(config, n) == 3
    variance = {c: s.share_std({}) ** 2 for c, s in clients.items()}
    accounted = (SIGMA * CLIP) ** 2
    for m in range(1, n + 1):
        for survivors in itertools.combinations(clients, m):
            released = sum(variance[c] for c in survivors)
            if m >= t:
                assert released >= accounted * (1 - 1e-12)
            else:  # refused by every protocol: could fall short
                assert released < accounted
    old = t * accounted / n  # the published sizing with one of four silos lost
    assert old < accounted
    assert math.sqrt(old) / CLIP == pytest.approx(SIGMA * math.sqrt(3 / 4))
    # σ of the measurement: |S| = 4, σ = 5, one silo lost → 4.33 (4.27 measured)
    assert 5 * math.sqrt(3 / 4) == pytest.approx(4.33, abs=0.01)
    # the server observer: public enhanced weights leave it σ/√t, not σ/√|S|
    _, enhanced, _ = _build(
        ULDP_CONTINUOUS, "algorithm.weights=enhanced", "data.public_user_histograms=true"
    )
    assert enhanced.observer_noise["server"] == pytest.approx(SIGMA / math.sqrt(t))


def test_every_admissible_set_of_idp_survivors_carries_the_accounted_noise() -> None:
    """N = 6 clients, t = 4: value and count shares of any ≥ 4 clients reach σ_v²C² and σ_b²."""
    config, server, clients = _build(IDP)
    setup = server.setup
    n, t = len(clients), setup.survivors
    assert t == share_threshold(config, n) == 4 and setup.asked_per_round == n
    value = setup.value_noise_multiplier * setup.initial_clip
    count = setup.count_noise_std
    per_value = share_std(value, t) ** 2
    per_count = share_std(count, t) ** 2
    for m in range(t, n + 1):
        assert m * per_value >= value**2 * (1 - 1e-12)
        assert m * per_count >= count**2 * (1 - 1e-12)
    assert t * value**2 / n < value**2  # the old M = N − tolerated_dropouts (0) fell short


def test_the_old_tolerated_dropouts_field_is_refused_with_the_replacement() -> None:
    with pytest.raises(ConfigError, match="tolerated_dropouts: removed.*secure.threshold"):
        config_from_dict(IDP, ["algorithm.tolerated_dropouts=1"])


# --------------------------------------------------------- statistical: the released noise


def _chi2_bounds(samples: int, p: float = 1e-6) -> tuple[float, float]:
    """Bounds on mean(x²)/Var for ``samples`` N(0, Var) values, each violated w.p. ≤ p."""
    return (
        float(stats.chi2.ppf(p, samples)) / samples,
        float(stats.chi2.ppf(1 - p, samples)) / samples,
    )


def test_a_uldp_round_that_lost_a_silo_releases_at_least_the_accounted_noise(monkeypatch) -> None:
    """Noise-only releases (no user of the round at any silo): the released sum of 3 of 4 silos
    has per-coordinate variance 3/t·σ²C² = σ²C² -- at least the accounted σ²C², where the
    published σ²C²/|S| shares gave 3/4 of it (the check has the power to tell)."""
    monkeypatch.setattr(
        UserLevelSilo, "selected_users", lambda self, config: np.zeros(0, dtype=np.int64)
    )
    rounds = 4
    config, server, clients = _build(ULDP, f"rounds={rounds}")
    transport = Losing(clients, {r: {r % 4} for r in range(rounds)})
    params = server.initial_params()
    sums = []
    for r in range(rounds):
        agg = PlainSum().collect(
            transport, list(clients), params, r, server.round_config(r), server
        )
        assert agg.count == 3
        sums.append(np.concatenate([np.ravel(a).astype(np.float64) for a in agg.total]))
    noise = np.concatenate(sums)
    accounted = (SIGMA * CLIP) ** 2
    lo, hi = _chi2_bounds(noise.size)
    ratio = float(np.mean(noise**2)) / accounted
    assert ratio >= lo, f"released variance {ratio:.3f}·σ²C² is below the accounted σ²C²"
    assert ratio <= hi * 3 / server.setup.survivors
    assert 3 / 4 < lo  # the old sizing would have failed this check


def test_an_idp_round_that_lost_clients_releases_at_least_the_accounted_noise(
    monkeypatch,
) -> None:
    """Clients not sampled release only their shares: 4 of 6 survivors (t = 4) carry σ_v²C²;
    the old σ_v²C²/N shares gave 4/6 of it."""
    monkeypatch.setattr(DistributedIdpSilo, "coin", lambda self, round_index: False)
    rounds = 4
    config, server, clients = _build(IDP_CONTINUOUS, f"rounds={rounds}", "algorithm.clipping=fixed")
    transport = Losing(clients, {r: {r % 6, (r + 3) % 6} for r in range(rounds)})
    params = server.initial_params()
    sums = []
    for r in range(rounds):
        agg = PlainSum().collect(
            transport, list(clients), params, r, server.round_config(r), server
        )
        assert agg.count == 4
        sums.append(np.concatenate([np.ravel(a).astype(np.float64) for a in agg.total]))
    noise = np.concatenate(sums)
    accounted = (server.setup.value_noise_multiplier * server.setup.initial_clip) ** 2
    lo, hi = _chi2_bounds(noise.size)
    ratio = float(np.mean(noise**2)) / accounted
    assert lo <= ratio <= hi
    assert 4 / 6 < lo


# ----------------------------------------------------------------------- the ledgers' ε


def test_the_ledgers_charge_the_noise_floor_never_less_than_a_dropout_round_released(
    tmp_path: Path,
) -> None:
    """Three rounds, one silo of four lost in each: the user ledger's ε is that of σ (the
    floor any released sum holds); the noise really released (3 shares of σ²C²/3) has ε no
    larger. With the published σ²C²/|S| shares the release had σ√(3/4): ε above the ledger's."""
    config, server, clients = _build(ULDP_CONTINUOUS)
    transport = Losing(clients, {0: {3}, 1: {0}, 2: {2}})
    result = run_federation(config, server, transport, tmp_path, progress=False)
    assert [m["contributions"] for m in result["metrics"]] == [3, 3, 3]
    spent = result["privacy"].spent_max("third-party")
    assert spent == pytest.approx(user_epsilon(SIGMA, DELTA, 3), rel=1e-9)
    shares = [s.share_std({}) ** 2 for s in clients.values()]
    released_sigma = math.sqrt(min(sum(c) for c in itertools.combinations(shares, 3))) / CLIP
    assert released_sigma >= SIGMA * (1 - 1e-12)
    assert user_epsilon(released_sigma, DELTA, 3) <= spent * (1 + 1e-9)
    old_sigma = SIGMA * math.sqrt(3 / 4)
    assert user_epsilon(old_sigma, DELTA, 3) > spent  # what the old sizing really cost


def test_each_idp_client_ledger_charges_the_noise_floor(tmp_path: Path) -> None:
    """The clients' own ledgers charge σ (their group's multiplier); a round with 4 of 6
    clients released value noise σ_v·C·√(4/t) ≥ σ_v·C and count noise ≥ σ_b."""
    config, server, clients = _build(IDP_CONTINUOUS)
    transport = Losing(clients, {0: {0, 1}, 1: {2, 3}, 2: {4, 5}})
    result = run_federation(config, server, transport, tmp_path, progress=False)
    assert [m["contributions"] for m in result["metrics"]] == [4, 4, 4]
    setup = server.setup
    ledgers = [s.ledger for s in clients.values() if s.ledger is not None]
    assert ledgers
    for ledger in ledgers:
        assert float(ledger.noise_multipliers[0]) == pytest.approx(setup.noise_multiplier)
        assert int(ledger.counts["third-party"][0]) == 3  # every round, lost or not
        q = float(ledger.rates[0])
        assert float(ledger.spent_epsilon("third-party")[0]) == pytest.approx(
            user_epsilon(setup.noise_multiplier, setup.delta, 3, q), rel=1e-3
        )
    # what a round released: 4 value shares of σ_v²C²/t and 4 count shares of σ_b²/t, t = 4
    assert 4 * share_std(1.0, setup.survivors) ** 2 >= 1.0


# --------------------------------------------------------- faults in the simulator's runs


def _crash_in(rounds: dict[int, set[int]], cls: type, method: str, monkeypatch) -> None:
    """``cls.method`` raises SiloCrash for silo c in round r when c ∈ rounds[r]."""
    original = getattr(cls, method)

    def crashing(self, *args, **kwargs):
        plan_or_job = args[0] if method == "release_update" else args[1]
        r = int(plan_or_job.round_index)
        if self.client_id in rounds.get(r, set()):
            raise SiloCrash(f"silo {self.client_id} died in round {r}")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, crashing)


def _watch_aggregates(server) -> list[tuple[int, int, list, list]]:
    seen: list[tuple[int, int, list, list]] = []
    original = server.aggregate

    def aggregate(t, params, agg):
        new = original(t, params, agg)
        seen.append((int(t), agg.count, [np.array(p) for p in params], [np.array(p) for p in new]))
        return new

    server.aggregate = aggregate
    return seen


@pytest.mark.parametrize("shares", ["continuous", "discrete"])
@pytest.mark.parametrize("aggregation", ["plain", "secure"])
def test_a_uldp_silo_dying_mid_round_leaves_t_shares_or_no_aggregate(
    aggregation: str, shares: str, tmp_path: Path, monkeypatch
) -> None:
    """Four silos (t = 3). Round 1: silo 3 dies after its charge -- 3 shares are released, at
    full noise (plain summation; secure summation's consistency round needs q = ⌈(4 + 3)/2⌉ = 4
    silos, so the round has no aggregate there). Round 2: silos 2 and 3 die -- fewer than t: no
    aggregate, the model is kept. Under secure summation the dying silos never upload (the
    protocol's own dropout path). Both kinds of shares: float Gaussian, and exact discrete Gaussian
    in Z_{2^b}."""
    _crash_in({1: {3}, 2: {2, 3}}, UserLevelSilo, "step", monkeypatch)
    config, server, clients = _build(
        ULDP, f"aggregation={aggregation}", f"privacy.noise_shares={shares}"
    )
    transport = Losing(clients)
    if aggregation == "secure":
        crash = {1: {3}, 2: {2, 3}}

        class Dying(Losing):
            def exchange(self, protocol, stage, requests, round_index):
                if stage == "upload":  # the silo dies computing its masked upload
                    dead = crash.get(int(round_index), set())
                    requests = {c: r for c, r in requests.items() if c not in dead}
                return super().exchange(protocol, stage, requests, round_index)

        transport = Dying(clients)
    seen = _watch_aggregates(server)
    result = run_federation(config, server, transport, tmp_path, progress=False)
    assert type(protocol_from_config(config)).__name__ == (
        "PlainSum" if aggregation == "plain" else "SecureSum"
    )
    released = [4, 3, 0] if aggregation == "plain" else [4, 0, 0]
    assert [m["contributions"] for m in result["metrics"]] == released
    t = server.setup.survivors
    for r, count, before, after in seen:
        if count:
            assert count >= t  # released: ≥ t shares of σ²C²/t each
        else:  # no aggregate: nothing moved
            assert released[r] == 0
            for a, b in zip(before, after, strict=True):
                np.testing.assert_array_equal(a, b)
    # the server's ledger charged all three rounds (write-ahead), at the noise floor σ
    spent = result["privacy"].spent_max("third-party")
    if shares == "continuous":
        assert spent == pytest.approx(user_epsilon(SIGMA, DELTA, 3), rel=1e-9)
    else:  # the distributed discrete Gaussian of t shares, never less than σ of noise
        assert isinstance(server.plan, DiscreteUserLevelPlan)
        assert server.plan.noise_multiplier >= SIGMA * (1 - 1e-12)
        planned = server.plan.planned_epsilon(np.array([1.0]), "third-party")[0]
        assert spent == pytest.approx(planned, rel=1e-9)
        assert spent >= user_epsilon(SIGMA, DELTA, 3) * (1 - 1e-9)


@pytest.mark.parametrize("shares", ["continuous", "discrete"])
def test_an_idp_client_dying_mid_round_leaves_t_shares_or_no_aggregate(
    shares: str, tmp_path: Path, monkeypatch
) -> None:
    """Six clients (t = 4). Round 1: two die (4 released); round 2: three die (3 < t: no
    aggregate -- the model and the clip norm C_t are kept)."""
    _crash_in({1: {0, 5}, 2: {1, 2, 3}}, DistributedIdpSilo, "release_update", monkeypatch)
    config, server, clients = _build(IDP, f"privacy.noise_shares={shares}")
    assert (server.share_encoding is not None) == (shares == "discrete")
    seen = _watch_aggregates(server)
    result = run_federation(config, server, Losing(clients), tmp_path, progress=False)
    assert [m["contributions"] for m in result["metrics"]] == [6, 4, 0]
    assert server.clip_history[-1] == server.clip_norm  # round 2 did not move C_t
    r, count, before, after = seen[-1]
    assert (r, count) == (2, 0)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    assert survivor_threshold(6) == server.setup.survivors == 4


# ------------------------------------------------------------------ Flower's launcher


def test_run_flower_refuses_per_message_mode_with_a_secret_keeping_protocol(
    tmp_path: Path,
) -> None:
    """Up front, before any process starts or any file is written: naming ``--mode warm``."""
    pytest.importorskip("flwr")
    from pdpfl.runtime.flower.launcher import check_mode, run_flower

    secure = config_from_dict(ULDP, ["aggregation=secure"])
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"mode: per-message.*'secure'.*--mode warm"):
        run_flower(secure, out, mode="per-message")
    assert not out.exists()
    private = config_from_dict(ULDP, ["algorithm.weights=private"])
    with pytest.raises(ValueError, match="'private-weighting'.*--mode warm"):
        check_mode(private, "per-message")
    check_mode(config_from_dict(ULDP, []), "per-message")  # plain summation: nothing to keep
    check_mode(secure, "warm")
