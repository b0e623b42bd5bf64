"""Checkpoints and ledgers detect tampering and corruption: a resume refuses an edited, foreign
or rolled-back checkpoint (ledger counts can never go down), and an edited ledger file does not
load. Each case first shows the edit (what the attacker wants), then that pdpfl refuses it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from pdpfl.config import config_from_dict
from pdpfl.integrity import IntegrityError, record_progress, seal, unseal
from pdpfl.io import decode_state, encode_state
from pdpfl.ledger import load_ledger
from pdpfl.runtime.loop import CHECKPOINT_NAME, load_checkpoint
from pdpfl.runtime.simulation import run_simulation

TINY = {
    "name": "integrity",
    "seed": 3,
    "threads": 1,
    "randomness": "reproducible",
    "data": {"dataset": "breast-cancer", "num_clients": 2},
    "model": {"name": "logreg"},
    "privacy": {"epsilon_max": 5.0, "delta": 1e-3},
    "training": {"rounds": 3, "local_steps": 2, "lr": 0.3, "batch_size": 8},
}


def _partial(tmp_path: Path, rounds: int = 2) -> tuple[Path, object]:
    cfg = config_from_dict(TINY)
    out = tmp_path / "run"
    run_simulation(cfg, out, progress=False, stop_after=rounds)
    return out, cfg


def _raw_state(out: Path) -> tuple[dict, str]:
    data = (out / CHECKPOINT_NAME).read_bytes()
    header = data.index(b"\n") + 1
    n = data[header]
    run_id = data[header + 1 : header + 1 + n].decode()
    payload = data[header + 1 + n + 32 :]  # an attacker can read the payload without the key
    return decode_state(payload), run_id


def test_zeroed_ledger_counts_are_refused_on_resume(tmp_path) -> None:
    out, cfg = _partial(tmp_path)
    state, run_id = _raw_state(out)
    ledger = state["client_states"][0]["ledger"]
    assert int(np.sum(ledger["third_party_rounds"])) > 0
    ledger["third_party_rounds"] = np.zeros_like(ledger["third_party_rounds"])
    # the attacker cannot compute the tag: re-seal under a key of their own
    forged = (out / CHECKPOINT_NAME).read_bytes()
    cut = forged.index(b"\n") + 2 + len(run_id)
    (out / CHECKPOINT_NAME).write_bytes(forged[:cut] + b"\0" * 32 + encode_state(state))
    with pytest.raises(IntegrityError, match="does not verify"):
        run_simulation(cfg, out, resume=True, progress=False)


def test_an_unsealed_or_truncated_checkpoint_is_refused(tmp_path) -> None:
    out, cfg = _partial(tmp_path)
    state, _ = _raw_state(out)
    state["next_round"] = 3  # skip a round
    (out / CHECKPOINT_NAME).write_bytes(encode_state(state))  # a plain npz, no seal
    with pytest.raises(IntegrityError, match="not sealed"):
        load_checkpoint(out)
    (out / CHECKPOINT_NAME).write_bytes(b"PDPFL-SEALED-1\n\x03abc")
    with pytest.raises(IntegrityError):
        load_checkpoint(out)


def test_an_older_checkpoint_put_back_is_refused(tmp_path) -> None:
    cfg = config_from_dict(TINY)
    out = tmp_path / "run"
    run_simulation(cfg, out, progress=False, stop_after=1)
    old = (out / CHECKPOINT_NAME).read_bytes()  # a valid, sealed checkpoint of round 1
    run_simulation(cfg, out, resume=True, progress=False, stop_after=2)
    (out / CHECKPOINT_NAME).write_bytes(old)  # rollback: the ledgers would forget round 2
    with pytest.raises(IntegrityError, match="older checkpoint"):
        run_simulation(cfg, out, resume=True, progress=False)


def test_a_checkpoint_of_another_run_is_refused(tmp_path) -> None:
    out, cfg = _partial(tmp_path)
    other = tmp_path / "other"
    run_simulation(config_from_dict(TINY, ["seed=9"]), other, progress=False, stop_after=1)
    shutil.copyfile(other / CHECKPOINT_NAME, out / CHECKPOINT_NAME)
    with pytest.raises(ValueError, match="different config|older checkpoint"):
        run_simulation(cfg, out, resume=True, progress=False)


def test_the_high_water_mark_never_goes_down() -> None:
    record_progress("abc123", 5)
    record_progress("abc123", 2)
    from pdpfl.integrity import check_progress

    assert check_progress("abc123", None) == 5
    with pytest.raises(IntegrityError):
        check_progress("abc123", 4)


def test_an_edited_ledger_file_does_not_load(tmp_path) -> None:
    cfg = config_from_dict(TINY)
    out = tmp_path / "run"
    run_simulation(cfg, out, progress=False)
    path = next((out / "ledgers").glob("*.npz"))
    load_ledger(path)  # verifies
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not verify|readable"):
        load_ledger(path)


def test_seal_round_trip_and_purpose_binding() -> None:
    blob = seal(b"payload", purpose="checkpoint", identity="run1")
    assert unseal(blob, purpose="checkpoint") == (b"payload", "run1")
    with pytest.raises(IntegrityError):
        unseal(blob, purpose="ledger")
    with pytest.raises(IntegrityError, match="another run"):
        unseal(blob, purpose="checkpoint", identity="run2")
