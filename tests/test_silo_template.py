"""The silo template owns the round duties: catch-up, pre-check, charge before the step,
refusal of a round already accounted, release checks, resume; and the in-process transport
batches the two-phase API without changing any result."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from pdpfl.fl.api import Contribution, Params, PrivacyBoundaryError, Scalars
from pdpfl.fl.template import BatchedSilo, NonFiniteError, RoundPlan, Silo
from pdpfl.ledger import PrivacyLedger
from pdpfl.privacy.unit import SampledGaussianPlan
from pdpfl.runtime.simulation import InProcessTransport

PLAN = SampledGaussianPlan("client", 2.0, 1e-5, 10)


class Toy(Silo):
    """One client unit; the step records what the ledger held when it ran."""

    def __init__(
        self, client_id: int, budget: float = 100.0, rate: float = 0.5, value: float = 1.0
    ) -> None:
        ledger = PrivacyLedger(
            np.array([budget]), np.array([rate]), PLAN, ids=np.array([f"c{client_id}"])
        )
        super().__init__(client_id, ledger, adversary="third-party")
        self.value = value
        self.seen: list[tuple[int, int]] = []

    def step(self, global_params: Params, plan: RoundPlan) -> Contribution:
        assert self.ledger is not None
        self.seen.append((plan.round_index, int(self.ledger.third_party_rounds[0])))
        return Contribution(update=[np.full(2, self.value * plan.active.sum(), np.float32)])

    def test(self, params: Params) -> Scalars:
        return {"loss": 0.0, "accuracy": 1.0, "n": 1}


def test_the_round_is_charged_before_the_step_runs_and_catch_up_comes_first() -> None:
    silo = Toy(0)
    silo.evaluate([np.zeros(2, np.float32)], 1, {})  # rounds 0 and 1: not asked, caught up
    out = silo.fit([np.zeros(2, np.float32)], 3, {})
    # rounds 0..3 are charged to third parties (active every round) before round 3's step
    assert silo.seen == [(3, 4)]
    assert silo.participations == 1 and silo.next_round == 4
    np.testing.assert_array_equal(out.update[0], [1.0, 1.0])


def test_a_round_already_accounted_is_refused() -> None:
    silo = Toy(0)
    silo.fit([np.zeros(2, np.float32)], 0, {})
    with pytest.raises(ValueError, match="already accounted"):
        silo.fit([np.zeros(2, np.float32)], 0, {})
    assert silo.ledger is not None and silo.ledger.rounds_recorded == 1


def test_a_unit_that_would_overspend_sits_out() -> None:
    ledger = PrivacyLedger(np.array([1e9]), np.array([0.5]), PLAN)
    ledger.record_round(np.array([True]), np.array([True]))
    eps_one = float(ledger.spent_epsilon("third-party")[0])
    silo = Toy(0, budget=eps_one * 1.01)  # room for one round, not two
    first = silo.fit([np.zeros(2, np.float32)], 0, {})
    second = silo.fit([np.zeros(2, np.float32)], 1, {})
    assert first.update[0][0] == 1.0 and second.update[0][0] == 0.0  # no active unit
    assert silo.ledger is not None and silo.ledger.stopped[0]
    assert silo.ledger.spent_epsilon("third-party")[0] <= eps_one * 1.01


def test_a_non_finite_update_is_never_released() -> None:
    silo = Toy(0, value=float("nan"))
    with pytest.raises(NonFiniteError, match="not finite"):
        silo.fit([np.zeros(2, np.float32)], 0, {})
    assert silo.ledger is not None and silo.ledger.rounds_recorded == 1  # the charge stays


def test_an_undeclared_metric_is_never_released() -> None:
    class Leaky(Toy):
        def step(self, global_params: Params, plan: RoundPlan) -> Contribution:
            return Contribution(update=[np.zeros(2, np.float32)], metrics={"n_train": 7.0})

    with pytest.raises(PrivacyBoundaryError, match="not declared public"):
        Leaky(0).fit([np.zeros(2, np.float32)], 0, {})


def test_state_round_trip_resumes_exactly() -> None:
    a = Toy(0)
    for t in range(3):
        a.fit([np.zeros(2, np.float32)], t, {})
    b = Toy(0)
    b.load_state_dict(a.state_dict())
    assert b.next_round == 3 and b.participations == 3
    with pytest.raises(ValueError, match="already accounted"):
        b.fit([np.zeros(2, np.float32)], 2, {})
    assert a.ledger is not None and b.ledger is not None
    np.testing.assert_array_equal(
        a.ledger.spent_epsilon("third-party"), b.ledger.spent_epsilon("third-party")
    )


class Batched(BatchedSilo[float, float]):
    calls: list[int] = []

    def __init__(self, client_id: int) -> None:
        super().__init__(client_id, None)
        self.tested = 0

    def prepare(self, global_params: Params, plan: RoundPlan) -> float:
        return float(global_params[0][0]) + self.client_id

    @classmethod
    def train_batch(cls, jobs: Sequence[float]) -> list[float]:
        cls.calls.append(len(jobs))
        return [2.0 * j for j in jobs]

    def finish(self, job: float, result: float) -> Contribution:
        return Contribution(update=[np.array([result], np.float32)])

    def test(self, params: Params) -> Scalars:
        self.tested += 1
        return {"loss": 0.0, "accuracy": self.client_id / 4, "n": 1}


def test_the_transport_batches_silos_and_gets_the_same_contributions() -> None:
    silos = {i: Batched(i) for i in range(4)}
    alone = [silos[i].fit([np.ones(1, np.float32)], 0, {}) for i in range(4)]
    Batched.calls.clear()
    fresh = {i: Batched(i) for i in range(4)}
    out = InProcessTransport(fresh).fit([0, 1, 2, 3], [np.ones(1, np.float32)], 0, {})
    assert Batched.calls == [4]  # one batched call for the four silos
    for a, b in zip(alone, out, strict=True):
        np.testing.assert_array_equal(a.update[0], b.update[0])
    assert all(s.next_round == 1 for s in fresh.values())
    evals = InProcessTransport(fresh).evaluate([0, 1, 2, 3], [np.ones(1, np.float32)], 0, {})
    assert [evals[i]["accuracy"] for i in range(4)] == [0.0, 0.25, 0.5, 0.75]
