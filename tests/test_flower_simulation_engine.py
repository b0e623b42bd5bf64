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
    """``run_flower_simulation`` with the fault plan ``{silo: [round indices]}`` (and the
    ``diverge`` and ``interrupt`` plans of :func:`flower_engine_faults.write_plan`)."""
    from flower_engine_faults import PLAN_ENV, SPEC, write_plan
    from pdpfl.runtime.flower.simulation_engine import run_flower_simulation

    faults = {k: kwargs.pop(k) for k in ("diverge", "interrupt") if k in kwargs}
    plan_file = out.parent / f"{out.name}-faults.json"
    write_plan(plan_file, plan, **faults)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(PLAN_ENV, str(plan_file))
        return run_flower_simulation(config, out, hooks=SPEC, **kwargs)


def _silo_ledgers(out: Path, n: int) -> dict[str, object]:
    """Each silo's own ledger in its state folder (what an interrupted engine run leaves)."""
    from pdpfl.ledger import load_ledger

    key = (out / "flower" / "run_key").read_text().strip()
    return {
        f"client_{i}": load_ledger(
            out / "flower" / f"silo-{i}" / f"run-{key}" / f"ledger-silo-{i}.npz", party=f"silo-{i}"
        )
        for i in range(n)
    }


def _trained_from(out: Path, first: int) -> set[int]:
    """The silos that trained (and charged) round ``first`` or later, from their own timings
    (a request announced before the run stopped may have been answered unseen)."""
    return {
        int(path.parent.parent.name.removeprefix("silo-"))
        for path in (out / "flower").glob("silo-*/run-*/timings-silo-*.jsonl")
        if any(t["action"].startswith("fit") and t["round"] >= first for t in _lines(path))
    }


FEDERATION = [*TINY, "data.num_clients=6", "training.client_rate=0.34"]


def test_the_catch_up_reaches_the_published_rounds_and_the_summary_names_silos_behind(
    tmp_path: Path,
) -> None:
    """The rounds an engine run reached are those it published (a diverged last round published
    no model); a silo whose ledger could not be caught up is named in the summary."""
    from pdpfl.runtime.flower.catch_up import CatchUpReport, note_behind, rounds_reached

    assert rounds_reached(tmp_path) == 0
    lines = [{"round": 0}, {"round": 1}, {"round": 2, "diverged": {"round": 2}}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    assert rounds_reached(tmp_path) == 2
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines[:2]))
    assert rounds_reached(tmp_path) == 2
    summary = {"warnings": ["w"], "eps_spent_max": 1.0}
    assert note_behind(summary, CatchUpReport(2, caught_up={0: 1}), tmp_path) is summary
    noted = note_behind(summary, CatchUpReport(2, behind={3: "IntegrityError: x"}), tmp_path)
    assert noted["silos_behind"] == [{"index": 3, "rounds": 2, "reason": "IntegrityError: x"}]
    assert noted["warnings"][0] == "w" and "silo(s) [3]" in noted["warnings"][1]
    assert json.loads((tmp_path / "summary.json").read_text()) == noted


@requires_ray
def test_an_interrupted_run_is_caught_up_and_resumes_to_the_simulators_diverged_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """digits, 6 virtual SuperNodes, λ = 0.34, 5 rounds, reproducible (seed 42 samples
    [5], [0, 4], [3, 5], [], [1, 2, 3, 4]). Run 1 is interrupted: silo 3's ClientApp sends SIGINT
    to this process in round 3. The engine stops with the finished rounds checkpointed and, before
    it returns, every silo's ledger is caught up to them: per silo ε ≥ the simulator's stopped
    after as many rounds, and = for every silo not sent a later training request (before, the
    silos not asked since their last message lacked their Type II catch-up charges). Resumed, the
    run diverges in round 5 at silo 4 (charged, then a non-finite update, as the simulator's run
    with the same fault): its ledgers (silos 0 and 5 caught up after the run), ε, metrics and
    model are the simulator's."""
    import ray

    from pdpfl.errors import TrainingDiverged
    from pdpfl.fl.messages import nonfinite_update_cause
    from pdpfl.fl.template import NonFiniteError, Silo
    from pdpfl.ledger.table import load_ledgers
    from pdpfl.runtime.flower.launcher import rounds_saved
    from pdpfl.runtime.flower.processes import FlowerInterrupted
    from pdpfl.runtime.simulation import run_simulation

    config = load_config(DEMO, [*FEDERATION, "rounds=5"])
    run_simulation(config, tmp_path / "full", progress=False)
    selected = [m["selected"] for m in _lines(tmp_path / "full" / "metrics.jsonl")]
    assert selected == [[5], [0, 4], [3, 5], [], [1, 2, 3, 4]]  # the schedule the test is about
    out = tmp_path / "engine"
    with pytest.raises(FlowerInterrupted):
        _engine_run(config, out, {}, interrupt={3: [2]})
    assert not ray.is_initialized()
    done = rounds_saved(out)
    assert 1 <= done <= 2
    report = json.loads((out / "flower" / "catch_up.json").read_text())
    assert report["rounds"] == done and report["caught_up"] and not report["behind"]
    run_simulation(config, tmp_path / "stopped", progress=False, stop_after=done)
    reference = load_ledgers(tmp_path / "stopped")
    later = _trained_from(out, done)
    for name, ledger in _silo_ledgers(out, 6).items():
        eps, ref = ledger.spent_epsilon(), reference[name].spent_epsilon()
        assert np.all(eps >= ref - 1e-12), name
        if int(name.removeprefix("client_")) not in later:
            np.testing.assert_allclose(eps, ref, rtol=0, atol=1e-12, err_msg=name)

    # The simulator's run with the same divergence: silo 4's update in round 5, after its charge.
    release = Silo.release

    def diverging(self, contribution, params=None):
        if self.client_id == 4 and self.next_round - 1 == 4:
            raise NonFiniteError(nonfinite_update_cause(0), round_index=4, silo=4)
        return release(self, contribution, params)

    with monkeypatch.context() as mp:
        mp.setattr(Silo, "release", diverging)
        with pytest.raises(TrainingDiverged):
            run_simulation(config, tmp_path / "sim", progress=False)
    with pytest.raises(TrainingDiverged) as caught:
        _engine_run(config, out, {}, diverge={4: [4]}, resume=True)
    summary = caught.value.result
    assert summary is not None and "silos_behind" not in summary
    assert summary["privacy_view"].startswith("operator: collected")
    sim_lines, eng_lines = _lines(tmp_path / "sim" / "metrics.jsonl"), _lines(out / "metrics.jsonl")
    assert [m["selected"] for m in eng_lines] == [m["selected"] for m in sim_lines]
    assert eng_lines[-1]["diverged"]["round"] == sim_lines[-1]["diverged"]["round"] == 4
    sim_ledgers, eng_ledgers = load_ledgers(tmp_path / "sim"), load_ledgers(out)
    assert set(eng_ledgers) == set(sim_ledgers) == {f"client_{i}" for i in range(6)}
    for name, ledger in sim_ledgers.items():
        np.testing.assert_array_equal(
            eng_ledgers[name].counts["third-party"], ledger.counts["third-party"], err_msg=name
        )
        np.testing.assert_allclose(
            eng_ledgers[name].spent_epsilon(), ledger.spent_epsilon(), rtol=0, atol=1e-12
        )
    a, b = np.load(tmp_path / "sim" / "model.npz"), np.load(out / "model.npz")
    assert a.files == b.files
    for key in a.files:
        np.testing.assert_allclose(a[key], b[key], rtol=0, atol=1e-6)
    # Each silo's state is in its own folder (the node config's state-dir) and every message
    # rebuilt the silo from it: no actor kept a copy between messages.
    timings = _lines(next((out / "flower").glob("silo-4/run-*/timings-silo-4.jsonl")))
    assert [t["warm"] for t in timings] == [False] * len(timings)
    assert len(timings) >= 3 and all(t["build_s"] > 0 for t in timings)
    assert not ray.is_initialized()


@requires_ray
def test_a_failing_virtual_client_is_dropped_and_the_others_finish(tmp_path: Path) -> None:
    """Silo 1's ClientApp raises in round 2 of 3: it is lost for the rest of the run (never
    contacted again), the rounds complete with silos 0 and 2, and silo 1's ledger keeps the one
    round it released and, caught up by the operator after the run, the third-party charge of
    the round it was lost in (it released nothing then; it might have been sampled: counted,
    conservatively) -- nothing after it."""
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
    assert counts["client_1"].max() == 2
    assert counts["client_0"].max() == counts["client_2"].max() == 3
    report = json.loads((tmp_path / "run" / "flower" / "catch_up.json").read_text())
    assert report["caught_up"] == {"1": 1} and not report["behind"]


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

    config = load_config(DEMO, [*FEDERATION, "rounds=3"])
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
    # the final round caught every silo up: nothing left for the operator after the run
    assert json.loads((out / "flower" / "catch_up.json").read_text())["caught_up"] == {}
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
def test_sigterm_stops_the_engine_and_prints_the_resume_command(tmp_path: Path) -> None:
    """SIGTERM mid-run (6 silos, λ = 0.34), as a scheduler stops a job: exit 143 within seconds
    with the finished rounds checkpointed (before, Ray's own SIGTERM handler took the signal and
    ended the process at once: no resume command, no catch-up), and no Ray process left (before
    that, Flower's threads waited forever on actors Ray had shut down); every silo's ledger is
    caught up to the rounds saved: ε ≥ the simulator's stopped there, = for each silo that
    trained no later round. (SIGINT from a ClientApp: the interrupted-run test above.)"""
    import os
    import signal
    import subprocess
    import sys
    import time

    from pdpfl.ledger.table import load_ledgers
    from pdpfl.runtime.flower.launcher import rounds_saved
    from pdpfl.runtime.flower.processes import descendants
    from pdpfl.runtime.simulation import run_simulation

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
        *[x for t in [*FEDERATION, "rounds=200"] for x in ("--set", t)],
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
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        output, _ = proc.communicate(timeout=60)
        assert time.monotonic() - t0 < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = output.decode()
    assert proc.returncode == 143, text
    assert "Resume with:" in text and "--resume" in text and "Traceback" not in text
    assert (out / "checkpoint.npz").exists()
    done = rounds_saved(out)
    assert json.loads((out / "flower" / "catch_up.json").read_text())["rounds"] == done
    config = load_config(DEMO, [*FEDERATION, "rounds=200"])
    run_simulation(config, tmp_path / "sim", progress=False, stop_after=done)
    reference, later = load_ledgers(tmp_path / "sim"), _trained_from(out, done)
    for name, ledger in _silo_ledgers(out, 6).items():
        eps, ref = ledger.spent_epsilon(), reference[name].spent_epsilon()
        assert np.all(eps >= ref - 1e-12), name
        if int(name.removeprefix("client_")) not in later:
            np.testing.assert_allclose(eps, ref, rtol=0, atol=1e-12, err_msg=name)
    time.sleep(1.0)
    assert not [
        p
        for p in ray_pids
        if Path(f"/proc/{p}").exists()
        and Path(f"/proc/{p}/stat").read_text().split(")")[1].split()[0] != "Z"
    ]
