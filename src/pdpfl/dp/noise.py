"""The one function that draws differential-privacy noise: :func:`add_noise`.

Every DP noise of pdpfl -- the DP-SGD step (:mod:`pdpfl.dp.engine`), the noisy sums of
:mod:`pdpfl.dp.steps` (the Filter baseline, ULDP-FL's silo noise and noise shares, IDP-FedAvg's
central aggregation noise), IDP-FedAvg's distributed value and count shares, the noise ULDP-FL's
private weighting protocol encodes -- is drawn here, from a noise description
(:mod:`pdpfl.privacy.noise`: the object whose event the ledger charges) and the owning party's
:class:`~pdpfl.randomness.RandomStream`. ``tests/test_noise_binding.py`` checks that no other
module of ``src/`` draws a normal.

The noise is added **in place** to float64 values (a torch tensor, a numpy array, or a sequence
of tensors drawn in order as one vector): the caller adds it to a float64 copy of its clipped
sum and rounds once to the parameter dtype (see :mod:`pdpfl.randomness` on floating-point
attacks). ``shapes`` states the layout the normals are drawn in (e.g. one block per model
parameter, in parameter order): the seeded stream of ``randomness: reproducible`` then draws
exactly what one draw per tensor would.

Samplers are looked up by the description's ``kind`` (:func:`register_sampler`), so a new kind
of noise adds its sampler here and its description in :mod:`pdpfl.privacy.noise`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pdpfl.privacy.noise import (
    CentralDiscreteGaussianNoise,
    DiscreteGaussianNoise,
    GaussianNoise,
    NoiseSpec,
)
from pdpfl.randomness import RandomStream, draw_normals, stream_from_generator

__all__ = [
    "CentralNoise",
    "PreparedNoise",
    "add_noise",
    "central_noise",
    "central_step_noise",
    "register_sampler",
    "samplers",
]

Values = Tensor | np.ndarray | Sequence[Tensor]
#: ``sampler(targets, noise, std, stream, shapes)``: add noise of per-coordinate ``std`` in place
#: to the float64 ``targets`` (their concatenation, drawn in the layout ``shapes``).
Sampler = Callable[[list[Tensor], Any, float, RandomStream, Sequence[Any]], None]


def _gaussian(
    targets: list[Tensor],
    noise: GaussianNoise,
    std: float,
    stream: RandomStream,
    shapes: Sequence[Any],
) -> None:
    """N(0, std²) per coordinate: one draw of all coordinates, in ``shapes`` order, added to
    float64 values (a float64 copy of the clipped sum, rounded once afterwards)."""
    if any(t.dtype is not torch.float64 for t in targets):
        raise ValueError(
            "values: Gaussian noise is added in float64 (to a float64 copy of the clipped sum, "
            f"rounded once afterwards), got {sorted({str(t.dtype) for t in targets})}"
        )
    if len(targets) == 1 and targets[0].dim() == 1:
        _gaussian_flat(targets[0], std, stream, shapes)
        return
    z = draw_normals(stream, shapes, device=targets[0].device)
    if len(targets) == 1:
        t = targets[0]
        if z.numel() != t.numel():
            raise ValueError(f"shapes: {list(shapes)} do not hold the {t.numel()} coordinates")
        t.add_(z if t.dim() == 1 else z.view(t.shape), alpha=std)
        return
    if z.numel() != sum(t.numel() for t in targets):
        raise ValueError(f"shapes: {list(shapes)} do not hold the coordinates of the values")
    offset = 0
    for t in targets:
        n = t.numel()
        t.add_(z[offset : offset + n].view(t.shape), alpha=std)
        offset += n


def _gaussian_flat(flat: Tensor, std: float, stream: RandomStream, shapes: Sequence[Any]) -> None:
    """:func:`_gaussian` on one flat vector (the DP-SGD step's hot path)."""
    z = draw_normals(stream, shapes, device=flat.device)
    if z.numel() != flat.numel():
        raise ValueError(f"shapes: {list(shapes)} do not hold the {flat.numel()} coordinates")
    flat.add_(z, alpha=std)


def _discrete_gaussian(
    targets: list[Tensor],
    noise: DiscreteGaussianNoise,
    std: float,
    stream: RandomStream,
    shapes: Sequence[Any],
) -> None:
    """N_Z(0, σ_s²) per coordinate, exactly (:func:`pdpfl.discrete_noise.sample_discrete_gaussian`:
    integer arithmetic from the stream's words), added to int64 values (a rounded integer
    vector; the caller reduces modulo 2^b). ``shapes`` is not used: one draw of all coordinates
    in order."""
    from pdpfl.discrete_noise import sample_discrete_gaussian

    if any(t.dtype is not torch.int64 for t in targets):
        raise ValueError(
            "values: discrete Gaussian noise is added to int64 integer vectors, got "
            f"{sorted({str(t.dtype) for t in targets})}"
        )
    total = sum(t.numel() for t in targets)
    z = torch.from_numpy(sample_discrete_gaussian(total, noise.variance, stream))
    offset = 0
    for t in targets:
        n = t.numel()
        # |x̃|² ≤ N < 2^62 and σ_s² ≤ 2^50 (the encoding's bounds): far from int64 overflow
        t.add_(z[offset : offset + n].view(t.shape).to(t.device))
        offset += n


#: |γS| is clamped here before rounding (exact in float64, fits int64; 1-Lipschitz per coordinate,
#: so the grid sensitivity γC + √d still holds).
_GRID_CLAMP = float(2**52)


def _central_discrete_gaussian(
    targets: list[Tensor],
    noise: CentralDiscreteGaussianNoise,
    std: float,
    stream: RandomStream,
    shapes: Sequence[Any],
) -> None:
    """Exact central discrete Gaussian noise on float64 values (the clipped sum), in place:
    S ← (round(clamp(γS)) + Z)/γ with Z ~ N_Z(0, σ²Δ'²)^d drawn with integer arithmetic only
    (:class:`~pdpfl.privacy.noise.CentralDiscreteGaussianNoise`). The integer vector
    round(γS) + Z is the mechanism; the division by γ = 2^k (and any float rounding of a huge
    integer) is post-processing. ``shapes`` is not used: one draw of all coordinates in order."""
    from pdpfl.discrete_noise import sample_discrete_gaussian

    if any(t.dtype is not torch.float64 for t in targets):
        raise ValueError(
            "values: central discrete noise is added to the float64 clipped sum, got "
            f"{sorted({str(t.dtype) for t in targets})}"
        )
    total = sum(t.numel() for t in targets)
    if total != noise.dimension:
        # the grid sensitivity γC + √d was derived for d coordinates: never add it to more
        raise ValueError(
            f"values: the central discrete noise was set up for dimension {noise.dimension} "
            f"(its grid sensitivity depends on it), got {total} coordinates"
        )
    gamma = noise.scale
    z = sample_discrete_gaussian(total, noise.variance, stream)
    offset = 0
    for t in targets:
        n = t.numel()
        flat = t.view(-1)
        grid = torch.round(torch.clamp(flat * gamma, -_GRID_CLAMP, _GRID_CLAMP)).to(torch.int64)
        grid += torch.from_numpy(z[offset : offset + n]).to(grid.device)
        # post-processing of the released integer vector
        flat.copy_(grid.to(torch.float64) / gamma)
        offset += n


_SAMPLERS: dict[str, Sampler] = {
    "gaussian": _gaussian,
    "discrete-gaussian": _discrete_gaussian,
    "central-discrete-gaussian": _central_discrete_gaussian,
}


def register_sampler(kind: str, sampler: Sampler) -> None:
    """Register the sampler of a new kind of noise description (unique ``kind``)."""
    key = str(kind)
    if not key or key in _SAMPLERS:
        raise ValueError(f"kind: {kind!r} is empty or already has a sampler")
    _SAMPLERS[key] = sampler


def samplers() -> tuple[str, ...]:
    """The kinds of noise :func:`add_noise` can draw."""
    return tuple(_SAMPLERS)


def _targets(values: Values) -> tuple[list[Tensor], Values]:
    if isinstance(values, Tensor):
        return [values], values
    if isinstance(values, np.ndarray):
        if not values.flags.writeable:
            raise ValueError("values: a read-only array cannot take noise in place")
        return [torch.from_numpy(values)], values  # shares memory: the array gets the noise
    targets = list(values)
    if not targets or not all(isinstance(t, Tensor) for t in targets):
        raise ValueError("values: expected a tensor, an array or a sequence of tensors")
    if len({t.device for t in targets}) != 1:
        raise ValueError("values: every tensor must be on one device")
    return targets, values


def add_noise(
    values: Values,
    noise: NoiseSpec,
    stream: RandomStream | torch.Generator | None,
    *,
    shapes: Sequence[tuple[int, ...] | torch.Size] | None = None,
    announced_survivors: int | None = None,
) -> Values:
    """Add the noise ``noise`` describes to ``values`` in place and return them.

    Parameters
    ----------
    values
        A tensor, a (writable) numpy array, or a sequence of tensors on one device (one draw
        for all, in order), of the dtype the kind's sampler adds to (float64 for Gaussian
        noise: checked by the sampler).
    noise
        The noise description (:class:`~pdpfl.privacy.noise.GaussianNoise`): the std added per
        coordinate is ``noise.std(announced_survivors)`` (σ·C, or σ·C/√t for a share).
    stream
        The owning party's stream (a seeded ``torch.Generator`` is the reproducible research
        mode). Not needed when the noise adds nothing (σ = 0).
    shapes
        The layout the normals are drawn in (default: each tensor's shape); the sizes must add
        up to the number of coordinates.
    announced_survivors
        A smaller t a summation protocol announced for the round (a share is then larger).
    """
    sampler = _sampler(noise)
    std = noise.std(announced_survivors)
    out: Values
    if isinstance(values, Tensor):
        targets, out = [values], values
    else:
        targets, out = _targets(values)
    if std == 0.0:
        return out
    if stream is None:
        raise ValueError("stream: the owning party's random stream is required to add noise")
    if isinstance(stream, torch.Generator):
        stream = stream_from_generator(stream)
    sampler(targets, noise, std, stream, [t.shape for t in targets] if shapes is None else shapes)
    return out


def _sampler(noise: NoiseSpec) -> Sampler:
    sampler = _SAMPLERS.get(getattr(noise, "kind", ""))
    if sampler is None:
        raise ValueError(
            f"noise: no sampler for {type(noise).__name__} (kinds: {', '.join(_SAMPLERS)})"
        )
    return sampler


class PreparedNoise:
    """:func:`add_noise` of one description on one float64 vector layout, checked once: the
    DP-SGD step's hot path (the same sampler and the same draw, without the per-call checks).

    ``prepared(flat, stream)`` adds the noise to the flat float64 vector of ``shapes`` in place.
    """

    __slots__ = ("noise", "shapes", "std", "numel", "_sampler", "_flat")

    def __init__(self, noise: NoiseSpec, shapes: Sequence[tuple[int, ...] | torch.Size]) -> None:
        self._sampler = _sampler(noise)
        # the built-in Gaussian sampler's flat path (the same draw, one call)
        self._flat = _gaussian_flat if self._sampler is _gaussian else None
        self.noise = noise
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.std = noise.std()
        self.numel = sum(math.prod(s) for s in self.shapes)

    def __call__(self, flat: Tensor, stream: RandomStream) -> Tensor:
        if flat.dtype is not torch.float64 or flat.dim() != 1:
            raise ValueError(
                f"values: expected the flat float64 vector of {self.numel} coordinates, got "
                f"{flat.dtype} of shape {tuple(flat.shape)}"
            )
        if self.std:
            if self._flat is not None:
                self._flat(flat, self.std, stream, self.shapes)
            else:
                self._sampler([flat], self.noise, self.std, stream, self.shapes)
        return flat


#: The description of a central DP step's noise: the secure float Gaussian or the exact
#: discrete Gaussian on a grid (``privacy.central_noise``).
CentralNoise = GaussianNoise | CentralDiscreteGaussianNoise


def central_noise(
    noise: GaussianNoise | None, noise_multiplier: float | None, max_grad_norm: float | None
) -> GaussianNoise:
    """The central Gaussian noise of a DP step: ``noise`` (the caller's description, one share),
    or ``GaussianNoise(noise_multiplier, max_grad_norm)`` -- given one way, not both."""
    if noise is not None:
        if noise_multiplier is not None or max_grad_norm is not None:
            raise ValueError(
                "noise: give either noise= or noise_multiplier and max_grad_norm, not both"
            )
        if not isinstance(noise, GaussianNoise) or noise.shares != 1:
            raise ValueError(f"noise: expected a central GaussianNoise (one share), got {noise!r}")
        return noise
    if noise_multiplier is None or max_grad_norm is None:
        raise ValueError("noise_multiplier and max_grad_norm: required under DP (or noise=)")
    return GaussianNoise(noise_multiplier, max_grad_norm)


def central_step_noise(
    noise: CentralNoise | None, noise_multiplier: float | None, max_grad_norm: float | None
) -> CentralNoise:
    """:func:`central_noise`, or a :class:`~pdpfl.privacy.noise.CentralDiscreteGaussianNoise`
    given as ``noise`` (the DP-SGD step: ``privacy.central_noise: discrete``)."""
    if isinstance(noise, CentralDiscreteGaussianNoise):
        if noise_multiplier is not None or max_grad_norm is not None:
            raise ValueError(
                "noise: give either noise= or noise_multiplier and max_grad_norm, not both"
            )
        return noise
    return central_noise(noise, noise_multiplier, max_grad_norm)
