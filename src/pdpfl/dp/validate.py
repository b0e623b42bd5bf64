"""Model checks for DP-SGD: modules that couple records or keep batch statistics are rejected.

* **BatchNorm** couples the records of a batch: the output (hence the gradient) of record *i*
  depends on the other records, so "the per-sample gradient of record *i*" is not a function of
  record *i* alone and the sensitivity analysis behind DP-SGD (rPDP-FL Alg. 3, lines 10–15)
  breaks. GroupNorm normalises within one record and is the usual replacement.
* **Buffers that change in training mode** (``InstanceNorm*d(track_running_stats=True)``'s
  running mean/variance, BatchNorm's) are functions of the training batches computed without
  noise; they would shape every later output, evaluation included (issue #10 §3). Known module
  types are rejected here, before training; the engine also checks after every private forward
  that no buffer changed (:func:`check_buffers_unchanged`), which catches
  custom modules.

Only trainable parameters ever leave a silo (:func:`pdpfl.models.get_params`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["check_buffers_unchanged", "replace_batchnorm", "validate_model"]

_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def validate_model(model: nn.Module) -> None:
    """Raise ``ValueError`` naming the first BatchNorm module of ``model``, or the first module
    whose buffers change in training mode (``InstanceNorm*d(track_running_stats=True)``).

    Also rejects models without trainable parameters.
    """
    for name, module in model.named_modules():
        label = f"module {name or '<root>'!r} ({type(module).__name__})"
        if isinstance(module, (*_BATCH_NORMS, nn.modules.batchnorm._BatchNorm)):
            raise ValueError(
                f"model: {label} normalises across "
                "the records of a batch, so per-sample gradients (and DP-SGD's sensitivity bound) "
                "are undefined; call pdpfl.dp.replace_batchnorm(model) to swap it for GroupNorm"
            )
        if isinstance(module, nn.modules.instancenorm._InstanceNorm) and (
            module.track_running_stats
        ):
            raise ValueError(
                f"model: {label} updates its running statistics (buffers) in training mode; they "
                "are computed from the batch without noise, so DP-SGD rejects them: use "
                "track_running_stats=False"
            )
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("model: has no trainable parameters")


def replace_batchnorm(model: nn.Module, num_groups: int = 32) -> nn.Module:
    """Replace every BatchNorm{1,2,3}d in ``model`` (in place) by GroupNorm; returns ``model``.

    Each replacement uses ``gcd(num_groups, C)`` groups (so the group count always divides the
    channel count) and keeps the BatchNorm's ``affine`` setting and ``eps``.
    """
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    if isinstance(model, _BATCH_NORMS):
        return _group_norm_for(model, num_groups)
    for name, child in list(model.named_children()):
        if isinstance(child, _BATCH_NORMS):
            setattr(model, name, _group_norm_for(child, num_groups))
        else:
            replace_batchnorm(child, num_groups)
    return model


def _group_norm_for(bn: nn.modules.batchnorm._NormBase, num_groups: int) -> nn.GroupNorm:
    channels = bn.num_features
    gn = nn.GroupNorm(math.gcd(num_groups, channels), channels, eps=bn.eps, affine=bn.affine)
    if bn.affine and bn.weight is not None:
        gn = gn.to(bn.weight.device, bn.weight.dtype)
    return gn


def _buffer_snapshot(model: nn.Module) -> list[tuple[str, str, Tensor]]:
    return [
        (mname, bname, b.detach().clone())
        for mname, module in model.named_modules()
        for bname, b in module.named_buffers(recurse=False)
        if b is not None
    ]


def check_buffers_unchanged(model: nn.Module, before: list[tuple[str, str, Tensor]]) -> None:
    """Raise ``ValueError`` naming the module whose buffer differs from the ``before`` snapshot.

    A buffer that changes in a training-mode forward (running statistics) is a function of the
    batch computed without noise; it would reach later outputs (and evaluation) unprotected.
    """
    modules = dict(model.named_modules())
    for mname, bname, old in before:
        module = modules.get(mname)
        new = None if module is None else getattr(module, bname, None)
        same = isinstance(new, Tensor) and new.shape == old.shape and new.dtype == old.dtype
        if same and isinstance(new, Tensor):
            if new.is_floating_point() or new.is_complex():
                same = bool(torch.equal(new.isnan(), old.isnan())) and bool(
                    torch.equal(new.nan_to_num(0.0), old.nan_to_num(0.0))
                )
            else:
                same = bool(torch.equal(new, old))
        if not same:
            raise ValueError(
                f"model: module {mname or '<root>'!r} ({type(module).__name__}) changed its "
                f"buffer {bname!r} during a training-mode forward; buffers computed from the "
                "batch bypass the noise, so DP-SGD rejects such modules (e.g. set "
                "track_running_stats=False)"
            )
