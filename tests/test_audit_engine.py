"""The DP engine's hook for audit canaries (pdpfl.dp.extra_rows) and the audit-only block."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from pdpfl.audit.space import AuditBlock, choose_space
from pdpfl.dp.engine import PersonalizedDPSGD, make_optimizer, train_steps
from pdpfl.dp.extra_rows import ExtraRows
from pdpfl.models import create_model, get_params, num_parameters
from pdpfl.randomness import SeededRandomness

torch.set_num_threads(1)


def _logreg(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return create_model("logreg", (5,), 3)  # Linear(5, 3): 15 weights, then 3 biases


def _train(
    model: torch.nn.Module,
    extra: ExtraRows | None,
    *,
    sigma: float,
    steps: int = 1,
    rates: float = 0.0,
    lr: float = 1.0,
    batch: float = 4.0,
) -> None:
    x = torch.randn(20, 5, generator=torch.Generator().manual_seed(1))
    y = torch.arange(20) % 3
    train_steps(
        model,
        x,
        y,
        rates=np.full(20, rates),
        steps=steps,
        noise_multiplier=sigma,
        max_grad_norm=2.0,
        optimizer=make_optimizer("sgd", model.parameters(), lr=lr),
        stream=SeededRandomness(5).stream("t"),
        normalizer=batch,
        extra=extra,
    )


def test_a_sampled_row_adds_its_clipped_vector_to_the_sum() -> None:
    model = _logreg()
    before = np.concatenate([p.ravel() for p in get_params(model)])
    # rate 1: always sampled; the second row (norm 5 > C = 2) is clipped to norm 2
    rows = ExtraRows(
        coords=np.array([[3, 0], [16, 2]]),
        values=np.array([[1.0, 0.0], [3.0, 4.0]]),
        rates=np.array([1.0, 1.0]),
    )
    _train(model, rows, sigma=0.0)
    after = np.concatenate([p.ravel() for p in get_params(model)])
    delta = after - before
    expected = np.zeros_like(delta)
    expected[3] -= 1.0 / 4.0  # lr · C e_j / B, C·e_j unclipped (norm 1 <= 2)
    expected[16] -= 3.0 * 0.4 / 4.0  # clipped by 2/5
    expected[2] -= 4.0 * 0.4 / 4.0
    np.testing.assert_allclose(delta, expected, atol=1e-6)
    assert rows.counts.tolist() == [1, 1]


def test_rows_are_sampled_with_their_own_rates() -> None:
    model = _logreg()
    rows = ExtraRows(coords=np.arange(4), values=np.ones(4), rates=np.array([0.0, 0.25, 0.6, 1.0]))
    _train(model, rows, sigma=1.0, steps=400, lr=1e-3)
    assert rows.counts[0] == 0 and rows.counts[3] == 400
    for q, k in zip((0.25, 0.6), rows.counts[1:3], strict=True):
        assert stats.binomtest(int(k), 400, q).pvalue > 1e-4


def test_rows_get_the_same_noise_as_every_coordinate() -> None:
    """With the row never sampled the coordinate is pure N(0, σ²C²)/B noise (nothing else)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    rows = ExtraRows(coords=np.array([0]), values=np.array([1.0]), rates=np.array([0.0]))
    x, y = torch.zeros(3, 1), torch.zeros(3)
    opt = make_optimizer("sgd", model.parameters(), lr=1.0)
    engine = PersonalizedDPSGD(
        model,
        opt,
        noise_multiplier=1.5,
        max_grad_norm=2.0,
        loss=lambda o, t: ((o.squeeze(1) - t) ** 2).mean(),
    )
    stream = SeededRandomness(3).stream("noise")
    moves = []
    for _ in range(300):
        w0 = float(model.weight)
        engine.step(x, y, np.zeros(3), stream, normalizer=1.0, extra=rows)
        moves.append(float(model.weight) - w0)
    assert stats.kstest(np.asarray(moves) / 3.0, "norm").pvalue > 1e-3


def test_extra_rows_are_checked() -> None:
    with pytest.raises(ValueError, match="distinct"):
        ExtraRows(coords=np.array([[1, 1]]), values=np.ones((1, 2)), rates=np.ones(1))
    with pytest.raises(ValueError, match="rates"):
        ExtraRows(coords=np.array([1]), values=np.ones(1), rates=np.array([1.5]))
    with pytest.raises(ValueError, match="finite"):
        ExtraRows(coords=np.array([1]), values=np.array([np.inf]), rates=np.ones(1))
    with pytest.raises(ValueError, match="non-negative"):
        ExtraRows(coords=np.array([-1]), values=np.ones(1), rates=np.ones(1))
    model = _logreg()
    outside = ExtraRows(coords=np.array([18]), values=np.ones(1), rates=np.ones(1))
    with pytest.raises(ValueError, match="outside"):
        _train(model, outside, sigma=0.0)
    x, y = torch.zeros(2, 5), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="private"):
        train_steps(
            model,
            x,
            y,
            rates=np.ones(2),
            steps=1,
            noise_multiplier=0.0,
            max_grad_norm=1.0,
            optimizer=make_optimizer("sgd", model.parameters(), 0.1),
            stream=SeededRandomness(1).stream("t"),
            private=False,
            extra=ExtraRows(coords=np.array([0]), values=np.ones(1), rates=np.ones(1)),
        )


def test_the_block_changes_neither_outputs_nor_record_gradients() -> None:
    inner = _logreg()
    model = AuditBlock(_logreg(), size=7)
    x = torch.randn(6, 5)
    torch.testing.assert_close(model(x), inner(x))
    assert num_parameters(model) == num_parameters(inner) + 7
    # every record at rate 1, no noise: the block's coordinates do not move, the model's do
    # exactly as without the block
    _train(model, None, sigma=0.0, rates=1.0)
    _train(inner, None, sigma=0.0, rates=1.0)
    for a, b in zip(get_params(model)[:-1], get_params(inner), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert np.all(get_params(model)[-1] == 0.0)


def test_choose_space() -> None:
    assert choose_space("auto", 650, 400) == "model"
    assert choose_space("auto", 14, 400) == "block"
    assert choose_space("block", 10_000, 4) == "block"
    with pytest.raises(ValueError, match="--space block"):
        choose_space("model", 14, 400)
