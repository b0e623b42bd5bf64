"""Batched training of many model copies equals the per-copy loop (pdpfl.dp.batched)."""

from __future__ import annotations

import pytest
import torch

from pdpfl.dp.batched import LocalTrainingSpec, train_copies, train_copies_loop
from pdpfl.models import create_model
from pdpfl.randomness import SeededRandomness


def _data(sizes, shape=(1, 8, 8), classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, *shape, generator=g), torch.randint(0, classes, (n,), generator=g))
        for n in sizes
    ]


@pytest.mark.parametrize(
    "spec",
    [
        LocalTrainingSpec(epochs=2, batch_size=8, optimizer="sgd", lr=0.1),
        LocalTrainingSpec(
            epochs=1, batch_size=5, optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-3
        ),
        LocalTrainingSpec(epochs=3, batch_size=16, optimizer="adam", lr=0.01),
        LocalTrainingSpec(epochs=1, batch_size=None, optimizer="sgd", lr=0.1),
        LocalTrainingSpec(epochs=4, batch_size=4, optimizer="sgd", lr=0.1, steps=3),
    ],
)
def test_batched_copies_follow_the_per_copy_loop(spec):
    torch.manual_seed(0)
    model = create_model("mlp", (1, 8, 8), 10)
    # different sizes: copies finish their epochs at different steps
    data = _data([3, 17, 40, 9, 1])
    a = train_copies(model, data, spec, stream=SeededRandomness(3).stream("shuffle"), group_size=2)
    b = train_copies_loop(model, data, spec, stream=SeededRandomness(3).stream("shuffle"))
    for x, y in zip(a, b, strict=True):
        assert x.shape == y.shape
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)
    # Every copy moved (no copy silently skipped) and copies differ from each other.
    norms = torch.stack([torch.cat([d[k].flatten() for d in a]).norm() for k in range(len(data))])
    assert bool((norms > 0).all())
    assert not torch.allclose(a[0][0], a[0][1])


def test_a_copy_without_data_has_a_zero_delta_and_the_model_is_untouched():
    torch.manual_seed(1)
    model = create_model("logreg", (5,), 3)
    before = [p.detach().clone() for p in model.parameters()]
    data = _data([0, 6], shape=(5,), classes=3)
    deltas = train_copies(model, data, LocalTrainingSpec(epochs=2, batch_size=4, lr=0.5))
    assert all(bool((d[0] == 0).all()) for d in deltas)
    assert any(bool((d[1] != 0).any()) for d in deltas)
    for p, q in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, q)


def test_shuffling_comes_from_the_given_stream():
    torch.manual_seed(2)
    model = create_model("logreg", (5,), 3)
    data = _data([30], shape=(5,), classes=3)
    spec = LocalTrainingSpec(epochs=1, batch_size=4, lr=0.5)
    same = [
        train_copies(model, data, spec, stream=SeededRandomness(7).stream("s")) for _ in range(2)
    ]
    other = train_copies(model, data, spec, stream=SeededRandomness(8).stream("s"))
    torch.testing.assert_close(same[0][0], same[1][0])
    assert not torch.allclose(same[0][0], other[0][0])


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(epochs=0), "epochs"),
        (dict(batch_size=0), "batch_size"),
        (dict(optimizer="lbfgs"), "optimizer"),
        (dict(lr=float("nan")), "lr"),
        (dict(momentum=1.0), "momentum"),
    ],
)
def test_bad_specs_name_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        LocalTrainingSpec(**bad)


def test_batchnorm_models_are_rejected():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    with pytest.raises(ValueError, match="BatchNorm"):
        train_copies(model, _data([4], shape=(4,), classes=4), LocalTrainingSpec())


def test_per_copy_streams_and_memory_capped_groups_follow_the_loop():
    torch.manual_seed(4)
    model = create_model("mlp", (1, 8, 8), 10)
    data = _data([5, 12, 0, 30, 7, 2], seed=1)
    spec = LocalTrainingSpec(epochs=2, batch_size=6, optimizer="sgd", lr=0.2, momentum=0.5)

    def streams():
        return [SeededRandomness(5).stream("user", k) for k in range(len(data))]

    a = train_copies(model, data, spec, stream=streams(), physical_batch_size=13)
    b = train_copies_loop(model, data, spec, stream=streams())
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)
    # A copy's training depends on its own stream only: dropping a copy changes no other.
    rest = [0, 1, 3, 4, 5]
    c = train_copies(model, [data[k] for k in rest], spec, stream=[streams()[k] for k in rest])
    for x, y in zip(a, c, strict=True):
        torch.testing.assert_close(x[rest], y, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="one stream per copy"):
        train_copies(model, data, spec, stream=streams()[:2])


def test_cnnmnist_copies_follow_the_loop():
    torch.manual_seed(6)
    model = create_model("cnnmnist", (1, 28, 28), 10, dropout=0.0)
    data = _data([3, 9, 5], shape=(1, 28, 28), seed=2)
    spec = LocalTrainingSpec(epochs=2, batch_size=4, optimizer="sgd", lr=0.05)
    a = train_copies(model, data, spec, stream=SeededRandomness(1).stream("s"))
    b = train_copies_loop(model, data, spec, stream=SeededRandomness(1).stream("s"))
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


class _Wrapped(torch.nn.Module):
    """Not an nn.Sequential: exercises the generic vmap(grad) path."""

    def __init__(self):
        super().__init__()
        self.inner = create_model("mlp", (1, 8, 8), 10)

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_generic_vmap_path_follows_the_loop(optimizer):
    torch.manual_seed(7)
    model = _Wrapped()
    data = _data([4, 11, 1], seed=3)
    spec = LocalTrainingSpec(
        epochs=2,
        batch_size=3,
        optimizer=optimizer,
        lr=0.05,
        momentum=0.9 if optimizer == "sgd" else 0.0,
        weight_decay=1e-3 if optimizer == "sgd" else 0.0,
    )
    a = train_copies(model, data, spec, stream=SeededRandomness(2).stream("s"))
    b = train_copies_loop(model, data, spec, stream=SeededRandomness(2).stream("s"))
    for x, y in zip(a, b, strict=True):
        # Adam's m/√v turns float rounding of near-zero gradients into ~1e-4 steps.
        torch.testing.assert_close(x, y, atol=1e-5 if optimizer == "sgd" else 2e-4, rtol=1e-4)


def test_private_fraud_net_copies_follow_the_loop():
    torch.manual_seed(8)
    model = create_model("private-fraud-net", (30,), 2, dropout=0.0)
    data = _data([5, 2, 9], shape=(30,), classes=2, seed=4)
    spec = LocalTrainingSpec(epochs=2, batch_size=4, optimizer="sgd", lr=0.1)
    a = train_copies(model, data, spec, stream=SeededRandomness(3).stream("s"))
    b = train_copies_loop(model, data, spec, stream=SeededRandomness(3).stream("s"))
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)
