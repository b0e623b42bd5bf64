"""Personalized DP-SGD: the local update of every pdpfl algorithm (rPDP-FL Alg. 3, lines 10–15).

One step on a silo's data ``D`` with per-record sampling rates ``q_i``:

1. **Poisson sampling** — one independent Bernoulli(q_i) per record:
   ``S = {i : U_i < q_i}`` with float64 uniforms ``U`` from the silo's
   :class:`~pdpfl.randomness.RandomStream` (a CSPRNG by default). A record with ``q_i = 0`` is
   never sampled. (Drawing a binomial batch size and then a uniform subset is *not* equivalent
   when the rates differ.)
2. **Per-sample gradients** of the loss for the records in ``S`` (in chunks of
   ``physical_batch_size``; see :mod:`pdpfl.dp.grad_sample`).
3. **Clipping** of each per-sample gradient to L2 norm ``C`` over all trainable parameters; the
   bound holds for every input (norms with a rigorous floating-point error bound, float32 where
   it decides and float64 where it does not, non-finite records add nothing, weight tying takes
   the exact path; see :mod:`pdpfl.dp.grad_sample`). The clipped sum is accumulated in float64.
4. **Noise**: the clipped sum plus ``N(0, σ²C²)`` per coordinate, added in float64 (one draw
   for all parameters from the same stream, in parameter order) by the one noise adder
   (:mod:`pdpfl.dp.noise`, prepared once per engine) from the engine's noise description
   (:class:`~pdpfl.privacy.noise.GaussianNoise` (σ, C): the object whose event a ledger
   charges; pass ``noise=`` to share the caller's).
5. **Normalisation** by a *public* constant ``normalizer`` (the configured expected batch size:
   never the realized ``|S|``, never ``Σ q_i`` computed from private budgets). An empty batch is
   a noise-only step, never skipped. See :mod:`pdpfl.dp.steps`.
6. The optimizer (SGD/Adam/RMSprop, weight decay) consumes the privatized gradient — this is
   post-processing and costs no privacy.

:class:`PersonalizedDPSGD` exposes the pieces as public methods (``sample``, ``clipped_sum``,
``noisy_gradient``, ``apply``; ``step`` chains them). Modules whose buffers change in a
training-mode forward are rejected with an error naming the module
(:func:`check_buffers_unchanged`), as :func:`~pdpfl.dp.validate.validate_model` does statically
for known types.

Uniform DP-SGD is the special case ``q_i = q``; ``private=False`` is plain minibatch SGD on the
Poisson batch (mean over the realized batch, no clipping or noise; the PrivacyFree baseline).
The privacy parameters (σ, C, q, τ) are always explicit arguments; nothing is inferred from a
data loader.

``device=`` (``"cpu"`` | ``"cuda"`` | ``"cuda:N"`` | ``"mps"`` | ``"auto"``; default: where the
model already is) moves the model and its optimizer state there; sampling indices, per-sample
products, clipping factors, the float64 sum, the noise and the update then stay on that device
(see :mod:`pdpfl.dp.device`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from pdpfl.dp.bookkeeping import Workspace
from pdpfl.dp.device import math_device, resolve_device
from pdpfl.dp.extra_rows import ExtraRows
from pdpfl.dp.grad_sample import ClippedSum, _clipped_grad_sum, hooked_modules, resolve_method
from pdpfl.dp.noise import CentralNoise, PreparedNoise, central_step_noise
from pdpfl.dp.steps import _checked_rates, as_rates, check_normalizer, poisson_sample
from pdpfl.dp.training import evaluate, make_optimizer, move_to_device
from pdpfl.dp.validate import (
    _buffer_snapshot,
    check_buffers_unchanged,
    replace_batchnorm,
    validate_model,
)
from pdpfl.models import loss_fn
from pdpfl.randomness import RandomStream, stream_from_generator

__all__ = [
    "LocalTrainingResult",
    "move_to_device",
    "as_stream",
    "check_buffers_unchanged",
    "PersonalizedDPSGD",
    "StepResult",
    "evaluate",
    "make_optimizer",
    "replace_batchnorm",
    "train_steps",
    "validate_model",
]

LossFn = Callable[[Tensor, Tensor], Tensor]


@dataclass
class StepResult:
    """What one :meth:`PersonalizedDPSGD.step` did."""

    batch_size: int
    """Realized Poisson batch size |S| (private to the silo)."""
    loss_sum: float
    """Σ_{i∈S} loss_i before the update (0 for an empty batch)."""
    indices: Tensor
    """Indices of the sampled records (CPU, int64)."""


@dataclass
class LocalTrainingResult:
    """Outcome of :func:`train_steps` (τ local steps on one silo)."""

    steps: int
    realized_batch_sizes: list[int]
    """Realized Poisson batch sizes (private to the silo: never released)."""
    expected_batch_size: float
    """Σ q_i of the rates used (private to the silo: never released)."""
    mean_loss: float
    """Mean per-record training loss over all sampled records (``nan`` if none was sampled)."""
    selection_counts: np.ndarray = field(repr=False)
    """Per record: in how many of the steps it was sampled (stays at the silo)."""


class PersonalizedDPSGD:
    """Personalized DP-SGD (per-record Poisson rates) around a model and an optimizer.

    Parameters
    ----------
    model
        A per-record model (no BatchNorm when ``private``; see :func:`validate_model`).
    optimizer
        Any ``torch.optim.Optimizer`` over (a subset of) ``model``'s parameters.
    noise_multiplier
        σ ≥ 0: noise standard deviation per coordinate is ``σ·C``.
    max_grad_norm
        C > 0: per-sample L2 clipping bound over all trainable parameters.
    noise
        Instead of ``noise_multiplier`` and ``max_grad_norm``: the noise description
        (:class:`~pdpfl.privacy.noise.GaussianNoise` with σ and sensitivity C, one share, or
        :class:`~pdpfl.privacy.noise.CentralDiscreteGaussianNoise`: the exact discrete Gaussian
        on a grid of the clipped sum, ``privacy.central_noise: discrete``) that the caller's
        ledger charges; the engine then draws exactly that noise.
    private
        ``False`` → plain minibatch SGD on the Poisson batch (no clipping, no noise).
    physical_batch_size
        Records per chunk for per-sample gradient computation (memory bound).
    loss
        Mean loss ``loss(outputs, targets)``; it must be the mean of per-record losses.
    grad_sampler
        ``"auto"`` | ``"hooks"`` | ``"func"`` (see :mod:`pdpfl.dp.grad_sample`).
    device
        ``None`` (keep the model where it is) | ``"cpu"`` | ``"cuda"`` | ``"cuda:N"`` | ``"mps"``
        | ``"auto"``: the model (and its optimizer state) is moved there; data passed to
        :meth:`step` is moved per batch.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        noise_multiplier: float | None = None,
        max_grad_norm: float | None = None,
        private: bool = True,
        physical_batch_size: int = 512,
        loss: LossFn = loss_fn,
        grad_sampler: str = "auto",
        device: str | torch.device | None = None,
        noise: CentralNoise | None = None,
    ):
        if private:
            noise = central_step_noise(noise, noise_multiplier, max_grad_norm)  # the σ, C check
            validate_model(model)
        else:
            noise = None
        if int(physical_batch_size) < 1:
            raise ValueError(f"physical_batch_size must be >= 1, got {physical_batch_size}")
        dev = resolve_device(device)
        if dev is not None:
            move_to_device(model, optimizer, dev)
        self.model = model
        self.optimizer = optimizer
        #: What every step adds: N(0, σ²C²) per coordinate (None: not private).
        self.noise = noise
        self.noise_multiplier = 0.0 if noise is None else noise.noise_multiplier
        self.max_grad_norm = (
            float(max_grad_norm or 0.0) if noise is None else float(noise.sensitivity)
        )
        self.private = bool(private)
        self.physical_batch_size = int(physical_batch_size)
        self.loss = loss
        self.grad_sampler = resolve_method(model, grad_sampler) if private else grad_sampler
        self.params = [p for p in model.parameters() if p.requires_grad]
        # fixed per engine: the layers the hooks record, the buffers to watch, reused buffers
        self._modules = hooked_modules(model) if self.grad_sampler == "hooks" else None
        self._has_buffers = any(True for _ in model.buffers())
        self._workspace = Workspace()
        self._shapes = [tuple(p.shape) for p in self.params]
        self._sizes = [p.numel() for p in self.params]
        self._numel = sum(self._sizes)
        self._index = {id(p): k for k, p in enumerate(self.params)}
        # the one noise adder, prepared once for this layout (pdpfl.dp.noise)
        self._add_noise = None if noise is None else PreparedNoise(noise, self._shapes)
        # step() rounds the noisy gradient into this buffer and hands its views to the
        # optimizer as `.grad` (overwritten by the next step, as backward() does)
        self._grad_buf: Tensor | None = None
        self._grad_views: list[Tensor] = []
        # ... and accumulates the clipped sum in this one (zeroed every step)
        self._sum_buf: Tensor | None = None
        self._sum_views_buf: list[Tensor] = []
        own = {id(p) for p in self.params}
        # parameters of the optimizer that this engine does not give a gradient to
        self._foreign = any(
            id(p) not in own for group in optimizer.param_groups for p in group["params"]
        )

    @property
    def device(self) -> torch.device:
        return self.params[0].device

    # -- the pieces of one step (pdpfl.dp.steps) ---------------------------------------------
    @staticmethod
    def sample(rates: Tensor | np.ndarray, stream: RandomStream | torch.Generator) -> Tensor:
        """Poisson sampling: indices ``{i : U_i < q_i}``, one Bernoulli(q_i) per record."""
        return poisson_sample(rates, as_stream(stream))

    def clipped_sum(self, xb: Tensor, yb: Tensor) -> ClippedSum:
        """Σ_{i∈S} clip_C(g_i) (float64, one tensor per trainable parameter) of a sampled batch.

        An empty batch gives zeros. Raises ``ValueError`` naming the module when a training-mode
        forward changed a buffer (running statistics computed from the batch). The sums are
        views of one float64 vector (all parameters, in order).
        """
        return self._clipped_sum(xb, yb)

    def _views(self, flat: Tensor) -> list[Tensor]:
        """Per-parameter views of a vector of all trainable parameters (in order)."""
        return [
            t.view(s) for t, s in zip(torch.split(flat, self._sizes), self._shapes, strict=True)
        ]

    def _clipped_sum(self, xb: Tensor, yb: Tensor, reuse: bool = False) -> ClippedSum:
        """:meth:`clipped_sum`; ``reuse``: accumulate in the engine's float64 buffer (zeroed
        here; for :meth:`step`, which consumes the sums before the next call)."""
        dev = math_device(self.device)
        if reuse:
            flat = self._sum_buf
            if flat is None or flat.device != dev:
                flat = self._sum_buf = torch.zeros(self._numel, dtype=torch.float64, device=dev)
                self._sum_views_buf = self._views(flat)
            else:
                flat.zero_()
            sums = self._sum_views_buf
        else:
            flat = torch.zeros(self._numel, dtype=torch.float64, device=dev)
            sums = self._views(flat)
        if xb.shape[0] == 0:
            return ClippedSum(
                sums=sums,
                loss_sum=0.0,
                norms=torch.zeros(0, dtype=torch.float64),
                factors=torch.zeros(0, dtype=torch.float64),
                method=self.grad_sampler,
                flat=flat,
            )
        before = _buffer_snapshot(self.model) if self._has_buffers else []
        try:
            res = _clipped_grad_sum(
                self.model,
                xb,
                yb,
                self.loss,
                self.max_grad_norm,
                self.grad_sampler,
                self.physical_batch_size,
                out=flat,
                modules=self._modules,
                ws=self._workspace,
                params=self.params,
                index=self._index,
                sums=sums,
            )
        except RuntimeError:
            if before:  # torch.func refuses in-place buffer updates: name the module instead
                with torch.no_grad():
                    self.model(xb[:1])
                check_buffers_unchanged(self.model, before)
            raise
        if before:
            check_buffers_unchanged(self.model, before)
        self.grad_sampler = res.method  # remember a fallback from "hooks" to "func"
        return res

    def noisy_gradient(
        self, sums: list[Tensor], normalizer: float, stream: RandomStream | torch.Generator
    ) -> list[Tensor]:
        """``(sums + N(0, σ²C² I)) / normalizer`` in float64, rounded once to each parameter's
        dtype; the noise is one draw of all coordinates from ``stream`` in parameter order."""
        normalizer = check_normalizer(normalizer)
        dev = math_device(self.device)
        flat = torch.cat([s.detach().reshape(-1).to(dev, torch.float64) for s in sums])
        return self._noisy(flat, normalizer, as_stream(stream))

    def _noisy(
        self, flat: Tensor, normalizer: float, stream: RandomStream, reuse: bool = False
    ) -> list[Tensor]:
        """In place on the float64 vector ``flat``: add the noise, divide, round once.

        ``reuse``: round into the engine's gradient buffer and return its views (the same
        tensors every step; for :meth:`step`, whose gradients only the optimizer sees)."""
        if self._add_noise is not None:
            self._add_noise(flat, stream)
        flat.div_(normalizer)
        dtype, device = self.params[0].dtype, self.params[0].device
        if all(p.dtype == dtype and p.device == device for p in self.params):
            if reuse:
                buf = self._grad_buf
                if buf is None or buf.dtype != dtype or buf.device != device:
                    buf = self._grad_buf = torch.empty(self._numel, dtype=dtype, device=device)
                    self._grad_views = self._views(buf)
                buf.copy_(flat)  # one rounding of every coordinate (as `to` rounds)
                return self._grad_views
            return self._views(flat.to(device, dtype))  # one rounding of every coordinate
        return [
            t.view(p.shape).to(p.device, p.dtype)
            for t, p in zip(torch.split(flat, self._sizes), self.params, strict=True)
        ]

    def privatized_gradient(
        self,
        xb: Tensor,
        yb: Tensor,
        normalizer: float,
        stream: RandomStream | torch.Generator,
        extra: ExtraRows | None = None,
    ) -> tuple[list[Tensor], float]:
        """``(Σ_{i∈S} clip_C(g_i) + N(0, σ²C² I)) / normalizer`` for an already sampled batch.

        Returns the gradient per trainable parameter and Σ loss_i over the batch. The noise is
        drawn from ``stream`` (parameter order) even when the batch is empty. ``extra`` (audit
        canaries, :mod:`pdpfl.dp.extra_rows`): its rows are sampled, clipped and added to the
        clipped sum before the noise.
        """
        normalizer = check_normalizer(normalizer)
        stream = as_stream(stream)
        res = self.clipped_sum(xb, yb)
        if extra is not None:
            extra.add_sampled(res.sums, stream, self.max_grad_norm)
        flat = _flat_of(res)
        return self._noisy(flat, normalizer, stream), res.loss_sum

    def nonprivate_gradient(self, xb: Tensor, yb: Tensor) -> tuple[list[Tensor], float]:
        """Mean gradient over the realized batch (no clipping, no noise) and Σ loss_i."""
        b = xb.shape[0]
        grads = [torch.zeros_like(p) for p in self.params]
        loss_sum = 0.0
        for start in range(0, b, self.physical_batch_size):
            xs = xb[start : start + self.physical_batch_size]
            ys = yb[start : start + self.physical_batch_size]
            loss = self.loss(self.model(xs), ys)
            chunk = torch.autograd.grad(loss, self.params, allow_unused=True)
            for g, c in zip(grads, chunk, strict=True):
                if c is not None:
                    g += c * (xs.shape[0] / b)
            loss_sum += float(loss.detach()) * xs.shape[0]
        return grads, loss_sum

    def apply(self, grads: list[Tensor]) -> None:
        """Let the optimizer consume ``grads`` (one per trainable parameter): post-processing."""
        if self._foreign:  # otherwise every parameter's gradient is replaced below
            self.optimizer.zero_grad(set_to_none=True)
        for p, g in zip(self.params, grads, strict=True):
            if p.grad is not g:  # step()'s reused buffer: already attached
                p.grad = g
        self.optimizer.step()

    def step(
        self,
        x: Tensor,
        y: Tensor,
        rates: np.ndarray | Tensor,
        stream: RandomStream | torch.Generator,
        normalizer: float | None = None,
        extra: ExtraRows | None = None,
    ) -> StepResult:
        """One personalized DP-SGD step on the silo's full local data ``(x, y)``.

        Sample (coins from ``stream``), clip, add noise (from ``stream``), divide by the public
        ``normalizer`` (required when private) and let the optimizer step. ``extra``: audit
        canaries added to the clipped sum (private steps only; see :mod:`pdpfl.dp.extra_rows`).
        A private step leaves its gradient in each parameter's ``.grad``: views of an engine
        buffer that the next step overwrites (as ``backward()`` accumulates into ``.grad``);
        :meth:`privatized_gradient` returns fresh tensors.
        """
        q = _checked_rates(rates, x.shape[0])  # validated and sampled at once: no copy
        if self.private:
            normalizer = check_normalizer(normalizer)
        elif extra is not None:
            raise ValueError("extra rows (audit canaries) need a private step")
        return self._step(x, y, q, as_stream(stream), normalizer, extra)

    def _step(
        self,
        x: Tensor,
        y: Tensor,
        q: Tensor | np.ndarray,
        stream: RandomStream,
        normalizer: float | None,
        extra: ExtraRows | None = None,
    ) -> StepResult:
        """:meth:`step` with validated rates, stream and normaliser."""
        idx = poisson_sample(q, stream)
        dev = self.device
        xb = x.index_select(0, idx if x.device.type == "cpu" else idx.to(x.device))
        yb = y.index_select(0, idx if y.device.type == "cpu" else idx.to(y.device))
        if xb.device != dev:
            xb = xb.to(dev)
        if yb.device != dev:
            yb = yb.to(dev)
        if self.private:
            assert normalizer is not None
            res = self._clipped_sum(xb, yb, reuse=True)
            if extra is not None:  # audit canaries: sampled after the records, before the noise
                extra.add_sampled(res.sums, stream, self.max_grad_norm)
            grads = self._noisy(_flat_of(res), normalizer, stream, reuse=True)
            loss_sum = res.loss_sum
        elif idx.numel() == 0:
            return StepResult(0, 0.0, idx)  # nothing to learn from; no privacy to protect
        else:
            grads, loss_sum = self.nonprivate_gradient(xb, yb)
        self.apply(grads)
        return StepResult(int(idx.numel()), loss_sum, idx)


def _flat_of(res: ClippedSum) -> Tensor:
    """The float64 vector holding all of ``res``'s sums (their concatenation if not recorded)."""
    if res.flat is not None:
        return res.flat
    return torch.cat([s.reshape(-1).to(torch.float64) for s in res.sums])


def as_stream(stream: RandomStream | torch.Generator) -> RandomStream:
    """A :class:`~pdpfl.randomness.RandomStream`; a seeded ``torch.Generator`` is wrapped
    (reproducible research mode: anyone who knows the seed can regenerate the noise)."""
    if isinstance(stream, torch.Generator):
        return stream_from_generator(stream)
    return stream


def train_steps(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    rates: np.ndarray | Tensor,
    steps: int,
    noise_multiplier: float | None = None,
    max_grad_norm: float | None = None,
    optimizer: torch.optim.Optimizer,
    stream: RandomStream | torch.Generator,
    normalizer: float | None = None,
    private: bool = True,
    physical_batch_size: int = 512,
    loss: LossFn = loss_fn,
    grad_sampler: str = "auto",
    device: str | torch.device | None = None,
    extra: ExtraRows | None = None,
    noise: CentralNoise | None = None,
) -> LocalTrainingResult:
    """τ = ``steps`` steps of personalized DP-SGD on one silo's full local data.

    Per step: Poisson-sample with one Bernoulli(``rates[i]``) per record, clip per-sample
    gradients to ``max_grad_norm``, sum, add N(0, σ²C²) per coordinate, divide by the public
    ``normalizer`` and let ``optimizer`` step (see the module docstring). ``stream`` supplies the
    coins and the noise (``SecureRandomness().stream(...)``; a seeded ``torch.Generator`` is
    accepted for reproducible research runs). ``rates`` and ``steps`` are the mechanism's
    public description; the caller accounts for them (``privacy/``). With ``private=False`` the
    normaliser is not needed (plain minibatch SGD on the realized batch). ``device`` (None: where
    the model is; ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``, ``"auto"``) moves the model,
    its optimizer state and ``(x, y)`` there for the whole run. ``extra`` (audit canaries;
    :mod:`pdpfl.dp.extra_rows`) adds sampled, clipped rows to every step's clipped sum.
    ``noise`` replaces ``noise_multiplier`` and ``max_grad_norm`` with the noise description
    the caller's ledger charges (:class:`~pdpfl.privacy.noise.GaussianNoise` or
    :class:`~pdpfl.privacy.noise.CentralDiscreteGaussianNoise`).
    """
    if int(steps) < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(
            f"x and y must have the same number of records, got {x.shape[0]} and {y.shape[0]}"
        )
    q = as_rates(rates, x.shape[0])
    expected = float(q.sum())
    if private:
        normalizer = check_normalizer(normalizer)
    elif extra is not None:
        raise ValueError("extra rows (audit canaries) need a private step")
    stream = as_stream(stream)
    engine = PersonalizedDPSGD(
        model,
        optimizer,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        private=private,
        physical_batch_size=physical_batch_size,
        loss=loss,
        grad_sampler=grad_sampler,
        device=device,
        noise=noise,
    )
    if device is not None:  # the data once, not every step
        x, y = x.to(engine.device), y.to(engine.device)
    was_training = model.training
    model.train()
    counts = torch.zeros(x.shape[0], dtype=torch.int64)
    sizes: list[int] = []
    loss_total = 0.0
    try:
        for _ in range(int(steps)):
            res = engine._step(x, y, q, stream, normalizer, extra)
            counts[res.indices] += 1
            sizes.append(res.batch_size)
            loss_total += res.loss_sum
    finally:
        model.train(was_training)
    n_seen = sum(sizes)
    return LocalTrainingResult(
        steps=int(steps),
        realized_batch_sizes=sizes,
        expected_batch_size=expected,
        mean_loss=loss_total / n_seen if n_seen else float("nan"),
        selection_counts=counts.numpy(),
    )
