"""PriFedSync's benchmark federations (Zheng, Chen, Long, Su, AISTATS 2021, §4).

``prifedsync-mnist`` (§4.1)
    Label-sorted shards: each label's training records are cut into single-label shards (the
    ``label-shards`` partition of :mod:`pdpfl.data.partition`), 4 per client, so **a client holds
    at most 4 labels**. Two layouts:

    * ``60k`` -- the paper's: the 60,000 training images in 400 shards of ~150, 100 clients with
      ~600 training images each; every client's test set is ``test_per_client`` (200) of the
      10,000 test images whose label the client holds, drawn **without replacement** (the
      reference draws them with replacement, so a test image can count twice). Different clients
      may share test images (100 × 200 > 10,000);
    * ``10k`` -- offline machines that only have the 10k test images (``mnist-10k``): the same
      shards over those images, 100 clients × ~100 images, each split 66/34 (stratified) into
      train and test, so test labels are train labels.

    ``layout: auto`` (default) picks ``60k`` when the training files are on disk (found in the
    searched folders; never downloaded for this check) and ``10k`` otherwise; the federation's
    metadata records which.
``prifedsync-cifar10`` (§4.2; Hsu et al. 2019)
    Per client a label mix q ~ Dirichlet(β·1) (β = 0.5), ``train_per_client`` (500) training
    images with counts ~ Multinomial(q) drawn **without replacement from a shared pool, so no
    image is on two clients** (the reference draws every client from the full set, so clients
    share images). When a label runs out, the rest of that client's count is redrawn over the
    labels still available (renormalised q). Test sets: ``test_per_client`` (200) images with
    counts ~ Multinomial(realised train mix) from the 10,000 test images, without replacement
    within a client (clients may share test images: 100 × 200 > 10,000).

Everything is seeded from ``seed`` (same seed → same federation); normalisation defaults to the
datasets' published per-channel constants (``standard``), which uses no data.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from pdpfl.data._rng import numpy_generator
from pdpfl.data.federation import ClientData, Federation
from pdpfl.data.partition import partition_indices
from pdpfl.data.pool import Pool, federate

__all__ = [
    "DATASET_NAMES",
    "dirichlet_disjoint",
    "load_prifedsync",
    "prifedsync_cifar10",
    "prifedsync_mnist",
]

DATASET_NAMES = ("prifedsync-mnist", "prifedsync-cifar10")
LAYOUTS = ("auto", "60k", "10k")
_NORMS = ("standard", "none")


def _positive_int(value: object, name: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if int(value) < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _normalise(x: np.ndarray, pool: Pool, normalize: str) -> np.ndarray:
    x = x.astype(np.float32)
    if normalize == "none":
        return x
    assert pool.channel_stats is not None
    shape = (1, -1) + (1,) * (len(pool.input_shape) - 1)
    mean = np.asarray(pool.channel_stats[0], np.float32).reshape(shape)
    std = np.asarray(pool.channel_stats[1], np.float32).reshape(shape)
    return (x - mean) / std


def _check_norm(normalize: object) -> str:
    if normalize not in _NORMS:
        raise ValueError(f"normalize must be one of {list(_NORMS)}, got {normalize!r}")
    return str(normalize)


def _train_files_present(data_dir: str | os.PathLike[str] | None) -> bool:
    from pdpfl.data.mnist import spec
    from pdpfl.data.sources import find_local

    return all(
        find_local(spec(f), data_dir) is not None
        for f in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
    )


def prifedsync_mnist(
    num_clients: int = 100,
    *,
    seed: int = 42,
    data_dir: str | os.PathLike[str] | None = None,
    layout: str = "auto",
    shards_per_client: int = 4,
    test_per_client: int = 200,
    test_fraction: float = 0.34,
    normalize: str = "standard",
    download: bool = True,
) -> Federation:
    """The PriFedSync MNIST federation (module docstring): ≤ ``shards_per_client`` labels each."""
    from pdpfl.data.mnist import mnist_pool

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
    m = _positive_int(num_clients, "num_clients")
    s = _positive_int(shards_per_client, "shards_per_client")
    n_test = _positive_int(test_per_client, "test_per_client")
    normalize = _check_norm(normalize)
    name = "prifedsync-mnist"
    chosen = layout
    if layout == "auto":
        chosen = "60k" if _train_files_present(data_dir) else "10k"
    params = {"shards_per_client": s}
    if chosen == "10k":
        pool = mnist_pool("test", data_dir=data_dir, name=name, download=download)
        fed = federate(
            pool,
            num_clients=m,
            partition="label-shards",
            partition_params=params,
            seed=seed,
            test_fraction=test_fraction,
            normalize=normalize,
            name=name,
        )
        fed.metadata.update({"layout": "10k"})
        return fed
    train = mnist_pool("train", data_dir=data_dir, name=name, download=download)
    test = mnist_pool("test", data_dir=data_dir, name=name, download=download)
    parts = partition_indices(
        train.y, m, "label-shards", params, rng=numpy_generator(seed, f"partition:{name}")
    )
    clients = []
    for k, part in enumerate(parts):
        labels = np.unique(train.y[part])
        candidates = np.flatnonzero(np.isin(test.y, labels))
        rng = numpy_generator(seed, f"test:{name}", k)
        pick = np.sort(rng.choice(candidates, size=min(n_test, len(candidates)), replace=False))
        clients.append(
            ClientData(
                name=f"client-{k}",
                x_train=_normalise(train.x[part], train, normalize),
                y_train=train.y[part],
                x_test=_normalise(test.x[pick], test, normalize),
                y_test=test.y[pick],
                record_ids=train.record_ids[part],
                test_record_ids=test.record_ids[pick],
            )
        )
    return Federation(
        name=name,
        clients=clients,
        input_shape=train.input_shape,
        num_classes=train.num_classes,
        class_names=train.class_names,
        metadata={
            "layout": "60k",
            "partition": "label-shards",
            "partition_params": params,
            "test_per_client": n_test,
            "seed": seed,
            "normalize": normalize,
        },
    )


def dirichlet_disjoint(
    labels: np.ndarray, num_clients: int, per_client: int, beta: float, rng: np.random.Generator
) -> tuple[list[np.ndarray], np.ndarray]:
    """Disjoint per-client draws with Dirichlet(β) label mixes (Hsu et al. 2019, fixed).

    Client by client: q ~ Dir(β·1); counts ~ Multinomial(per_client, q) capped by what is left
    of each label; the shortfall is redrawn over the labels still available (q renormalised;
    uniform over them if q puts no mass there). Returns each client's positions into ``labels``
    (sorted, pairwise disjoint) and the drawn mixes ``q`` (``num_clients × n_labels``).
    """
    y = np.asarray(labels).reshape(-1)
    classes = np.unique(y)
    if num_clients * per_client > len(y):
        raise ValueError(
            f"train_per_client: {num_clients} clients × {per_client} images exceed the "
            f"{len(y)} available; lower num_clients or train_per_client"
        )
    pools = [np.flatnonzero(y == c) for c in classes]
    pools = [p[rng.permutation(len(p))] for p in pools]
    used = np.zeros(len(classes), dtype=np.int64)
    sizes = np.array([len(p) for p in pools], dtype=np.int64)
    mixes = np.zeros((num_clients, len(classes)))
    out = []
    for i in range(num_clients):
        q = rng.dirichlet(np.full(len(classes), float(beta)))
        mixes[i] = q
        counts = np.zeros(len(classes), dtype=np.int64)
        need = per_client
        while need > 0:
            left = sizes - used - counts
            w = np.where(left > 0, q, 0.0)
            w = w / w.sum() if w.sum() > 0 else (left > 0) / max(int((left > 0).sum()), 1)
            take = np.minimum(rng.multinomial(need, w), left)
            counts += take
            need -= int(take.sum())
        picks = [pools[c][used[c] : used[c] + counts[c]] for c in range(len(classes))]
        used += counts
        out.append(np.sort(np.concatenate(picks)))
    return out, mixes


def prifedsync_cifar10(
    num_clients: int = 100,
    *,
    seed: int = 42,
    data_dir: str | os.PathLike[str] | None = None,
    beta: float = 0.5,
    train_per_client: int = 500,
    test_per_client: int = 200,
    normalize: str = "standard",
    download: bool = True,
) -> Federation:
    """The PriFedSync CIFAR-10 federation (module docstring): disjoint Dirichlet(β) silos."""
    from pdpfl.data.cifar import cifar10_pool

    if isinstance(beta, bool) or not isinstance(beta, int | float) or not beta > 0:
        raise ValueError(f"beta must be a number > 0, got {beta!r}")
    m = _positive_int(num_clients, "num_clients")
    n_train = _positive_int(train_per_client, "train_per_client")
    n_test = _positive_int(test_per_client, "test_per_client")
    normalize = _check_norm(normalize)
    name = "prifedsync-cifar10"
    train = cifar10_pool("train", data_dir=data_dir, download=download)
    test = cifar10_pool("test", data_dir=data_dir, download=download)
    parts, _ = dirichlet_disjoint(
        train.y, m, n_train, float(beta), numpy_generator(seed, f"partition:{name}")
    )
    by_label = {int(c): np.flatnonzero(test.y == c) for c in np.unique(test.y)}
    clients = []
    for k, part in enumerate(parts):
        rng = numpy_generator(seed, f"test:{name}", k)
        labels, counts = np.unique(train.y[part], return_counts=True)
        draw = rng.multinomial(n_test, counts / counts.sum())
        pick = []
        for c, t in zip(labels, draw, strict=True):
            avail = by_label.get(int(c), np.zeros(0, np.int64))
            pick.append(rng.choice(avail, size=min(int(t), len(avail)), replace=False))
        sel = np.sort(np.concatenate(pick)).astype(np.int64)
        clients.append(
            ClientData(
                name=f"client-{k}",
                x_train=_normalise(train.x[part], train, normalize),
                y_train=train.y[part],
                x_test=_normalise(test.x[sel], test, normalize),
                y_test=test.y[sel],
                record_ids=train.record_ids[part],
                test_record_ids=test.record_ids[sel],
            )
        )
    return Federation(
        name=name,
        clients=clients,
        input_shape=train.input_shape,
        num_classes=train.num_classes,
        class_names=train.class_names,
        metadata={
            "partition": "dirichlet-disjoint",
            "beta": float(beta),
            "train_per_client": n_train,
            "test_per_client": n_test,
            "seed": seed,
            "normalize": normalize,
        },
    )


def load_prifedsync(
    name: str,
    num_clients: int | None,
    partition: str,
    partition_params: dict[str, Any] | None,
    seed: int,
    data_dir: str | os.PathLike[str] | None,
    options: dict[str, Any],
) -> Federation:
    """Dispatch from :func:`pdpfl.data.load_federation` (fixed layouts: no partition choice)."""
    if partition != "iid" or partition_params:
        raise ValueError(
            f"partition/partition_params cannot be set for {name}: its layout is the paper's "
            "(use the dataset's options, e.g. shards_per_client, beta)"
        )
    opts = dict(options)
    if "num_users" in opts:
        raise ValueError(f"num_users is not supported for {name} (records are their own users)")
    m = 100 if num_clients is None else num_clients
    if name == "prifedsync-mnist":
        return prifedsync_mnist(m, seed=seed, data_dir=data_dir, **opts)
    return prifedsync_cifar10(m, seed=seed, data_dir=data_dir, **opts)
