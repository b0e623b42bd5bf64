"""Model checks for DP-SGD: BatchNorm couples the records of a batch and is rejected.

With BatchNorm the output (hence the gradient) of record *i* depends on the other records in
the batch, so "the per-sample gradient of record *i*" is not a function of record *i* alone and
the sensitivity analysis behind DP-SGD (rPDP-FL Alg. 3, lines 10–15) breaks. GroupNorm
normalises within one record and is the usual replacement.
"""

from __future__ import annotations

import math

from torch import nn

__all__ = ["replace_batchnorm", "validate_model"]

_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def validate_model(model: nn.Module) -> None:
    """Raise ``ValueError`` naming the first BatchNorm module of ``model``, if any.

    Also rejects models without trainable parameters.
    """
    for name, module in model.named_modules():
        if isinstance(module, _BATCH_NORMS):
            raise ValueError(
                f"model: module {name or '<root>'!r} ({type(module).__name__}) normalises across "
                "the records of a batch, so per-sample gradients (and DP-SGD's sensitivity bound) "
                "are undefined; call pdpfl.dp.replace_batchnorm(model) to swap it for GroupNorm"
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
