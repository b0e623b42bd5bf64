"""Where the canaries live: coordinates of the model, or an audit-only block appended to it.

A Dirac canary (Steinke, Nasr & Jagielski 2023, §6) owns one coordinate j of the trained
parameters; its clipped gradient is ``C·e_j``. Canaries need distinct coordinates, and one-run
auditing needs many canaries (hundreds per budget group), more than a small model has
(Fed-Heart-Disease's logistic regression has 14 parameters). Two spaces:

``model``
    j is drawn at random among the model's own trainable parameters. The records' gradients
    also move these coordinates, which adds variance to the canaries' scores.
``block``
    the model is extended by an audit-only block of ``size`` parameters (:class:`AuditBlock`):
    a bias-free ``Linear(size, 1)`` applied to an all-zero input and added to the logits, so the
    outputs, the records' gradients (exactly zero on the block: the input is zero) and hence the
    trained model are those of the original model. The block goes through the same mechanism:
    it is part of every clipped norm (adding 0), every noisy sum (its noise is drawn with the
    rest) and every released update. DP-SGD's guarantee does not depend on the dimension, so
    the accountant's ε is unchanged. The block's coordinates come after the model's.
``auto``
    ``model`` when the model has at least as many parameters as canaries, else ``block``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from pdpfl.models import MODELS, create_model

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig

__all__ = ["BLOCK_MODEL", "AuditBlock", "Space", "block_config", "choose_space"]

Space = Literal["auto", "model", "block"]

#: The registered name of the block-extended model (options: inner, inner_options, size).
BLOCK_MODEL = "pdpfl-audit-block"


class AuditBlock(nn.Module):
    """``inner(x) + block(0)``: the inner model with ``size`` audit-only parameters."""

    def __init__(self, inner: nn.Module, size: int) -> None:
        super().__init__()
        if int(size) < 1:
            raise ValueError(f"audit block: size must be >= 1, got {size}")
        self.inner = inner
        self.size = int(size)
        self.block = nn.Linear(self.size, 1, bias=False)
        with torch.no_grad():
            self.block.weight.zero_()

    @property
    def inert_inner(self) -> nn.Module:
        """The model the block extends: no input moves the block (its input is 0), so local
        training of many copies (:func:`pdpfl.dp.batched.train_copies`) trains this one and
        gives the block zero deltas."""
        return self.inner

    def forward(self, x: Tensor) -> Tensor:
        out = self.inner(x)
        zeros = out.new_zeros(out.shape[0], self.size)
        logits: Tensor = out + self.block(zeros)  # adds exactly 0; broadcast over the logits
        return logits


def _build(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    inner: str,
    size: int,
    inner_options: dict[str, Any] | None = None,
) -> nn.Module:
    # The inner model is created first, so it consumes the seeded initialisation exactly as the
    # original model would (x⁰ of the model's coordinates is unchanged).
    model = create_model(inner, input_shape, num_classes, **dict(inner_options or {}))
    return AuditBlock(model, size)


if BLOCK_MODEL not in MODELS:
    MODELS[BLOCK_MODEL] = _build


def block_config(config: ExperimentConfig, size: int) -> ExperimentConfig:
    """``config`` whose model is the configured one extended by an audit block of ``size``."""
    from pdpfl.config import ModelConfig

    model = ModelConfig(
        name=BLOCK_MODEL,
        options={
            "inner": config.model.name,
            "size": int(size),
            "inner_options": dict(config.model.options),
        },
    )
    return config.model_copy(update={"model": model})


def choose_space(space: Space, model_parameters: int, canaries: int) -> Literal["model", "block"]:
    """The space ``auto`` resolves to (``model`` refused when it is too small)."""
    if space == "block":
        return "block"
    if canaries <= model_parameters:
        return "model"
    if space == "model":
        raise ValueError(
            f"--canaries: {canaries} canaries (with the control group) need as many distinct "
            f"coordinates, and the model has {model_parameters} parameters; use fewer canaries "
            "or --space block"
        )
    return "block"
