"""Local training and evaluation of IDP-FedAvg clients, alone or many at once (Algorithm 2,
LocalUpdate).

Each sampled client trains E local epochs (``local_epochs``) from the global model, in
minibatches of ``local_batch_size`` of its E shuffled epochs concatenated (flidp's
``shuffle().repeat(E).batch(B)``, :func:`repeated_epochs`), with the ``training`` optimizer (the
paper: Adam 5e-4), and forms Δ_i = θ_i − θ_t. :func:`train_clients` computes the updates of
several clients from one global model, as one batched computation
(:func:`pdpfl.dp.batched.train_copies`, ``torch.func.vmap`` over stacked copies) or one after
the other (:func:`~pdpfl.dp.batched.train_copies_loop`): the same updates either way.
:func:`evaluate_clients` tests one model on several clients' test splits in one pass.

These are pure functions of their arguments: the silo (:mod:`~pdpfl.fl.idp_fedavg.silo`) calls
them for itself, or the in-process transport for many silos at once through the silo's
two-phase API (:class:`pdpfl.fl.template.BatchedSilo`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pdpfl.fl.api import Params, Scalars

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from pdpfl.randomness import RandomStream

__all__ = [
    "LocalTraining",
    "choose_strategy",
    "evaluate_clients",
    "evaluate_arrays",
    "has_conv",
    "repeated_epochs",
    "train_clients",
]

#: Test records per forward pass of :func:`evaluate_clients`.
_EVAL_CHUNK = 4096


@dataclass(frozen=True)
class LocalTraining:
    """The public local-training settings every client uses (part of the published setup).

    ``strategy``: ``batched`` (one vmap computation for many clients), ``loop`` (one client at a
    time) or ``auto`` (:func:`choose_strategy`).
    """

    epochs: int
    batch_size: int
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    strategy: str = "auto"


def has_conv(model: torch.nn.Module) -> bool:
    import torch

    conv = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    return any(isinstance(m, conv) for m in model.modules())


def choose_strategy(strategy: str, model: torch.nn.Module) -> str:
    """``auto``: the per-client loop for conv nets (vmap turns their convolutions into grouped
    ones: measured 2-3× slower than the loop on CPU and 2.9× slower on an H200, see
    benchmarks/RESULTS.md), the batched computation otherwise (5.4× faster than the loop for
    the MLP on the H200)."""
    if strategy != "auto":
        return strategy
    return "loop" if has_conv(model) else "batched"


def repeated_epochs(
    x: torch.Tensor, y: torch.Tensor, epochs: int, stream: RandomStream
) -> tuple[torch.Tensor, torch.Tensor]:
    """E shuffled passes over a client's data, concatenated (``shuffle().repeat(E)`` in flidp):
    minibatches of the concatenation may span an epoch boundary, as in the reference."""
    import torch

    n = int(y.shape[0])
    if n == 0:
        return x[:0], y[:0]
    perms = [np.argsort(stream.uniform(n), kind="stable") for _ in range(int(epochs))]
    idx = torch.as_tensor(np.concatenate(perms), dtype=torch.long)
    return x[idx], y[idx]


def train_clients(
    model: torch.nn.Module,
    params: Params,
    datasets: Sequence[tuple[torch.Tensor, torch.Tensor]],
    local: LocalTraining,
) -> list[list[np.ndarray]]:
    """Local updates Δ_k (trained − global, float64) of several clients from ``params``.

    Each dataset is already the client's E shuffled epochs (:func:`repeated_epochs`), trained
    as one pass in minibatches of ``local.batch_size``. ``local.strategy`` ``batched`` uses
    :func:`pdpfl.dp.batched.train_copies`, ``loop`` :func:`~pdpfl.dp.batched.train_copies_loop`
    (the same updates). ``model`` only provides the architecture; its weights are overwritten.
    """
    from pdpfl.dp.batched import LocalTrainingSpec, train_copies, train_copies_loop
    from pdpfl.models import set_params

    set_params(model, params)
    spec = LocalTrainingSpec(
        epochs=1,
        batch_size=int(local.batch_size),
        optimizer=str(local.optimizer),
        lr=float(local.lr),
        momentum=float(local.momentum),
        weight_decay=float(local.weight_decay),
    )
    fn = train_copies if choose_strategy(local.strategy, model) == "batched" else train_copies_loop
    deltas = fn(model, list(datasets), spec, stream=None)
    return [
        [d[k].detach().to("cpu").numpy().astype(np.float64) for d in deltas]
        for k in range(len(datasets))
    ]


def evaluate_clients(
    model: torch.nn.Module,
    params: Params,
    tests: Sequence[tuple[torch.Tensor, torch.Tensor]],
) -> list[Scalars]:
    """``loss``, ``accuracy``, ``n`` of ``params`` on each client's test split, in one pass over
    the concatenated splits (chunks of 4096 records; NaN metrics for an empty split)."""
    import torch

    k = len(tests)
    if k == 0:
        return []
    owner = np.concatenate([np.full(len(y), j, dtype=np.int64) for j, (_, y) in enumerate(tests)])
    x = torch.cat([t[0] for t in tests])
    y = torch.cat([t[1] for t in tests])
    n, loss, accuracy = evaluate_arrays(model, params, x, y, owner, k)
    return [
        {
            "loss": float(loss[j]) if n[j] else float("nan"),
            "accuracy": float(accuracy[j]) if n[j] else float("nan"),
            "n": int(n[j]),
        }
        for j in range(k)
    ]


def evaluate_arrays(
    model: torch.nn.Module,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    owner: np.ndarray,
    k: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per client (of ``k``): test records ``n``, mean ``loss`` and ``accuracy`` (NaN for an
    empty split) of ``params`` on test splits already concatenated, ``owner[j]`` the client of
    record j (the simulator's client pool concatenates them once)."""
    import torch
    import torch.nn.functional as F

    from pdpfl.models import predict, set_params

    set_params(model, params)
    device = next(iter(model.parameters())).device
    was = model.training
    model.eval()
    losses, correct = [], []
    try:
        with torch.no_grad():
            for s in range(0, len(y), _EVAL_CHUNK):
                out = model(x[s : s + _EVAL_CHUNK].to(device))
                t = y[s : s + _EVAL_CHUNK].to(device)
                if out.shape[1] == 1:
                    loss = F.binary_cross_entropy_with_logits(
                        out[:, 0], t.to(out.dtype), reduction="none"
                    )
                else:
                    loss = F.cross_entropy(out, t, reduction="none")
                losses.append(loss.double().cpu().numpy())
                correct.append((predict(out) == t).cpu().numpy())
    finally:
        model.train(was)
    loss_all = np.concatenate(losses) if losses else np.zeros(0)
    corr_all = np.concatenate(correct).astype(np.float64) if correct else np.zeros(0)
    n = np.bincount(owner, minlength=k)
    loss_sum = np.bincount(owner, weights=loss_all, minlength=k)
    corr_sum = np.bincount(owner, weights=corr_all, minlength=k)
    with np.errstate(invalid="ignore", divide="ignore"):
        loss_mean = np.where(n > 0, loss_sum / np.maximum(n, 1), np.nan)
        accuracy = np.where(n > 0, corr_sum / np.maximum(n, 1), np.nan)
    return n.astype(np.int64), loss_mean, accuracy
