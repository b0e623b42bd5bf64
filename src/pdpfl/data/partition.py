"""Splitting one pool of labelled records across silos.

Every partitioner returns, per client, an array of *positions into the pool*; records are
only ever moved, never relabelled, so each silo's (x, y) pairs are exactly pool pairs (the
reference n-way k-shot builder assigned the wrong labels to records; here that cannot
happen by construction, and the tests check it).

Methods (``partition=`` of :func:`pdpfl.data.load_federation`):

``iid``
    a uniformly random permutation cut into ``num_clients`` near-equal parts.
``n-way-k-shot``
    each client holds exactly ``n_way`` distinct labels (alias ``classes_per_client``) and
    ``k_shot`` records of each (default: as many as the rarest label allows); labels are
    dealt round-robin over a random label order so each label has near-equal holders.
``shards``
    McMahan et al. (2017): sort by label, cut into ``num_clients * shards_per_client``
    equal shards, deal ``shards_per_client`` random shards to each client (default 2).
``label-shards``
    PriFedSync (Zheng et al. 2021, §4.1): like ``shards``, but every shard holds ONE label -- each
    label's records are cut into a number of near-equal shards proportional to its size
    (largest remainder), ``num_clients * shards_per_client`` shards in all (default 4 per
    client) -- so a client holds at most ``shards_per_client`` labels. A label too rare for one
    shard is left out.
``dirichlet``
    label skew: for each label, the share of each client ~ Dirichlet(``beta`` · 1)
    (default ``beta=0.5``); redrawn until every client has ``min_size`` records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

PARTITIONS: dict[str, tuple[str, ...]] = {
    "iid": (),
    "n-way-k-shot": ("n_way", "classes_per_client", "k_shot"),
    "shards": ("shards_per_client",),
    "label-shards": ("shards_per_client",),
    "dirichlet": ("beta", "min_size", "max_tries"),
}


def _int_param(
    params: dict[str, Any], name: str, default: int | None, low: int, high: int | None = None
) -> int | None:
    value = params.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"partition parameter {name!r} must be an integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        rng = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"partition parameter {name!r} must be {rng}, got {value}")
    return value


def _iid(
    y: np.ndarray, m: int, params: dict[str, Any], rng: np.random.Generator
) -> list[np.ndarray]:
    return [np.sort(p) for p in np.array_split(rng.permutation(len(y)), m)]


def _n_way_k_shot(
    y: np.ndarray, m: int, params: dict[str, Any], rng: np.random.Generator
) -> list[np.ndarray]:
    classes = np.unique(y)
    n_classes = len(classes)
    if (
        "n_way" in params
        and "classes_per_client" in params
        and (params["n_way"] != params["classes_per_client"])
    ):
        raise ValueError("give either 'n_way' or its alias 'classes_per_client', not both")
    key = "n_way" if "n_way" in params else "classes_per_client"
    n_way = _int_param(params, key, min(2, n_classes), 1, n_classes)
    assert n_way is not None
    order = classes[rng.permutation(n_classes)]
    held = [order[(i * n_way + np.arange(n_way)) % n_classes] for i in range(m)]
    holders = {int(c): [i for i in range(m) if c in held[i]] for c in classes}
    by_class = {int(c): np.flatnonzero(y == c) for c in classes}
    max_k = min(len(by_class[c]) // len(h) for c, h in holders.items() if h)
    if max_k < 1:
        raise ValueError(
            f"partition parameters 'n_way'={n_way} with {m} clients need more records: some "
            f"label has fewer records than clients holding it; lower n_way or num_clients"
        )
    k_shot = _int_param(params, "k_shot", max_k, 1)
    assert k_shot is not None
    if k_shot > max_k:
        raise ValueError(
            f"partition parameter 'k_shot' must be <= {max_k} for n_way={n_way} and "
            f"{m} clients (the rarest held label has too few records), got {k_shot}"
        )
    parts: list[list[np.ndarray]] = [[] for _ in range(m)]
    for c, h in holders.items():
        idx = by_class[c][rng.permutation(len(by_class[c]))]
        for j, client in enumerate(h):
            parts[client].append(idx[j * k_shot : (j + 1) * k_shot])
    return [np.sort(np.concatenate(p)) for p in parts]


def _shards(
    y: np.ndarray, m: int, params: dict[str, Any], rng: np.random.Generator
) -> list[np.ndarray]:
    most = max(1, len(y) // m)
    s = _int_param(params, "shards_per_client", min(2, most), 1, most)
    assert s is not None
    perm = rng.permutation(len(y))
    by_label = perm[np.argsort(y[perm], kind="stable")]
    shards = np.array_split(by_label, m * s)
    deal = rng.permutation(m * s).reshape(m, s)
    return [np.sort(np.concatenate([shards[k] for k in row])) for row in deal]


def _label_shards(
    y: np.ndarray, m: int, params: dict[str, Any], rng: np.random.Generator
) -> list[np.ndarray]:
    most = max(1, len(y) // m)
    s = _int_param(params, "shards_per_client", min(4, most), 1, most)
    assert s is not None
    total = m * s
    classes, counts = np.unique(y, return_counts=True)
    ideal = counts * (total / len(y))
    per_class = np.floor(ideal).astype(np.int64)
    order = np.lexsort((rng.random(len(classes)), -(ideal - per_class)))
    per_class[order[: total - int(per_class.sum())]] += 1
    per_class = np.minimum(per_class, counts)
    if int(per_class.sum()) < total:
        raise ValueError(
            f"partition parameter 'shards_per_client'={s} with {m} clients needs {total} "
            f"single-label shards but the labels allow only {int(per_class.sum())}; lower it"
        )
    shards: list[np.ndarray] = []
    for c, k in zip(classes, per_class, strict=True):
        if k == 0:  # too rare for one shard: left out
            continue
        idx = np.flatnonzero(y == c)
        shards.extend(np.array_split(idx[rng.permutation(len(idx))], int(k)))
    deal = rng.permutation(total).reshape(m, s)
    return [np.sort(np.concatenate([shards[k] for k in row])) for row in deal]


def _dirichlet(
    y: np.ndarray, m: int, params: dict[str, Any], rng: np.random.Generator
) -> list[np.ndarray]:
    beta = params.get("beta", 0.5)
    if isinstance(beta, bool) or not isinstance(beta, int | float) or not (0 < beta < float("inf")):
        raise ValueError(f"partition parameter 'beta' must be a finite number > 0, got {beta!r}")
    min_size = _int_param(params, "min_size", min(10, len(y) // m), 0, len(y) // m)
    tries = _int_param(params, "max_tries", 1000, 1)
    assert min_size is not None and tries is not None
    classes = np.unique(y)
    for _ in range(tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(m)]
        for c in classes:
            idx = np.flatnonzero(y == c)
            idx = idx[rng.permutation(len(idx))]
            share = rng.dirichlet(np.full(m, float(beta)))
            cuts = (np.cumsum(share)[:-1] * len(idx)).astype(np.int64)
            for client, piece in enumerate(np.split(idx, cuts)):
                parts[client].append(piece)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in out) >= min_size:
            return out
    raise ValueError(
        f"dirichlet partition: no draw in {tries} tries gave every client >= {min_size} "
        f"records; increase 'beta' or lower 'min_size'"
    )


_BUILDERS: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": _iid,
    "n-way-k-shot": _n_way_k_shot,
    "shards": _shards,
    "dirichlet": _dirichlet,
    "label-shards": _label_shards,
}


def partition_indices(
    labels: np.ndarray,
    num_clients: int,
    method: str = "iid",
    params: dict[str, Any] | None = None,
    *,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Positions into ``labels`` held by each of ``num_clients`` clients (disjoint, sorted).

    Raises
    ------
    ValueError
        Unknown ``method`` or parameter names, or out-of-range values (the message names
        the field and the allowed values).
    """
    if method not in _BUILDERS:
        raise ValueError(f"partition must be one of {sorted(_BUILDERS)}, got {method!r}")
    params = dict(params or {})
    unknown = sorted(set(params) - set(PARTITIONS[method]))
    if unknown:
        allowed = list(PARTITIONS[method]) or "none"
        raise ValueError(
            f"unknown partition_params {unknown} for partition {method!r}; allowed: {allowed}"
        )
    y = np.asarray(labels).reshape(-1)
    if (
        isinstance(num_clients, bool)
        or not isinstance(num_clients, int | np.integer)
        or not (1 <= num_clients <= len(y))
    ):
        raise ValueError(f"num_clients must be an integer in [1, {len(y)}], got {num_clients!r}")
    return _BUILDERS[method](y, int(num_clients), params, rng)
