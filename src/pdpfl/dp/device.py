"""Which device the DP engine and the batched trainers run on: ``auto | cpu | cuda[:N] | mps``.

``cpu`` is the default and what the test-suite covers. On an accelerator the data, the model,
the per-sample products, the clipping factors, the float64 clipped sum, the noise addition and
the update all stay on the device; only the random numbers are drawn on the CPU (the
:mod:`pdpfl.randomness` streams: OpenSSL's ChaCha20 keystream, or a seeded CPU generator in the
reproducible mode) and cross once per step -- see ``docs/dpsgd.md`` ("Accelerators").

Apple's ``mps`` has no float64: the forward and backward passes run there, the per-sample norms,
the clipped sum and the noise run on the CPU (:func:`math_device`).
"""

from __future__ import annotations

import torch

__all__ = ["DEVICE_CHOICES", "math_device", "resolve_device", "training_device_for"]

#: What a configuration may say (``cuda:<index>`` selects one GPU).
DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """``None`` → None (keep the model where it is); ``"auto"`` → cuda, else mps, else cpu.

    Raises ``ValueError`` (``device: ...``) for an unknown name or an unavailable device.
    """
    if device is None:
        return None
    if isinstance(device, str) and device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device: expected one of 'auto', 'cpu', 'cuda', 'cuda:<index>', 'mps', got {device!r}"
        ) from exc
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(
            f"device: expected one of 'auto', 'cpu', 'cuda', 'cuda:<index>', 'mps', got {device!r}"
        )
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device: 'cuda' requested but torch.cuda.is_available() is False")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device: {device!r} requested but only {torch.cuda.device_count()} CUDA "
                "device(s) exist"
            )
    if dev.type == "mps" and not _mps_available():
        raise ValueError("device: 'mps' requested but torch.backends.mps.is_available() is False")
    return dev


def training_device_for(setting: str) -> torch.device:
    """The device of a ``training.device`` setting (``auto``: cuda, else mps, else cpu).

    Raises ``ValueError("training.device: ...")`` when the named device is not available here
    (a silo checks its own machine: in a Flower federation each silo resolves it for itself).
    """
    try:
        dev = resolve_device(setting)
    except ValueError as err:
        raise ValueError(
            f"training.{err}; use one that exists here (auto picks cuda, else mps, else cpu)"
        ) from None
    return torch.device("cpu") if dev is None else dev


def math_device(device: torch.device) -> torch.device:
    """Where clipping and noise run for a model on ``device``: the device itself, except the
    CPU for ``mps`` (no float64)."""
    return torch.device("cpu") if device.type == "mps" else device
