"""Buffers reused from one DP step to the next (:class:`Workspace`, owned by one engine).

Allocating tens of MB afresh every step costs page faults comparable to the arithmetic (fresh
large allocations are new zero pages: every first touch faults). One workspace belongs to one
engine and is never shared between threads.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["Workspace", "empty", "padded"]


class Workspace:
    """Named buffers, grown on demand and handed out as views of the requested shape."""

    def __init__(self) -> None:
        self._buffers: dict[object, Tensor] = {}
        #: The model modifies a recorded layer output in place: the hooks hand out copies.
        self.clone_outputs = False

    def get(
        self,
        key: object,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
        zeros: bool = False,
    ) -> Tensor:
        """The buffer ``key`` as a ``shape`` view; a new buffer is zeroed when ``zeros``."""
        n = math.prod(shape)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < n or buf.dtype != dtype or buf.device != device:
            make = torch.zeros if zeros else torch.empty
            buf = make(max(n, 1), dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf[:n].view(shape)


def empty(
    ws: Workspace | None,
    key: object,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> Tensor:
    """``torch.empty(shape)``, from ``ws`` when there is one."""
    if ws is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return ws.get(key, shape, dtype, device)


def padded(a: Tensor, ph: int, pw: int, dtype: torch.dtype, ws: Workspace | None) -> Tensor:
    """``F.pad(a, (pw, pw, ph, ph)).to(dtype)`` for ``a`` of shape ``(b, C, H, W)``.

    With a workspace the zero border is written once: the buffer for ``(C, H, W, ph, pw)``
    keeps one record every ``C·(H+2ph)·(W+2pw)`` elements whatever ``b`` is, and only the
    interior is overwritten (a fresh buffer is zeroed whole).
    """
    b, c, h, w = a.shape
    shape = (b, c, h + 2 * ph, w + 2 * pw)
    if ws is None:
        out = torch.zeros(shape, dtype=dtype, device=a.device)
    else:
        out = ws.get(("padded", c, h, w, ph, pw), shape, dtype, a.device, zeros=True)
    out[:, :, ph : ph + h, pw : pw + w].copy_(a)
    return out
