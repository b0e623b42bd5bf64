"""Every registered algorithm on Flower (toy size), and the Flower half of the privacy boundary.

Each algorithm that is not simulation-only runs through pdpfl's real ServerApp and ClientApp
(:data:`pdpfl.runtime.flower.hooks.PDPFL_HOOKS`: config, data, registry, round loop) over an
in-memory grid whose messages are deflated and inflated as on the wire
(:class:`test_flower_toy.FakeGrid`), and must produce the simulator's model exactly under
``randomness: reproducible``. Algorithms registered later are picked up automatically from
:data:`pdpfl.config.ALGORITHMS`; the fields one needs beyond ``name`` come from its
registered ``toy_overrides`` (or :data:`EXTRA`).

With ``PDPFL_MESSAGE_LOG`` set, the ServerApp logs the record names and keys of every reply; the
test fails on any record or key other than: a train reply's :class:`~pdpfl.fl.api.Contribution`
(``update``; ``contribution``: ``weight`` and the server's declared public metrics), an evaluate
reply's ``loss``/``accuracy``/``n``, and a discovery reply's public facts. The multi-process
version of this check runs in ``tests/test_flower_runtime.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr")

from test_flower_toy import FakeGrid, serve, task_identity  # noqa: E402,F401

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

#: Config overrides an algorithm needs beyond ``algorithm.name`` (toy values).
EXTRA: dict[str, list[str]] = {"uniform": ["algorithm.epsilon=1.0"]}

#: Public facts a silo may tell the server when it is discovered (size only if declared public).
HELLO_KEYS = {"partition-id", "num-partitions", "has-state"}
INFO_KEYS = {"input_shape", "num_classes", "name"}


def _flower_algorithms() -> list[str]:
    from pdpfl.config import ALGORITHMS

    return [name for name in ALGORITHMS.names() if not ALGORITHMS.get(name).simulation_only]


def public_data_grid(run_config: dict[str, Any], state_root: Path, monkeypatch: Any) -> Any:
    """Three SuperNodes started with ``--allow-respend``: the digits are public, so a run may
    re-spend them (the config says ``lifetime.allow_respend: true`` too)."""
    grid = FakeGrid(run_config, state_root, 3, hooks=None, monkeypatch=monkeypatch)
    for node_config in grid.node_configs.values():
        node_config["allow-respend"] = True
    return grid


def toy_digits(name: str, *extra: str):
    from pdpfl.config import ALGORITHMS, load_config

    return load_config(
        EXAMPLES / "digits_demo.yaml",
        [
            "rounds=2",
            "data.num_clients=3",
            "training.local_steps=2",
            "training.batch_size=12",
            "randomness=reproducible",
            f"algorithm.name={name}",
            *ALGORITHMS.get(name).toy_overrides,  # what the algorithm needs at toy size
            *EXTRA.get(name, []),
            *extra,
        ],
    )


def check_message_log(path: Path, public_metrics: frozenset[str], sizes_public: bool) -> dict:
    """Every reply in the log carries only what the privacy boundary allows; counts by action."""
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        action, records = entry["action"], entry["records"]
        counts[action] = counts.get(action, 0) + 1
        if action in ("fit", "fit+evaluate"):
            # A training reply; with the evaluation of the model it started from, if asked.
            evaluation = {"metrics": ["accuracy", "loss", "n"]} if action != "fit" else {}
            assert set(records) == {"update", "contribution", *evaluation}, entry
            assert {k: records[k] for k in evaluation} == evaluation, entry
            allowed = {"weight"} | {f"metric.{k}" for k in public_metrics}
            assert "weight" in records["contribution"], entry
            assert set(records["contribution"]) <= allowed, entry
        elif action == "evaluate":
            assert records == {"metrics": ["accuracy", "loss", "n"]}, entry
        elif action == "hello":
            assert set(records) == {"hello", "info"}, entry
            assert set(records["hello"]) == HELLO_KEYS, entry
            allowed = INFO_KEYS | ({"num_examples"} if sizes_public else set())
            assert set(records["info"]) <= allowed, entry
        else:
            raise AssertionError(f"unexpected reply {entry}")
    return counts


def run_like_the_simulator(
    config: Any, tmp_path: Path, monkeypatch: Any, round_timeout: float = 30.0
) -> tuple[dict, dict, Path]:
    """The simulator's run and the same config through pdpfl's Flower apps (message log on);
    asserts both give the same model after the same rounds. Returns (sim, flower result, log)."""
    from pdpfl.config import config_to_dict
    from pdpfl.runtime.flower.codec import encode_config
    from pdpfl.runtime.simulation import run_simulation

    sim = run_simulation(config, tmp_path / "sim", progress=False)
    log = tmp_path / "messages.jsonl"
    monkeypatch.setenv("PDPFL_MESSAGE_LOG", str(log))
    out = tmp_path / "flower"
    run_config = {
        "pdpfl-config": encode_config(config_to_dict(config)),
        "pdpfl-hooks": "pdpfl.runtime.flower.hooks:PDPFL_HOOKS",
        "pdpfl-out-dir": str(out),
        "pdpfl-resume": False,
        "pdpfl-round-timeout": round_timeout,
        "pdpfl-startup-timeout": 30.0,
        "pdpfl-min-silos": 3,
    }
    result = serve(public_data_grid(run_config, out / "silos", monkeypatch), out)
    assert result["status"] == "ok", result.get("error")
    a, b = np.load(tmp_path / "sim" / "model.npz"), np.load(out / "model.npz")
    assert a.files == b.files
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])
    assert result["summary"]["rounds_completed"] == sim["rounds_completed"] == 2
    return sim, result, log


@pytest.mark.slow
@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("name", _flower_algorithms())
def test_every_algorithm_runs_on_flower_like_the_simulator(
    name: str, tmp_path: Path, monkeypatch: Any
) -> None:
    from pdpfl.fl.algorithm import build_federation_algorithms
    from pdpfl.runtime.simulation import load_federation_for

    config = toy_digits(name)
    _, result, log = run_like_the_simulator(config, tmp_path, monkeypatch)
    server, _ = build_federation_algorithms(config, load_federation_for(config))
    counts = check_message_log(log, server.public_metrics, config.data.public_silo_sizes)
    # one training request per silo the server selected (as in the simulation), one evaluation
    # per silo and round; round 0's evaluation travels with round 1's training requests
    from pdpfl.runtime.loop import read_metrics

    first, second = (m["selected"] for m in read_metrics(tmp_path / "sim"))
    assert first or second
    expected = {"hello": 3, "fit": len(first), "fit+evaluate": len(second),
                "evaluate": 6 - len(second)}  # fmt: skip
    assert counts == {k: n for k, n in expected.items() if n}
    # The coordinator's summary holds no per-silo privacy numbers.
    assert result["summary"]["privacy_view"].startswith("coordinator")


def test_boundary_check_fails_on_an_extra_field(tmp_path: Path) -> None:
    """The message-log check is not vacuous: a reply with any other key fails it."""
    log = tmp_path / "log.jsonl"
    good = {"action": "fit", "silo": 0, "records": {"update": ["0"], "contribution": ["weight"]}}
    log.write_text(json.dumps(good) + "\n")
    check_message_log(log, frozenset(), False)
    for bad in (
        {"update": ["0"], "contribution": ["weight", "num_examples"]},
        {"update": ["0"], "contribution": ["weight"], "metrics": ["mean_loss"]},
    ):
        log.write_text(json.dumps({**good, "records": bad}) + "\n")
        with pytest.raises(AssertionError):
            check_message_log(log, frozenset(), False)
    both = {"update": ["0"], "contribution": ["weight"], "metrics": ["accuracy", "loss", "n"]}
    log.write_text(json.dumps({**good, "action": "fit+evaluate", "records": both}) + "\n")
    check_message_log(log, frozenset(), False)
    for bad in (
        {**both, "metrics": ["accuracy", "loss", "n", "n_train"]},
        {**both, "info": ["num_examples"]},
        {"update": ["0"], "contribution": ["weight"]},
    ):
        log.write_text(json.dumps({**good, "action": "fit+evaluate", "records": bad}) + "\n")
        with pytest.raises(AssertionError):
            check_message_log(log, frozenset(), False)
    sized = {"action": "hello", "silo": 0, "records": {
        "hello": sorted(HELLO_KEYS), "info": ["input_shape", "num_examples"]}}  # fmt: skip
    log.write_text(json.dumps(sized) + "\n")
    with pytest.raises(AssertionError):
        check_message_log(log, frozenset(), False)
    check_message_log(log, frozenset(), True)


#: Multi-message aggregation protocols on Flower (issue #13 / #16): secure summation, hidden
#: participation and ULDP-FL's private weighting, each against the simulator's model.
PROTOCOL_CASES = {
    "secure-sum": ("rpdp", ["aggregation=secure"]),
    "hidden-participation": (
        "rpdp",
        ["aggregation=secure", "participation=hidden", "training.client_rate=0.5"],
    ),
    "private-weights": (
        "uldp-avg",
        ["algorithm.weights=private", "secure.n_max=600", "secure.workers=1"],
    ),
}


@pytest.mark.slow
@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("case", list(PROTOCOL_CASES))
def test_aggregation_protocols_run_on_flower_like_the_simulator(
    case: str, tmp_path: Path, monkeypatch: Any
) -> None:
    name, extra = PROTOCOL_CASES[case]
    _, _, log = run_like_the_simulator(
        toy_digits(name, *extra), tmp_path, monkeypatch, round_timeout=120.0
    )
    actions = [json.loads(line)["action"] for line in log.read_text().splitlines()]
    # no plain training reply: every update left its silo masked or encrypted
    assert "fit" not in actions, sorted(set(actions))
    # Keys, seeds, shares and the contribution being masked never reach the silo's disk; the
    # rounds a silo has masked (public) are kept next to its state, so a resume cannot re-mask.
    silos = tmp_path / "flower" / "silos"
    assert not list(silos.rglob("protocol-memory-silo-*.npz"))
    if case != "private-weights":
        assert len(list(silos.rglob("protocol-public-silo-*.npz"))) == 3


@pytest.mark.usefixtures("task_identity")
def test_secure_aggregation_is_refused_in_per_message_mode(tmp_path: Path, monkeypatch) -> None:
    """A per-message silo process would have to write the round's keys to disk between stages:
    the silo refuses the protocol with the fix in the error, and nothing secret is stored."""
    from pdpfl.config import config_to_dict
    from pdpfl.runtime.flower.codec import encode_config

    out = tmp_path / "flower"
    run_config = {
        "pdpfl-config": encode_config(config_to_dict(toy_digits("rpdp", "aggregation=secure"))),
        "pdpfl-hooks": "pdpfl.runtime.flower.hooks:PDPFL_HOOKS",
        "pdpfl-out-dir": str(out),
        "pdpfl-resume": False,
        "pdpfl-round-timeout": 30.0,
        "pdpfl-startup-timeout": 30.0,
        "pdpfl-min-silos": 1,
    }
    grid = FakeGrid(
        run_config, out / "silos", 3, hooks=None, mode="per-message", monkeypatch=monkeypatch
    )
    from pdpfl.runtime.flower.transport import FlowerRunError

    with pytest.raises(FlowerRunError, match="mode per-message.*--mode warm"):
        serve(grid, out)
    assert not list((out / "silos").rglob("protocol-memory-silo-*.npz"))


@pytest.mark.slow
@pytest.mark.usefixtures("task_identity")
def test_private_subsampling_runs_on_flower(tmp_path: Path, monkeypatch: Any) -> None:
    """``subsampling: private`` through pdpfl's Flower apps: the oblivious transfer's stage
    crosses the wire, no plain training reply and no user mask leaves the server, and both
    observers are charged the Poisson(q)-subsampled ε (the sample is the silos' CSPRNG draw, so
    the model is not compared with the simulator's)."""
    from pdpfl.config import config_to_dict
    from pdpfl.privacy.uldp import user_epsilon
    from pdpfl.runtime.flower.codec import encode_config

    config = toy_digits(
        "uldp-avg",
        "algorithm.weights=private",
        "algorithm.user_rate=0.5",
        "algorithm.subsampling=private",
        "algorithm.ot_items=2",
        "secure.n_max=600",
        "secure.workers=1",
    )
    log = tmp_path / "messages.jsonl"
    monkeypatch.setenv("PDPFL_MESSAGE_LOG", str(log))
    out = tmp_path / "flower"
    run_config = {
        "pdpfl-config": encode_config(config_to_dict(config)),
        "pdpfl-hooks": "pdpfl.runtime.flower.hooks:PDPFL_HOOKS",
        "pdpfl-out-dir": str(out),
        "pdpfl-resume": False,
        "pdpfl-round-timeout": 120.0,
        "pdpfl-startup-timeout": 30.0,
        "pdpfl-min-silos": 3,
    }
    result = serve(public_data_grid(run_config, out / "silos", monkeypatch), out)
    assert result["status"] == "ok", result.get("error")
    assert result["summary"]["rounds_completed"] == 2
    text = log.read_text()
    actions = {json.loads(line)["action"] for line in text.splitlines()}
    assert "fit" not in actions and any("weights-ot" in a for a in actions), sorted(actions)
    sigma = config.privacy.noise_multiplier
    summary = json.loads((out / "summary.json").read_text())
    eps = summary["eps_spent_max"]
    assert eps["server"] == pytest.approx(eps["third_party"], rel=1e-9)
    if sigma is not None:
        assert eps["server"] == pytest.approx(
            user_epsilon(sigma, config.privacy.delta, 2, 0.5), rel=1e-6
        )
