"""Real faults on a loopback Flower federation under secure aggregation (issue #22, item 5).

rPDP-FL (``algorithm.name: rpdp``, ``aggregation: secure``), one SuperNode and one silo worker per
silo. Each faulty round must end with the exact sum of its survivors -- the simulator, replaying
which silos answered each protocol stage, releases the same model bit for bit (reproducible
randomness), so the noise in it is every survivor's full noise -- or with no aggregate; never a
partial unmask; no process is left; ``resume`` continues. The harness (``flower_faults.py``)
works for any algorithm: swap the config. The fault matrix is in docs/secure_aggregation.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from flower_faults import FaultDrill, read_events, replay_transport, stage_event  # noqa: E402
from pdpfl.runtime.flower.processes import flower_binary  # noqa: E402
from pdpfl.runtime.flower.transport import FlowerRunError  # noqa: E402

try:
    for _name in ("flower-superlink", "flower-supernode", "flwr"):
        flower_binary(_name)
except FlowerRunError as _err:  # pragma: no cover - depends on the installation
    pytest.skip(f"Flower binaries missing: {_err}", allow_module_level=True)

pytestmark = [
    pytest.mark.flower,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning"),
]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


#: Longest wait per protocol stage: generous, since a loaded 2-core CI machine runs every silo.
TIMEOUT_S = 15.0


def _config(silos: int, rounds: int, *extra: str):
    from pdpfl.config import load_config

    return load_config(
        EXAMPLES / "digits_demo.yaml",
        [
            f"data.num_clients={silos}",
            f"rounds={rounds}",
            "training.local_steps=2",
            "training.batch_size=12",
            "randomness=reproducible",
            "aggregation=secure",
            *extra,
        ],
    )


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _replayed_model(config, events) -> list[np.ndarray]:
    """The simulator's model when exactly the Flower run's silos answer each stage."""
    from pdpfl.fl.algorithm import build_federation_algorithms
    from pdpfl.runtime.loop import run_federation
    from pdpfl.runtime.simulation import load_federation_for

    server, clients = build_federation_algorithms(config, load_federation_for(config))
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        result = run_federation(
            config, server, replay_transport(clients, events), out, progress=False
        )
    return result["params"]


def test_a_killed_silo_leaves_the_exact_sum_and_a_stalled_one_below_the_quorum_nothing(
    tmp_path: Path,
) -> None:
    """Five silos, t = 3 (``secure.threshold: 0.6``), consistency quorum q = 4: one dropout
    tolerated before the consistency round. Round 0: silo 4's SuperNode is SIGKILLed once the
    seeds are shared (its pairwise masks are removed with its reconstructed mask seed): the
    exact sum of the 4 survivors is released. Round 1: silo 3's worker is SIGSTOPped at the same
    point and SIGCONTed after the server gave up on it, so it answers late: 3 survivors < q, the
    round has no aggregate (nothing is unmasked), and the late reply is never read."""
    from pdpfl.runtime.flower import run_flower

    config = _config(5, 2, "secure.threshold=0.6")
    out = tmp_path / "run"
    log = tmp_path / "messages.jsonl"
    drill = (
        FaultDrill(out)
        .at(stage_event(0, "stage:secure/share"), "kill", 4)
        .at(stage_event(1, "stage:secure/share"), "stop-worker", 3)
        .at(stage_event(1, "stage:secure/upload"), "cont-worker", 3)
    )
    summary = run_flower(
        config,
        out,
        round_timeout_s=TIMEOUT_S,
        workers="per-silo",
        on_started=drill,
        env={"PDPFL_MESSAGE_LOG": str(log)},
    )
    assert not drill.errors and [f[:2] for f in drill.fired] == [
        ("kill", 4),
        ("stop-worker", 3),
        ("cont-worker", 3),
    ]
    assert summary["rounds_completed"] == 2
    events = read_events(out / "flower" / "transport.jsonl")
    uploads = {e["round"]: e["replied"] for e in events if e["action"] == "stage:secure/upload"}
    assert uploads == {0: [0, 1, 2, 3], 1: [0, 1, 2]}
    unmasked = {e["round"]: e["sent"] for e in events if e["action"] == "stage:secure/unmask"}
    assert unmasked == {0: uploads[0]}  # round 0 unmasked exactly its survivors; round 1: < q
    metrics = _lines(out / "metrics.jsonl")
    assert [m["contributions"] for m in metrics] == [4, 0]
    # The exact sum of the survivors: the simulator replaying the same stage answers gives the
    # same model bit for bit (every survivor's update with its full noise, nothing else).
    model = np.load(out / "model.npz")
    for key, ref in zip(model.files, _replayed_model(config, events), strict=True):
        np.testing.assert_array_equal(model[key], ref)
    # Silo 3's late upload: computed after the server gave up, never among the replies it read.
    replies = [json.loads(x) for x in log.read_text().splitlines()]
    read = [r for r in replies if r["silo"] == 3 and r["action"] == "stage:secure/upload"]
    assert len(read) == 1  # round 0 only
    timings = _lines(next((out / "flower" / "silo-3").glob("run-*/timings-silo-3.jsonl")))
    assert {"action": "stage:secure/upload", "round": 1}.items() <= max(
        (t for t in timings if t["action"] == "stage:secure/upload"), key=lambda t: t["round"]
    ).items()  # the late reply was really produced
    result = json.loads((out / "flower" / "server_result.json").read_text())
    assert sorted(result["lost"]) == ["3", "4"]
    assert not drill.alive()


def test_dropping_below_t_releases_nothing_and_resume_continues(tmp_path: Path) -> None:
    """Three silos (t = 2): two SuperNodes are SIGKILLed in round 1 once the seeds are shared.
    Fewer than t silos (and fewer than ``min_silos``) remain: the round is never unmasked and
    the run stops at the checkpoint of round 0. ``resume`` restarts every silo (new keys): a
    silo that masked round 1 before declines it, so round 1 is summed only over silos that had
    not, if they reach the consistency quorum q = 3 (they do not: no aggregate); round 2 has
    every silo."""
    from pdpfl.fl.aggregation.secure_identity import consistency_quorum
    from pdpfl.integrity import unseal
    from pdpfl.io import decode_state
    from pdpfl.runtime.flower import run_flower

    config = _config(silos=3, rounds=3)
    out = tmp_path / "run"
    drill = (
        FaultDrill(out)
        .at(stage_event(1, "stage:secure/share"), "kill", 1)
        .at(stage_event(1, "stage:secure/share"), "kill", 2)
    )
    with pytest.raises(FlowerRunError, match="fewer than min_silos=2"):
        run_flower(config, out, round_timeout_s=TIMEOUT_S, min_silos=2, on_started=drill)
    events = read_events(out / "flower" / "transport.jsonl")
    assert not any(e["action"] == "stage:secure/unmask" and e["round"] == 1 for e in events)
    assert [m["round"] for m in _lines(out / "metrics.jsonl")] == [0]
    assert not drill.alive()
    run_key = (out / "flower" / "run_key").read_text().strip()

    def masked(silo: int) -> list[int]:
        path = (
            out / "flower" / f"silo-{silo}" / f"run-{run_key}" / f"protocol-public-silo-{silo}.npz"
        )
        payload, _ = unseal(path.read_bytes(), purpose="protocol-public", party=f"silo-{silo}")
        return list(decode_state(payload)["secure"]["masked"])

    before = {s: masked(s) for s in range(3)}
    assert before[0] == [0, 1]  # silo 0 masked round 1; its update was never unmasked
    fresh = [s for s in range(3) if 1 not in before[s]]
    resumed = FaultDrill(out)
    summary = run_flower(config, out, resume=True, round_timeout_s=TIMEOUT_S, on_started=resumed)
    assert summary["rounds_completed"] == 3
    metrics = _lines(out / "metrics.jsonl")
    assert [m["round"] for m in metrics] == [0, 1, 2]
    # asked: all three silos (t = 2, consistency quorum q = 3); silo 0 declines round 1
    q = consistency_quorum(3, 2)
    assert metrics[1]["contributions"] == (len(fresh) if len(fresh) >= q else 0)
    assert metrics[2]["contributions"] == 3
    if len(fresh) >= q:
        assert all(1 in masked(s) for s in fresh)
    else:  # the round stopped once the keys were in: no fresh silo masked (or computed) it
        assert not any(1 in masked(s) for s in fresh)
    assert not resumed.alive()
