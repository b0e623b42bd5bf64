"""The DP step in separable parts: sample, clip, add noise, normalise.

Every pdpfl mechanism is assembled from these pieces (as Opacus' ``DPOptimizer.pre_step`` is from
``clip_and_accumulate``/``add_noise``/``scale_grad``):

* :func:`poisson_sample` -- one independent Bernoulli(q_u) per unit (record, user or client),
  coins from the owning party's :class:`~pdpfl.randomness.RandomStream`;
* :func:`wor_sample` -- exactly ``B`` distinct units drawn uniformly without replacement (the
  fixed-size batches of PriFedSync's Algorithm 2), from the same kind of stream;
* clipping -- per record inside a gradient computation
  (:func:`pdpfl.dp.grad_sample.clipped_grad_sum`), or per unit on whole parameter vectors
  (:func:`clip_vectors`: a user's model delta in ULDP-FL, a client's update in IDP-FedAvg);
* :func:`noisy_normalised_sum` -- adds the noise of a description
  (:class:`~pdpfl.privacy.noise.GaussianNoise`: N(0, σ²C²/t) per coordinate) to a clipped sum
  in float64 through :func:`pdpfl.dp.noise.add_noise`, divides by a *public* normaliser and
  rounds once to the parameter dtype. The noise is added even when nothing was sampled (an
  empty batch is a noise-only step).

Norms used for clipping are computed in float64 (with a rigorous error bound on the Gram /
ghost-norm paths, see :mod:`pdpfl.dp.grad_sample`), so a crafted unit cannot slip past the bound
through float32 cancellation; a unit whose gradient or vector is not finite adds nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from pdpfl.dp.noise import add_noise
from pdpfl.privacy.noise import NoiseSpec
from pdpfl.randomness import RandomStream

__all__ = [
    "as_rates",
    "check_normalizer",
    "clip_vectors",
    "noisy_normalised_sum",
    "poisson_sample",
    "vector_norms",
    "wor_sample",
]


def poisson_sample(rates: Tensor | np.ndarray, stream: RandomStream) -> Tensor:
    """Indices ``{u : U_u < q_u}``: one independent Bernoulli(q_u) per unit (int64, CPU).

    ``rates`` are validated float64 probabilities; a unit with ``q_u = 0`` is never drawn and a
    unit with ``q_u = 1`` always is (the uniforms lie in the open interval (0, 1)).
    """
    if isinstance(rates, Tensor):
        if rates.dtype == torch.float64 and rates.device.type == "cpu" and rates.dim() == 1:
            q = rates.detach().numpy()  # validated rates (as_rates): no copy
        else:
            q = rates.detach().to("cpu", torch.float64).reshape(-1).numpy()
    else:
        q = np.asarray(rates, dtype=np.float64).reshape(-1)
    u = np.asarray(stream.uniform(q.shape[0]), dtype=np.float64)
    return torch.from_numpy(np.flatnonzero(u < q).astype(np.int64, copy=False))


def wor_sample(num_units: int, batch_size: int, stream: RandomStream) -> Tensor:
    """Exactly ``batch_size`` distinct indices in ``[0, num_units)``, a uniformly random subset.

    A partial Fisher–Yates shuffle driven by ``batch_size`` float64 uniforms from ``stream``: step
    k swaps position k with position ``k + ⌊U_k·(n − k)⌋``. Every B-subset (and every order) is
    equally likely up to the 53-bit resolution of the uniforms (a relative bias below
    ``n·2⁻⁵³`` per index). Returns int64 CPU indices in draw order.

    Raises
    ------
    ValueError
        ``batch_size`` outside ``[0, num_units]`` (naming the field).
    """
    n, b = int(num_units), int(batch_size)
    if n < 0:
        raise ValueError(f"num_units: must be >= 0, got {num_units!r}")
    if not 0 <= b <= n:
        raise ValueError(
            f"batch_size: a batch drawn without replacement needs 0 <= B <= {n} (the number of "
            f"records), got {batch_size!r}"
        )
    u = np.asarray(stream.uniform(b), dtype=np.float64)
    perm = np.arange(n, dtype=np.int64)
    for k in range(b):
        j = k + min(int(u[k] * (n - k)), n - k - 1)
        perm[k], perm[j] = perm[j], perm[k]
    return torch.from_numpy(perm[:b].copy())


def check_normalizer(normalizer: float | None, name: str = "normalizer") -> float:
    """A public normaliser: a finite number > 0 (ValueError naming ``name`` otherwise)."""
    if normalizer is None:
        raise ValueError(
            f"{name}: required under DP -- the public constant (e.g. the expected batch size) "
            "that divides the noisy sum; pdpfl never divides by a count computed from private data"
        )
    b = float(normalizer)
    if not (math.isfinite(b) and b > 0):
        raise ValueError(f"{name}: must be a finite number > 0, got {normalizer!r}")
    return b


def noisy_normalised_sum(
    sums: Sequence[Tensor],
    noise: NoiseSpec | None,
    normalizer: float,
    stream: RandomStream | None,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
    announced_survivors: int | None = None,
) -> list[Tensor]:
    """``(Σ clipped + N(0, std² I)) / normalizer`` per tensor, noise drawn in tensor order.

    ``noise`` is the noise description the caller's ledger charges (std per coordinate
    ``noise.std(announced_survivors)``: σ·C, or σ·C/√t for a share); ``None`` adds nothing (no
    DP) and needs no stream. The addition and the division happen in float64 and the result is
    rounded once, to each tensor's dtype or to ``dtypes[k]`` (e.g. float64 clipped sums for
    float32 parameters; see :mod:`pdpfl.randomness` on floating-point attacks).
    """
    b = check_normalizer(normalizer)
    if dtypes is not None and len(dtypes) != len(sums):
        raise ValueError(f"dtypes: expected {len(sums)} dtypes, got {len(dtypes)}")
    accs = [s.detach().to(torch.float64, copy=True) for s in sums]
    if noise is not None and accs:
        add_noise(accs, noise, stream, announced_survivors=announced_survivors)
    return [
        (acc / b).to(s.dtype if dtypes is None else dtypes[k])
        for k, (acc, s) in enumerate(zip(accs, sums, strict=True))
    ]


def vector_norms(vectors: Sequence[Tensor]) -> Tensor:
    """Per-unit L2 norms over several tensors with a leading unit axis, computed in float64.

    ``vectors[k]`` has shape ``(U, *shape_k)``; returns ``(U,)`` float64.
    """
    if not vectors:
        raise ValueError("vectors: expected at least one tensor")
    total = torch.zeros(vectors[0].shape[0], dtype=torch.float64, device=vectors[0].device)
    for v in vectors:
        total = total + v.detach().to(torch.float64).reshape(v.shape[0], -1).pow(2).sum(1)
    return total.sqrt()


def clip_vectors(
    vectors: Sequence[Tensor], max_norm: float | Tensor
) -> tuple[list[Tensor], Tensor]:
    """Scale each unit's vector (over all tensors) to L2 norm at most ``max_norm``.

    ``vectors[k]`` has shape ``(U, *shape_k)`` (unit axis first). Returns the clipped tensors (same
    dtype) and the float64 factors ``min(1, C / ‖v_u‖)``. The norm is taken in float64 and a
    clipping factor is shrunk by a few ulps of float32, so that ``‖clipped_u‖ ≤ C`` holds for the
    float32 result too.
    """
    norms = vector_norms(vectors)
    c = torch.as_tensor(max_norm, dtype=torch.float64)
    if bool((c <= 0).any()) or not bool(torch.isfinite(c).all()):
        raise ValueError(f"max_norm: must be finite and > 0, got {max_norm!r}")
    c = c.to(norms.device)
    finite = torch.isfinite(norms)
    clipped = norms > c
    # A clipped unit's factor is shrunk by a few float32 ulps so rounding cannot overshoot C.
    factors = torch.where(
        clipped, c / norms.clamp_min(1e-300) * (1.0 - 4.0 * 2.0**-24), torch.ones_like(norms)
    )
    # A unit whose vector is not finite (or whose norm overflows) contributes nothing, rather
    # than turning the sum into NaN/inf (which would reveal it without noise).
    factors = torch.where(finite, factors, torch.zeros_like(factors))
    out = []
    for v in vectors:
        f = factors.reshape(-1, *([1] * (v.dim() - 1)))
        keep = finite.reshape(-1, *([1] * (v.dim() - 1)))
        v64 = torch.where(keep, v.detach().to(torch.float64), torch.zeros((), dtype=torch.float64))
        out.append((v64 * f).to(v.dtype))
    return out, factors


def as_rates(rates: np.ndarray | Tensor | Iterable[float], n: int) -> Tensor:
    """Validate per-record sampling rates: shape ``(n,)``, finite, in ``[0, 1]`` → float64 CPU."""
    # a private copy: later edits of `rates` do not count
    return torch.from_numpy(_checked_rates(rates, n).copy())


def _checked_rates(rates: np.ndarray | Tensor | Iterable[float], n: int) -> np.ndarray:
    """:func:`as_rates` without the copy (float64 numpy; a view of ``rates`` when it already is
    one): for rates used at once (one :meth:`PersonalizedDPSGD.step`)."""
    if isinstance(rates, Tensor):
        rates = rates.detach().to("cpu", torch.float64).numpy()
    q = np.asarray(rates, dtype=np.float64)
    if q.ndim != 1 or q.shape[0] != n:
        raise ValueError(f"rates must have shape ({n},) (one per record), got {tuple(q.shape)}")
    # NaN fails both comparisons (min/max propagate it), ±inf fails one: no isfinite pass
    if n and not (q.min() >= 0.0 and q.max() <= 1.0):
        raise ValueError("rates must be finite and in [0, 1]")
    return q
