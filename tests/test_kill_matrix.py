"""The kill matrix of docs/flower.md, on real processes (issue #36 item 1 and 2).

SIGINT, SIGTERM and SIGHUP -- Ctrl-C, a scheduler's stop (SLURM, Kubernetes, systemd), a closed
terminal -- are sent to a running ``pdpfl`` process mid-round. Each must: exit with 128 + the
signal, print the command that continues the run, keep every finished round (no temporary file
left), leave no process behind, and the printed command must continue the run to the model of an
uninterrupted one.

Before: SIGTERM and SIGHUP killed ``pdpfl run`` where it stood (no message, no resume command,
sometimes ``.checkpoint.npz.*.tmp`` left); ``pdpfl flower supernode`` kept its children in
sessions of their own, so a signal to its process group did not reach them.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits_demo.yaml"
# As started from a terminal: a shell's background job (CI runners, ``cmd &``) inherits SIGINT
# ignored, and pdpfl keeps an ignored signal ignored (as ``nohup`` users expect of SIGHUP).
PDPFL = [
    sys.executable,
    "-c",
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from pdpfl.cli import main; main()",
]
TOY = [
    "--set",
    "data.num_clients=3",
    "--set",
    "training.local_steps=2",
    "--set",
    "randomness=reproducible",
]


def _respend() -> list[str]:
    """``--set`` for several runs on the same records in one test, where a person's budget is
    kept for life across runs (the ``lifetime`` section): allowed to re-spend (public data)."""
    from pdpfl.config import ExperimentConfig

    return (
        ["--set", "lifetime.allow_respend=true"]
        if "lifetime" in ExperimentConfig.model_fields
        else []
    )


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*PDPFL, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # as a scheduler's job: the test signals the pdpfl process
    )


def _wait_for(condition: Any, proc: subprocess.Popen[str], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            out = proc.communicate()[0]
            raise AssertionError(f"pdpfl ended before the signal (exit {proc.returncode}):\n{out}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out")
        time.sleep(0.02)


def _temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*.tmp")]


def _resume_args(output: str) -> list[str]:
    line = next(x for x in output.splitlines() if x.strip().startswith("pdpfl run "))
    return shlex.split(line)[1:]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    from pdpfl.config import load_config
    from pdpfl.runtime.simulation import run_simulation

    config = load_config(EXAMPLE, ["rounds=5", *TOY[1::2]])
    out = tmp_path_factory.mktemp("whole")
    run_simulation(config, out, progress=False, overwrite=True)
    return dict(np.load(out / "model.npz"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: signal.Signals(s).name
)
def test_a_stopped_run_keeps_its_rounds_and_resumes_to_the_same_model(
    sig: int, tmp_path: Path, uninterrupted: dict[str, np.ndarray]
) -> None:
    from typer.testing import CliRunner

    from pdpfl.cli import app

    out = tmp_path / "run"
    proc = _start(["run", str(EXAMPLE), "--out", str(out), "--set", "rounds=5", *TOY], tmp_path)
    _wait_for(lambda: _lines(out / "metrics.jsonl") >= 2, proc)
    proc.send_signal(sig)  # mid-round 3
    output = proc.communicate(timeout=120)[0]
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, output
    assert f"interrupted ({name}):" in output and "Traceback" not in output
    assert "round 1/5 · " in output  # no terminal: progress as plain lines (issue #36 item 7)
    done = _lines(out / "metrics.jsonl")
    assert 2 <= done < 5 and f"{done} of 5 rounds are saved" in output
    assert _temporaries(out) == []
    assert not (out / "summary.json").exists()  # an interrupted run is not a finished one
    args = _resume_args(output)
    assert args[-1] == "--resume" or "--resume" in args
    res = CliRunner().invoke(app, [*args, "--quiet"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    resumed = np.load(out / "model.npz")
    for key, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[key], value)


@pytest.mark.slow
def test_a_stopped_compare_keeps_the_finished_runs(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    args = ["compare", str(EXAMPLE), "--methods", "privacy-free", "rpdp", "--out", str(out)]
    proc = _start([*args, "--set", "rounds=6", *TOY, *_respend()], tmp_path)
    _wait_for(lambda: _lines(out / "compare.csv") >= 2, proc)  # header + the first run
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, output
    assert "interrupted (SIGTERM): 1 of 2 runs finished" in output
    assert _lines(out / "compare.csv") == 2
    assert (out / "privacy-free" / f"seed{42}" / "summary.json").is_file()
    assert _temporaries(out) == []


# ------------------------------------------------------------------------------ Flower


def _descendants(pid: int) -> set[int]:
    from pdpfl.runtime.flower.processes import descendants

    return set(descendants([pid]))


def _alive(pids: set[int], wait_s: float = 10.0) -> set[int]:
    """The processes of ``pids`` still alive after up to ``wait_s`` (Flower's own processes
    follow their parent within about a second)."""
    from pdpfl.runtime.flower.processes import _alive as alive

    deadline = time.monotonic() + wait_s
    left = {p for p in pids if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {p for p in left if alive(p)}
    return left


@pytest.mark.flower
@pytest.mark.slow
def test_a_stopped_flower_run_leaves_no_process_and_resumes(tmp_path: Path) -> None:
    pytest.importorskip("flwr")
    out = tmp_path / "fl"
    toy = ["--set", "data.num_clients=2", *TOY[2:]]
    proc = _start(
        ["run", str(EXAMPLE), "--runtime", "flower", "--out", str(out), "--set", "rounds=4", *toy],
        tmp_path,
    )
    seen: set[int] = set()

    def first_round() -> bool:
        seen.update(_descendants(proc.pid))
        return _lines(out / "metrics.jsonl") >= 1

    _wait_for(first_round, proc, timeout=600)
    seen.update(_descendants(proc.pid))
    assert len(seen) >= 4  # SuperLink, 2 SuperNodes, the worker (and Flower's own)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, output
    assert "interrupted (SIGTERM) after" in output and "every Flower process was stopped" in output
    assert _alive(seen) == set()
    assert _temporaries(out) == []
    resumed = subprocess.run(
        [*PDPFL, *_resume_args(output), "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert _lines(out / "metrics.jsonl") == 4


@pytest.mark.flower
@pytest.mark.slow
def test_superlink_and_supernode_stop_with_their_children(tmp_path: Path) -> None:
    pytest.importorskip("flwr")
    from pdpfl.runtime.flower.processes import free_port

    link_port, api_port = free_port(), free_port()
    superlink = _start(["flower", "superlink", "--insecure", "--port", str(link_port)], tmp_path)
    supernode = _start(
        [
            "flower",
            "supernode",
            "--silo",
            "0",
            "--num-silos",
            "1",
            "--superlink",
            f"127.0.0.1:{link_port}",
            "--insecure",
            "--state-dir",
            str(tmp_path / "state"),
            "--port",
            str(api_port),
        ],
        tmp_path,
    )
    try:
        # the SuperNode and its silo worker are children of the pdpfl process, in its group
        _wait_for(lambda: len(_descendants(supernode.pid)) >= 2, supernode, timeout=300)
        children = _descendants(supernode.pid)
        assert {os.getpgid(p) for p in children} == {os.getpgid(supernode.pid)}
        link_children = _descendants(superlink.pid)
        supernode.send_signal(signal.SIGTERM)
        output = supernode.communicate(timeout=180)[0]  # a loaded CI machine is slow to stop it
        assert supernode.returncode == 143, output
        assert _alive(children) == set()
        # the port is free again: another SuperNode may start there
        from pdpfl.runtime.flower.ports import port_problem

        assert port_problem("127.0.0.1", api_port) is None
        superlink.send_signal(signal.SIGTERM)
        superlink.communicate(timeout=60)
        assert _alive(link_children | {superlink.pid}) == set()
    finally:
        for proc in (supernode, superlink):
            if proc.poll() is None:
                proc.kill()
