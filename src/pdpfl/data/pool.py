"""Building a federation from one pool of records: partition, per-silo split, normalize."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pdpfl.data._rng import numpy_generator
from pdpfl.data.federation import ClientData, Federation
from pdpfl.data.partition import partition_indices
from pdpfl.data.splits import stratified_split
from pdpfl.data.users import UserAllocation, assign_users

#: Per-silo feature scaling: ``none`` (as loaded), ``zscore`` (each silo's own train
#: mean/std, test records scaled with the train statistics), ``standard`` (the dataset's
#: published per-channel mean/std constants; images only, uses no data at all).
NORMALIZATIONS = ("none", "zscore", "standard")


@dataclass
class Pool:
    """All records of a dataset before federating (``x`` may be any numeric dtype)."""

    name: str
    x: np.ndarray
    y: np.ndarray
    record_ids: np.ndarray
    input_shape: tuple[int, ...]
    num_classes: int
    feature_names: list[str] | None = None
    class_names: list[str] | None = None
    channel_stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    """Published per-channel (mean, std) of the [0, 1]-scaled images, for ``standard``."""
    silos: np.ndarray | None = None
    """Optional silo label of each record (e.g. a CSV's silo column): the silos come from the
    data instead of a partition."""


def _zscore(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = train.mean(axis=0)
    std = train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return (train - mean) / std, (test - mean) / std


def _every_user_trains(
    splits: list[tuple[np.ndarray, np.ndarray]], user_ids: np.ndarray, num_users: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Move one test record of each user that has no training record into its silo's train
    split (every user of a user-level federation has at least one training record)."""
    trained = np.zeros(num_users, dtype=bool)
    for tr, _ in splits:
        trained[user_ids[tr]] = True
    if trained.all():
        return splits
    out = []
    for tr, te in splits:
        move = []
        for pos, rec in enumerate(te):
            u = user_ids[rec]
            if not trained[u]:
                trained[u] = True
                move.append(pos)
        if move:
            tr = np.sort(np.concatenate([tr, te[move]]))
            te = np.delete(te, move)
        out.append((tr, te))
    return out


def federate(
    pool: Pool,
    *,
    num_clients: int | None,
    partition: str = "iid",
    partition_params: dict[str, Any] | None = None,
    seed: int = 42,
    test_fraction: float = 0.34,
    normalize: str = "none",
    users: dict[str, Any] | None = None,
    name: str | None = None,
) -> Federation:
    """Partition ``pool`` over ``num_clients`` silos, then split each silo 66/34 (stratified).

    With ``users`` (``{"num_users": U, "distribution": "uniform"|"zipf", "alpha_user",
    "alpha_silo"}``) the silo of each record comes from :func:`assign_users` instead of a
    label partition, and each train record carries its user id. A pool with ``silos`` (a
    CSV's silo column) keeps those silos (named by their labels, in sorted order).
    """
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {list(NORMALIZATIONS)}, got {normalize!r}")
    if normalize == "standard" and pool.channel_stats is None:
        raise ValueError(
            f"normalize='standard' needs published channel statistics, which "
            f"{pool.name!r} has not; use 'zscore' or 'none'"
        )
    fed_name = name or pool.name
    alloc: UserAllocation | None = None
    silo_names: list[str] | None = None
    if users is not None and pool.silos is not None:
        raise ValueError(
            "num_users: the silos come from the silo column; user allocation "
            "(num_users) cannot also decide them"
        )
    if users is not None:
        if partition != "iid" or partition_params:
            raise ValueError(
                "partition must be 'iid' (the default) when num_users is given: "
                "the user allocation decides each record's silo"
            )
        if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
            raise ValueError(f"num_clients must be an integer >= 1, got {num_clients!r}")
        extra: dict[str, Any] = {}
        if users.get("labels_per_user") is not None:
            extra["labels"] = pool.y
        alloc = assign_users(
            len(pool.y),
            num_silos=num_clients,
            rng=numpy_generator(seed, f"users:{fed_name}"),
            **users,
            **extra,
        )
        parts = [np.flatnonzero(alloc.silo_ids == k) for k in range(num_clients)]
        empty = [k for k, p in enumerate(parts) if len(p) < 2]
        if empty:
            raise ValueError(
                f"user allocation left silos {empty} with fewer than 2 records; "
                f"use fewer clients, more users or a smaller alpha_silo"
            )
    elif pool.silos is not None:
        if partition != "iid" or partition_params:
            raise ValueError(
                "partition: the silos come from the silo column; leave partition "
                "and partition_params out"
            )
        keys = np.unique(pool.silos)
        if num_clients is not None and num_clients != len(keys):
            raise ValueError(
                f"num_clients: the silo column names {len(keys)} silos, got "
                f"num_clients={num_clients} (leave it out)"
            )
        parts = [np.flatnonzero(pool.silos == key) for key in keys]
        silo_names = [str(key) for key in keys]
    else:
        if num_clients is None:
            raise ValueError("num_clients: required when the data has no silo column")
        parts = partition_indices(
            pool.y,
            num_clients,
            partition,
            partition_params,
            rng=numpy_generator(seed, f"partition:{fed_name}"),
        )
    splits = []
    for k, part in enumerate(parts):
        tr_pos, te_pos = stratified_split(
            pool.y[part], test_fraction, numpy_generator(seed, f"split:{fed_name}", k)
        )
        splits.append((part[tr_pos], part[te_pos]))
    if alloc is not None:
        splits = _every_user_trains(splits, alloc.user_ids, alloc.num_users)
    clients = []
    for k, (tr, te) in enumerate(splits):
        x_tr = pool.x[tr].astype(np.float32)
        x_te = pool.x[te].astype(np.float32)
        if normalize == "zscore":
            x_tr, x_te = _zscore(pool.x[tr].astype(np.float64), pool.x[te].astype(np.float64))
        elif normalize == "standard":
            assert pool.channel_stats is not None
            shape = (1, -1) + (1,) * (len(pool.input_shape) - 1)
            mean = np.asarray(pool.channel_stats[0], np.float32).reshape(shape)
            std = np.asarray(pool.channel_stats[1], np.float32).reshape(shape)
            x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
        clients.append(
            ClientData(
                name=f"client-{k}" if silo_names is None else silo_names[k],
                x_train=x_tr,
                y_train=pool.y[tr],
                x_test=x_te,
                y_test=pool.y[te],
                record_ids=pool.record_ids[tr],
                user_ids=None if alloc is None else alloc.user_ids[tr],
                test_record_ids=pool.record_ids[te],
            )
        )
    return Federation(
        name=fed_name,
        clients=clients,
        input_shape=pool.input_shape,
        num_classes=pool.num_classes,
        feature_names=pool.feature_names,
        class_names=pool.class_names,
        metadata={
            "partition": "users"
            if alloc is not None
            else ("silo-column" if silo_names is not None else partition),
            "partition_params": dict(partition_params or {}),
            "seed": seed,
            "test_fraction": test_fraction,
            "normalize": normalize,
            **({"users": dict(users)} if users else {}),
        },
    )
