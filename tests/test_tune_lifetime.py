"""A private hyper-parameter search as ONE sealed budget-store entry (Papernot & Steinke 2022).

The entry holds each unit's RDP curve of the whole search per observer; it composes with the
store's run entries by RDP addition. Checked against independent computations: the tune plan's
own closed form (pdpfl.tune.accounting), the run's curve from the RDP accountant added by hand,
and the capped search's δ slack solved directly. Then the refusals, the seal, and ``pdpfl tune``
on data whose lifetime budgets are enforced.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.integrity import IntegrityError
from pdpfl.ledger import PrivacyLedger
from pdpfl.ledger.budget_store import BudgetStore
from pdpfl.ledger.lifetime import (
    LifetimeAccount,
    SearchOverBudget,
    charge_search,
    lifetime_table,
)
from pdpfl.privacy import TrainingPlan
from pdpfl.privacy.accountant import RdpAccountant
from pdpfl.privacy.conversion import rdp_to_epsilon
from pdpfl.privacy.lifetime import CurveCharges, RunCharges, compose_epsilon, convert_with_tail
from pdpfl.privacy.mechanisms import Composed
from pdpfl.privacy.tuning import PoissonTrials
from pdpfl.testing import toy_config
from pdpfl.tune import TuneRefused, tune
from pdpfl.tune.accounting import ORDERS, ledger_curves, search_cost

PLAN = TrainingPlan(noise_multiplier=2.0, delta=1e-3, steps=4, rounds=3, client_rate=1.0)
IDS = np.array([11, 12, 13])
RATES = np.array([0.05, 0.2, 0.2])
BUDGETS = np.array([20.0, 20.0, 20.0])


def _search_curves(scale: float) -> np.ndarray:
    """A made-up search curve per unit (a Gaussian's α/(2s²), one scale per unit)."""
    return np.stack([ORDERS * scale * (1 + u) for u in range(IDS.size)])


def _run(root: Path, run: str, rounds: int, budgets: np.ndarray = BUDGETS) -> PrivacyLedger:
    ledger = PrivacyLedger(budgets, RATES, PLAN, ids=IDS)
    store = BudgetStore(root, "silo-0", "data").open()
    account = LifetimeAccount.attach(ledger, store, {"run": run}, enforce=True)
    for _ in range(rounds):
        active = ~ledger.would_exceed()
        ledger.record_round(participated=active, active=active)
    account.close()
    return ledger


def _charge(root: Path, curves: np.ndarray, **kw):
    with BudgetStore(root, "silo-0", "data").open() as store:
        return charge_search(
            store,
            {"run": "tune-1", "unit": "record"},
            IDS,
            kw.pop("budgets", BUDGETS),
            {"third-party": curves, "server": curves},
            ORDERS,
            delta=1e-3,
            **kw,
        )


# ----------------------------------------------------------------------- composition
def test_a_search_entry_composes_with_a_run_by_rdp_addition(tmp_path: Path) -> None:
    _run(tmp_path, "a", 3)
    curves = _search_curves(0.01)
    spent = _charge(tmp_path, curves)
    # independently: the run's curve (3 rounds of its event per record) plus the search's,
    # converted once at δ
    acc = RdpAccountant(ORDERS, refine=False)
    for u in range(IDS.size):
        run = acc.rdp(Composed(PLAN.round_event(RATES[u : u + 1], "third-party"), 3))[0]
        want, _ = rdp_to_epsilon((run + curves[u])[None, :], ORDERS, 1e-3)
        assert spent["third-party"][u] == pytest.approx(float(want[0]), rel=1e-9)
    table = lifetime_table(tmp_path)
    order = np.argsort(table["id"].astype(int))
    np.testing.assert_allclose(table["epsilon_third_party"][order], spent["third-party"])
    assert table["runs"].tolist() == [2, 2, 2]


def test_a_later_run_sees_the_search_in_its_prior(tmp_path: Path) -> None:
    curves = _search_curves(0.01)
    _charge(tmp_path, curves)
    alone = _run(tmp_path / "fresh", "b", 2).spent_epsilon("third-party")
    after = _run(tmp_path, "b", 2).lifetime_spent("third-party")
    assert np.all(after > alone)  # composed with the search, not ignored
    parts = [
        CurveCharges(curves, ORDERS),
        RunCharges(PLAN, RATES, np.full(3, 2.0), np.full(3, 2)),
    ]
    np.testing.assert_allclose(after, compose_epsilon(parts, "third-party", 1e-3), rtol=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    scale=st.floats(1e-4, 0.2),
    tail=st.floats(1e-9, 1e-5),
)
def test_the_capped_search_pays_its_tail_in_delta(scale: float, tail: float) -> None:
    """ε = conv(δ − (1 + e^ε')·p) with ε ≤ ε' (the statement that makes the capped search
    (ε, δ)-DP), never below the uncapped conversion at δ."""
    curve = ORDERS[None, :] * scale
    delta = 1e-3
    eps = float(convert_with_tail(curve, ORDERS, delta, tail)[0])
    plain = float(rdp_to_epsilon(curve, ORDERS, delta)[0][0])
    assert eps >= plain - 1e-12
    left = delta - (1 + math.exp(eps)) * tail
    again = float(rdp_to_epsilon(curve, ORDERS, left)[0][0])
    assert again <= eps + 1e-9
    assert eps <= float(rdp_to_epsilon(curve, ORDERS, left - 1e-9 * delta)[0][0]) + 1e-6


def test_a_search_and_a_group_run_fall_back_to_basic_composition() -> None:
    """GROUP-k has no curve on the search's orders: each side at δ/2, summed."""
    from pdpfl.privacy.unit import GroupPlan

    group = GroupPlan(2.0, 3, 1e-3, 4, group_size=3, conversion="rdp")
    run = RunCharges(group, np.array([0.1]), np.array([2.0]), np.array([4]))
    curve = CurveCharges(ORDERS[None, :] * 0.01, ORDERS)
    got = float(compose_epsilon([run, curve], "third-party", 1e-3)[0])
    own = float(compose_epsilon([run], "third-party", 5e-4)[0])
    search = float(rdp_to_epsilon(ORDERS[None, :] * 0.01, ORDERS, 5e-4)[0][0])
    assert got == pytest.approx(own + search, rel=1e-9)


# ----------------------------------------------------------------- refusal and the seal
def test_a_search_over_a_lifetime_budget_is_refused_and_charges_nothing(tmp_path: Path) -> None:
    ledger = _run(tmp_path, "a", 3)
    tight = ledger.spent_epsilon("third-party") * 1.05
    before = BudgetStore(tmp_path, "silo-0", "data").open(lock=False).generation
    with pytest.raises(SearchOverBudget, match=r"3 of 3 record\(s\) of silo-0 .* 11 \(budget"):
        _charge(tmp_path, _search_curves(0.01), budgets=tight)
    store = BudgetStore(tmp_path, "silo-0", "data").open(lock=False)
    assert store.generation == before and sorted(store.runs) == ["a"]
    # not enforced (public data): written and reported, over budget
    spent = _charge(tmp_path, _search_curves(0.01), budgets=tight, enforce=False)
    assert np.all(spent["third-party"] > tight)


def test_a_tampered_search_entry_is_refused(tmp_path: Path) -> None:
    _charge(tmp_path, _search_curves(0.01))
    path = tmp_path / "silo-0" / "data" / "run-tune-1.npz"
    data = bytearray(path.read_bytes())
    data[-30] ^= 0xFF  # e.g. a curve lowered by hand
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="does not verify"):
        BudgetStore(tmp_path, "silo-0", "data").open()


# ------------------------------------------------------------------------ pdpfl tune
def _enforced(extra=()):
    return toy_config("rpdp", ["rounds=2", "privacy.adversary=third-party", *extra])


def test_the_entry_equals_the_plans_closed_form(tmp_path: Path) -> None:
    """What the store charges for a search on a fresh store is tune/accounting.py's ε: the
    server's exactly, the third parties' at most (the store pays the cap's tail with e^ε, the
    plan with e^budget) and within 0.1 %."""
    base = ledger_curves({"client_0": PrivacyLedger(BUDGETS, RATES, PLAN, ids=IDS)})
    cost = search_cost(base, [base, base], PoissonTrials(2.0))
    assert cost.tail > 0
    with BudgetStore(tmp_path, "silo-0", "data").open() as store:
        spent = charge_search(
            store,
            {"run": "tune-x"},
            IDS,
            BUDGETS,
            {o: cost.search_rdp[o] for o in base.observers},
            ORDERS,
            delta=PLAN.delta,
            tail={"third-party": cost.tail},
        )
    np.testing.assert_allclose(spent["server"], cost.epsilon["server"], rtol=1e-9)
    assert np.all(spent["third-party"] <= cost.epsilon["third-party"] * (1 + 1e-12))
    np.testing.assert_allclose(spent["third-party"], cost.epsilon["third-party"], rtol=1e-3)
    table = lifetime_table(tmp_path)  # read back from the sealed file: the same
    order = np.argsort(table["id"].astype(int))
    np.testing.assert_allclose(table["epsilon_server"][order], spent["server"], rtol=1e-12)


@pytest.mark.slow
def test_tune_charges_an_enforced_store_once_and_refuses_a_search_it_cannot_pay(
    tmp_path: Path,
) -> None:
    config = _enforced()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = tune(
            config,
            ["training.lr=0.3"],
            tmp_path / "t",
            expected_trials=1.0,
            trial_budget_fraction=0.3,
        )
        assert res.lifetime is not None and res.lifetime["enforced"]
        table = lifetime_table(config.lifetime.store or _default())
        # every silo's store holds the one search entry, nothing per trial
        assert set(table["run_ids"].tolist()) == {res.lifetime["entry"]}
        assert set(table["party"]) == {"silo-0", "silo-1", "silo-2"}
        eps = table["epsilon_third_party"].astype(float)
        assert np.all(eps <= table["budget"].astype(float) * (1 + 1e-9))
        assert np.max(eps) == pytest.approx(res.privacy.spent_max("third-party"), rel=1e-3)
        # a search that alone fits (≈ 0.95 of every budget) but not after the first (≈ 0.37):
        # refused before training, by the lifetime check
        with pytest.raises(TuneRefused, match=r"^lifetime: \d+ of \d+ record\(s\) of silo-"):
            tune(
                config,
                ["training.lr=0.3"],
                tmp_path / "t2",
                expected_trials=1.5,
                trial_budget_fraction=0.8,
            )
    assert not (tmp_path / "t2" / "trials").exists()
    assert set(lifetime_table(_default())["run_ids"].tolist()) == {res.lifetime["entry"]}


def _default() -> Path:
    from pdpfl.ledger.budget_store import default_store_dir

    return default_store_dir()
