"""Model registry, loss/prediction conventions and parameter (de)serialisation.

Configs name models by string (``create_model("mnist-cnn", (1, 28, 28), 10)``). Every model here
treats the records of a batch independently (no BatchNorm), so per-sample gradients are well
defined and the personalized DP-SGD step of :mod:`pdpfl.dp.engine` applies.

Output convention: ``logreg`` and ``mlp`` emit **one logit** for binary tasks (``num_classes == 2``)
and ``num_classes`` logits otherwise; :func:`loss_fn` and :func:`predict` dispatch on the number
of output columns (one column → sigmoid/BCE with logits, else softmax/cross-entropy).

Models
------
``logreg``       Flatten → Linear(d, 1 or K). Fed-Heart-Disease: Linear(13, 1) = 14 parameters.
``mlp``          Flatten → [Linear → ReLU]* → Linear, hidden sizes ``hidden=(64, 32)``.
``mnist-cnn``    The rPDP-FL MNIST CNN (26,010 parameters for 1×28×28 inputs, 10 classes):
                 conv(1→16, k8, s2, p3) → tanh → maxpool(2, 1) → conv(16→32, k4, s2) → tanh →
                 maxpool(2, 1) → Linear(512, 32) → tanh → Linear(32, 10).
``prifedsync-mnist-cnn``
                 The PriFedSync paper's MNIST CNN (1,199,882 parameters on 1×28×28, 10 classes):
                 conv(1→32, k3) → ReLU → conv(32→64, k3) → ReLU → maxpool(2) → [dropout] →
                 Linear(9216, 128) → ReLU → [dropout] → Linear(128, 10).
``prifedsync-cifar-cnn``
                 The TensorFlow-tutorial CIFAR CNN used by PriFedSync (122,570 parameters on
                 3×32×32, 10 classes): conv(3→32, k3) → ReLU → maxpool(2) → conv(32→64, k3) →
                 ReLU → maxpool(2) → conv(64→64, k3) → ReLU → Linear(1024, 64) → ReLU →
                 Linear(64, 10).
``resnet18-gn``  torchvision's ResNet-18 layout (7×7 stem, max-pool, 4 stages of 2 basic blocks)
                 with GroupNorm instead of BatchNorm: 11,181,642 parameters for 10 classes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "MODELS",
    "create_model",
    "get_params",
    "initial_model",
    "loss_fn",
    "num_parameters",
    "predict",
    "register_model",
    "trainable_parameters",
    "set_params",
]

ModelBuilder = Callable[..., nn.Module]

#: Registered model builders: ``builder(input_shape, num_classes, **kwargs) -> nn.Module``.
MODELS: dict[str, ModelBuilder] = {}


def register_model(name: str) -> Callable[[ModelBuilder], ModelBuilder]:
    """Decorator registering ``builder(input_shape, num_classes, **kwargs)`` under ``name``."""

    def deco(builder: ModelBuilder) -> ModelBuilder:
        if name in MODELS:
            raise ValueError(f"model name {name!r} is already registered")
        MODELS[name] = builder
        return builder

    return deco


def create_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, **kwargs: Any
) -> nn.Module:
    """Build the registered model ``name`` for inputs of shape ``input_shape`` (no batch axis).

    Raises
    ------
    ValueError
        Unknown ``name``, empty/non-positive ``input_shape`` or ``num_classes < 2``.
    """
    if name not in MODELS:
        raise ValueError(f"model: unknown name {name!r}; registered: {sorted(MODELS)}")
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(
            f"input_shape must be a non-empty tuple of positive ints, got {input_shape!r}"
        )
    if int(num_classes) < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    return MODELS[name](shape, int(num_classes), **kwargs)


def initial_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    options: dict[str, Any],
    *,
    seed: int,
) -> nn.Module:
    """The public initial model x⁰ of a run: :func:`create_model` under torch's generator
    seeded from ``(seed, "model-init")`` (x⁰ is public; the caller's global torch random state
    is left as it was). Drawn on the CPU, so it is the same on every device."""
    from pdpfl.seeding import derive_seed

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "model-init"))
        return create_model(name, input_shape, num_classes, **options)


def num_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable) scalar parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _out_dim(num_classes: int) -> int:
    return 1 if num_classes == 2 else num_classes


@register_model("logreg")
def _logreg(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), _out_dim(num_classes)))


@register_model("mlp")
def _mlp(
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: tuple[int, ...] | list[int] = (64, 32),
) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for h in hidden:
        if int(h) <= 0:
            raise ValueError(f"mlp: hidden sizes must be positive, got {hidden!r}")
        layers += [nn.Linear(width, int(h)), nn.ReLU()]
        width = int(h)
    layers.append(nn.Linear(width, _out_dim(num_classes)))
    return nn.Sequential(*layers)


class MnistCNN(nn.Module):
    """The rPDP-FL / Opacus-tutorial MNIST CNN (26,010 parameters on 1×28×28, 10 classes)."""

    def __init__(self, input_shape: tuple[int, ...] = (1, 28, 28), num_classes: int = 10):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"mnist-cnn: input_shape must be (C, H, W), got {input_shape!r}")
        self.conv1 = nn.Conv2d(input_shape[0], 16, 8, stride=2, padding=3)
        self.conv2 = nn.Conv2d(16, 32, 4, stride=2)
        with torch.no_grad():
            flat = self._features(torch.zeros(1, *input_shape)).shape[1]
        self.fc1 = nn.Linear(flat, 32)
        self.fc2 = nn.Linear(32, num_classes)

    def _features(self, x: Tensor) -> Tensor:
        # From conv1's output on, activations are stored channels-last (same values): torch's
        # CPU tanh and stride-1 max-pool kernels on small NCHW planes (14×14) are several times
        # slower than on channels-last tensors, and they were half of a training step
        # (benchmarks/RESULTS.md, "The MNIST CNN in channels-last").
        x = F.max_pool2d(torch.tanh(_to_channels_last(self.conv1(x))), 2, 1)
        x = F.max_pool2d(torch.tanh(self.conv2(x)), 2, 1)
        return x.flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        logits: Tensor = self.fc2(torch.tanh(self.fc1(self._features(x))))
        return logits


def _to_channels_last(x: Tensor) -> Tensor:
    """``x`` (N, C, H, W) copied into channels-last memory order; permutes rather than
    ``contiguous(memory_format=...)``, which ``torch.func.vmap`` does not support."""
    return x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


@register_model("mnist-cnn")
def _mnist_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return MnistCNN(input_shape, num_classes)


class PriFedSyncMnistCNN(nn.Module):
    """PriFedSync's MNIST CNN (Zheng et al. 2021, §4.1): 1,199,882 parameters on 1×28×28.

    ``dropout=True`` adds the reference's channel dropout (p = 0.25) after pooling and dropout
    (p = 0.5) before the last layer. Off by default: dropout masks come from torch's global RNG,
    so a ``randomness: reproducible`` run would no longer replay bit for bit. The reference's
    final ``log_softmax`` is left out: :func:`loss_fn` applies the softmax (same loss and
    predictions).
    """

    def __init__(
        self,
        input_shape: tuple[int, ...] = (1, 28, 28),
        num_classes: int = 10,
        dropout: bool = False,
    ):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(
                f"prifedsync-mnist-cnn: input_shape must be (C, H, W), got {input_shape!r}"
            )
        self.conv1 = nn.Conv2d(input_shape[0], 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.drop1: nn.Module = nn.Dropout2d(0.25) if dropout else nn.Identity()
        self.drop2: nn.Module = nn.Dropout(0.5) if dropout else nn.Identity()
        with torch.no_grad():
            flat = self._features(torch.zeros(1, *input_shape)).shape[1]
        self.fc1 = nn.Linear(flat, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def _features(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        features: Tensor = self.drop1(x).flatten(1)
        return features

    def forward(self, x: Tensor) -> Tensor:
        logits: Tensor = self.fc2(self.drop2(F.relu(self.fc1(self._features(x)))))
        return logits


@register_model("prifedsync-mnist-cnn")
def _prifedsync_mnist_cnn(
    input_shape: tuple[int, ...], num_classes: int, dropout: bool = False
) -> nn.Module:
    return PriFedSyncMnistCNN(input_shape, num_classes, dropout=bool(dropout))


class PriFedSyncCifarCNN(nn.Module):
    """The TensorFlow-tutorial CIFAR CNN used by PriFedSync (§4.2): 122,570 parameters.

    As in the tutorial, the third convolution is followed by a ReLU (the reference code drops
    it; the parameter count is the same).
    """

    def __init__(self, input_shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(
                f"prifedsync-cifar-cnn: input_shape must be (C, H, W), got {input_shape!r}"
            )
        self.conv1 = nn.Conv2d(input_shape[0], 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.conv3 = nn.Conv2d(64, 64, 3)
        with torch.no_grad():
            flat = self._features(torch.zeros(1, *input_shape)).shape[1]
        self.fc1 = nn.Linear(flat, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def _features(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.relu(self.conv3(x)).flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        logits: Tensor = self.fc2(F.relu(self.fc1(self._features(x))))
        return logits


@register_model("prifedsync-cifar-cnn")
def _prifedsync_cifar_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return PriFedSyncCifarCNN(input_shape, num_classes)


def _group_norm(channels: int, num_groups: int = 32) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(num_groups, channels), channels)


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, num_groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.gn1 = _group_norm(cout, num_groups)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.gn2 = _group_norm(cout, num_groups)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), _group_norm(cout, num_groups)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.gn1(self.conv1(x)))
        out = self.gn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


class ResNet18GN(nn.Module):
    """ResNet-18 (torchvision layout) with GroupNorm; 11,181,642 parameters for 10 classes."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10, num_groups: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
        self.gn1 = _group_norm(64, num_groups)
        stages: list[nn.Module] = []
        cin = 64
        for i, cout in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            stages.append(
                nn.Sequential(
                    _BasicBlock(cin, cout, stride, num_groups),
                    _BasicBlock(cout, cout, 1, num_groups),
                )
            )
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.gn1(self.conv1(x))), 3, 2, 1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        logits: Tensor = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return logits


@register_model("resnet18-gn")
def _resnet18_gn(input_shape: tuple[int, ...], num_classes: int, num_groups: int = 32) -> nn.Module:
    if len(input_shape) != 3:
        raise ValueError(f"resnet18-gn: input_shape must be (C, H, W), got {input_shape!r}")
    return ResNet18GN(input_shape[0], num_classes, num_groups)


def loss_fn(outputs: Tensor, targets: Tensor) -> Tensor:
    """Mean loss: BCE-with-logits for one output column (float targets), else cross-entropy."""
    if outputs.ndim == 2 and outputs.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(outputs[:, 0], targets.to(outputs.dtype))
    return F.cross_entropy(outputs, targets.long())


def predict(outputs: Tensor) -> Tensor:
    """Class indices: ``logit > 0`` for one output column, else ``argmax``."""
    if outputs.ndim == 2 and outputs.shape[1] == 1:
        return (outputs[:, 0] > 0).long()
    return outputs.argmax(dim=1)


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The trainable parameters ``(name, parameter)`` in ``model.parameters()`` order.

    Shared (tied) parameters appear once, as in ``model.parameters()``. Buffers (running
    statistics, counters) are not parameters: they never leave a silo.
    """
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def get_params(model: nn.Module) -> list[np.ndarray]:
    """The trainable parameters as float32 NumPy arrays: exactly what crosses the network.

    Only trainable parameters travel (never buffers such as running statistics, which are
    functions of the training data computed without noise).
    """
    named = trainable_parameters(model)
    return [p.detach().to("cpu", torch.float32).numpy().copy() for _, p in named]


def set_params(model: nn.Module, params: list[np.ndarray]) -> None:
    """Load arrays produced by :func:`get_params` (same order and shapes) into ``model``, in
    place."""
    named = trainable_parameters(model)
    if len(params) != len(named):
        raise ValueError(f"params: expected {len(named)} arrays, got {len(params)}")
    with torch.no_grad():
        for (name, tensor), value in zip(named, params, strict=True):
            arr = np.asarray(value)
            if tuple(arr.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"params: shape mismatch for {name!r}: expected {tuple(tensor.shape)}, "
                    f"got {tuple(arr.shape)}"
                )
            tensor.copy_(torch.as_tensor(arr).to(tensor.device, tensor.dtype))


class IdpCNN(nn.Module):
    """The IDP-FedAvg paper's CNN (Lange et al. 2025, Fig. 2; flidp ``experiments/models.py``).

    3 × [Conv(32, 3×3, ReLU) → MaxPool(2) → Dropout(p)] → Flatten → Dense(64, ReLU) →
    Dropout(p) → Dense(K): 21,578 parameters on 1×28×28 and 28,298 on 3×32×32 (10 classes).
    Keras' ``Rescaling(1/255)`` is the loaders' job here (pdpfl images are already in [0, 1]);
    ``rescale`` multiplies the input if raw 0..255 pixels are fed. The softmax is in the loss.
    """

    def __init__(
        self,
        input_shape: tuple[int, ...] = (1, 28, 28),
        num_classes: int = 10,
        dropout: float = 0.1,
        rescale: float = 1.0,
    ):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"idp-cnn: input_shape must be (C, H, W), got {input_shape!r}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"idp-cnn: dropout must be in [0, 1), got {dropout!r}")
        self.rescale = float(rescale)
        self.conv1 = nn.Conv2d(input_shape[0], 32, 3)
        self.conv2 = nn.Conv2d(32, 32, 3)
        self.conv3 = nn.Conv2d(32, 32, 3)
        self.drop = nn.Dropout(float(dropout))
        with torch.no_grad():
            flat = self._features(torch.zeros(1, *input_shape)).shape[1]
        if flat == 0:
            raise ValueError(f"idp-cnn: input {input_shape!r} is too small for 3 conv/pool stages")
        self.fc1 = nn.Linear(flat, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def _features(self, x: Tensor) -> Tensor:
        if self.rescale != 1.0:
            x = x * self.rescale
        for conv in (self.conv1, self.conv2, self.conv3):
            x = self.drop(F.max_pool2d(F.relu(conv(x)), 2))
        return x.flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        logits: Tensor = self.fc2(self.drop(F.relu(self.fc1(self._features(x)))))
        return logits


@register_model("idp-cnn")
def _idp_cnn(
    input_shape: tuple[int, ...], num_classes: int, dropout: float = 0.1, rescale: float = 1.0
) -> nn.Module:
    return IdpCNN(input_shape, num_classes, dropout=dropout, rescale=rescale)


class CNNMnist(nn.Module):
    """ULDP-FL's MNIST CNN (the reference code's ``CNNMnist``; 21,840 parameters).

    Conv(1→10, k5) → max-pool 2 → ReLU → Conv(10→20, k5) → Dropout2d → max-pool 2 → ReLU →
    Linear(320, 50) → ReLU → Dropout → Linear(50, 10) → log-softmax. ``dropout`` (0.5 as in the
    reference) may be set to 0 for deterministic training (e.g. to compare two trainers).
    """

    def __init__(
        self,
        input_shape: tuple[int, ...] = (1, 28, 28),
        num_classes: int = 10,
        dropout: float = 0.5,
    ):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"cnnmnist: input_shape must be (C, H, W), got {input_shape!r}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout: must be in [0, 1), got {dropout!r}")
        self.dropout = float(dropout)
        self.conv1 = nn.Conv2d(input_shape[0], 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        with torch.no_grad():
            flat = self._features(torch.zeros(1, *input_shape)).shape[1]
        self.fc1 = nn.Linear(flat, 50)
        self.fc2 = nn.Linear(50, num_classes)

    def _features(self, x: Tensor) -> Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = self.conv2(x)
        if self.dropout:
            x = F.dropout2d(x, self.dropout, self.training)
        x = F.relu(F.max_pool2d(x, 2))
        return x.flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.fc1(self._features(x)))
        if self.dropout:
            x = F.dropout(x, self.dropout, self.training)
        return F.log_softmax(self.fc2(x), dim=1)


@register_model("cnnmnist")
def _cnnmnist(input_shape: tuple[int, ...], num_classes: int, dropout: float = 0.5) -> nn.Module:
    return CNNMnist(input_shape, num_classes, dropout)


class PrivateFraudNet(nn.Sequential):
    """ULDP-FL's Creditcard model (reference ``PrivateFraudNet(30, 30, 4)``; 5,012 parameters).

    [Linear(d, h), ReLU, GroupNorm(1, h)] + ``layers`` × [Linear(h, h), ReLU, GroupNorm(1, h),
    Dropout(``dropout``)] + Linear(h, classes). GroupNorm normalises each record on its own, so
    per-record gradients stay well defined.
    """

    def __init__(
        self,
        input_dim: int = 30,
        num_classes: int = 2,
        hidden: int = 30,
        layers: int = 4,
        dropout: float = 0.5,
    ):
        if int(hidden) < 1 or int(layers) < 0:
            raise ValueError(f"hidden/layers: must be >= 1 / >= 0, got {hidden!r}/{layers!r}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout: must be in [0, 1), got {dropout!r}")
        blocks: list[nn.Module] = [
            nn.Flatten(),
            nn.Linear(int(input_dim), int(hidden)),
            nn.ReLU(),
            nn.GroupNorm(1, hidden),
        ]
        for _ in range(int(layers)):
            blocks += [nn.Linear(hidden, hidden), nn.ReLU(), nn.GroupNorm(1, hidden)]
            if dropout:
                blocks.append(nn.Dropout(float(dropout)))
        blocks.append(nn.Linear(hidden, num_classes))
        super().__init__(*blocks)


@register_model("private-fraud-net")
def _private_fraud_net(
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: int = 30,
    layers: int = 4,
    dropout: float = 0.5,
) -> nn.Module:
    return PrivateFraudNet(math.prod(input_shape), num_classes, hidden, layers, dropout)
