"""Multi-process Flower federations on loopback: ten silos equal to the simulator, the privacy
boundary on the wire, protocol stages and a killed silo, Ctrl-C and ``--resume``.

Each test starts a SuperLink, one SuperNode per silo and the silo worker as child processes
(stopped by PID at the end, descendants included); every wait is bounded. Skipped only when the
Flower binaries are not installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from pdpfl.runtime.flower.processes import LocalFederation, _alive, descendants, flower_binary  # noqa: E402
from pdpfl.runtime.flower.transport import FlowerRunError  # noqa: E402

TESTS_DIR = Path(__file__).resolve().parent
ROOT = TESTS_DIR.parent
EXAMPLES = ROOT / "examples"

try:
    for _name in ("flower-superlink", "flower-supernode", "flwr"):
        flower_binary(_name)
except FlowerRunError as _err:  # pragma: no cover - depends on the installation
    pytest.skip(f"Flower binaries missing: {_err}", allow_module_level=True)

pytestmark = [pytest.mark.flower, pytest.mark.slow]

DIGITS = [
    "training.batch_size=12",
    "training.local_steps=3",
    "randomness=reproducible",
]


def _env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(TESTS_DIR), *sys.path])}


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_ten_silos_match_the_simulation_and_only_contributions_leave(tmp_path: Path) -> None:
    """The digits demo's ten silos on this machine: the simulator's model, every reply on the
    wire within the privacy boundary, every process stopped at the end."""
    from pdpfl.config import load_config
    from pdpfl.fl.algorithm import build_federation_algorithms
    from pdpfl.runtime.flower import run_flower
    from pdpfl.runtime.simulation import load_federation_for, run_simulation
    from test_flower_algorithms import check_message_log

    config = load_config(
        EXAMPLES / "digits_demo.yaml", ["rounds=2", "data.num_clients=10", *DIGITS]
    )
    assert config.data.num_clients == 10
    sim = run_simulation(config, tmp_path / "sim", progress=False)
    log = tmp_path / "messages.jsonl"
    started: list[LocalFederation] = []
    flw = run_flower(
        config,
        tmp_path / "flower",
        env={"PDPFL_MESSAGE_LOG": str(log)},
        on_started=started.append,
    )
    a = np.load(tmp_path / "sim" / "model.npz")
    b = np.load(tmp_path / "flower" / "model.npz")
    assert a.files == b.files
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])
    sim_lines = _lines(tmp_path / "sim" / "metrics.jsonl")
    flw_lines = _lines(tmp_path / "flower" / "metrics.jsonl")
    assert [m["selected"] for m in sim_lines] == [m["selected"] for m in flw_lines]
    assert [m["accuracy"] for m in sim_lines] == [m["accuracy"] for m in flw_lines]
    assert flw["rounds_completed"] == sim["rounds_completed"] == 2
    # On loopback the launcher collects the silos' own summaries: the simulator's numbers.
    assert flw["privacy_view"].startswith("operator: collected")
    assert flw["eps_spent_max"] == sim["eps_spent_max"]
    for path in (tmp_path / "sim" / "ledgers").glob("*.npz"):
        assert (tmp_path / "flower" / "ledgers" / path.name).exists()
    # The wire: hellos, contributions and evaluation metrics only.
    server, _ = build_federation_algorithms(config, load_federation_for(config))
    counts = check_message_log(log, server.public_metrics, config.data.public_silo_sizes)
    # One message per silo per round: round 0's evaluation travelled with round 1's training.
    assert counts == {"hello": 10, "fit": 10, "fit+evaluate": 10, "evaluate": 10}
    # The silos were warm: built once, never rebuilt per message.
    timings = _lines(
        next((tmp_path / "flower" / "flower").glob("silo-3/run-*/timings-silo-3.jsonl"))
    )
    assert [t["warm"] for t in timings] == [True] * 4
    assert [t["build_s"] > 0 for t in timings] == [True, False, False, False]
    fed = started[0]
    assert not any(_alive(pid) for pid in fed.all_processes())


def test_protocol_stages_then_a_killed_supernode(tmp_path: Path) -> None:
    """Separate processes: a two-stage toy protocol (``FlowerTransport.exchange``) runs before
    training; then silo 1's SuperNode is killed after its update was released, before the
    evaluation: the round completes without it and its ledger holds the release."""
    from pdpfl.integrity import unseal
    from pdpfl.runtime.flower import run_flower
    from pdpfl.runtime.flower.codec import decode_state
    from test_flower_toy import TOY_SPEC, toy_config

    out = tmp_path / "run"
    events_file = out / "flower" / "transport.jsonl"
    log = tmp_path / "messages.jsonl"
    killed = threading.Event()
    started: list[LocalFederation] = []

    def drill(federation: LocalFederation) -> None:
        started.append(federation)

        def kill_after_the_fit_exchange() -> None:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                if events_file.exists() and '"fit"' in events_file.read_text():
                    federation.kill_supernode(1)
                    killed.set()
                    return
                time.sleep(0.05)

        threading.Thread(target=kill_after_the_fit_exchange, daemon=True).start()

    summary = run_flower(
        toy_config(num_silos=2, rounds=1, aggregation="toy-sum-sq"),
        out,
        hooks=TOY_SPEC,
        env={**_env(), "PDPFL_MESSAGE_LOG": str(log)},
        round_timeout_s=15,
        on_started=drill,
    )
    assert killed.is_set()
    assert summary["rounds_completed"] == 1  # the round completed without silo 1
    result = json.loads((out / "flower" / "server_result.json").read_text())
    assert list(result["lost"]) == ["1"] and "no reply within 15 s" in result["lost"]["1"]
    commit, reveal, fit, evaluate = _lines(events_file)
    assert commit["action"] == "stage:toy-sum-sq/commit" and commit["replied"] == [0, 1]
    assert reveal["action"] == "stage:toy-sum-sq/reveal" and reveal["replied"] == [0, 1]
    assert fit["action"] == "fit" and fit["replied"] == [0, 1]
    assert evaluate["action"] == "evaluate" and evaluate["replied"] == [0]
    stages = {e["action"]: e["records"] for e in _lines(log) if e["action"].startswith("stage")}
    assert stages["stage:toy-sum-sq/reveal"] == {
        "payload.arrays": ["echo"], "payload.values": ["nonce", "rounds", "value"]}  # fmt: skip
    line = _lines(out / "metrics.jsonl")[0]
    assert line["selected"] == [0, 1]  # the Type I view counts silo 1 (over-counts only)
    assert list(line["clients"]) == ["0"]

    def silo_state(i: int) -> dict:
        path = out / "flower" / f"silo-{i}" / f"run-{result['run_key']}" / f"silo-{i}.npz"
        payload, _ = unseal(path.read_bytes(), purpose="silo-state", party=f"silo-{i}")
        return decode_state(payload)

    # Silo 1's own ledger (its state file) holds the update it released before dying.
    assert silo_state(1)["fits"] >= 1
    assert silo_state(0)["fits"] == 1 and silo_state(0)["evaluated_until"] == 0
    # The warm worker kept the protocol memory in memory only.
    assert not list((out / "flower").rglob("protocol-memory-silo-*.npz"))
    assert not any(_alive(pid) for pid in started[0].all_processes())


def test_ctrl_c_stops_every_process_and_resume_finishes_the_run(tmp_path: Path) -> None:
    """``pdpfl run --runtime flower``: Ctrl-C after round 1 stops every process within 5 s and
    prints how to resume; ``--resume`` then ends with the simulator's model."""
    from pdpfl.config import load_config
    from pdpfl.runtime.simulation import run_simulation

    overrides = ["rounds=3", "data.num_clients=2", *DIGITS]
    sim_config = load_config(EXAMPLES / "digits_demo.yaml", overrides)
    run_simulation(sim_config, tmp_path / "sim", progress=False)
    out = tmp_path / "flower"
    cmd = [str(Path(sys.executable).parent / "pdpfl"), "run", str(EXAMPLES / "digits_demo.yaml")]
    cmd += ["--runtime", "flower", "--out", str(out)]
    for item in overrides:
        cmd += ["--set", item]
    env = {**os.environ, **_env(), "COLUMNS": "200"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            seen.update(descendants([proc.pid]))
            if (out / "metrics.jsonl").exists() and _lines(out / "metrics.jsonl"):
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        else:
            raise AssertionError("no round completed in time")
        seen.update(descendants([proc.pid]))
        assert len(seen) >= 6  # superlink, superexec, serverapp, 2 supernodes, worker, flwr
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        while any(_alive(pid) for pid in seen) and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        stopped_s = time.monotonic() - t0
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    still = [pid for pid in seen if _alive(pid)]
    assert not still and stopped_s < 5.0, (still, stopped_s)
    text = err.decode()
    assert proc.returncode == 130, text
    assert "Resume with:" in text and "--resume" in text
    assert "round" in text  # the coordinator's progress was shown
    done = len(_lines(out / "metrics.jsonl"))
    assert 1 <= done < 3
    # Resume (the command it printed) finishes the run: same model as the simulator.
    resume = subprocess.run(
        [*cmd, "--resume", "--quiet"], env=env, capture_output=True, text=True, timeout=300
    )
    assert resume.returncode == 0, resume.stderr[-3000:]
    lines = _lines(out / "metrics.jsonl")
    assert [m["round"] for m in lines] == [0, 1, 2]
    a, b = np.load(tmp_path / "sim" / "model.npz"), np.load(out / "model.npz")
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])
    assert json.loads((out / "summary.json").read_text())["rounds_completed"] == 3
