"""The budget store (pdpfl.ledger.budget_store / lifetime): sealed, rollback-proof, locked, and
charged ahead of every release -- the attacks first, then the accounting it feeds."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pdpfl.integrity import IntegrityError
from pdpfl.ledger import PrivacyLedger
from pdpfl.ledger.budget_store import BudgetStore, StoreBusy, dataset_fingerprint, find_stores
from pdpfl.ledger.lifetime import LifetimeAccount, lifetime_table
from pdpfl.privacy import TrainingPlan
from pdpfl.privacy.accountant import mechanism_epsilon

PLAN = TrainingPlan(noise_multiplier=2.0, delta=1e-3, steps=4, rounds=3, client_rate=1.0)
IDS = np.array([11, 12, 13, 14])
RATES = np.array([0.05, 0.2, 0.2, 0.2])
#: The first two records' budgets are exactly what one run of T = 3 rounds spends (a
#: calibration that uses every budget fully); the last two have room for more runs.
BUDGETS = np.concatenate(
    [mechanism_epsilon(PLAN, RATES[:2], "third-party", np.full(2, 3))[0], [8.0, 8.0]]
)


def _ledger() -> PrivacyLedger:
    return PrivacyLedger(BUDGETS, RATES, PLAN, ids=IDS)


def _run(root: Path, run: str, rounds: int, *, key: str = "data", party: str = "silo-0"):
    """A run of ``rounds`` rounds charging the store (closed at the end)."""
    ledger = _ledger()
    store = BudgetStore(root, party, key).open()
    account = LifetimeAccount.attach(ledger, store, {"run": run}, enforce=True)
    everyone = np.ones(IDS.size, dtype=bool)
    for _ in range(rounds):
        active = ~ledger.would_exceed()
        ledger.record_round(participated=active & everyone, active=active)
    account.close()
    return ledger


# ------------------------------------------------------------------------ integrity (attacks)


def test_a_tampered_run_file_is_refused(tmp_path: Path) -> None:
    _run(tmp_path, "a", 2)
    (path,) = (tmp_path / "silo-0" / "data").glob("run-a.npz")
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF  # e.g. a count zeroed by hand
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="does not verify"):
        BudgetStore(tmp_path, "silo-0", "data").open()


def test_a_run_file_rolled_back_is_refused(tmp_path: Path) -> None:
    ledger = _ledger()
    store = BudgetStore(tmp_path, "silo-0", "data").open()
    LifetimeAccount.attach(ledger, store, {"run": "a"}, enforce=True)
    ones = np.ones(IDS.size, dtype=bool)
    ledger.record_round(participated=ones, active=ones)
    path = tmp_path / "silo-0" / "data" / "run-a.npz"
    old = path.read_bytes()  # one round charged
    ledger.record_round(participated=ones, active=ones)
    store.close()
    path.write_bytes(old)  # the second charge forgotten
    with pytest.raises(IntegrityError, match="older copy of this run"):
        BudgetStore(tmp_path, "silo-0", "data").open()


def test_a_whole_store_rolled_back_or_deleted_is_refused(tmp_path: Path) -> None:
    _run(tmp_path, "a", 1)
    folder = tmp_path / "silo-0" / "data"
    backup = tmp_path / "backup"
    shutil.copytree(folder, backup)
    _run(tmp_path, "b", 1)
    shutil.rmtree(folder)
    shutil.copytree(backup, folder)  # every file of an older, valid copy
    with pytest.raises(IntegrityError, match="older copy was put back"):
        BudgetStore(tmp_path, "silo-0", "data").open()
    shutil.rmtree(folder)  # deleting it does not start everyone's budget again either
    with pytest.raises(IntegrityError, match="deleted or replaced"):
        BudgetStore(tmp_path, "silo-0", "data").open()


def test_a_foreign_store_is_refused(tmp_path: Path) -> None:
    _run(tmp_path, "a", 1, key="other-data")
    _run(tmp_path, "a", 1, key="data", party="silo-1")
    mine = tmp_path / "silo-0" / "data"
    # another dataset's store put in this dataset's place
    shutil.copytree(tmp_path / "silo-0" / "other-data", mine)
    with pytest.raises(IntegrityError, match="another dataset or party"):
        BudgetStore(tmp_path, "silo-0", "data").open()
    shutil.rmtree(mine)
    # the same dataset's store of another party (sealed with silo-1's key)
    shutil.copytree(tmp_path / "silo-1" / "data", mine)
    with pytest.raises(IntegrityError, match="does not verify"):
        BudgetStore(tmp_path, "silo-0", "data").open()


# ------------------------------------------------------------------------ concurrent runs


def test_a_second_writer_is_refused_naming_the_holder_or_waits_its_turn(tmp_path: Path) -> None:
    holder = BudgetStore(tmp_path, "silo-0", "data").open()
    with pytest.raises(StoreBusy, match=r"being charged by pid \d+"):
        BudgetStore(tmp_path, "silo-0", "data").open(wait_s=0.0)
    # serialized: a second run that waits sees the first one's charges, never a stale copy
    ledger = _ledger()
    LifetimeAccount.attach(ledger, holder, {"run": "first"}, enforce=True)
    ones = np.ones(IDS.size, dtype=bool)
    ledger.record_round(participated=ones, active=ones)
    seen: list[dict] = []

    def second() -> None:
        with BudgetStore(tmp_path, "silo-0", "data").open(wait_s=10.0) as store:
            seen.append({k: r.counts["third-party"].copy() for k, r in store.runs.items()})

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.3)
    ledger.record_round(participated=ones, active=ones)  # still charging while the other waits
    holder.close()
    thread.join(timeout=20)
    assert seen and seen[0]["first"].tolist() == [2, 2, 2, 2]


@pytest.mark.slow
def test_two_processes_on_one_store_are_serialized(tmp_path: Path) -> None:
    """Process A holds the store; process B (another interpreter) is refused."""
    import subprocess
    import sys

    holder = BudgetStore(tmp_path, "silo-0", "data").open()
    code = (
        "import sys; from pdpfl.ledger.budget_store import BudgetStore, StoreBusy\n"
        f"try: BudgetStore({str(tmp_path)!r}, 'silo-0', 'data').open()\n"
        "except StoreBusy as e: print('busy', e); sys.exit(3)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 3 and "being charged by" in res.stdout, res.stderr
    holder.close()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


# ------------------------------------------------------------------------ charge before release


def test_every_charge_is_on_disk_before_the_round_runs_and_a_crash_keeps_it(
    tmp_path: Path,
) -> None:
    ledger = _ledger()
    store = BudgetStore(tmp_path, "silo-0", "data").open()
    LifetimeAccount.attach(ledger, store, {"run": "r"}, enforce=True)
    ones = np.ones(IDS.size, dtype=bool)
    ledger.record_round(participated=ones, active=ones)
    checkpoint = ledger.state_dict()  # the run's last checkpoint: one round
    ledger.record_round(participated=ones, active=ones)  # charged (maybe released), then a crash
    on_disk = BudgetStore(tmp_path, "silo-0", "data").open(lock=False)
    assert on_disk.runs["r"].counts["third-party"].tolist() == [2, 2, 2, 2]
    store.close()
    # the run resumes from its checkpoint: the uncheckpointed round stays charged
    resumed = _ledger()
    resumed.load_state_dict(checkpoint)
    store = BudgetStore(tmp_path, "silo-0", "data").open()
    account = LifetimeAccount.attach(resumed, store, {"run": "r"}, enforce=True)
    assert account.offset["third-party"].tolist() == [1, 1, 1, 1]
    assert store.runs["r"].counts["third-party"].tolist() == [2, 2, 2, 2]
    two, _ = mechanism_epsilon(PLAN, RATES, "third-party", np.full(4, 2))
    np.testing.assert_allclose(resumed.lifetime_spent("third-party"), two, rtol=2e-2)
    assert np.all(resumed.lifetime_spent("third-party") >= two * (1 - 1e-12))
    resumed.record_round(participated=ones, active=ones)  # the round is run again: 3 charged
    assert store.runs["r"].counts["third-party"].tolist() == [3, 3, 3, 3]
    store.close()


def test_a_crash_between_a_run_file_and_the_index_keeps_the_charge(tmp_path: Path) -> None:
    from pdpfl.integrity import key_dir

    _run(tmp_path, "a", 1)
    folder = tmp_path / "silo-0" / "data"
    mark = key_dir() / "runs" / f"{BudgetStore(tmp_path, 'silo-0', 'data').mark_id}.mark"
    index, high = (folder / "index.sealed").read_bytes(), mark.read_bytes()
    _run(tmp_path, "b", 1)
    # as if the process died right after writing run b's file: index and mark one step behind
    (folder / "index.sealed").write_bytes(index)
    mark.write_bytes(high)
    store = BudgetStore(tmp_path, "silo-0", "data").open(lock=False)
    assert sorted(store.runs) == ["a", "b"]  # run b's charge is not forgotten
    assert store.runs["b"].counts["third-party"][2:].tolist() == [1, 1]


def test_earlier_runs_limit_the_next_one_by_composition(tmp_path: Path) -> None:
    first = _run(tmp_path, "a", 3)
    second = _run(tmp_path, "b", 3)
    # the 0.5 and 2.0 records spent their budget in the first run: they sat out the second
    assert second.counts["third-party"][:2].tolist() == [0, 0]
    assert second.stopped[:2].all() and not second.stopped[2:].any()
    life = second.lifetime_spent("third-party")
    assert np.all(life <= BUDGETS * (1 + 1e-12))
    np.testing.assert_array_equal(life[:2], first.spent_epsilon("third-party")[:2])
    assert np.all(life[2:] > first.spent_epsilon("third-party")[2:])  # composed, not ignored
    table = lifetime_table(tmp_path)
    assert sorted(table["id"].tolist()) == IDS.tolist()
    assert table["runs"][table["id"] == 13][0] == 2
    np.testing.assert_allclose(
        table["epsilon_third_party"][np.argsort(table["id"].astype(int))], life, rtol=1e-9
    )


def test_the_fingerprint_is_the_units_and_their_rows_in_any_order() -> None:
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    y = np.array([0, 1, 0, 1])
    order = np.array([2, 0, 3, 1])
    assert dataset_fingerprint(IDS, x, y) == dataset_fingerprint(IDS[order], x[order], y[order])
    x2 = x.copy()
    x2[1, 1] += 1
    assert dataset_fingerprint(IDS, x, y) != dataset_fingerprint(IDS, x2, y)
    assert dataset_fingerprint(IDS, x, y) != dataset_fingerprint(IDS + 1, x, y)


def test_stores_are_found_under_a_root_a_party_or_one_store(tmp_path: Path) -> None:
    _run(tmp_path, "a", 1)
    _run(tmp_path, "a", 1, party="silo-1")
    assert len(find_stores(tmp_path)) == 2
    assert find_stores(tmp_path / "silo-1") == [(tmp_path, "silo-1", "data")]
    assert find_stores(tmp_path / "silo-0" / "data") == [(tmp_path, "silo-0", "data")]
