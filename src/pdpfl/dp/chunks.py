"""One chunk of records through a per-sample back-end: the recorded (input, backprop) pairs of
every hooked layer turned into :class:`~pdpfl.dp.bookkeeping.Part` objects (``"hooks"``), or
``torch.func`` per-sample gradients (``"func"``); see :mod:`pdpfl.dp.grad_sample`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from pdpfl.dp.bookkeeping import Part, Workspace, layer_parts
from pdpfl.dp.bookkeeping import _materialised as _materialised_part
from pdpfl.dp.bounds import float32_is_ieee
from pdpfl.dp.device import math_device

__all__ = ["HOOK_LAYERS", "hooked_modules"]

LossFn = Callable[[Tensor, Tensor], Tensor]

#: Layers whose per-sample gradients the hooks back-end forms from (input, backprop) pairs.
HOOK_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.GroupNorm, nn.LayerNorm)
_F64 = torch.float64
_F32 = torch.float32
#: Chunks of Linear layers on 2-D inputs with at most this many recorded elements (inputs and
#: backprops) take the compact float64 path of :mod:`pdpfl.dp.linear`.
LINEAR_SMALL = 2**17


def hooked_modules(model: nn.Module) -> list[nn.Module]:
    """The modules whose calls the hooks back-end records (supported layers with trainable
    parameters), in ``model.modules()`` order."""
    return [
        m
        for m in model.modules()
        if isinstance(m, HOOK_LAYERS) and any(p.requires_grad for p in m.parameters(recurse=False))
    ]


class _Recorder:
    """Forward hooks recording (module, input, output) of the supported layers.

    The recorded input is used after the forward and the recorded output is the target of
    ``autograd.grad``: an in-place op of the model on either (``ReLU(inplace=True)``,
    ``x += ...``) would corrupt them. :meth:`modified` compares version counters after the
    forward; with ``clone=True`` the hooks hand a copy of each output to the rest of the model.
    """

    def __init__(self, modules: list[nn.Module], clone: bool = False):
        self.records: list[tuple[nn.Module, Tensor, Tensor]] = []
        self.versions: list[tuple[int, int]] = []
        self.clone = clone
        self.handles = [m.register_forward_hook(self._hook) for m in modules]

    def _hook(self, module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> Tensor | None:
        a = inputs[0].detach()  # shares the version counter of the input
        self.records.append((module, a, output))
        self.versions.append((a._version, output._version))
        return output.clone() if self.clone else None

    def modified(self) -> tuple[bool, bool]:
        """(some recorded input, some recorded output) was modified in place afterwards."""
        inputs = outputs = False
        for (_, a, o), (va, vo) in zip(self.records, self.versions, strict=True):
            inputs = inputs or a._version != va
            outputs = outputs or o._version != vo
        return inputs, outputs

    def close(self) -> None:
        for h in self.handles:
            h.remove()


class _Unsupported(Exception):
    pass


@dataclass
class _Chunk:
    """The per-parameter parts of one chunk, Σ loss over kept records, and (float32 chunks) a
    float64 recomputation of chosen records."""

    parts: list[Part]
    losses: Callable[[Tensor | None], float]
    redo: Callable[[Tensor], list[Part]] | None = None
    linear: list[tuple[nn.Module, Tensor, Tensor]] | None = None
    """Small Linear layers on 2-D inputs only: their (module, a, g) in float64, for
    :func:`pdpfl.dp.linear.clip_linear` (``parts`` is then empty)."""


def _small_linear(pairs: list[tuple[nn.Module, Tensor, Tensor]]) -> bool:
    """Every recorded layer is a Linear on a 2-D input and the float64 copies are small."""
    size = 0
    for m, a, g in pairs:
        if type(m) is not nn.Linear or a.dim() != 2 or g.dim() != 2:
            return False
        if a.dtype == _F64 or g.dtype == _F64:  # float64 models: the general path
            return False
        size += a.numel() + g.numel()
    return size <= LINEAR_SMALL


def _working_dtype(
    pairs: list[tuple[nn.Module, Tensor, Tensor]], device: torch.device
) -> torch.dtype:
    """float32 when every recorded tensor is float32 and float32 BLAS is IEEE, else float64."""
    if all(a.dtype == _F32 and g.dtype == _F32 for _, a, g in pairs) and float32_is_ieee(device):
        return _F32
    return _F64


def _hook_chunk(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    loss: LossFn,
    materialise: bool,
    modules: list[nn.Module] | None = None,
    ws: Workspace | None = None,
) -> _Chunk:
    modules = hooked_modules(model) if modules is None else modules
    clone = ws is not None and ws.clone_outputs
    recorder = _Recorder(modules, clone)
    try:
        out = model(x)
    finally:
        recorder.close()
    inputs_changed, outputs_changed = recorder.modified()
    if inputs_changed:  # the recorded activations are no longer the layer's inputs
        raise _Unsupported("a layer's input is modified in place after the layer")
    if outputs_changed:  # ReLU(inplace=True) and friends: record copies instead
        if ws is not None:
            ws.clone_outputs = True
        recorder = _Recorder(modules, clone=True)
        try:
            out = model(x)
        finally:
            recorder.close()
        if any(recorder.modified()):
            raise _Unsupported("a recorded tensor is modified in place")
    records = recorder.records
    owners: set[int] = set()
    for module, _, _ in records:
        for p in module._parameters.values():  # parameters(recurse=False), without the
            if p is None:  # generator machinery
                continue
            if id(p) in owners:
                # a layer called twice, or a parameter shared by two called layers: the norm of
                # the summed gradient is not the sum of per-call norms -> exact path
                raise _Unsupported("a parameter is used by more than one layer call per forward")
            owners.add(id(p))
    if out.shape[0] != x.shape[0]:
        raise _Unsupported("model output does not have one row per record")
    B = x.shape[0]
    mean = loss(out, y)
    # the loss is a mean over records: seeding its gradient with B gives the backprops of
    # Σ_i loss_i (bit for bit those of `mean * B`, without the extra graph node)
    backprops = torch.autograd.grad(
        mean, [o for _, _, o in records], torch.full_like(mean, B), allow_unused=True
    )
    pairs = [
        (module, a, torch.zeros_like(o) if g is None else g.detach())
        for (module, a, o), g in zip(records, backprops, strict=True)
    ]
    dev = math_device(x.device)
    if dev != x.device:  # mps: no float64 there, the book-keeping runs on the CPU
        pairs = [(m, a.to(dev), g.to(dev)) for m, a, g in pairs]
    total_loss = float(mean.detach()) * B
    linear = not materialise and bool(pairs) and _small_linear(pairs)
    if linear:
        pairs = [(m, a.to(_F64), g.to(_F64)) for m, a, g in pairs]
        wd = _F64
        parts: list[Part] = []
    else:
        wd = _working_dtype(pairs, dev)
        parts = [p for m, a, g in pairs for p in layer_parts(m, a, g, wd, materialise, ws)]

    def losses(keep: Tensor | None) -> float:
        if keep is None:
            return total_loss
        n = int(keep.sum())
        if n == 0:
            return 0.0
        with torch.no_grad():
            return float(loss(out.detach()[keep], y[keep])) * n

    def redo(idx: Tensor) -> list[Part]:
        return [p for m, a, g in pairs for p in layer_parts(m, a[idx], g[idx], _F64, materialise)]

    return _Chunk(parts, losses, redo if wd == _F32 else None, pairs if linear else None)


def _func_chunk(model: nn.Module, x: Tensor, y: Tensor, loss: LossFn) -> _Chunk:
    named = dict(model.named_parameters())
    train = {k: p.detach() for k, p in named.items() if p.requires_grad}
    frozen = {k: p.detach() for k, p in named.items() if not p.requires_grad}
    buffers = dict(model.named_buffers())

    def one(params: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        out = functional_call(model, ({**params, **frozen}, buffers), (xi.unsqueeze(0),))
        return loss(out, yi.unsqueeze(0))

    # functional_call does not restore the parameters of a module registered under two names
    # (torch 2.13 leaves plain tensors behind): put the original objects back ourselves.
    saved = [
        (module, dict(module._parameters), dict(module._buffers)) for module in model.modules()
    ]
    try:
        grads, losses = vmap(grad_and_value(one), in_dims=(None, 0, 0), randomness="different")(
            train, x, y
        )
    finally:
        for module, params, bufs in saved:
            module._parameters.update(params)
            module._buffers.update(bufs)
    B = x.shape[0]
    dev = math_device(x.device)
    # these per-sample gradients *are* what the mechanism applies: no error term
    parts = [_materialised_part(named[k], grads[k].to(dev), None, B, False) for k in train]
    losses = losses.detach()

    def total(keep: Tensor | None) -> float:
        return float(losses.sum() if keep is None else losses[keep].sum())

    return _Chunk(parts, total)
