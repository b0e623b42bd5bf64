"""Benchmark federations and partitions (numpy only; no torch, no :mod:`pdpfl.fl`).

Quick start::

    from pdpfl.data import load_federation
    fed = load_federation("heart-disease", data_dir="../shared/data")
    fed.describe()        # one-screen JSON-ready summary
    fed.clients[0].x_train, fed.clients[0].y_train, fed.clients[0].record_ids
"""

from pdpfl.data.federation import ClientData, Federation
from pdpfl.data.partition import PARTITIONS, partition_indices
from pdpfl.data.registry import DATASETS, DatasetInfo, load_federation
from pdpfl.data.sources import ChecksumError, DataFileNotFoundError, FileSpec, resolve_file
from pdpfl.data.splits import stratified_split
from pdpfl.data.users import USER_DISTRIBUTIONS, UserAllocation, assign_users

__all__ = [
    "DATASETS",
    "PARTITIONS",
    "USER_DISTRIBUTIONS",
    "ChecksumError",
    "ClientData",
    "DataFileNotFoundError",
    "DatasetInfo",
    "Federation",
    "FileSpec",
    "UserAllocation",
    "assign_users",
    "load_federation",
    "partition_indices",
    "resolve_file",
    "stratified_split",
]
