"""Real faults on Flower for the algorithms whose silos add noise shares (issue #22, item 2).

ULDP-AVG under plain summation and IDP-FedAvg ``variant: distributed`` under secure summation, on
a loopback federation (one SuperNode per silo, the harness of ``flower_faults.py``). A SuperNode
SIGKILLed mid-run leaves each later round either a sum of at least t shares -- each sized
σ²C²/t, so at full noise -- or no aggregate; the released model equals the simulator's replay of
which silos answered (reproducible randomness), so nothing but the survivors' full noisy
contributions is in it; the ledgers charge every round at the noise floor; no process is left.
The simulator's half (and the exact and statistical noise checks) is ``test_noise_shares.py``;
the fault matrix is in docs/secure_aggregation.md.
"""

from __future__ import annotations

import json
import tempfile
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
TIMEOUT_S = 15.0


def _config(name: str, silos: int, rounds: int, *extra: str):
    from pdpfl.config import ALGORITHMS, load_config

    return load_config(
        EXAMPLES / "digits_demo.yaml",
        [
            f"data.num_clients={silos}",
            f"rounds={rounds}",
            "training.local_steps=2",
            "training.batch_size=12",
            "randomness=reproducible",
            f"algorithm.name={name}",
            *ALGORITHMS.get(name).toy_overrides,
            *extra,
        ],
    )


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _replayed(config, events) -> dict:
    from pdpfl.fl.algorithm import build_federation_algorithms
    from pdpfl.runtime.loop import run_federation
    from pdpfl.runtime.simulation import load_federation_for

    server, clients = build_federation_algorithms(config, load_federation_for(config))
    with tempfile.TemporaryDirectory() as out:
        return run_federation(
            config, server, replay_transport(clients, events), out, progress=False
        )


def _same_model(out: Path, params) -> None:
    model = np.load(out / "model.npz")
    for key, ref in zip(model.files, params, strict=True):
        np.testing.assert_array_equal(model[key], ref)


def test_uldp_silos_killed_mid_run_leave_t_shares_or_no_aggregate(tmp_path: Path) -> None:
    """ULDP-AVG, 4 silos, t = 3, plain summation, discrete shares (the default). Silo 3's
    SuperNode is killed once round 0 is evaluated (round 1 then sums 3 shares: σ²C² in full);
    silo 2's once round 1 is (round 2 has 2 < t contributions: no aggregate, the model is
    kept)."""
    from pdpfl.privacy.uldp import user_epsilon
    from pdpfl.runtime.flower import run_flower

    sigma, delta = 2.0, 1e-3
    config = _config(
        "uldp-avg", 4, 3, "privacy.epsilon_max=null", f"privacy.noise_multiplier={sigma}"
    )
    assert config.privacy.delta == delta
    out = tmp_path / "run"
    drill = (
        FaultDrill(out)
        .at(stage_event(0, "evaluate"), "kill", 3)
        .at(stage_event(1, "evaluate"), "kill", 2)
    )
    summary = run_flower(config, out, round_timeout_s=TIMEOUT_S, prefetch=False, on_started=drill)
    assert not drill.errors and [f[:2] for f in drill.fired] == [("kill", 3), ("kill", 2)]
    assert summary["rounds_completed"] == 3
    metrics = _lines(out / "metrics.jsonl")
    assert [m["contributions"] for m in metrics] == [4, 3, 0]
    events = read_events(out / "flower" / "transport.jsonl")
    replay = _replayed(config, events)
    assert [m["contributions"] for m in replay["metrics"]] == [4, 3, 0]
    _same_model(out, replay["params"])
    # every round charged (write-ahead) at the floor σ: the third party's ε of 3 full rounds,
    # of the distributed discrete Gaussian (discrete shares, the default: integers on the wire)
    summary_json = json.loads((out / "summary.json").read_text())
    assert summary_json["aggregation"]["discrete_shares"]["container"] == "uint32"
    eps = summary_json["eps_spent_max"]["third_party"]
    assert user_epsilon(sigma, delta, 3) * (1 - 1e-9) <= eps <= user_epsilon(sigma, delta, 3) * 1.01
    assert eps == pytest.approx(replay["privacy"].spent_max("third-party"), rel=1e-9)
    assert not drill.alive()


def test_an_idp_client_killed_after_the_seeds_are_shared_leaves_t_shares(
    tmp_path: Path,
) -> None:
    """IDP-FedAvg distributed, 5 clients, t = 3 (``secure.threshold: 0.6``), consistency quorum
    q = 4, secure summation, discrete shares (the default: uint32 shares masked modulo 2^b):
    client 4's SuperNode is killed in round 0 once the mask seeds are
    shared. Round 0 is unmasked over the 4 survivors (each noise share σ_v²C²/3: at least
    σ_v²C² from any t of them), round 1 likewise."""
    from pdpfl.runtime.flower import run_flower

    config = _config(
        "idp-fedavg",
        5,
        2,
        "algorithm.variant=distributed",
        "aggregation=secure",
        "secure.threshold=0.6",
    )
    out = tmp_path / "run"
    drill = FaultDrill(out).at(stage_event(0, "stage:secure/share"), "kill", 4)
    summary = run_flower(config, out, round_timeout_s=TIMEOUT_S, on_started=drill)
    assert not drill.errors and [f[:2] for f in drill.fired] == [("kill", 4)]
    assert summary["rounds_completed"] == 2
    events = read_events(out / "flower" / "transport.jsonl")
    uploads = {e["round"]: e["replied"] for e in events if e["action"] == "stage:secure/upload"}
    assert uploads == {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}
    assert [m["contributions"] for m in _lines(out / "metrics.jsonl")] == [4, 4]
    replay = _replayed(config, events)
    _same_model(out, replay["params"])
    assert not drill.alive()
