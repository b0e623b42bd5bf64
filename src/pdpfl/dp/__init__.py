"""Personalized DP-SGD in torch: Poisson sampling per record, per-sample clipping, noise.

The public entry points live in :mod:`pdpfl.dp.engine`; centralized trainers in
:mod:`pdpfl.dp.centralized` (rPDP-SGD) and :mod:`pdpfl.dp.filter` (Feldman–Zrnic filter).
"""

from pdpfl.dp.engine import (
    LocalTrainingResult,
    PersonalizedDPSGD,
    StepResult,
    as_stream,
    check_buffers_unchanged,
    evaluate,
    make_optimizer,
    train_steps,
)
from pdpfl.dp.grad_sample import (
    ClippedSum,
    clipped_grad_sum,
    hooks_supported,
    per_sample_gradients,
    shared_parameters,
)
from pdpfl.dp.validate import replace_batchnorm, validate_model

__all__ = [
    "ClippedSum",
    "LocalTrainingResult",
    "PersonalizedDPSGD",
    "StepResult",
    "as_stream",
    "check_buffers_unchanged",
    "clipped_grad_sum",
    "evaluate",
    "hooks_supported",
    "make_optimizer",
    "per_sample_gradients",
    "replace_batchnorm",
    "shared_parameters",
    "train_steps",
    "validate_model",
]
