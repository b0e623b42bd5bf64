"""``PersonalizedDPSGD.step`` rounds the noisy gradient into a reused buffer (issue #26): the
update must be bit for bit the one built from :meth:`privatized_gradient` (fresh tensors), the
gradients the optimizer sees must be this step's, and the sampled records the same."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pdpfl.dp.engine import PersonalizedDPSGD, make_optimizer
from pdpfl.models import create_model


def _pair(name: str, opt_name: str):
    out = []
    for _ in range(2):
        torch.manual_seed(3)
        model = create_model(name, (6,), 3)
        opt = make_optimizer(opt_name, model.parameters(), lr=0.1, weight_decay=1e-3)
        out.append(PersonalizedDPSGD(model, opt, noise_multiplier=0.7, max_grad_norm=0.5))
    return out


@pytest.mark.parametrize("name", ["logreg", "mlp"])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_step_equals_sample_privatize_apply_bit_for_bit(name, opt_name):
    fast, ref = _pair(name, opt_name)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g)
    x[3] *= 1e6  # a record that is clipped hard
    rates = np.linspace(0.05, 0.95, 40)
    gen_fast, gen_ref = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    seen: list[list[torch.Tensor]] = []
    for _ in range(5):
        res = fast.step(x, y, rates, gen_fast, normalizer=12.0)
        idx = ref.sample(rates, gen_ref)
        assert torch.equal(res.indices, idx)
        grads, loss_sum = ref.privatized_gradient(x[idx], y[idx], 12.0, gen_ref)
        assert res.loss_sum == pytest.approx(loss_sum, rel=1e-12)
        for p, gr in zip(fast.params, grads, strict=True):  # this step's gradient, exactly
            assert p.grad is not None and torch.equal(p.grad, gr)
        seen.append([p.grad for p in fast.params if p.grad is not None])
        ref.apply(grads)
        for a, b in zip(fast.params, ref.params, strict=True):
            assert torch.equal(a, b)
    # the same gradient tensors are handed to the optimizer every step (no allocation) ...
    assert all(a is b for a, b in zip(seen[0], seen[-1], strict=True))
    # ... and zero_grad(set_to_none=True) between steps does not break it
    fast.optimizer.zero_grad(set_to_none=True)
    ref.optimizer.zero_grad(set_to_none=True)
    fast.step(x, y, rates, gen_fast, normalizer=12.0)
    idx = ref.sample(rates, gen_ref)
    ref.apply(ref.privatized_gradient(x[idx], y[idx], 12.0, gen_ref)[0])
    for a, b in zip(fast.params, ref.params, strict=True):
        assert torch.equal(a, b)


def test_gradients_returned_by_privatized_gradient_are_not_overwritten_by_step():
    fast, _ = _pair("logreg", "sgd")
    x, y = torch.randn(30, 6), torch.randint(0, 3, (30,))
    gen = torch.Generator().manual_seed(1)
    kept, _ = fast.privatized_gradient(x, y, 10.0, gen)
    copy = [t.clone() for t in kept]
    for _ in range(3):
        fast.step(x, y, np.full(30, 0.5), gen, normalizer=10.0)
    assert all(torch.equal(a, b) for a, b in zip(kept, copy, strict=True))


@pytest.mark.parametrize(
    "bad",
    [[0.5, float("nan"), 0.1], [float("inf"), 0.1, 0.1], [-float("inf"), 0.1, 0.1],
     [0.5, -1e-300, 0.1], [0.5, 1.0 + 2**-52, 0.1], [float("nan")] * 3],
)  # fmt: skip
def test_step_validates_rates_without_copying_them(bad):
    """step() checks its rates in place (no private copy: they are used at once); the checks
    are those of as_rates (NaN and ±inf rejected through min/max alone)."""
    fast, _ = _pair("logreg", "sgd")
    x, y = torch.randn(3, 6), torch.randint(0, 3, (3,))
    for rates in (np.array(bad), torch.tensor(bad, dtype=torch.float64), bad):
        with pytest.raises(ValueError, match=r"rates must be finite and in \[0, 1\]"):
            fast.step(x, y, rates, torch.Generator(), normalizer=1.0)
    with pytest.raises(ValueError, match=r"rates must have shape \(3,\)"):
        fast.step(x, y, np.full(4, 0.5), torch.Generator(), normalizer=1.0)
    for ok in (np.array([0.0, 1.0, 0.5]), torch.tensor([0.0, 1.0, 0.5]), [0.0, 1.0, 0.5]):
        res = fast.step(x, y, ok, torch.Generator().manual_seed(0), normalizer=1.0)
        assert res.indices.tolist() in ([1], [1, 2])  # q = 0 never, q = 1 always
