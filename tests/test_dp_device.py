"""``device=`` of the DP engine and the batched trainers, and the engine's reuse of state.

CI has no accelerator: the CPU paths are tested here, the CUDA test is skipped with a reason
where no GPU is present.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from pdpfl.dp import PersonalizedDPSGD, clipped_grad_sum, make_optimizer, train_steps
from pdpfl.dp.batched import LocalTrainingSpec, train_copies, train_copies_loop
from pdpfl.dp.device import math_device, resolve_device
from pdpfl.dp.engine import move_to_device
from pdpfl.models import create_model, get_params, loss_fn
from pdpfl.randomness import stream_from_generator

torch.set_num_threads(2)


def test_resolve_device_names_and_errors():
    assert resolve_device(None) is None
    assert resolve_device("cpu") == torch.device("cpu")
    auto = resolve_device("auto")
    assert auto is not None
    if not torch.cuda.is_available():
        assert auto.type in ("cpu", "mps")
        with pytest.raises(ValueError, match=r"device: 'cuda' requested"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match=r"device: expected one of 'auto', 'cpu', 'cuda'"):
        resolve_device("gpu")
    with pytest.raises(ValueError, match="device: expected"):
        resolve_device("meta")
    assert math_device(torch.device("mps")) == torch.device("cpu")  # no float64 on mps
    assert math_device(torch.device("cpu")) == torch.device("cpu")


def _run(device, seed=3):
    torch.manual_seed(0)
    model = create_model("mnist-cnn", (1, 14, 14), 10)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(40, 1, 14, 14, generator=g), torch.randint(0, 10, (40,), generator=g)
    opt = make_optimizer("adam", model.parameters(), lr=1e-2)
    res = train_steps(
        model, x, y, rates=np.full(40, 0.3), steps=3, noise_multiplier=1.0, max_grad_norm=1.0,
        optimizer=opt, stream=torch.Generator().manual_seed(seed), normalizer=12.0, device=device,
    )  # fmt: skip
    return res, np.concatenate([a.ravel() for a in get_params(model)])


def test_train_steps_on_cpu_device_is_the_default_run():
    a, pa = _run(None)
    b, pb = _run("cpu")
    assert a.realized_batch_sizes == b.realized_batch_sizes
    np.testing.assert_array_equal(pa, pb)


def test_move_to_device_keeps_parameters_and_moves_optimizer_state():
    model = nn.Linear(3, 2)
    weight = model.weight
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    move_to_device(model, opt, torch.device("meta"))  # torch swaps the Parameter objects here
    assert model.weight.device.type == "meta"
    assert opt.param_groups[0]["params"][0] is model.weight  # the optimizer follows
    state = opt.state[model.weight]
    assert state["exp_avg"].device.type == "meta" and state["step"].device.type == "cpu"
    assert weight not in opt.state


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_step_matches_the_cpu_step():  # pragma: no cover - needs a GPU
    a, pa = _run(None)
    b, pb = _run("cuda")
    assert a.realized_batch_sizes == b.realized_batch_sizes  # same coins (drawn on the CPU)
    np.testing.assert_allclose(pa, pb, rtol=1e-4, atol=1e-5)  # same noise, other rounding
    torch.manual_seed(0)
    model = create_model("mlp", (5,), 3)
    data = [(torch.randn(7, 5), torch.randint(0, 3, (7,))) for _ in range(4)]
    spec = LocalTrainingSpec(epochs=2, batch_size=3, lr=0.1)
    cpu = train_copies(model, data, spec)
    gpu = train_copies(model, data, spec, device="cuda")
    assert gpu[0].device.type == "cuda"
    for c, g in zip(cpu, gpu, strict=True):
        torch.testing.assert_close(c, g.cpu(), rtol=1e-4, atol=1e-6)


def test_batched_trainers_accept_a_device():
    torch.manual_seed(0)
    model = create_model("mlp", (5,), 3)
    data = [(torch.randn(n, 5), torch.randint(0, 3, (n,))) for n in (7, 3, 0, 5)]
    spec = LocalTrainingSpec(epochs=2, batch_size=3, lr=0.1)
    ref = train_copies(model, data, spec, stream=stream_from_generator(torch.Generator()))
    for fn in (train_copies, train_copies_loop):
        got = fn(model, data, spec, stream=stream_from_generator(torch.Generator()), device="cpu")
        for r, o in zip(ref, got, strict=True):
            assert o.device.type == "cpu"
            torch.testing.assert_close(r, o, rtol=1e-5, atol=1e-7)


# -- in-place ops and reused buffers ------------------------------------------------------


class _InplaceRelu(nn.Module):
    """ReLU(inplace=True) on the output of a recorded layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.act = nn.ReLU(inplace=True)
        self.head = nn.Linear(3 * 4 * 4, 4)

    def forward(self, x):
        return self.head(self.act(self.conv(x)).flatten(1))


def test_in_place_op_on_a_recorded_output_gives_the_exact_clipped_sum():
    """The recorder hands out no copies until a version counter shows an in-place op; then it
    records again with copies (and the engine keeps doing so)."""
    torch.manual_seed(0)
    model = _InplaceRelu().double()
    x, y = torch.randn(6, 2, 6, 6, dtype=torch.float64), torch.randint(0, 3, (6,))
    hooks = clipped_grad_sum(model, x, y, loss_fn, 0.05, method="hooks")
    func = clipped_grad_sum(model, x, y, loss_fn, 0.05, method="func")
    assert hooks.method == "hooks"
    for a, b in zip(hooks.sums, func.sums, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)
    engine = PersonalizedDPSGD(model, make_optimizer("sgd", model.parameters(), lr=0.1),
                               noise_multiplier=0.0, max_grad_norm=0.05)  # fmt: skip
    for _ in range(2):
        res = engine.clipped_sum(x, y)
        for a, b in zip(res.sums, func.sums, strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)
    assert engine._workspace.clone_outputs


def test_engine_reuses_buffers_without_mixing_steps():
    """The engine keeps per-sample buffers between steps: a second batch gives what a fresh
    computation gives."""
    torch.manual_seed(0)
    model = create_model("mnist-cnn", (1, 14, 14), 10)
    opt = make_optimizer("sgd", model.parameters(), lr=0.1)
    engine = PersonalizedDPSGD(model, opt, noise_multiplier=0.0, max_grad_norm=0.5)
    g = torch.Generator().manual_seed(2)
    xa, ya = torch.randn(9, 1, 14, 14, generator=g), torch.randint(0, 10, (9,), generator=g)
    xb, yb = torch.randn(5, 1, 14, 14, generator=g), torch.randint(0, 10, (5,), generator=g)
    engine.clipped_sum(xa, ya)
    got = engine.clipped_sum(xb, yb)
    ref = clipped_grad_sum(model, xb, yb, loss_fn, 0.5)
    for a, b in zip(got.sums, ref.sums, strict=True):
        assert torch.equal(a, b)
