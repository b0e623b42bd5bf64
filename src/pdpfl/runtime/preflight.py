"""Checks before any training: what would otherwise fail after a round has trained.

Every check raises ``ValueError`` naming the field to change (``model``, ``PDPFL_KEY_DIR``), so
that ``pdpfl run`` exits 2 with ``error: <field>: ...`` and :func:`pdpfl.train` raises the same
message, before anything is written:

* :func:`check_key_dir` -- the folder that keeps this machine's sealing keys and high-water
  marks (:mod:`pdpfl.integrity`) is a folder and writable. A run seals its first checkpoint
  after its first round: a ``PDPFL_KEY_DIR`` that is a file used to fail only then.
* :func:`check_model` -- a model registered by the user (``--import``, :func:`pdpfl.train`)
  builds with the ``(input_shape, num_classes)`` builder signature, has trainable parameters,
  and returns one tensor of ``(batch, classes)`` logits for a batch of records. pdpfl's own
  models are not built again here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig
    from pdpfl.data.federation import Federation

__all__ = ["check_key_dir", "check_model", "check_module_output"]


def check_key_dir(party: str = "operator") -> Path:
    """The key folder, after making sure the party's key can be created or read there."""
    from pdpfl.integrity import IntegrityError, party_key

    base = os.environ.get("PDPFL_KEY_DIR")
    where = f"PDPFL_KEY_DIR={base}" if base else "the key folder ~/.local/share/pdpfl"
    path = Path(base).expanduser() if base else Path.home() / ".local" / "share" / "pdpfl"
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(
            f"PDPFL_KEY_DIR: {where}: {probe} is a file, not a folder (pdpfl keeps this "
            "machine's sealing keys and run marks there, mode 0700); point PDPFL_KEY_DIR at a "
            "folder"
        )
    try:
        party_key(party)
        (path / "runs").mkdir(exist_ok=True, mode=0o700)
    except IntegrityError as err:
        raise ValueError(f"PDPFL_KEY_DIR: {err}") from None
    except OSError as err:
        raise ValueError(
            f"PDPFL_KEY_DIR: {where}: cannot keep the sealing keys there "
            f"({err.strerror or err}); point PDPFL_KEY_DIR at a writable folder"
        ) from None
    return path


def check_module_output(output: object, num_classes: int, *, batch: int, what: str) -> None:
    """``output`` of ``what`` on ``batch`` records must be one tensor of logits:
    ``(batch, num_classes)``, or ``(batch, 1)``/``(batch, 2)`` for binary labels."""
    import torch

    allowed = (1, 2) if num_classes == 2 else (num_classes,)
    shapes = " or ".join(f"({batch}, {k})" for k in allowed)
    if not isinstance(output, torch.Tensor):
        kind = type(output).__name__
        extra = f" of {len(output)} items" if isinstance(output, tuple | list) else ""
        raise ValueError(
            f"model: {what} returns a {kind}{extra} for a batch of {batch} record(s); pdpfl needs "
            f"one tensor of logits, shape {shapes} (return only the logits from forward())"
        )
    if output.ndim != 2 or output.shape[0] != batch or output.shape[1] not in allowed:
        raise ValueError(
            f"model: {what} returns shape {tuple(output.shape)} for a batch of {batch} "
            f"record(s); the federation has {num_classes} classes, so it must return {shapes} "
            "logits (one logit for binary labels uses a logistic loss)"
        )


def check_model(config: ExperimentConfig, federation: Federation) -> None:
    """The config's model, if a user registered it, builds and fits the federation's records."""
    import numpy as np
    import torch

    from pdpfl.models import MODELS, create_model, trainable_parameters

    name = str(config.model.name)
    builder = MODELS.get(name)
    if builder is None or getattr(builder, "__module__", "") == "pdpfl.models":
        return  # unknown names are the config's error; pdpfl's own models are tested
    shape = tuple(int(s) for s in federation.input_shape)
    k = int(federation.num_classes)
    try:
        with torch.random.fork_rng(devices=[]):
            module = create_model(name, shape, k, **dict(config.model.options))
    except Exception as err:  # noqa: BLE001 - the user's builder: report, do not trace back
        raise ValueError(
            f"model: building {name!r} failed ({type(err).__name__}: {err}); a builder is "
            "called as f(input_shape, num_classes, **options) and returns a torch.nn.Module"
        ) from None
    if not isinstance(module, torch.nn.Module):
        raise ValueError(
            f"model: the builder of {name!r} returned a {type(module).__name__}, not a "
            "torch.nn.Module"
        )
    if not trainable_parameters(module):
        raise ValueError(
            f"model: {name!r} ({type(module).__name__}) has no trainable parameters; DP-SGD "
            "trains and releases parameters, so the module needs at least one (requires_grad)"
        )
    first = next((c for c in federation.clients if len(c.x_train)), None)
    if first is None:
        return
    batch = min(2, len(first.x_train))
    x = torch.as_tensor(np.asarray(first.x_train[:batch], dtype=np.float32))
    try:
        with torch.no_grad():
            module.eval()
            output = module(x)
    except Exception as err:  # noqa: BLE001 - the user's forward(): report it
        raise ValueError(
            f"model: {name!r} fails on a batch of shape {tuple(x.shape)} (features "
            f"{shape}): {type(err).__name__}: {err}"
        ) from None
    check_module_output(output, k, batch=batch, what=f"{name!r}")
