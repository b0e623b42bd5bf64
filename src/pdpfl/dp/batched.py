"""Train many copies of one model at once, each on its own data (``torch.func`` + ``vmap``).

IDP-FedAvg trains every sampled *client* for E local epochs from the global model; ULDP-AVG
trains, in every silo, a fresh copy of the global model on *each user's* records for Q epochs.
Both are "K independent local trainings from the same starting point", which a Python loop runs
one model at a time. :func:`train_copies` runs them as one batched computation:

* the trainable parameters are stacked along a leading copy axis (K, *shape);
* copies are sorted by data size and processed in groups of similar size (``group_size``), so
  little work is wasted on padding;
* every step, each copy takes its own next minibatch of its own (shuffled) data: the per-copy
  gradient is ``vmap(grad(loss))`` over the stacked parameters, and a copy whose epoch has no
  batch left at that step is frozen (its parameters and optimizer state do not move), so every
  copy follows exactly the sequence of updates a per-copy loop would make;
* SGD (momentum, weight decay) and Adam are implemented functionally on the stacked tensors.

This is local (pre-privatisation) training: the DP mechanism is applied afterwards to each
copy's delta (clipping per unit, noise), see :mod:`pdpfl.dp.steps`. Shuffling uses the owning
party's random stream. :func:`train_copies_loop` is the obvious per-copy loop with the same
semantics, kept as the reference for tests and benchmarks.

Models with batch-coupled layers (BatchNorm) or buffers that change in training are rejected
(:func:`pdpfl.dp.validate.validate_model`); dropout draws differ between copies
(``randomness="different"``).

A module that is another module plus parameters no input ever moves (the audit's block on an
all-zero input, :class:`pdpfl.audit.space.AuditBlock`) names the other one ``inert_inner``;
only that one is trained (its deltas come first, as in ``parameters()``) and the rest get zero
deltas -- the same result, without the extra parameters' cost or the loss of the fast path.

``device=`` (``"cpu"`` | ``"cuda"`` | ``"cuda:N"`` | ``"mps"`` | ``"auto"``; default: the model's
device) runs the stacked copies there: data, parameters, optimizer state and the returned deltas
stay on it (the model object itself is not moved). Shuffling coins are drawn on the CPU from
the owner's stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from pdpfl.models import loss_fn as default_loss
from pdpfl.randomness import RandomStream

__all__ = ["LocalTrainingSpec", "train_copies", "train_copies_loop"]

LossFn = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class LocalTrainingSpec:
    """How each copy trains: ``epochs`` passes over its data in minibatches of ``batch_size``.

    ``optimizer`` is ``"sgd"`` (``momentum``, ``weight_decay``) or ``"adam"`` (``betas``,
    ``eps``, ``weight_decay`` as L2 added to the gradient, like ``torch.optim.Adam``).
    ``steps`` (optional) caps the number of steps per copy (e.g. ULDP-SGD: one step on all of a
    user's records = ``batch_size=None, epochs=1``). ``batch_size=None`` means full batch.
    """

    epochs: int = 1
    batch_size: int | None = 32
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    steps: int | None = None

    def __post_init__(self) -> None:
        if int(self.epochs) < 1:
            raise ValueError(f"epochs: must be an integer >= 1, got {self.epochs}")
        if self.batch_size is not None and int(self.batch_size) < 1:
            raise ValueError(
                f"batch_size: must be >= 1 or None (full batch), got {self.batch_size}"
            )
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer: expected 'sgd' or 'adam', got {self.optimizer!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr: must be a finite number > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum: must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay: must be >= 0, got {self.weight_decay}")
        if self.steps is not None and int(self.steps) < 1:
            raise ValueError(f"steps: must be >= 1 or None, got {self.steps}")


def _model_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _device_of(model: nn.Module, device: str | torch.device | None) -> torch.device:
    """The resolved ``device``, or the model's own device when None."""
    from pdpfl.dp.device import resolve_device

    dev = resolve_device(device)
    return _model_device(model) if dev is None else dev


def _batches_per_epoch(n: int, batch: int | None) -> int:
    if n == 0:
        return 0
    return 1 if batch is None else math.ceil(n / batch)


Streams = RandomStream | Sequence[RandomStream] | None
#: One training step's per-copy gradients: ``(params, x, y, weights) -> grads`` by name.
GradFn = Callable[[dict[str, Tensor], Tensor, Tensor, Tensor], dict[str, Tensor]]


def _stream_for(stream: Streams, k: int, count: int) -> RandomStream | None:
    if stream is None or isinstance(stream, RandomStream):
        return stream
    if not isinstance(stream, list | tuple):
        return stream  # type: ignore[return-value]  # any other stream-like object
    if len(stream) != count:
        raise ValueError(f"stream: expected one stream per copy ({count}), got {len(stream)}")
    picked: RandomStream = stream[k]
    return picked


def _schedules(
    sizes: Sequence[int], spec: LocalTrainingSpec, streams: Streams
) -> list[list[np.ndarray]]:
    """Per copy, the list of minibatch index arrays in training order (epochs × batches).

    ``streams``: one stream shared by all copies (drawn in copy order), one stream per copy
    (each copy's shuffles then depend on its own stream only), or None (no shuffling).
    """
    out = []
    for k, n in enumerate(sizes):
        stream = _stream_for(streams, k, len(sizes))
        plan: list[np.ndarray] = []
        for _ in range(int(spec.epochs)):
            if n == 0:
                break
            if stream is None:
                order = np.arange(n)
            else:  # a uniformly random permutation from the owner's stream
                order = np.argsort(stream.uniform(n), kind="stable")
            b = n if spec.batch_size is None else int(spec.batch_size)
            plan.extend(order[s : s + b] for s in range(0, n, b))
        if spec.steps is not None:
            plan = plan[: int(spec.steps)]
        out.append(plan)
    return out


def _per_sample_loss(loss: LossFn) -> Callable[[Tensor, Tensor], Tensor]:
    def one(o: Tensor, t: Tensor) -> Tensor:
        return loss(o.unsqueeze(0), t.unsqueeze(0))

    return vmap(one)


def train_copies(
    model: nn.Module,
    datasets: Sequence[tuple[Tensor, Tensor]],
    spec: LocalTrainingSpec,
    *,
    stream: Streams = None,
    loss: LossFn = default_loss,
    group_size: int = 64,
    physical_batch_size: int | None = None,
    device: str | torch.device | None = None,
) -> list[Tensor]:
    """Train K copies of ``model`` (from its current parameters), copy k on ``datasets[k]``.

    Returns the deltas (trained − initial) per trainable parameter, stacked: a list with one
    tensor of shape ``(K, *param.shape)`` per parameter in ``model.parameters()`` order. A copy
    with no data has a zero delta. ``model`` itself is not modified.

    Copies are processed in groups of at most ``group_size`` copies of similar schedule length;
    ``physical_batch_size`` caps copies × largest minibatch per group. By default (None) the cap
    keeps one vectorized step's layer outputs near 16 MB (measured on one record): CPU caches,
    not arithmetic, limit large groups of convolutional copies.
    ``stream`` shuffles each copy's data every epoch: one stream for all copies or one per copy.
    ``device``: where the copies train and the deltas live (default: the model's device).
    """
    from pdpfl.dp.validate import validate_model

    validate_model(model)
    K = len(datasets)
    dev = _device_of(model, device)
    inner = getattr(model, "inert_inner", None)
    if isinstance(inner, nn.Module):  # ``inner`` plus parameters no input moves: train inner
        inner_deltas = train_copies(
            inner,
            datasets,
            spec,
            stream=stream,
            loss=loss,
            group_size=group_size,
            physical_batch_size=physical_batch_size,
            device=device,
        )
        rest = [p for p in model.parameters() if p.requires_grad][len(inner_deltas) :]
        return [
            *inner_deltas,
            *(torch.zeros((K, *p.shape), dtype=p.dtype, device=dev) for p in rest),
        ]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    base = {n: p.detach().to(dev) for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().to(dev) for n, p in model.named_parameters() if not p.requires_grad}
    buffers = {n: b.detach().to(dev) for n, b in model.named_buffers()}
    deltas = [torch.zeros((K, *base[n].shape), dtype=base[n].dtype, device=dev) for n in names]
    if K == 0:
        return deltas
    sizes = [int(y.shape[0]) for _, y in datasets]
    schedules = _schedules(sizes, spec, stream)
    per_sample = _per_sample_loss(loss)

    def copy_loss(params: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        out = functional_call(model, ({**params, **frozen}, buffers), (x,))
        return (per_sample(out, y) * w).sum()

    grad_fn = _sequential_grad_fn(model, frozen) if loss is default_loss else None
    if grad_fn is None:
        if K == 1:  # one copy of a generic model: the plain loop is the same and cheaper
            return train_copies_loop(model, datasets, spec, stream=stream, loss=loss, device=dev)
        grad_fn = vmap(grad(copy_loss), in_dims=(0, 0, 0, 0), randomness="different")
    # All records once, concatenated: every step gathers its minibatches with one index.
    live = [k for k in range(K) if schedules[k]]
    if not live:
        return deltas
    offsets = np.zeros(K + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(sizes)
    x_all = torch.cat([datasets[k][0].to(dev) for k in range(K)])
    y_all = torch.cat([datasets[k][1].to(dev) for k in range(K)])
    if physical_batch_size is None:
        physical_batch_size = _auto_cap(model, x_all[:1].to(_model_device(model)))
    was_training = model.training
    model.train()
    try:
        for group in _groups(live, schedules, int(group_size), physical_batch_size):
            trained = _train_group(
                group, x_all, y_all, offsets, schedules, base, names, spec, grad_fn
            )
            for j, k in enumerate(group):
                for i, n in enumerate(names):
                    deltas[i][k] = trained[n][j] - base[n]
    finally:
        model.train(was_training)
    return deltas


_ELEMENTWISE = {nn.ReLU: torch.relu, nn.Tanh: torch.tanh, nn.Sigmoid: torch.sigmoid}


def _sequential_grad_fn(model: nn.Module, frozen: dict[str, Tensor]) -> GradFn | None:
    """A faster per-copy gradient for ``nn.Sequential`` models of Flatten / Linear / ReLU / Tanh
    / Sigmoid / Dropout / GroupNorm layers (logreg, MLP, PrivateFraudNet): batched matrix
    products and one ordinary backward
    pass over Σ_k loss_k (copies are independent, so ∂/∂θ_k of the sum is copy k's gradient).
    ``None`` for any other model (the generic ``vmap(grad)`` path is used)."""
    if not isinstance(model, nn.Sequential) or type(model).forward is not nn.Sequential.forward:
        return None
    if frozen:
        return None
    layers = list(model.children())
    for m in layers:
        if type(m) not in (nn.Flatten, nn.Linear, nn.Dropout, nn.GroupNorm, *_ELEMENTWISE):
            return None
        if type(m) is nn.Flatten and (m.start_dim, m.end_dim) != (1, -1):
            return None

    def forward(params: dict[str, Tensor], x: Tensor) -> Tensor:
        h = x  # (G, b, *record shape)
        for i, m in enumerate(layers):
            if type(m) is nn.Flatten:
                h = h.reshape(h.shape[0], h.shape[1], -1)
            elif type(m) is nn.Linear:
                w = params[f"{i}.weight"].transpose(1, 2)
                bias = params.get(f"{i}.bias")
                h = torch.bmm(h, w) if bias is None else torch.baddbmm(bias.unsqueeze(1), h, w)
            elif type(m) is nn.Dropout:
                h = F.dropout(h, m.p, training=True)
            elif type(m) is nn.GroupNorm:  # on (G, b, channels): per record, per group
                if h.dim() != 3:
                    raise ValueError("GroupNorm: the fast path expects (records, channels)")
                z = h.reshape(h.shape[0], h.shape[1], m.num_groups, -1)
                mean = z.mean(-1, keepdim=True)
                var = z.var(-1, unbiased=False, keepdim=True)
                h = ((z - mean) / torch.sqrt(var + m.eps)).reshape(h.shape)
                if m.affine:
                    h = h * params[f"{i}.weight"].unsqueeze(1) + params[f"{i}.bias"].unsqueeze(1)
            else:
                h = _ELEMENTWISE[type(m)](h)
        return h

    def grad_fn(params: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor) -> dict[str, Tensor]:
        leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
        out = forward(leaves, x)
        if out.shape[-1] == 1:  # the conventions of pdpfl.models.loss_fn
            per = F.binary_cross_entropy_with_logits(out[..., 0], y.to(out.dtype), reduction="none")
        else:
            per = F.cross_entropy(
                out.reshape(-1, out.shape[-1]), y.reshape(-1).long(), reduction="none"
            ).reshape(y.shape)
        grads = torch.autograd.grad((per * w).sum(), list(leaves.values()))
        return dict(zip(leaves, grads, strict=True))

    return grad_fn


#: Layer-output floats per vectorized step targeted by the default group cap (16 MB).
_GROUP_ACTIVATIONS = 1 << 22


def _auto_cap(model: nn.Module, one: Tensor) -> int:
    """Records per vectorized step so that the layers' outputs stay near _GROUP_ACTIVATIONS."""
    sizes: list[int] = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: sizes.append(int(out.numel())))
        for m in model.modules()
        if not list(m.children())
    ]
    was_training = model.training
    try:
        model.eval()  # no dropout: the probe must not draw from any random generator
        with torch.no_grad():
            model(one)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    per_record = max(1, sum(sizes) + int(one[0].numel()))
    return max(1, _GROUP_ACTIVATIONS // per_record)


def _groups(
    live: list[int], schedules: list[list[np.ndarray]], group_size: int, cap: int | None
) -> list[list[int]]:
    """Copies sorted by (steps, largest minibatch), cut into groups of similar work."""

    def width(k: int) -> int:
        return max(len(b) for b in schedules[k])

    order = sorted(live, key=lambda k: (len(schedules[k]), width(k)))
    groups: list[list[int]] = []
    current: list[int] = []
    bmax = 0
    for k in order:
        w = max(bmax, width(k))
        full = len(current) >= max(1, group_size) or (
            cap is not None and current and (len(current) + 1) * w > cap
        )
        if full:
            groups.append(current)
            current, w = [], width(k)
        current.append(k)
        bmax = w
    if current:
        groups.append(current)
    return groups


def _train_group(
    group: list[int],
    x_all: Tensor,
    y_all: Tensor,
    offsets: np.ndarray,
    schedules: list[list[np.ndarray]],
    base: dict[str, Tensor],
    names: list[str],
    spec: LocalTrainingSpec,
    grad_fn: GradFn,
) -> dict[str, Tensor]:
    G = len(group)
    steps = max(len(schedules[k]) for k in group)
    bmax = max(len(b) for k in group for b in schedules[k])
    # (steps, G, bmax) gather indices into the concatenated data, per-record weights 1/|b|
    # (0 on padding) and which copies still move at each step -- all built once.
    index = np.zeros((steps, G, bmax), dtype=np.int64)
    weight = np.zeros((steps, G, bmax), dtype=np.float64)
    active_np = np.zeros((steps, G), dtype=bool)
    for j, k in enumerate(group):
        for s, b in enumerate(schedules[k]):
            index[s, j, : len(b)] = offsets[k] + b
            weight[s, j, : len(b)] = 1.0 / len(b)
            active_np[s, j] = True
    dev = x_all.device
    index_t = torch.from_numpy(index).to(dev)
    weight_t = torch.from_numpy(weight).to(dev, x_all.dtype)
    active_t = torch.from_numpy(active_np).to(dev)
    params = {n: base[n].unsqueeze(0).repeat(G, *([1] * base[n].dim())) for n in names}
    state: dict[str, dict[str, Tensor]] = {}
    if spec.optimizer == "adam" or spec.momentum:
        state = {"m": {n: torch.zeros_like(p) for n, p in params.items()}}
        if spec.optimizer == "adam":
            state["v"] = {n: torch.zeros_like(p) for n, p in params.items()}
    t_count = torch.zeros(G, dtype=torch.float64, device=dev)
    for s in range(steps):
        idx = index_t[s]
        g = grad_fn(params, x_all[idx], y_all[idx], weight_t[s])
        active = active_t[s]
        t_count += active.to(torch.float64)
        params = _update(params, g, state, active, t_count, spec)
    return params


def _update(
    params: dict[str, Tensor],
    grads: dict[str, Tensor],
    state: dict[str, dict[str, Tensor]],
    active: Tensor,
    t: Tensor,
    spec: LocalTrainingSpec,
) -> dict[str, Tensor]:
    out = {}
    if bool(active.all()) and spec.optimizer == "sgd" and not spec.momentum:
        # Every copy moves (the common case): a plain SGD step, no masking.
        for n, p in params.items():
            g = grads[n] + spec.weight_decay * p if spec.weight_decay else grads[n]
            out[n] = p - spec.lr * g
        return out
    for n, p in params.items():
        mask = active.reshape(-1, *([1] * (p.dim() - 1)))
        g = grads[n]
        if spec.weight_decay:
            g = g + spec.weight_decay * p
        if spec.optimizer == "sgd":
            if spec.momentum:
                m = state["m"][n]
                m_new = torch.where(mask, spec.momentum * m + g, m)
                state["m"][n] = m_new
                step = m_new
            else:
                step = g
            out[n] = torch.where(mask, p - spec.lr * step, p)
        else:
            b1, b2 = spec.betas
            m = torch.where(mask, b1 * state["m"][n] + (1 - b1) * g, state["m"][n])
            v = torch.where(mask, b2 * state["v"][n] + (1 - b2) * g * g, state["v"][n])
            state["m"][n], state["v"][n] = m, v
            tt = t.clamp(min=1.0).to(p.dtype).reshape(-1, *([1] * (p.dim() - 1)))
            bc1 = 1 - b1**tt
            bc2 = 1 - b2**tt
            upd = spec.lr * (m / bc1) / ((v / bc2).sqrt() + spec.eps)
            out[n] = torch.where(mask, p - upd, p)
    return out


def train_copies_loop(
    model: nn.Module,
    datasets: Sequence[tuple[Tensor, Tensor]],
    spec: LocalTrainingSpec,
    *,
    stream: Streams = None,
    loss: LossFn = default_loss,
    device: str | torch.device | None = None,
) -> list[Tensor]:
    """The same as :func:`train_copies`, one copy at a time with ``torch.optim`` (reference)."""
    import copy

    dev = _device_of(model, device)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    base = {
        n: p.detach().to(dev, copy=True) for n, p in model.named_parameters() if p.requires_grad
    }
    K = len(datasets)
    deltas = [torch.zeros((K, *base[n].shape), dtype=base[n].dtype, device=dev) for n in names]
    sizes = [int(y.shape[0]) for _, y in datasets]
    schedules = _schedules(sizes, spec, stream)
    for k, (x, y) in enumerate(datasets):
        if not schedules[k]:
            continue
        m = copy.deepcopy(model).to(dev)
        m.train()
        x, y = x.to(dev), y.to(dev)
        params = [p for p in m.parameters() if p.requires_grad]
        opt: torch.optim.Optimizer
        if spec.optimizer == "sgd":
            opt = torch.optim.SGD(
                params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
            )
        else:
            opt = torch.optim.Adam(
                params, lr=spec.lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay
            )
        for idx in schedules[k]:
            sel = torch.as_tensor(idx, dtype=torch.long, device=dev)
            opt.zero_grad(set_to_none=True)
            torch.autograd.backward(loss(m(x[sel]), y[sel]))
            opt.step()
        trained = dict(m.named_parameters())
        for i, n in enumerate(names):
            deltas[i][k] = trained[n].detach() - base[n]
    return deltas
