"""Model registry, parameter counts, loss/prediction conventions, parameter serialisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pdpfl.dp import hooks_supported, validate_model
from pdpfl.models import (
    MODELS,
    create_model,
    get_params,
    loss_fn,
    num_parameters,
    predict,
    register_model,
    set_params,
)

torch.set_num_threads(2)


@pytest.mark.parametrize(
    ("name", "shape", "k", "count"),
    [
        ("logreg", (13,), 2, 14),
        ("logreg", (64,), 10, 650),
        ("mnist-cnn", (1, 28, 28), 10, 26_010),
        ("resnet18-gn", (3, 32, 32), 10, 11_181_642),
    ],
)
def test_parameter_counts(name, shape, k, count):
    model = create_model(name, shape, k)
    assert num_parameters(model) == count
    validate_model(model)  # no BatchNorm anywhere


def test_models_run_and_have_expected_output_columns():
    assert create_model("logreg", (13,), 2)(torch.randn(3, 13)).shape == (3, 1)
    assert create_model("mlp", (30,), 2)(torch.randn(3, 30)).shape == (3, 1)
    mlp = create_model("mlp", (4, 5), 3, hidden=[8])
    assert mlp(torch.randn(3, 4, 5)).shape == (3, 3)
    assert num_parameters(mlp) == 20 * 8 + 8 + 8 * 3 + 3
    assert create_model("mnist-cnn", (1, 28, 28), 10)(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert create_model("resnet18-gn", (3, 32, 32), 10)(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    for name in ("logreg", "mlp", "mnist-cnn"):
        assert hooks_supported(create_model(name, (1, 28, 28), 10))
    assert hooks_supported(create_model("resnet18-gn", (3, 32, 32), 10))


def test_registry_errors_and_registration():
    with pytest.raises(ValueError, match="unknown name 'nope'"):
        create_model("nope", (3,), 2)
    with pytest.raises(ValueError, match="num_classes"):
        create_model("logreg", (3,), 1)
    with pytest.raises(ValueError, match="input_shape"):
        create_model("logreg", (0,), 2)
    with pytest.raises(ValueError, match="already registered"):
        register_model("logreg")(lambda s, k: nn.Linear(1, 1))

    @register_model("test-tiny")
    def _tiny(shape, k):
        return nn.Linear(shape[0], k)

    try:
        assert num_parameters(create_model("test-tiny", (2,), 3)) == 9
    finally:
        MODELS.pop("test-tiny")


def test_loss_and_predict_conventions():
    logits1 = torch.tensor([[2.0], [-1.0], [0.0]])
    y1 = torch.tensor([1, 0, 1])
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits1[:, 0], y1.float())
    assert float(loss_fn(logits1, y1)) == pytest.approx(float(expected))
    assert predict(logits1).tolist() == [1, 0, 0]
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]])
    y = torch.tensor([1, 2])
    assert float(loss_fn(logits, y)) == pytest.approx(
        float(torch.nn.functional.cross_entropy(logits, y))
    )
    assert predict(logits).tolist() == [1, 0]


def test_get_set_params_roundtrip_and_validation():
    a = create_model("mnist-cnn", (1, 28, 28), 10)
    b = create_model("mnist-cnn", (1, 28, 28), 10)
    params = get_params(a)
    assert all(p.dtype == np.float32 for p in params)
    assert [p.shape for p in params] == [tuple(v.shape) for v in a.parameters()]
    set_params(b, params)
    x = torch.randn(2, 1, 28, 28)
    torch.testing.assert_close(a(x), b(x))
    params[0] += 1.0  # the arrays are copies, not views of the model
    assert not np.array_equal(params[0], get_params(a)[0])
    with pytest.raises(ValueError, match="expected 8 arrays"):
        set_params(b, params[:-1])
    with pytest.raises(ValueError, match="shape mismatch for 'conv1.weight'"):
        set_params(b, [np.zeros((1, 1))] + params[1:])


def test_only_trainable_parameters_are_exchanged():
    """Buffers (running statistics) and frozen parameters never leave a silo (issue #10 §3)."""
    model = nn.Sequential(
        nn.Conv1d(2, 4, 3), nn.InstanceNorm1d(4, affine=True, track_running_stats=True),
        nn.Flatten(), nn.Linear(4 * 6, 3),
    )  # fmt: skip
    model[0].bias.requires_grad_(False)
    model.train()
    model(torch.randn(5, 2, 8))  # the running statistics now depend on the batch
    params = get_params(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert [a.shape for a in params] == [tuple(p.shape) for p in trainable]
    assert len(params) == 5 < len(model.state_dict())  # no running_mean/var, no frozen bias
    running = model[1].running_mean.clone()
    frozen = model[0].bias.detach().clone()
    other = [np.full(a.shape, 0.5, dtype=np.float32) for a in params]
    set_params(model, other)
    assert all(torch.all(p == 0.5) for p in trainable)
    assert torch.equal(model[1].running_mean, running) and torch.equal(model[0].bias, frozen)


def test_mnist_cnn_channels_last_activations_keep_the_nchw_values():
    """From conv1 on the MNIST CNN stores activations channels-last (a speed choice of the
    CPU kernels): the outputs and gradients are those of the plain NCHW network."""
    torch.manual_seed(0)
    model = create_model("mnist-cnn", (1, 28, 28), 10)
    x, y = torch.randn(5, 1, 28, 28), torch.randint(0, 10, (5,))
    seen = []
    model.conv2.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    out = model(x)
    assert seen[0].is_contiguous(memory_format=torch.channels_last)
    assert not seen[0].is_contiguous()

    def nchw(m, x):
        h = F.max_pool2d(torch.tanh(m.conv1(x)), 2, 1)
        h = F.max_pool2d(torch.tanh(F.conv2d(h, m.conv2.weight, m.conv2.bias, 2)), 2, 1)
        return m.fc2(torch.tanh(m.fc1(h.flatten(1))))

    ref = nchw(model, x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    g = torch.autograd.grad(loss_fn(out, y), list(model.parameters()))
    g_ref = torch.autograd.grad(loss_fn(ref, y), list(model.parameters()))
    for a, b in zip(g, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
