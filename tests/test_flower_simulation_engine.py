"""``--runtime flower-simulation``: the pdpfl Flower apps under Flower's Simulation Engine (Ray).

The refusals (no Ray installed, a protocol that keeps secrets in a silo's memory) need no Ray.
The end-to-end runs -- a run stopped by failing ClientApps and resumed to the in-process
simulator's model, a failing virtual client dropped while the others finish, Ctrl-C -- need Ray
(``pip install 'pdpfl[simulation]'``, part of ``dev``): skipped, saying why, where it is not
installed, except under CI (``CI`` set), where they run (and fail without Ray): 0 skipped.
Failures are injected through the hooks of ``flower_engine_faults.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from typer.testing import CliRunner  # noqa: E402

from pdpfl.cli import app  # noqa: E402
from pdpfl.config import load_config, run_fingerprint, with_updates  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "digits_demo.yaml"
TINY = [
    "rounds=2",
    "data.num_clients=3",
    "training.batch_size=12",
    "training.local_steps=3",
    "randomness=reproducible",
]
HAS_RAY = importlib.util.find_spec("ray") is not None
runner = CliRunner()
#: The engine's end-to-end tests; CI installs the simulation extra (in dev) and never skips them.
_needs_ray = pytest.mark.skipif(
    not HAS_RAY and not os.environ.get("CI"),
    reason="Ray is not installed (pip install 'pdpfl[simulation]')",
)


def requires_ray(test):
    """Ray end to end: slow, multi-process (flower), skipped without Ray outside CI."""
    for mark in (_needs_ray, pytest.mark.slow, pytest.mark.flower):
        test = mark(test)
    return test


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_without_ray_the_runtime_is_refused_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "run",
            str(DEMO),
            "--runtime",
            "flower-simulation",
            "--out",
            str(out),
            *[x for t in TINY for x in ("--set", t)],
        ],
    )
    assert res.exit_code == 2, res.output
    assert (
        "error: --runtime: flower-simulation needs the simulation extra: "
        "pip install 'pdpfl[simulation]'"
    ) in res.output
    assert "Traceback" not in res.output
    assert not out.exists()
    # Named by the config (no --runtime flag): the field is named.
    res = runner.invoke(
        app,
        [
            "run",
            str(DEMO),
            "--out",
            str(out),
            "--set",
            "runtime=flower-simulation",
            *[x for t in TINY for x in ("--set", t)],
        ],
    )
    assert res.exit_code == 2
    assert "error: runtime: flower-simulation needs the simulation extra" in res.output


def test_a_protocol_with_secrets_in_silo_memory_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    """Ray hands a silo's next message to any free actor: secure summation's keys would have to
    be written to disk between stages, so the run is refused (exit 2) before it starts."""
    from pdpfl.runtime.flower.simulation_engine import check_simulation

    config = load_config(DEMO, [*TINY, "aggregation=secure"])
    with pytest.raises(ValueError, match=r"runtime: flower-simulation .*'secure'.*runtime: flower"):
        check_simulation(config)
    check_simulation(load_config(DEMO, TINY))  # plain summation runs
    if HAS_RAY:
        out = tmp_path / "run"
        res = runner.invoke(
            app,
            [
                "run",
                str(DEMO),
                "--runtime",
                "flower-simulation",
                "--out",
                str(out),
                "--set",
                "aggregation=secure",
                *[x for t in TINY for x in ("--set", t)],
            ],
        )
        assert res.exit_code == 2, res.output
        assert "error: runtime: flower-simulation hands each message" in res.output
        assert not out.exists()


def test_client_resources_are_validated_and_do_not_change_the_run() -> None:
    from pdpfl.config import ConfigError
    from pdpfl.runtime.flower.simulation_engine import backend_config

    base = load_config(DEMO, TINY)
    half = with_updates(
        base,
        [
            "flower.simulation.client_resources.num_cpus=0.5",
            "flower.simulation.client_resources.num_gpus=0.25",
        ],
    )
    assert run_fingerprint(half) == run_fingerprint(base)  # resources, not the computation
    assert backend_config({"num_cpus": 0.5, "num_gpus": 0.25})["client_resources"] == {
        "num_cpus": 0.5,
        "num_gpus": 0.25,
    }
    assert backend_config(None)["client_resources"] == {"num_cpus": 1.0, "num_gpus": 0.0}
    with pytest.raises(ConfigError, match="flower.simulation.client_resources.num_cpus"):
        with_updates(base, ["flower.simulation.client_resources.num_cpus=0"])
    with pytest.raises(ConfigError, match="flower.simulation.client_resources.num_gpus"):
        with_updates(base, ["flower.simulation.client_resources.num_gpus=-1"])


def test_resources_no_actor_could_get_are_refused_before_ray_starts() -> None:
    """An actor pool Ray cannot fill would crash the engine after start-up: refused first."""
    import os

    from pdpfl.runtime.flower.simulation_engine import check_simulation

    cpus = os.cpu_count() or 1
    too_many = load_config(DEMO, [*TINY, f"flower.simulation.client_resources.num_cpus={cpus + 1}"])
    with pytest.raises(
        ValueError,
        match=rf"client_resources.num_cpus: {cpus + 1} is more than "
        rf"the {cpus} CPUs.*\(0, {cpus}\]",
    ):
        check_simulation(too_many)
    all_cpus = f"flower.simulation.client_resources.num_cpus={cpus}"
    check_simulation(load_config(DEMO, [*TINY, all_cpus]))
    import torch

    if not torch.cuda.is_available():
        gpu = load_config(DEMO, [*TINY, "flower.simulation.client_resources.num_gpus=0.5"])
        with pytest.raises(ValueError, match="num_gpus: 0.5 but torch sees 0 CUDA device"):
            check_simulation(gpu)


def test_a_serverapp_stops_waiting_once_the_engine_stopped() -> None:
    """If Ray fails under it, the ServerApp's next grid call raises (no wait for its timeout)."""
    import threading

    from pdpfl.runtime.flower.simulation_engine import _StoppableGrid
    from pdpfl.runtime.flower.transport import FlowerRunError

    class Grid:
        run = "r"

        def get_node_ids(self) -> list[int]:
            return [1, 2]

    stopped = threading.Event()
    grid = _StoppableGrid(Grid(), stopped)  # type: ignore[arg-type]
    assert grid.get_node_ids() == [1, 2] and grid.run == "r"
    stopped.set()
    with pytest.raises(FlowerRunError, match="Simulation Engine stopped"):
        grid.get_node_ids()


def test_the_virtual_supernode_gets_its_silos_node_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flwr.app import Context, RecordDict

    from pdpfl.io import write_json
    from pdpfl.runtime.flower.simulation_engine import PLAN_ENV, virtual_node_context

    plan = tmp_path / "plan.json"
    nodes = [
        {"partition-id": i, "num-partitions": 2, "state-dir": f"/s/silo-{i}"} for i in range(2)
    ]
    write_json(plan, {"run_config": {"pdpfl-config": "x"}, "node_configs": nodes})
    monkeypatch.setenv(PLAN_ENV, str(plan))
    ctx = Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": 1, "num-partitions": 2},
        state=RecordDict(),
        run_config={},
    )
    got = virtual_node_context(ctx)
    assert dict(got.node_config) == nodes[1]
    assert dict(got.run_config) == {"pdpfl-config": "x"}
    bad = Context(
        run_id=1,
        node_id=8,
        node_config={"partition-id": 2, "num-partitions": 3},
        state=RecordDict(),
        run_config={},
    )
    with pytest.raises(ValueError, match=r"partition-id=2 not in \[0, 2\)"):
        virtual_node_context(bad)
    monkeypatch.delenv(PLAN_ENV)
    with pytest.raises(RuntimeError, match=PLAN_ENV):
        virtual_node_context(ctx)


def _engine_run(config, out: Path, plan: dict[int, list[int]], **kwargs):
    """``run_flower_simulation`` with the fault plan ``{silo: [round indices]}``."""
    from flower_engine_faults import PLAN_ENV, SPEC, write_plan
    from pdpfl.runtime.flower.simulation_engine import run_flower_simulation

    plan_file = out.parent / f"{out.name}-faults.json"
    write_plan(plan_file, plan)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(PLAN_ENV, str(plan_file))
        return run_flower_simulation(config, out, hooks=SPEC, **kwargs)


@requires_ray
def test_a_run_stopped_by_failing_silos_resumes_to_the_simulators_model(tmp_path: Path) -> None:
    """digits, 3 virtual SuperNodes, 3 rounds, reproducible. Every silo's ClientApp raises in
    round 3: the run stops (no silo left) with round 1 checkpointed (round 2's evaluation
    travels with round 3's training request, which failed); resumed, it ends with the
    in-process simulator's model, metrics and ε, and each silo's ledger."""
    import ray

    from pdpfl.runtime.flower.transport import FlowerRunError
    from pdpfl.runtime.simulation import run_simulation

    config = load_config(DEMO, [*TINY, "rounds=3", "flower.simulation.client_resources.num_cpus=1"])
    sim = run_simulation(config, tmp_path / "sim", progress=False)
    out = tmp_path / "engine"
    with pytest.raises(FlowerRunError, match=r"(?s)only 0 silo\(s\) reachable.*injected failure"):
        _engine_run(config, out, {0: [2], 1: [2], 2: [2]})
    assert [m["round"] for m in _lines(out / "metrics.jsonl")] == [0]
    assert not ray.is_initialized()  # the engine shut Ray down after the failure too
    summary = _engine_run(config, out, {}, resume=True)
    a, b = np.load(tmp_path / "sim" / "model.npz"), np.load(out / "model.npz")
    assert a.files == b.files
    for key in a.files:
        np.testing.assert_allclose(a[key], b[key], rtol=0, atol=1e-6)
    sim_lines, eng_lines = _lines(tmp_path / "sim" / "metrics.jsonl"), _lines(out / "metrics.jsonl")
    assert [m["selected"] for m in sim_lines] == [m["selected"] for m in eng_lines]
    np.testing.assert_allclose(
        [m["accuracy"] for m in eng_lines], [m["accuracy"] for m in sim_lines], atol=1e-6
    )
    assert summary["rounds_completed"] == sim["rounds_completed"] == 3
    assert summary["privacy_view"].startswith("operator: collected")
    assert summary["eps_spent_max"] == pytest.approx(sim["eps_spent_max"], abs=1e-9)
    for path in (tmp_path / "sim" / "ledgers").glob("*.npz"):
        assert (out / "ledgers" / path.name).exists()
    # Each silo's state is in its own folder (the node config's state-dir) and every message
    # rebuilt the silo from it: no actor kept a copy between messages.
    timings = _lines(next((out / "flower").glob("silo-2/run-*/timings-silo-2.jsonl")))
    assert [t["warm"] for t in timings] == [False] * len(timings)
    assert len(timings) >= 4 and all(t["build_s"] > 0 for t in timings)
    assert not ray.is_initialized()


@requires_ray
def test_a_failing_virtual_client_is_dropped_and_the_others_finish(tmp_path: Path) -> None:
    """Silo 1's ClientApp raises in round 2 of 3: it is lost for the rest of the run (never
    contacted again), the rounds complete with silos 0 and 2, and silo 1's ledger keeps the one
    round it released -- nothing of the failed round, which released nothing."""
    from pdpfl.ledger.table import load_ledgers

    config = load_config(DEMO, [*TINY, "rounds=3"])
    summary = _engine_run(config, tmp_path / "run", {1: [1]})
    assert summary["rounds_completed"] == 3
    lines = _lines(tmp_path / "run" / "metrics.jsonl")
    assert [m["contributions"] for m in lines] == [3, 2, 2]
    events = _lines(tmp_path / "run" / "flower" / "transport.jsonl")
    failed = next(e for e in events if e["round"] == 1 and e["action"].startswith("fit"))
    assert failed["lost"] == [1] and 1 not in failed["replied"]
    assert all(1 not in e["sent"] for e in events if e["round"] == 2)
    counts = {
        name: ledger.counts["third-party"]
        for name, ledger in load_ledgers(tmp_path / "run").items()
    }
    assert set(counts) == {"client_0", "client_1", "client_2"}
    assert counts["client_1"].max() == 1
    assert counts["client_0"].max() == counts["client_2"].max() == 3


def test_a_round_whose_evaluated_silos_hold_no_test_record_is_reported(tmp_path: Path) -> None:
    """Only sampled silos evaluate on the engine: their test splits may all be empty (pooled
    accuracy NaN); the round's status file says accuracy null instead of failing the run."""
    from types import SimpleNamespace

    from pdpfl.runtime.flower.apps import RoundReporter, Status

    status = Status(tmp_path / "status.json")
    reporter = RoundReporter(status, 3, SimpleNamespace(lost={}))  # type: ignore[arg-type]
    reporter(0, {"selected": [4], "contributions": 1, "accuracy": float("nan")})
    assert json.loads((tmp_path / "status.json").read_text())["accuracy"] is None
    reporter(1, {"selected": [2], "contributions": 1, "accuracy": 0.5})
    assert json.loads((tmp_path / "status.json").read_text())["accuracy"] == 0.5


@requires_ray
def test_only_the_sampled_silos_are_asked_and_the_final_ledgers_are_the_simulators(
    tmp_path: Path,
) -> None:
    """digits, 6 virtual SuperNodes, λ = 0.34, 3 rounds, reproducible: before the final round
    each round's evaluation travels only to the next round's sample (a silo left out gets no
    message), every silo evaluates the final round, and each silo's final ledger (its catch-up
    charges for the rounds it sat out applied when next asked or at the end) is the in-process
    simulator's, as is the final round's pooled accuracy."""
    from pdpfl.ledger.table import load_ledgers
    from pdpfl.runtime.flower.simulation_engine import run_flower_simulation
    from pdpfl.runtime.simulation import run_simulation

    config = load_config(
        DEMO, [*TINY, "rounds=3", "data.num_clients=6", "training.client_rate=0.34"]
    )
    run_simulation(config, tmp_path / "sim", progress=False)
    out = tmp_path / "engine"
    run_flower_simulation(config, out)
    sim_lines, eng_lines = _lines(tmp_path / "sim" / "metrics.jsonl"), _lines(out / "metrics.jsonl")
    selected = [m["selected"] for m in sim_lines]
    assert [m["selected"] for m in eng_lines] == selected
    assert all(0 < len(s) < 6 for s in selected[1:])  # the seed leaves silos out of rounds 2, 3
    events = _lines(out / "flower" / "transport.jsonl")
    for t in (0, 1):  # round t's model is evaluated with round t + 1's training request only
        sent = [e["sent"] for e in events if e["round"] == t + 1 and e["action"] == "fit+evaluate"]
        assert sent == [selected[t + 1]]
        assert eng_lines[t]["clients_evaluated"] == len(selected[t + 1])
    evaluations = [(e["round"], sorted(e["sent"])) for e in events if e["action"] == "evaluate"]
    assert evaluations == [(2, list(range(6)))]  # the final round: every silo, once
    assert "clients_evaluated" not in eng_lines[2]
    assert eng_lines[2]["accuracy"] == pytest.approx(sim_lines[2]["accuracy"], abs=1e-6)
    sim_ledgers, eng_ledgers = load_ledgers(tmp_path / "sim"), load_ledgers(out)
    assert set(eng_ledgers) == set(sim_ledgers) == {f"client_{i}" for i in range(6)}
    for name, ledger in sim_ledgers.items():
        np.testing.assert_array_equal(
            eng_ledgers[name].counts["third-party"], ledger.counts["third-party"]
        )
        np.testing.assert_allclose(
            eng_ledgers[name].spent_epsilon(), ledger.spent_epsilon(), rtol=0, atol=1e-12
        )


@requires_ray
def test_ctrl_c_stops_the_engine_and_prints_the_resume_command(tmp_path: Path) -> None:
    """SIGINT mid-run: exit 130 within seconds with the finished rounds checkpointed, and no
    Ray process left (before, Flower's threads waited forever on actors Ray had shut down)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from pdpfl.runtime.flower.processes import descendants

    out = tmp_path / "run"
    cmd = [
        str(Path(sys.executable).parent / "pdpfl"),
        "run",
        str(DEMO),
        "--runtime",
        "flower-simulation",
        "--quiet",
        "--out",
        str(out),
        *[x for t in [*TINY, "rounds=200"] for x in ("--set", t)],
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        # as from a terminal: a runner started as a shell's background job passes SIGINT on
        # ignored, and pdpfl (like Python) keeps an inherited ignored signal ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().count("\n") >= 1):
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "no round finished within 120 s"
            time.sleep(0.2)
        ray_pids = descendants([proc.pid])
        assert ray_pids  # Ray's processes run under the command
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        output, _ = proc.communicate(timeout=60)
        assert time.monotonic() - t0 < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = output.decode()
    assert proc.returncode == 130, text
    assert "Resume with:" in text and "--resume" in text and "Traceback" not in text
    assert (out / "checkpoint.npz").exists()
    time.sleep(1.0)
    assert not [
        p
        for p in ray_pids
        if Path(f"/proc/{p}").exists()
        and Path(f"/proc/{p}/stat").read_text().split(")")[1].split()[0] != "Z"
    ]
