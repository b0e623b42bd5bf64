"""Personalized DP-SGD engine: per-sample gradients, clipping, noise, Poisson sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from torch import nn

from pdpfl.dp import (
    PersonalizedDPSGD,
    bookkeeping,
    clipped_grad_sum,
    hooks_supported,
    make_optimizer,
    per_sample_gradients,
    replace_batchnorm,
    train_steps,
    validate_model,
)
from pdpfl.dp.engine import evaluate
from pdpfl.dp.im2col import unfold2d
from pdpfl.models import create_model, get_params, loss_fn

torch.set_num_threads(2)


class _Mixed(nn.Module):
    """Conv1d + GroupNorm + sequence Linear + LayerNorm: exercises every hook layer type."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.seq = nn.Linear(6, 5)  # applied to (B, 4, 6): a "sequence" linear layer
        self.ln = nn.LayerNorm(5)
        self.head = nn.Linear(20, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.gn(self.conv(x)))
        h = self.ln(torch.tanh(self.seq(h)))
        return self.head(h.flatten(1))


class _Ghost(nn.Module):
    """Layers for which the hook back-end takes the Gram-matrix ("ghost norm") branch."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3)  # 4x8 input → L = 12: 2L² < 16·72 (Gram if large)
        self.seq = nn.Linear(8, 16)  # on (B, 2, 8): 2T² < din·dout (Gram if large)
        self.head = nn.Linear(16 * 12 + 32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.conv(x)).flatten(1)
        b = torch.tanh(self.seq(x[:, :2, 0, :])).flatten(1)  # (B, 2, 8) → (B, 2, 16)
        return self.head(torch.cat([a, b], 1))


class _Twice(nn.Module):
    """One layer used twice per forward (the hook back-end must fall back to torch.func)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.emb = nn.Embedding(3, 4)  # unsupported by hooks → "auto" picks func

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.tanh(self.lin(x))) + self.emb.weight[:1]


class _RowConv(nn.Module):
    """A padded stride-2 convolution whose kernel height is 3 strides: row-wise patches."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 6, stride=2, padding=2)
        self.head = nn.Linear(3 * 8 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.conv(x)).flatten(1))


class _OddConv(nn.Module):
    """Grouped, dilated, strided, asymmetric-padded convolution (materialised branch)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            4, 6, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(2, 1), groups=2
        )
        self.head = nn.Linear(6 * 4 * 10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.conv(x)).flatten(1))


def _case(name: str, n: int = 6, seed: int = 0):
    torch.manual_seed(seed)
    if name == "logreg":
        model, x, y = (
            create_model("logreg", (13,), 2),
            torch.randn(n, 13),
            torch.randint(0, 2, (n,)),
        )
    elif name == "mlp":
        model, x, y = create_model("mlp", (7,), 4), torch.randn(n, 7), torch.randint(0, 4, (n,))
    elif name == "cnn":
        model = create_model("mnist-cnn", (1, 14, 14), 10)
        x, y = torch.randn(n, 1, 14, 14), torch.randint(0, 10, (n,))
    elif name == "mixed":
        model, x, y = _Mixed(), torch.randn(n, 2, 6), torch.randint(0, 3, (n,))
    elif name == "oddconv":
        model, x, y = _OddConv(), torch.randn(n, 4, 9, 7), torch.randint(0, 3, (n,))
    elif name == "rowconv":
        model, x, y = _RowConv(), torch.randn(n, 2, 16, 16), torch.randint(0, 3, (n,))
    elif name == "ghost":
        model, x, y = _Ghost(), torch.randn(n, 8, 4, 8), torch.randint(0, 3, (n,))
    elif name.endswith("-nhwc"):  # channels-last inputs: the convolutions record NHWC tensors
        model, x, y = _case(name.removesuffix("-nhwc"), n, seed)
        return model, x.contiguous(memory_format=torch.channels_last), y
    else:
        raise AssertionError(name)
    return model.double(), x.double(), y


def _loop_grads(model, x, y):
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(x.shape[0]):
        g = torch.autograd.grad(loss_fn(model(x[i : i + 1]), y[i : i + 1]), params)
        out.append(torch.cat([t.flatten() for t in g]))
    return torch.stack(out)


@pytest.fixture(autouse=True)
def _gram_for_ghost(request, monkeypatch):
    """The "ghost" case exercises the Gram-matrix path (chosen for large layers only)."""
    if "ghost" in request.node.name:
        monkeypatch.setattr(bookkeeping, "_MATERIALISE_LIMIT", 0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "logreg",
        "mlp",
        "cnn",
        "mixed",
        "ghost",
        "oddconv",
        "rowconv",
        "ghost-nhwc",
        "oddconv-nhwc",
        "rowconv-nhwc",
    ],  # fmt: skip
)
@pytest.mark.parametrize("method", ["hooks", "func"])
def test_per_sample_gradients_match_loop(name, method):
    model, x, y = _case(name)
    assert hooks_supported(model)
    if name.startswith("rowconv"):  # the case exists for this path
        conv = model.conv
        geometry = (conv.kernel_size, conv.dilation, conv.padding, conv.stride)
        assert bookkeeping._patch_strategy(x, conv.out_channels, geometry, 1) == "rows"
    ps = per_sample_gradients(model, x, y, loss_fn, method=method, physical_batch_size=4)
    flat = torch.cat([ps[n].flatten(1) for n, _ in model.named_parameters()], 1)
    torch.testing.assert_close(flat, _loop_grads(model, x, y), atol=1e-6, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "logreg",
        "mlp",
        "cnn",
        "mixed",
        "ghost",
        "oddconv",
        "rowconv",
        "ghost-nhwc",
        "oddconv-nhwc",
        "rowconv-nhwc",
    ],  # fmt: skip
)
def test_clipped_sum_matches_explicit_clipping(name):
    model, x, y = _case(name, n=9)
    C = 0.05
    loop = _loop_grads(model, x, y)
    norms = loop.norm(dim=1)
    expected = (loop * (C / (norms + 1e-6)).clamp(max=1)[:, None]).sum(0)
    for method in ("hooks", "func"):
        res = clipped_grad_sum(model, x, y, loss_fn, C, method=method, physical_batch_size=4)
        got = torch.cat([s.flatten() for s in res.sums])
        torch.testing.assert_close(got, expected, atol=1e-9, rtol=1e-7)
        torch.testing.assert_close(res.norms, norms, atol=1e-9, rtol=1e-7)
        assert res.loss_sum == pytest.approx(float(loss_fn(model(x), y).detach()) * 9, rel=1e-9)


def test_fallback_for_unsupported_and_reused_layers():
    torch.manual_seed(0)
    model = _Twice().double()
    x, y = torch.randn(5, 4).double(), torch.randint(0, 4, (5,))
    assert not hooks_supported(model)
    res = clipped_grad_sum(model, x, y, loss_fn, 1e6, method="auto")
    torch.testing.assert_close(
        torch.cat([s.flatten() for s in res.sums]), _loop_grads(model, x, y).sum(0)
    )
    model.emb.weight.requires_grad_(False)
    assert hooks_supported(model)  # but `lin` is called twice: the engine must notice
    res = clipped_grad_sum(model, x, y, loss_fn, 1e6, method="auto")
    torch.testing.assert_close(
        torch.cat([s.flatten() for s in res.sums]), _loop_grads(model, x, y).sum(0)
    )


def _engine(model, sigma, C, private=True):
    opt = make_optimizer("sgd", model.parameters(), lr=0.1)
    return PersonalizedDPSGD(model, opt, noise_multiplier=sigma, max_grad_norm=C, private=private)


def test_sigma_zero_gradient_is_clipped_mean_scaled_by_realized_over_expected():
    model, x, y = _case("mlp", n=10)
    C, expected_bs = 0.1, 3.7
    loop = _loop_grads(model, x, y)
    clipped = loop * (C / (loop.norm(dim=1) + 1e-6)).clamp(max=1)[:, None]
    grads, _ = _engine(model, 0.0, C).privatized_gradient(x, y, expected_bs, torch.Generator())
    got = torch.cat([g.flatten() for g in grads])
    torch.testing.assert_close(got, clipped.mean(0) * (10 / expected_bs), atol=1e-10, rtol=1e-8)


@pytest.mark.slow
@pytest.mark.parametrize("empty", [True, False])
def test_noise_std_matches_sigma_c_over_expected_batch(empty):
    torch.manual_seed(0)
    model = create_model("logreg", (40,), 10).double()  # 410 coordinates per draw
    x, y = torch.randn(4, 40, dtype=torch.float64), torch.randint(0, 10, (4,))
    sigma, C, expected_bs = 1.3, 0.7, 2.5
    engine = _engine(model, sigma, C)
    xb, yb = (x[:0], y[:0]) if empty else (x, y)
    base, _ = _engine(model, 0.0, C).privatized_gradient(xb, yb, expected_bs, torch.Generator())
    base = torch.cat([b.flatten() for b in base])
    gen = torch.Generator().manual_seed(3)
    draws = torch.stack(
        [
            torch.cat(
                [g.flatten() for g in engine.privatized_gradient(xb, yb, expected_bs, gen)[0]]
            )
            for _ in range(120)
        ]
    )
    noise = draws - base
    target = sigma * C / expected_bs
    assert float(noise.std()) == pytest.approx(target, rel=0.05)
    assert abs(float(noise.mean())) < 0.05 * target
    # independent coordinates and draws: neighbouring coordinates / draws are uncorrelated
    assert (
        abs(
            float(
                torch.corrcoef(torch.stack([noise[:, :-1].flatten(), noise[:, 1:].flatten()]))[0, 1]
            )
        )
        < 0.03
    )
    assert (
        abs(float(torch.corrcoef(torch.stack([noise[:-1].flatten(), noise[1:].flatten()]))[0, 1]))
        < 0.03
    )


def test_empty_batch_is_a_noise_only_step_and_is_counted():
    model, x, y = _case("mlp", n=5)
    before = [p.detach().clone() for p in model.parameters()]
    rates = np.full(5, 1e-9)
    opt = make_optimizer("sgd", model.parameters(), lr=1e-9)
    res = train_steps(
        model,
        x,
        y,
        rates=rates,
        steps=3,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        optimizer=opt,
        stream=torch.Generator().manual_seed(0),
        normalizer=2.0,
    )
    assert res.steps == 3 and res.realized_batch_sizes == [0, 0, 0]
    assert np.isnan(res.mean_loss)
    assert res.selection_counts.tolist() == [0] * 5
    assert res.expected_batch_size == pytest.approx(5e-9)
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    # all rates 0 (a silo whose records all sat out): still τ noise-only steps
    before = [p.detach().clone() for p in model.parameters()]
    res = train_steps(
        model, x, y, rates=np.zeros(5), steps=2, noise_multiplier=1.0, max_grad_norm=1.0,
        optimizer=opt, stream=torch.Generator().manual_seed(1), normalizer=2.0,
    )  # fmt: skip
    assert res.realized_batch_sizes == [0, 0]
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_sampling_frequencies_match_rates_chi_square():
    n, T = 40, 3000
    rates = torch.linspace(0.0, 1.0, n, dtype=torch.float64)
    gen = torch.Generator().manual_seed(11)
    counts = torch.zeros(n)
    for _ in range(T):
        counts[PersonalizedDPSGD.sample(rates, gen)] += 1
    assert counts[0] == 0 and counts[-1] == T  # q = 0 never, q = 1 always
    inner = slice(1, n - 1)
    q = rates[inner].numpy()
    chi2 = float((((counts[inner].numpy() - T * q) ** 2) / (T * q * (1 - q))).sum())
    assert chi2 < stats.chi2.ppf(0.999, n - 2)
    # the realized batch sizes of independent Bernoullis have variance Σ q(1-q), not 0
    sizes = [len(PersonalizedDPSGD.sample(rates, gen)) for _ in range(500)]
    assert np.var(sizes) == pytest.approx(float((rates * (1 - rates)).sum()), rel=0.3)


@settings(max_examples=30)
@given(st.lists(st.sampled_from([0.0, 0.3, 1.0]), min_size=1, max_size=30), st.integers(0, 2**31))
def test_sample_respects_zero_and_one_rates(rate_list, seed):
    rates = torch.tensor(rate_list, dtype=torch.float64)
    idx = set(PersonalizedDPSGD.sample(rates, torch.Generator().manual_seed(seed)).tolist())
    assert {i for i, r in enumerate(rate_list) if r == 1.0} <= idx
    assert not idx & {i for i, r in enumerate(rate_list) if r == 0.0}


def test_nonprivate_step_is_plain_sgd_on_the_poisson_batch():
    model, x, y = _case("mlp", n=30)
    start = [p.detach().clone() for p in model.parameters()]
    lr = 0.5
    opt = make_optimizer("sgd", model.parameters(), lr=lr)
    res = train_steps(
        model,
        x,
        y,
        rates=np.full(30, 0.4),
        steps=1,
        noise_multiplier=5.0,
        max_grad_norm=1e-3,
        optimizer=opt,
        stream=torch.Generator().manual_seed(2),
        private=False,
        physical_batch_size=4,
    )
    idx = np.flatnonzero(res.selection_counts)
    assert len(idx) == res.realized_batch_sizes[0] > 0
    ref = _case("mlp", n=30)[0]
    loss = loss_fn(ref(x[idx]), y[idx])
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    for s, g, p in zip(start, grads, model.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), s - lr * g)
    assert res.mean_loss == pytest.approx(float(loss.detach()), rel=1e-9)


def test_private_step_update_equals_lr_times_privatized_gradient():
    model, x, y = _case("mlp", n=20)
    ref = _case("mlp", n=20)[0]
    rates = np.linspace(0.05, 0.9, 20)
    lr, C, B = 0.3, 0.2, 7.0  # B: the public normaliser (never Σq computed from the rates)
    opt = make_optimizer("sgd", model.parameters(), lr=lr)
    res = train_steps(
        model,
        x,
        y,
        rates=rates,
        steps=1,
        noise_multiplier=0.0,
        max_grad_norm=C,
        optimizer=opt,
        stream=torch.Generator().manual_seed(5),
        normalizer=B,
    )
    idx = np.flatnonzero(res.selection_counts)
    loop = _loop_grads(ref, x[idx], y[idx])
    clipped = (loop * (C / (loop.norm(dim=1) + 1e-6)).clamp(max=1)[:, None]).sum(0) / B
    start = torch.cat([p.detach().flatten() for p in ref.parameters()])
    now = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.testing.assert_close(now, start - lr * clipped)


@pytest.mark.slow
def test_same_seed_same_model_and_different_seed_differs():
    def run(seed):
        model, x, y = _case("cnn", n=20)
        opt = make_optimizer("adam", model.parameters(), lr=1e-2, weight_decay=1e-3)
        train_steps(
            model,
            x,
            y,
            rates=np.full(20, 0.3),
            steps=3,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            optimizer=opt,
            stream=torch.Generator().manual_seed(seed),
            normalizer=6.0,
        )
        return np.concatenate([a.ravel() for a in get_params(model)])

    np.testing.assert_array_equal(run(1), run(1))
    assert not np.array_equal(run(1), run(2))


@pytest.mark.parametrize("opt_name", ["sgd", "adam", "rmsprop"])
def test_optimizers_consume_the_private_gradient(opt_name):
    model, x, y = _case("logreg", n=50)
    x = x.float()
    model = model.float()
    before = evaluate(model, x, y)
    opt = make_optimizer(opt_name, model.parameters(), lr=0.05, weight_decay=1e-4)
    res = train_steps(
        model,
        x,
        y,
        rates=np.full(50, 0.5),
        steps=30,
        noise_multiplier=0.1,
        max_grad_norm=5.0,
        optimizer=opt,
        stream=torch.Generator().manual_seed(0),
        normalizer=25.0,
    )
    assert res.steps == 30 and len(res.realized_batch_sizes) == 30
    assert evaluate(model, x, y)["loss"] < before["loss"]


def test_bad_inputs_have_clear_messages():
    model, x, y = _case("logreg", n=4)
    opt = make_optimizer("sgd", model.parameters(), lr=0.1)
    kw = dict(
        steps=1, noise_multiplier=1.0, max_grad_norm=1.0, optimizer=opt, stream=torch.Generator(),
        normalizer=2.0,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"rates must have shape \(4,\)"):
        train_steps(model, x, y, rates=np.full(3, 0.5), **kw)
    with pytest.raises(ValueError, match=r"rates must be finite and in \[0, 1\]"):
        train_steps(model, x, y, rates=np.array([0.5, 1.5, 0.1, 0.1]), **kw)
    with pytest.raises(ValueError, match="normalizer: required under DP"):
        train_steps(model, x, y, rates=np.full(4, 0.5), **{**kw, "normalizer": None})
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="normalizer: must be a finite number > 0"):
            train_steps(model, x, y, rates=np.full(4, 0.5), **{**kw, "normalizer": bad})
    with pytest.raises(ValueError, match="max_grad_norm"):
        train_steps(model, x, y, rates=np.full(4, 0.5), **{**kw, "max_grad_norm": 0.0})
    with pytest.raises(ValueError, match="noise_multiplier"):
        train_steps(model, x, y, rates=np.full(4, 0.5), **{**kw, "noise_multiplier": -1.0})
    with pytest.raises(ValueError, match="optimizer must be one of"):
        make_optimizer("lbfgs", model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="lr must be"):
        make_optimizer("sgd", model.parameters(), lr=0.0)


def test_batchnorm_rejected_with_module_name_and_groupnorm_swap_trains():
    model = nn.Sequential(
        nn.Conv2d(1, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 3)
    )
    with pytest.raises(ValueError, match=r"'1' \(BatchNorm2d\).*replace_batchnorm"):
        validate_model(model)
    with pytest.raises(ValueError, match="BatchNorm2d"):
        _engine(model, 1.0, 1.0)
    replace_batchnorm(model, num_groups=4)
    assert isinstance(model[1], nn.GroupNorm) and model[1].num_groups == 2  # gcd(4, 6)
    validate_model(model)
    x, y = torch.randn(12, 1, 6, 6), torch.randint(0, 3, (12,))
    res = train_steps(
        model,
        x,
        y,
        rates=np.full(12, 0.5),
        steps=2,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        optimizer=make_optimizer("sgd", model.parameters(), lr=0.1),
        stream=torch.Generator().manual_seed(0),
        normalizer=6.0,
    )
    assert res.steps == 2


def test_evaluate_reports_per_class_accuracy():
    model = nn.Linear(2, 3)
    with torch.no_grad():
        model.weight.copy_(torch.eye(3, 2))
        model.bias.zero_()
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0, 1, 1, 2])
    out = evaluate(model, x, y, batch_size=3)
    assert out["n"] == 4 and out["accuracy"] == pytest.approx(0.5)
    assert out["per_class_accuracy"] == {0: 1.0, 1: 0.5, 2: 0.0}
    assert model.training


@pytest.mark.slow
def test_resnet18_gn_hook_clipping_matches_loop():
    torch.manual_seed(0)
    model = create_model("resnet18-gn", (3, 16, 16), 10).double()
    x, y = torch.randn(2, 3, 16, 16, dtype=torch.float64), torch.randint(0, 10, (2,))
    assert hooks_supported(model)
    loop = _loop_grads(model, x, y)
    C = 1.0
    expected = (loop * (C / (loop.norm(dim=1) + 1e-6)).clamp(max=1)[:, None]).sum(0)
    res = clipped_grad_sum(model, x, y, loss_fn, C, method="hooks")
    torch.testing.assert_close(torch.cat([s.flatten() for s in res.sums]), expected)
    torch.testing.assert_close(res.norms, loop.norm(dim=1))


@settings(max_examples=40)
@given(
    st.integers(1, 3), st.integers(1, 3), st.integers(1, 2), st.integers(1, 2),
    st.integers(0, 2), st.integers(0, 2), st.integers(1, 3), st.integers(1, 3),
)  # fmt: skip
def test_unfold_matches_torch_im2col(kh, kw, dh, dw, ph, pw, sh, sw):
    a = torch.randn(2, 3, 8, 9)
    args = ((kh, kw), (dh, dw), (ph, pw), (sh, sw))
    expected = torch.nn.functional.unfold(
        a, *args[:1], dilation=args[1], padding=args[2], stride=args[3]
    )
    assert torch.equal(unfold2d(a, *args), expected)


class _CountingNorm(nn.Module):
    """A custom module whose buffer is a running statistic of the batch (unknown to validate)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, 3)
        self.register_buffer("running_mean", torch.zeros(d))
        self.register_buffer("scale", torch.ones(d))  # constant: allowed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.running_mean.mul_(0.9).add_(0.1 * x.mean(0))
        return self.lin(x * self.scale)


def test_modules_whose_buffers_change_in_training_are_rejected():
    # statically, for known types (the running statistics are a function of the batch)
    model = nn.Sequential(
        nn.Conv1d(2, 4, 3), nn.InstanceNorm1d(4, track_running_stats=True), nn.Flatten(),
        nn.Linear(4 * 6, 3),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"module '1' \(InstanceNorm1d\).*running statistics"):
        validate_model(model)
    with pytest.raises(ValueError, match="InstanceNorm1d"):
        _engine(model, 1.0, 1.0)
    validate_model(nn.Sequential(nn.Conv1d(2, 4, 3), nn.InstanceNorm1d(4)))  # stateless: fine
    # dynamically, for any module: buffers changed by a training-mode forward
    torch.manual_seed(0)
    wrapped = nn.Sequential(_CountingNorm(5))
    validate_model(wrapped)
    x, y = torch.randn(12, 5), torch.randint(0, 3, (12,))
    opt = make_optimizer("sgd", wrapped.parameters(), lr=0.1)
    kw = dict(rates=np.ones(12), steps=1, noise_multiplier=1.0, max_grad_norm=1.0, optimizer=opt,
              stream=torch.Generator().manual_seed(0), normalizer=12.0)  # fmt: skip
    for method in ("hooks", "func"):
        with pytest.raises(ValueError, match=r"module '0' \(_CountingNorm\).*'running_mean'"):
            train_steps(wrapped, x, y, grad_sampler=method, **kw)
    # a constant buffer passes, and only trainable parameters are exchanged
    del wrapped[0].running_mean
    wrapped[0].register_buffer("running_mean", torch.zeros(5))
    wrapped[0].forward = lambda x: wrapped[0].lin(x * wrapped[0].scale)
    res = train_steps(wrapped, x, y, **kw)
    assert res.steps == 1
    assert [a.shape for a in get_params(wrapped)] == [(3, 5), (3,)]
