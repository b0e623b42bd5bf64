"""``training.device`` / ``--device``: where silos train (issue #26, item 2).

CI has no accelerator, so these tests pin the CPU contract: ``device: cpu`` is the default and
gives the same model bit-for-bit for every registered algorithm (reproducible mode); a device
that is not on this machine is refused before any work (``error: training.device: ...``, exit
2, nothing written); ``auto`` falls back to the CPU here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from pdpfl.cli import app
from pdpfl.config import ALGORITHMS, ConfigError, run_fingerprint, with_updates
from pdpfl.fl.common import ModelSource, federation_info, silo_model, training_device
from pdpfl.runtime.loop import run_federation
from pdpfl.runtime.simulation import InProcessTransport, load_federation_for
from pdpfl.testing import _build, toy_config

pytestmark = pytest.mark.filterwarnings("ignore::pdpfl.randomness.ReproducibleRandomnessWarning")

HAS_CUDA = torch.cuda.is_available()


def _final_params(name: str, extra: list[str], out: Path) -> list[np.ndarray]:
    server, clients, config = _build(toy_config(name, extra))
    result = run_federation(config, server, InProcessTransport(clients), out, progress=False)
    return [np.asarray(p) for p in result["params"]]


@pytest.mark.parametrize(
    "name",
    # rPDP-FL in the fast lane; every other algorithm in the full suite (each a few seconds)
    [n if n == "rpdp" else pytest.param(n, marks=pytest.mark.slow) for n in ALGORITHMS.names()],
)
def test_device_cpu_is_the_default_bit_for_bit(name: str, tmp_path: Path) -> None:
    default = _final_params(name, [], tmp_path / "default")
    on_cpu = _final_params(name, ["training.device=cpu"], tmp_path / "cpu")
    assert len(default) == len(on_cpu)
    for a, b in zip(default, on_cpu, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_config_accepts_the_documented_names_only() -> None:
    base = toy_config("rpdp")
    assert base.training.device == "cpu"
    for name in ("auto", "cpu", "cuda", "cuda:1", "mps"):
        assert with_updates(base, [f"training.device={name}"]).training.device == name
    for bad in ("gpu", "cuda:", "tpu", "CPU", "cuda:x"):
        with pytest.raises(ConfigError, match=r"training\.device"):
            with_updates(base, [f"training.device={bad}"])


def test_device_does_not_change_the_resume_fingerprint() -> None:
    base = toy_config("rpdp")
    assert run_fingerprint(base) == run_fingerprint(with_updates(base, ["training.device=auto"]))


def test_auto_falls_back_to_the_cpu_without_an_accelerator() -> None:
    config = with_updates(toy_config("rpdp"), ["training.device=auto"])
    dev = training_device(config.training.device)
    if HAS_CUDA:
        assert dev.type == "cuda"
    elif not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        assert dev == torch.device("cpu")


@pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA")
def test_cuda_without_cuda_is_refused_before_any_work(tmp_path: Path) -> None:
    config = with_updates(toy_config("rpdp"), ["training.device=cuda"])
    with pytest.raises(ValueError, match=r"^training\.device: 'cuda' requested"):
        training_device(config.training.device)
    with pytest.raises(ValueError, match=r"^training\.device"):
        _build(config)
    with pytest.raises(ValueError, match=r"^training\.device"):
        model = ModelSource.of(config.model, seed=config.seed, device=config.training.device)
        silo_model(model, federation_info(load_federation_for(config), config))


@pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA")
@pytest.mark.parametrize("name", ["rpdp", "idp-fedavg", "uldp-avg", "uldp-group", "prifedsync"])
def test_a_silo_built_alone_refuses_an_absent_device(name: str) -> None:
    """What a Flower silo calls (``algorithm.client`` with the published setup, as
    ``runtime/flower/hooks.py`` does) checks the device on the silo's own machine."""
    from pdpfl.fl.algorithm import as_algorithm
    from pdpfl.fl.common import party_randomness

    config = toy_config(name)
    algorithm = as_algorithm(config.algorithm)
    config, federation = algorithm.prepare(config, load_federation_for(config))
    info = federation_info(federation, config)
    setup = algorithm.setup(config, info)
    on_cuda = with_updates(config, ["training.device=cuda"])
    assert (
        algorithm.client(
            config, 0, federation.clients[0], info, setup, party_randomness(config, "silo-0")
        )
        is not None
    )
    with pytest.raises(ValueError, match=r"^training\.device"):
        algorithm.client(
            on_cuda, 0, federation.clients[0], info, setup, party_randomness(on_cuda, "silo-0")
        )


@pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA")
@pytest.mark.parametrize("command", ["run", "compare"])
def test_cli_device_cuda_without_cuda_exits_2(command: str, tmp_path: Path) -> None:
    cfg = tmp_path / "toy.yaml"
    cfg.write_text(
        "name: toy\nseed: 1\nrandomness: reproducible\n"
        "data: {dataset: digits, num_clients: 2}\nmodel: {name: logreg}\n"
        "budgets: {scenario: uniform, params: {value: 2.0}}\n"
        "privacy: {epsilon_max: 2.0, delta: 1.0e-3}\n"
        "training: {rounds: 1, local_steps: 1, batch_size: 8}\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    args = [command, str(cfg), "--device", "cuda", "--out", str(out)]
    if command == "compare":
        args += ["--methods", "rpdp"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "error: training.device: 'cuda' requested" in res.output
    assert "Traceback" not in res.output
    assert not out.exists()  # nothing half-written


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device on this machine (CI is CPU-only)")
@pytest.mark.parametrize("name", ["rpdp", "idp-fedavg", "uldp-avg", "prifedsync"])
def test_cuda_run_releases_cpu_arrays(name: str, tmp_path: Path) -> None:
    params = _final_params(name, ["training.device=cuda"], tmp_path / "cuda")
    assert all(isinstance(p, np.ndarray) and np.all(np.isfinite(p)) for p in params)
