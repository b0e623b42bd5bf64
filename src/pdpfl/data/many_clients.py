"""Federations with hundreds or thousands of clients (IDP-FedAvg's setting, spec B.5).

Cross-device-style benchmarks federate a *training* pool over many clients and evaluate on the
dataset's official *test* pool. Here the test pool is spread over the same clients (uniformly at
random, disjoint), so the pooled (example-weighted) test accuracy that pdpfl reports every round
is exactly the accuracy on the official test set.

``label_mix_partition`` is the CIFAR-10 partition of IDP-FedAvg's reference code (flidp
``notebooks/prepare_cifar10.ipynb``): every client draws a label distribution from
Dirichlet(α = remaining label counts / total); labels are handed out round-robin, one draw per
client, until a label is exhausted; then the distributions are redrawn over the remaining
labels. Examples are then dealt per label, so **every image belongs to exactly one client**
(checked by the tests; the reference's label-count vector came from ``value_counts()``, sorted
by frequency rather than by label, which mislabels counts whenever the classes are unbalanced).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from pdpfl.data._rng import numpy_generator
from pdpfl.data.federation import ClientData, Federation
from pdpfl.data.pool import Pool

__all__ = ["federate_train_test", "label_mix_partition", "uniform_assignment"]


def uniform_assignment(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Each of ``n`` records goes to a uniformly random client (flidp's IID split; a client may
    end up empty). Returns sorted, disjoint positions per client."""
    owner = rng.integers(0, num_clients, size=n)
    order = np.argsort(owner, kind="stable")
    cuts = np.searchsorted(owner[order], np.arange(1, num_clients))
    return [np.sort(p) for p in np.split(order, cuts)]


def label_mix_partition(
    y: np.ndarray, num_clients: int, rng: np.random.Generator, concentration: float = 1.0
) -> list[np.ndarray]:
    """flidp's per-client Dirichlet label mixes, with disjoint clients (see module docstring).

    ``concentration`` multiplies the Dirichlet parameter (1 = the reference: α_l = the share of
    label l among the remaining records, so each client's mix is very peaked).
    """
    y = np.asarray(y).reshape(-1)
    m = int(num_clients)
    if not 1 <= m <= len(y):
        raise ValueError(f"num_clients must be in [1, {len(y)}], got {num_clients!r}")
    if not (concentration > 0 and np.isfinite(concentration)):
        raise ValueError(f"concentration: must be a finite number > 0, got {concentration!r}")
    classes, inverse = np.unique(y, return_inverse=True)
    remaining = np.bincount(inverse, minlength=len(classes)).astype(np.int64)
    counts = np.zeros((m, len(classes)), dtype=np.int64)
    labels = np.flatnonzero(remaining > 0)
    current = 0
    while labels.size:
        alpha = remaining[labels] / remaining[labels].sum() * float(concentration)
        dists = rng.dirichlet(alpha, size=m)
        dists = np.where(np.isfinite(dists), dists, 0.0)
        cum = np.cumsum(dists, axis=1)
        while remaining[labels].min() > 0:
            row = cum[current]
            total = row[-1]
            if total <= 0:  # degenerate draw (all mass underflowed): uniform over labels left
                pick = labels[int(rng.integers(len(labels)))]
            else:
                pick = labels[
                    min(int(np.searchsorted(row, rng.random() * total, "right")), len(labels) - 1)
                ]
            remaining[pick] -= 1
            counts[current, pick] += 1
            current = (current + 1) % m
        labels = labels[remaining[labels] > 0]
    parts: list[list[np.ndarray]] = [[] for _ in range(m)]
    for j in range(len(classes)):
        idx = np.flatnonzero(inverse == j)
        idx = idx[rng.permutation(len(idx))]
        cuts = np.cumsum(counts[:, j])[:-1]
        for k, piece in enumerate(np.split(idx, cuts)):
            parts[k].append(piece)
    return [np.sort(np.concatenate(p)) for p in parts]


def federate_train_test(
    train: Pool,
    test: Pool,
    train_parts: list[np.ndarray],
    *,
    seed: int,
    name: str,
    client_names: list[str] | None = None,
    test_parts: list[np.ndarray] | None = None,
    metadata: dict[str, Any] | None = None,
) -> Federation:
    """One client per entry of ``train_parts``; the test pool spread uniformly over them
    (unless ``test_parts`` is given). Record ids: the pools' own ids."""
    m = len(train_parts)
    if test_parts is None:
        test_parts = uniform_assignment(len(test.y), m, numpy_generator(seed, f"test:{name}"))
    if len(test_parts) != m:
        raise ValueError("test_parts: one entry per client")
    clients = []
    for k, (tr, te) in enumerate(zip(train_parts, test_parts, strict=True)):
        clients.append(
            ClientData(
                name=client_names[k] if client_names else f"client-{k}",
                x_train=train.x[tr],
                y_train=train.y[tr],
                x_test=test.x[te],
                y_test=test.y[te],
                record_ids=train.record_ids[tr],
                test_record_ids=test.record_ids[te],
            )
        )
    return Federation(
        name=name,
        clients=clients,
        input_shape=train.input_shape,
        num_classes=train.num_classes,
        class_names=train.class_names,
        metadata={"seed": seed, **(metadata or {})},
    )


def load_cifar10_clients(
    *,
    num_clients: int = 500,
    partition: str = "label-mix",
    partition_params: dict[str, Any] | None = None,
    seed: int = 42,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
) -> Federation:
    """CIFAR-10's 50k training images over ``num_clients`` clients, the 10k test images spread
    over them. ``partition``: ``label-mix`` (flidp's per-client Dirichlet label mixes,
    ``partition_params: {concentration: 1.0}``), ``uniform`` (every image to a uniformly random
    client, flidp's IID) or any :data:`pdpfl.data.partition.PARTITIONS` method. Built on the
    CIFAR-10 loader's :func:`~pdpfl.data.cifar.cifar10_pool`."""
    from pdpfl.data.cifar import cifar10_pool
    from pdpfl.data.partition import PARTITIONS, partition_indices

    params = dict(partition_params or {})
    train = cifar10_pool("train", data_dir=data_dir, download=download)
    test = cifar10_pool("test", data_dir=data_dir, download=download)
    rng = numpy_generator(seed, "partition:cifar10-clients")
    if partition == "label-mix":
        unknown = sorted(set(params) - {"concentration"})
        if unknown:
            raise ValueError(
                f"unknown partition_params {unknown} for partition 'label-mix'; "
                "allowed: ['concentration']"
            )
        parts = label_mix_partition(
            train.y, num_clients, rng, float(params.get("concentration", 1.0))
        )
    elif partition == "uniform":
        if params:
            raise ValueError("partition 'uniform' takes no partition_params")
        parts = uniform_assignment(len(train.y), num_clients, rng)
    elif partition in PARTITIONS:
        parts = partition_indices(train.y, num_clients, partition, params, rng=rng)
    else:
        raise ValueError(
            f"partition must be one of {['label-mix', 'uniform', *PARTITIONS]} "
            f"for cifar10-clients, got {partition!r}"
        )
    return federate_train_test(
        train,
        test,
        parts,
        seed=seed,
        name="cifar10-clients",
        metadata={"partition": partition, "partition_params": params},
    )
