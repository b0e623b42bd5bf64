"""``load_federation(name, ...)``: every benchmark federation by name.

>>> from pdpfl.data import load_federation
>>> fed = load_federation("digits", num_clients=5, partition="n-way-k-shot",
...                       partition_params={"n_way": 2, "k_shot": 40}, seed=1)
>>> fed.num_clients, fed.input_shape, fed.num_classes
(5, (64,), 10)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.data._rng import numpy_generator
from pdpfl.data.federation import Federation
from pdpfl.data.pool import Pool, federate
from pdpfl.data.splits import DEFAULT_TEST_FRACTION
from pdpfl.data.users import USER_DISTRIBUTIONS, assign_users

if TYPE_CHECKING:
    from pdpfl.data.sources import FileSpec

#: Options accepted by every dataset (besides the keyword arguments of load_federation).
COMMON_OPTIONS = (
    "test_fraction",
    "num_users",
    "user_distribution",
    "alpha_user",
    "alpha_silo",
    "home_fraction",
    "labels_per_user",
)


@dataclass(frozen=True)
class DatasetInfo:
    """A registered dataset: description, defaults and the options it accepts."""

    name: str
    description: str
    default_clients: int | None
    fixed_silos: bool
    options: tuple[str, ...]
    needs_files: bool


DATASETS: dict[str, DatasetInfo] = {
    d.name: d
    for d in (
        DatasetInfo(
            "heart-disease",
            "Fed-Heart-Disease: 4 fixed hospitals, 13 features, binary (UCI processed.*.data)",
            4,
            True,
            ("normalize", "download", "split"),
            True,
        ),
        DatasetInfo(
            "mnist",
            "MNIST 60k training images (IDX) partitioned over clients, 66/34 per client",
            10,
            False,
            ("pool", "normalize", "download"),
            True,
        ),
        DatasetInfo(
            "mnist-10k",
            "the 10k MNIST test images partitioned over clients, 66/34 per client",
            10,
            False,
            ("normalize", "download"),
            True,
        ),
        DatasetInfo(
            "cifar10",
            "CIFAR-10 50k training images (official binary archive) "
            "partitioned over clients, 66/34 per client",
            10,
            False,
            ("pool", "normalize", "download"),
            True,
        ),
        DatasetInfo(
            "femnist-digits",
            "TFF Federated EMNIST digits: 3,383 writers as clients "
            "with their own train/test examples (emnist_all.sqlite.lzma)",
            None,
            False,
            ("download", "invert"),
            True,
        ),
        DatasetInfo(
            "svhn",
            "SVHN cropped digits (.mat): 73,257 training images over 725 "
            "clients uniformly at random, test images spread over them",
            725,
            False,
            ("download",),
            True,
        ),
        DatasetInfo(
            "cifar10-clients",
            "CIFAR-10 50k training images over 500 clients with "
            "per-client Dirichlet label mixes (disjoint), test images spread over them",
            500,
            False,
            ("download",),
            True,
        ),
        DatasetInfo(
            "prifedsync-mnist",
            "PriFedSync MNIST: single-label shards, at most 4 "
            "labels per client; 600 train + 200 test images each (60k files) or ~100 "
            "images each split 66/34 (10k test images only)",
            100,
            False,
            ("layout", "shards_per_client", "test_per_client", "normalize", "download"),
            True,
        ),
        DatasetInfo(
            "prifedsync-cifar10",
            "PriFedSync CIFAR-10: per-client Dirichlet(0.5) "
            "label mixes, 500 disjoint train + 200 test images each",
            100,
            False,
            ("beta", "train_per_client", "test_per_client", "normalize", "download"),
            True,
        ),
        DatasetInfo(
            "digits",
            "scikit-learn 8x8 digits (offline): 1,797 records, 64 features in [0, 1], 10 classes",
            10,
            False,
            ("normalize", "flat"),
            False,
        ),
        DatasetInfo(
            "breast-cancer",
            "scikit-learn Wisconsin breast cancer (offline): 569 "
            "records, 30 z-scored features, 2 classes",
            4,
            False,
            ("normalize",),
            False,
        ),
        DatasetInfo(
            "creditcard",
            "ULB/Kaggle credit-card fraud: 284,807 x 30, 15 % stratified "
            "test, scaler fit on train, train majority undersampled to 10 % (ULDP-FL)",
            5,
            False,
            ("download", "majority_fraction"),
            True,
        ),
        DatasetInfo(
            "csv",
            "a user-supplied CSV file: label column, optional silo column "
            "(else partitioned over clients), record ids and dropped columns, "
            "per-client z-scoring fitted on train, optional undersampling",
            5,
            False,
            (
                "path",
                "label_column",
                "undersample",
                "delimiter",
                "normalize",
                "silo_column",
                "record_id_column",
                "drop_columns",
            ),
            False,
        ),
    )
}


def _users_option(options: dict[str, Any]) -> dict[str, Any] | None:
    num_users = options.pop("num_users", None)
    keys = ("user_distribution", "alpha_user", "alpha_silo", "home_fraction", "labels_per_user")
    extra = {k: options.pop(k) for k in keys if k in options}
    if num_users is None:
        if extra:
            raise ValueError(f"options {sorted(extra)} need num_users")
        return None
    dist = extra.pop("user_distribution", "uniform")
    if dist not in USER_DISTRIBUTIONS:
        raise ValueError(
            f"user_distribution must be one of {list(USER_DISTRIBUTIONS)}, got {dist!r}"
        )
    return {"num_users": num_users, "distribution": dist, **extra}


def _heart(
    num_clients: int | None,
    partition: str,
    partition_params: dict[str, Any] | None,
    seed: int,
    data_dir: str | os.PathLike[str] | None,
    options: dict[str, Any],
) -> Federation:
    from pdpfl.data.heart import load_heart_disease

    if num_clients not in (None, 4):
        raise ValueError(
            f"num_clients must be 4 (or None) for heart-disease: its 4 silos are "
            f"fixed hospitals, got {num_clients!r}"
        )
    if partition != "iid" or partition_params:
        raise ValueError(
            "partition/partition_params cannot be set for heart-disease: its "
            "silos are fixed hospitals"
        )
    users = _users_option(options)
    normalize = options.pop("normalize", "zscore")
    if normalize not in (True, False, "zscore", "none"):
        raise ValueError(
            f"normalize must be one of ['zscore', 'none'] for heart-disease, got {normalize!r}"
        )
    split = options.pop("split", "seeded")
    if split not in ("seeded", "flamby"):
        raise ValueError(
            f"split must be one of ['seeded', 'flamby'] for heart-disease, got {split!r}"
        )
    if split == "flamby" and "test_fraction" in options:
        raise ValueError("test_fraction cannot be set with split: flamby (FLamby's split is 66/34)")
    test_fraction = options.pop("test_fraction", DEFAULT_TEST_FRACTION)
    if (
        isinstance(test_fraction, bool)
        or not isinstance(test_fraction, int | float)
        or not (0 < test_fraction < 1)
    ):
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    fed = load_heart_disease(
        seed=seed,
        data_dir=data_dir,
        test_fraction=float(test_fraction),
        normalize=normalize in (True, "zscore"),
        download=bool(options.pop("download", True)),
        split=str(split),
    )
    if users is not None:
        silos = np.concatenate([np.full(c.num_train, k) for k, c in enumerate(fed.clients)])
        alloc = assign_users(
            len(silos), silo_ids=silos, rng=numpy_generator(seed, "users:heart-disease"), **users
        )
        for k, c in enumerate(fed.clients):
            c.user_ids = alloc.user_ids[silos == k]
        fed.metadata["users"] = dict(users)
    return fed


#: Federations with their own client structure (IDP-FedAvg's datasets, spec B.5).
_MANY_CLIENTS = ("femnist-digits", "svhn", "cifar10-clients")


def _many_clients(
    name: str,
    num_clients: int | None,
    partition: str,
    partition_params: dict[str, Any] | None,
    seed: int,
    data_dir: str | os.PathLike[str] | None,
    options: dict[str, Any],
) -> Federation:
    for key in ("test_fraction", *COMMON_OPTIONS[1:]):
        if key in options:
            raise ValueError(
                f"option {key!r} does not apply to {name!r} (its clients and "
                "train/test splits are fixed by the dataset's construction)"
            )
    download = bool(options.pop("download", True))
    if name == "femnist-digits":
        from pdpfl.data.femnist import load_femnist_digits

        if partition_params:
            raise ValueError("partition_params do not apply to femnist-digits")
        return load_femnist_digits(
            num_clients=num_clients,
            partition=partition,
            seed=seed,
            data_dir=data_dir,
            download=download,
            invert=bool(options.pop("invert", False)),
        )
    if name == "svhn":
        from pdpfl.data.svhn import load_svhn

        if partition_params:
            raise ValueError("partition_params do not apply to svhn")
        return load_svhn(
            num_clients=725 if num_clients is None else num_clients,
            partition=partition,
            seed=seed,
            data_dir=data_dir,
            download=download,
        )
    from pdpfl.data.many_clients import load_cifar10_clients

    return load_cifar10_clients(
        num_clients=500 if num_clients is None else num_clients,
        partition=partition,
        partition_params=partition_params,
        seed=seed,
        data_dir=data_dir,
        download=download,
    )


def _creditcard(
    num_clients: int | None,
    partition: str,
    partition_params: dict[str, Any] | None,
    seed: int,
    data_dir: str | os.PathLike[str] | None,
    options: dict[str, Any],
) -> Federation:
    from pdpfl.data.creditcard import load_creditcard

    if partition != "iid" or partition_params:
        raise ValueError(
            "partition/partition_params cannot be set for creditcard: silos come "
            "from the user allocation (num_users) or a uniform split"
        )
    users = _users_option(options)
    return load_creditcard(
        num_clients=5 if num_clients is None else num_clients,
        seed=seed,
        data_dir=data_dir,
        download=bool(options.pop("download", True)),
        users=users,
        test_fraction=float(options.pop("test_fraction", 0.15)),
        majority_fraction=float(options.pop("majority_fraction", 0.1)),
    )


def _pool_for(
    name: str, data_dir: str | os.PathLike[str] | None, options: dict[str, Any]
) -> tuple[Pool, str]:
    """The pool of ``name`` and its default normalization (pops the options it uses)."""
    if name == "digits":
        from pdpfl.data.embedded import digits_pool

        return digits_pool(flat=bool(options.pop("flat", True))), "none"
    if name == "breast-cancer":
        from pdpfl.data.embedded import breast_cancer_pool

        return breast_cancer_pool(), "zscore"
    if name in ("mnist", "mnist-10k"):
        from pdpfl.data.mnist import mnist_pool

        pool = "test" if name == "mnist-10k" else options.pop("pool", "train")
        return mnist_pool(
            pool, data_dir=data_dir, name=name, download=bool(options.pop("download", True))
        ), "none"
    if name == "cifar10":
        from pdpfl.data.cifar import cifar10_pool

        return cifar10_pool(
            options.pop("pool", "train"),
            data_dir=data_dir,
            download=bool(options.pop("download", True)),
        ), "none"
    if name == "csv":
        from pdpfl.data.tabular import csv_pool

        if "path" not in options:
            raise ValueError("option 'path' (the CSV file) is required for dataset 'csv'")
        return csv_pool(
            options.pop("path"),
            label_column=options.pop("label_column", None),
            delimiter=options.pop("delimiter", ","),
            undersample=options.pop("undersample", None),
            rng=numpy_generator(options.pop("_seed"), "csv-undersample"),
            silo_column=options.pop("silo_column", None),
            record_id_column=options.pop("record_id_column", None),
            drop_columns=options.pop("drop_columns", None),
        ), "zscore"
    raise AssertionError(name)  # pragma: no cover


def load_federation(
    name: str,
    *,
    num_clients: int | None = None,
    partition: str = "iid",
    partition_params: dict[str, Any] | None = None,
    seed: int = 42,
    data_dir: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Federation:
    """Build the federation ``name`` (one of :data:`DATASETS`), reproducibly from ``seed``.

    Parameters
    ----------
    name:
        ``heart-disease``, ``mnist``, ``mnist-10k``, ``cifar10``, ``digits``,
        ``breast-cancer`` or ``csv``.
    num_clients:
        number of silos (default: the dataset's, see :data:`DATASETS`); fixed for
        ``heart-disease``.
    partition, partition_params:
        ``iid``, ``n-way-k-shot`` (``n_way``/``classes_per_client``, ``k_shot``),
        ``shards`` (``shards_per_client``), ``dirichlet`` (``beta``, ``min_size``);
        see :mod:`pdpfl.data.partition`.
    seed:
        the same seed gives an identical federation.
    data_dir:
        folder holding the dataset files (see :mod:`pdpfl.data.sources`).
    **options:
        ``test_fraction`` (0.34), ``split`` (heart-disease: ``seeded`` by the seed, or
        ``flamby``: FLamby's fixed split, the same for every seed), ``normalize``
        (``"none"``, ``"zscore"`` with each silo's train statistics, or ``"standard"``: fixed
        published per-channel constants, images only),
        ``num_users`` + ``user_distribution`` (``uniform``/``zipf``), ``alpha_user``,
        ``alpha_silo``, ``home_fraction`` (user ids for user-level DP), and per dataset:
        ``download`` (bool), ``pool`` (``train``/``test``/``all`` for mnist, cifar10),
        ``flat`` (digits), ``path``, ``label_column``, ``undersample``, ``delimiter``,
        ``silo_column`` (the silos come from this column), ``record_id_column`` (integer ids;
        default: the 0-based data row) and ``drop_columns`` (csv).

    Raises
    ------
    ValueError
        unknown dataset, partition, option or out-of-range value (the message names it).
    pdpfl.data.sources.DataFileNotFoundError, pdpfl.data.sources.ChecksumError
        a file is missing and cannot be downloaded, or is not the canonical file.
    """
    if name not in DATASETS:
        raise ValueError(f"dataset must be one of {sorted(DATASETS)}, got {name!r}")
    info = DATASETS[name]
    allowed = set(info.options) | set(COMMON_OPTIONS)
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(
            f"unknown options {unknown} for dataset {name!r}; allowed: {sorted(allowed)}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    opts = dict(options)
    if name == "heart-disease":
        return _heart(num_clients, partition, partition_params, int(seed), data_dir, opts)
    if name in _MANY_CLIENTS:
        return _many_clients(
            name, num_clients, partition, partition_params, int(seed), data_dir, opts
        )
    if name in ("prifedsync-mnist", "prifedsync-cifar10"):
        from pdpfl.data.prifedsync import load_prifedsync

        return load_prifedsync(
            name, num_clients, partition, partition_params, int(seed), data_dir, opts
        )
    if name == "creditcard":
        return _creditcard(num_clients, partition, partition_params, int(seed), data_dir, opts)
    users = _users_option(opts)
    opts["_seed"] = int(seed)
    pool, default_norm = _pool_for(name, data_dir, opts)
    normalize = opts.pop("normalize", default_norm)
    test_fraction = opts.pop("test_fraction", DEFAULT_TEST_FRACTION)
    if (
        isinstance(test_fraction, bool)
        or not isinstance(test_fraction, int | float)
        or not (0 < test_fraction < 1)
    ):
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    if pool.silos is None and num_clients is None:
        num_clients = info.default_clients
    return federate(
        pool,
        num_clients=num_clients,
        partition=partition,
        partition_params=partition_params,
        seed=int(seed),
        test_fraction=float(test_fraction),
        normalize=normalize,
        users=users,
        name=name,
    )


#: Callables building a federation by name (for plug-ins and the CLI).
LOADERS: dict[str, Callable[..., Federation]] = {n: load_federation for n in DATASETS}


def file_specs(name: str) -> list[FileSpec]:
    """The canonical files (:class:`~pdpfl.data.sources.FileSpec`) a dataset needs."""
    if name == "heart-disease":
        from pdpfl.data.heart import file_specs as heart_specs

        return heart_specs()
    if name in ("mnist", "mnist-10k", "prifedsync-mnist"):
        from pdpfl.data.mnist import SHA256, spec

        files = [f for f in SHA256 if name != "mnist-10k" or f.startswith("t10k")]
        return [spec(f) for f in files]
    if name in ("cifar10", "cifar10-clients", "prifedsync-cifar10"):
        from pdpfl.data.cifar import SPEC

        return [SPEC]
    if name == "femnist-digits":
        from pdpfl.data.femnist import SPEC as FEMNIST

        return [FEMNIST]
    if name == "svhn":
        from pdpfl.data.svhn import SHA256 as SVHN
        from pdpfl.data.svhn import spec as svhn_spec

        return [svhn_spec(f) for f in SVHN]
    if name == "creditcard":
        from pdpfl.data.creditcard import file_specs as creditcard_specs

        return creditcard_specs()
    raise ValueError(
        f"dataset must be one of ['cifar10', 'cifar10-clients', 'creditcard', "
        f"'femnist-digits', 'heart-disease', 'mnist', 'mnist-10k', "
        f"'prifedsync-cifar10', 'prifedsync-mnist', 'svhn'] (the others need no "
        f"files), got {name!r}"
    )
