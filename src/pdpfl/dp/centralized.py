"""Centralized rPDP-SGD (rPDP-FL §7.1, Appendix A): personalized DP-SGD on one pooled data set.

Each record *i* has a privacy budget ε_i; the calibrator (rPDP-FL §5, Alg. 2 —
:func:`pdpfl.calibration.calibrate`) maps budgets to per-record Poisson sampling rates q_i for the
mechanism (σ, C, τ = ``steps``). Training is then τ steps of :class:`PersonalizedDPSGD`.
Uniform DP-SGD is the same call with equal rates.

The calibration is *injected* (``rates=`` directly, or ``budgets=`` plus a ``calibrator``
callable), so this module neither imports nor depends on a particular calibrator::

    from pdpfl.calibration import calibrate
    res = train_rpdp_sgd(model, (x, y), (x_test, y_test), budgets=eps,
                         calibrator=lambda eps: calibrate(eps, ...).rates, ...)

Reports: test loss/accuracy, test accuracy per class (Appendix A, Table 4) and per budget group
(``test_groups``: the group of each test record, e.g. the budget of its class for
data-dependent budgets), and per training budget group the mean rate and realized selection
frequency.

Privacy boundary (issue #10): the noisy clipped sum is divided by ``normalizer``, a *public*
constant the caller declares (e.g. the expected batch size it planned for) -- never Σ q_i, which
is computed from the private budgets. The Poisson coins and the noise come from a
:mod:`pdpfl.randomness` stream: a fresh :class:`~pdpfl.randomness.SecureRandomness` key by
default; ``seed=`` (or a seeded ``torch.Generator`` as ``stream=``) is the labelled reproducible
research mode, with no guarantee against anyone who knows the seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from pdpfl.dp.engine import LossFn, PersonalizedDPSGD, evaluate, make_optimizer
from pdpfl.dp.steps import as_rates, check_normalizer
from pdpfl.dp.training import Evaluation
from pdpfl.models import loss_fn, predict
from pdpfl.randomness import (
    REPRODUCIBLE_LABEL,
    SECURE_LABEL,
    RandomStream,
    SecureRandomness,
    SeededRandomness,
    stream_from_generator,
)

__all__ = ["CentralizedResult", "group_accuracy", "mechanism_stream", "train_rpdp_sgd"]


def mechanism_stream(
    stream: RandomStream | torch.Generator | None, seed: int | None, purpose: str
) -> tuple[RandomStream, str]:
    """The stream a centralized trainer draws its coins and noise from, and its label.

    Default (both ``None``): a fresh :class:`~pdpfl.randomness.SecureRandomness` key. ``seed``:
    :class:`~pdpfl.randomness.SeededRandomness` (reproducible, no guarantee against anyone who
    knows the seed). ``stream``: a caller's stream, or a seeded ``torch.Generator`` (reproducible).
    """
    if stream is not None and seed is not None:
        raise ValueError("give at most one of stream= and seed=")
    if seed is not None:
        return SeededRandomness(int(seed)).stream(purpose), REPRODUCIBLE_LABEL
    if stream is None:
        return SecureRandomness().stream(purpose), SECURE_LABEL
    if isinstance(stream, torch.Generator):
        return stream_from_generator(stream), REPRODUCIBLE_LABEL
    if not isinstance(stream, RandomStream):
        raise TypeError(
            f"stream: expected a pdpfl.randomness.RandomStream or a torch.Generator, "
            f"got {type(stream).__name__}"
        )
    kind = type(stream).__name__
    if kind == "_ChaChaStream":
        return stream, SECURE_LABEL
    if kind == "_TorchStream":
        return stream, REPRODUCIBLE_LABEL
    return stream, f"caller-provided stream ({kind})"


@torch.no_grad()
def _correct(model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 1024) -> np.ndarray:
    was = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        out = [
            predict(model(x[s : s + batch_size].to(device))).cpu()
            for s in range(0, x.shape[0], batch_size)
        ]
    finally:
        model.train(was)
    if not out:
        return np.zeros(0, dtype=bool)
    return (torch.cat(out) == y.cpu().long().flatten()).numpy()


def group_accuracy(
    model: nn.Module, x: Tensor, y: Tensor, groups: Sequence[Any] | np.ndarray
) -> dict[str, float]:
    """Accuracy on ``(x, y)`` per group label (``groups[i]`` is the group of record *i*)."""
    g = np.asarray(groups)
    if g.shape != (x.shape[0],):
        raise ValueError(f"groups must have shape ({x.shape[0]},), got {g.shape}")
    correct = _correct(model, x, y)
    return {str(k): float(correct[g == k].mean()) for k in np.unique(g)}


def _group_stats(
    groups: np.ndarray, rates: np.ndarray, counts: np.ndarray, steps: int
) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for k in np.unique(groups):
        m = groups == k
        out[str(k)] = {
            "n": int(m.sum()),
            "mean_rate": float(rates[m].mean()),
            "selection_frequency": float(counts[m].mean() / steps) if steps else float("nan"),
        }
    return out


@dataclass
class CentralizedResult:
    """Outcome of a centralized run (rPDP-SGD here; the Filter baseline extends it)."""

    steps: int
    test: Evaluation
    """:func:`pdpfl.dp.engine.evaluate` on the test set (incl. ``per_class_accuracy``)."""
    per_group_accuracy: dict[str, float]
    """Test accuracy per budget group (empty unless ``test_groups`` was given)."""
    train_groups: dict[str, dict[str, float]]
    """Per training budget group: ``n`` and method-specific statistics."""
    history: list[dict[str, float]] = field(default_factory=list)
    """``{"step", "loss", "accuracy"}`` every ``eval_every`` steps."""
    mean_step_seconds: float = float("nan")
    realized_batch_sizes: list[int] = field(default_factory=list)
    expected_batch_size: float = float("nan")
    """Σ q_i (a function of the private budgets: a diagnostic, never the normaliser)."""
    normalizer: float = float("nan")
    """The public constant the noisy sums were divided by."""
    randomness: str = SECURE_LABEL
    """Where the coins and the noise came from (see :mod:`pdpfl.randomness`)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary."""
        return {
            "steps": self.steps,
            "normalizer": self.normalizer,
            "randomness": self.randomness,
            "test": self.test,
            "per_group_accuracy": self.per_group_accuracy,
            "train_groups": self.train_groups,
            "history": self.history,
            "mean_step_seconds": self.mean_step_seconds,
            "expected_batch_size": self.expected_batch_size,
        }


def train_rpdp_sgd(
    model: nn.Module,
    train: tuple[Tensor, Tensor],
    test: tuple[Tensor, Tensor],
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    steps: int,
    rates: np.ndarray | Tensor | None = None,
    budgets: np.ndarray | None = None,
    calibrator: Callable[[np.ndarray], np.ndarray] | None = None,
    lr: float = 0.1,
    optimizer: str = "sgd",
    weight_decay: float = 0.0,
    momentum: float = 0.0,
    normalizer: float | None = None,
    stream: RandomStream | torch.Generator | None = None,
    seed: int | None = None,
    train_groups: Sequence[Any] | np.ndarray | None = None,
    test_groups: Sequence[Any] | np.ndarray | None = None,
    eval_every: int = 0,
    physical_batch_size: int = 512,
    loss: LossFn = loss_fn,
) -> CentralizedResult:
    """Centralized rPDP-SGD: τ = ``steps`` personalized DP-SGD steps on the pooled data.

    Parameters
    ----------
    rates
        Per-record sampling rates q_i (e.g. from the calibrator). Exactly one of ``rates`` or
        (``budgets`` and ``calibrator``) must be given; ``calibrator(budgets)`` must return the
        rates for *this* mechanism (σ = ``noise_multiplier``, τ = ``steps``).
    train_groups
        Budget group of each training record (defaults to ``budgets`` when given).
    test_groups
        Group of each test record for the per-group test accuracy.
    normalizer
        The public constant dividing each noisy sum (required), e.g. the expected batch size the
        experiment declares; never computed here from the (private) rates.
    stream, seed
        Source of the Poisson coins and the noise (see :func:`mechanism_stream`): secure by
        default; ``seed=`` or a seeded ``torch.Generator`` for reproducible research runs.
    """
    x, y = train
    xt, yt = test
    if rates is None:
        if budgets is None or calibrator is None:
            raise ValueError("give either rates= or both budgets= and calibrator=")
        rates = np.asarray(calibrator(np.asarray(budgets, dtype=np.float64)), dtype=np.float64)
    elif budgets is not None and calibrator is not None:
        raise ValueError("give either rates= or budgets= with calibrator=, not both")
    q = as_rates(rates, x.shape[0])
    if float(q.sum()) <= 0:
        raise ValueError("rates: all sampling rates are 0 (Σq = 0); nothing to train on")
    if train_groups is None and budgets is not None:
        train_groups = np.asarray(budgets)
    normalizer = check_normalizer(normalizer)
    rng, label = mechanism_stream(stream, seed, "centralized-training")
    opt = make_optimizer(optimizer, model.parameters(), lr, weight_decay, momentum)
    engine = PersonalizedDPSGD(
        model,
        opt,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        physical_batch_size=physical_batch_size,
        loss=loss,
    )
    counts = np.zeros(x.shape[0], dtype=np.int64)
    sizes: list[int] = []
    history: list[dict[str, float]] = []
    model.train()
    elapsed = 0.0
    for t in range(1, int(steps) + 1):
        t0 = time.perf_counter()
        res = engine.step(x, y, q, rng, normalizer)
        elapsed += time.perf_counter() - t0
        counts[res.indices.numpy()] += 1
        sizes.append(res.batch_size)
        if eval_every and (t % eval_every == 0 or t == steps):
            ev = evaluate(model, xt, yt)
            history.append({"step": t, "loss": ev["loss"], "accuracy": ev["accuracy"]})
    qn = q.numpy()
    return CentralizedResult(
        steps=int(steps),
        test=evaluate(model, xt, yt),
        per_group_accuracy=(
            group_accuracy(model, xt, yt, test_groups) if test_groups is not None else {}
        ),
        train_groups=(
            _group_stats(np.asarray(train_groups), qn, counts, int(steps))
            if train_groups is not None
            else {}
        ),
        history=history,
        mean_step_seconds=elapsed / steps if steps else float("nan"),
        realized_batch_sizes=sizes,
        expected_batch_size=float(qn.sum()),
        normalizer=normalizer,
        randomness=label,
    )
