"""Optimizers, device moves and evaluation around the DP engine (:mod:`pdpfl.dp.engine`).

The optimizer consumes the privatized gradient (post-processing, no privacy cost); evaluation
reports loss, accuracy and per-class accuracy of a model on a test set.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, TypedDict

import torch
from torch import Tensor, nn

from pdpfl.models import loss_fn, predict

__all__ = ["Evaluation", "evaluate", "make_optimizer", "move_to_device"]


class Evaluation(TypedDict):
    """What :func:`evaluate` returns."""

    loss: float
    accuracy: float
    per_class_accuracy: dict[int, float]
    """Accuracy per label present in ``y``."""
    n: int


def make_optimizer(
    name: str,
    params: Iterable[nn.Parameter] | Iterable[dict[str, Any]],
    lr: float,
    weight_decay: float = 0.0,
    momentum: float = 0.0,
) -> torch.optim.Optimizer:
    """``"sgd"`` | ``"adam"`` | ``"rmsprop"`` (``momentum`` applies to SGD and RMSprop only)."""
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive finite number, got {lr}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    key = name.lower()
    if key == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if key == "adam":
        if momentum:
            raise ValueError("momentum is not an option of adam (use betas); set momentum=0")
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if key == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ValueError(f"optimizer must be one of 'sgd', 'adam', 'rmsprop', got {name!r}")


def move_to_device(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, dev: torch.device
) -> None:
    """Move ``model`` and the tensors of ``optimizer``'s state to ``dev``.

    The optimizer keeps referring to the model's parameters (torch keeps their identity for
    cpu ↔ cuda moves; where it swaps them the optimizer is re-pointed); Adam's step counters
    stay on the CPU, as torch expects.
    """
    before = list(model.parameters())
    model.to(dev)
    after = list(model.parameters())
    if optimizer is None:
        return
    swapped = {id(a): b for a, b in zip(before, after, strict=True) if a is not b}
    if swapped:
        for group in optimizer.param_groups:
            group["params"] = [swapped.get(id(p), p) for p in group["params"]]
        items = list(optimizer.state.items())
        optimizer.state.clear()
        for p, st in items:
            optimizer.state[swapped.get(id(p), p)] = st
    for state in optimizer.state.values():
        for key, value in list(state.items()):
            if isinstance(value, Tensor) and key != "step":
                state[key] = value.to(dev)


@torch.no_grad()
def evaluate(model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 1024) -> Evaluation:
    """Loss (via :func:`pdpfl.models.loss_fn`), accuracy and per-class accuracy on ``(x, y)``.

    Returns ``{"loss", "accuracy", "per_class_accuracy": {label: acc}, "n"}``; the per-class
    dictionary has one entry per label present in ``y``. Empty data gives ``nan`` metrics.
    """
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        n = int(x.shape[0])
        loss_sum, preds = 0.0, []
        for start in range(0, n, batch_size):
            xs = x[start : start + batch_size].to(device)
            ys = y[start : start + batch_size].to(device)
            out = model(xs)
            loss_sum += float(loss_fn(out, ys)) * xs.shape[0]
            preds.append(predict(out).cpu())
    finally:
        model.train(was_training)
    if n == 0:
        return {"loss": float("nan"), "accuracy": float("nan"), "per_class_accuracy": {}, "n": 0}
    pred = torch.cat(preds)
    labels = y.detach().cpu().long().flatten()
    correct = pred == labels
    per_class = {
        int(c): float(correct[labels == c].float().mean()) for c in torch.unique(labels).tolist()
    }
    return {
        "loss": loss_sum / n,
        "accuracy": float(correct.float().mean()),
        "per_class_accuracy": per_class,
        "n": n,
    }
