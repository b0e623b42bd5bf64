"""The one federation type every pdpfl dataset loader returns.

A :class:`Federation` is a list of silos (:class:`ClientData`), each with its own train/test
arrays, integer labels, stable record ids (unique across the whole federation) and optional
user ids for user-level DP. Loaders never mix records between the train and test side of a
silo, and never change a record's label.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdpfl.data.validation import DataValidationError, non_finite_records, record_ids_of


def _as_float32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32))


def _as_int64(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, dtype=np.int64))


@dataclass
class ClientData:
    """One silo's private data.

    Attributes
    ----------
    name:
        Human-readable silo name (e.g. ``"cleveland"`` or ``"client-3"``).
    x_train, x_test:
        float32 features; images as ``(n, C, H, W)``, tabular data as ``(n, d)``.
    y_train, y_test:
        int64 class indices in ``[0, num_classes)``.
    record_ids:
        int64 id of each *train* record: stable for a given dataset and seed, unique across
        the whole federation (the privacy ledger is keyed by it).
    user_ids:
        Optional int64 user of each train record (user-level DP); ``None`` when records are
        their own users.
    test_record_ids:
        Optional int64 ids of the test records (same id space as ``record_ids``).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    record_ids: np.ndarray
    user_ids: np.ndarray | None = None
    test_record_ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.x_train = _as_float32(self.x_train)
        self.x_test = _as_float32(self.x_test)
        self.y_train = _as_int64(self.y_train).reshape(-1)
        self.y_test = _as_int64(self.y_test).reshape(-1)
        self.record_ids = _as_int64(self.record_ids).reshape(-1)
        for side, x, ids in (
            ("training", self.x_train, self.record_ids),
            ("test", self.x_test, self.test_record_ids),
        ):
            bad = non_finite_records(x)
            if bad.any():
                raise DataValidationError(
                    f"client {self.name!r}: {int(bad.sum())} {side} record(s) have NaN or "
                    f"infinite features as float32 ({record_ids_of(ids, bad)}); clean the data "
                    "(values beyond ±3.4e38 overflow float32)"
                )
        n, m = len(self.x_train), len(self.x_test)
        if len(self.y_train) != n or len(self.record_ids) != n:
            raise ValueError(
                f"client {self.name!r}: x_train, y_train and record_ids must have the same "
                f"length (got {n}, {len(self.y_train)}, {len(self.record_ids)})"
            )
        if len(self.y_test) != m:
            raise ValueError(
                f"client {self.name!r}: x_test and y_test must have the same length "
                f"(got {m}, {len(self.y_test)})"
            )
        if self.user_ids is not None:
            self.user_ids = _as_int64(self.user_ids).reshape(-1)
            if len(self.user_ids) != n:
                raise ValueError(
                    f"client {self.name!r}: user_ids must have one entry per train record "
                    f"(got {len(self.user_ids)}, expected {n})"
                )
        if self.test_record_ids is not None:
            self.test_record_ids = _as_int64(self.test_record_ids).reshape(-1)
            if len(self.test_record_ids) != m:
                raise ValueError(
                    f"client {self.name!r}: test_record_ids must have one entry per test "
                    f"record (got {len(self.test_record_ids)}, expected {m})"
                )

    @property
    def num_train(self) -> int:
        return int(len(self.y_train))

    @property
    def num_test(self) -> int:
        return int(len(self.y_test))


def _label_counts(y: np.ndarray, num_classes: int) -> dict[str, int]:
    counts = np.bincount(y, minlength=num_classes)
    return {str(c): int(k) for c, k in enumerate(counts)}


@dataclass
class Federation:
    """A named list of silos sharing one input shape and label space."""

    name: str
    clients: list[ClientData]
    input_shape: tuple[int, ...]
    num_classes: int
    feature_names: list[str] | None = None
    class_names: list[str] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.input_shape = tuple(int(s) for s in self.input_shape)
        if not self.clients:
            raise ValueError(f"federation {self.name!r}: at least one client is required")
        seen: set[int] = set()
        for c in self.clients:
            for x in (c.x_train, c.x_test):
                if x.shape[1:] != self.input_shape:
                    raise ValueError(
                        f"client {c.name!r}: feature shape {x.shape[1:]} != federation "
                        f"input_shape {self.input_shape}"
                    )
            for y in (c.y_train, c.y_test):
                if len(y) and (y.min() < 0 or y.max() >= self.num_classes):
                    raise ValueError(
                        f"client {c.name!r}: labels must lie in [0, {self.num_classes})"
                    )
            ids = set(c.record_ids.tolist())
            if len(ids) != c.num_train or ids & seen:
                raise ValueError(
                    f"client {c.name!r}: record_ids must be unique across the federation"
                )
            seen |= ids

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def describe(self) -> dict[str, Any]:
        """A one-screen, JSON-ready summary (no record-level values).

        Returns ``{"name", "clients": [{"name", "train", "test", "label_counts",
        "test_label_counts"[, "users"]}], "features", "classes", "input_shape",
        "feature_names", "class_names", "total_train", "total_test"}`` where
        ``label_counts`` counts train labels keyed by class index.
        """
        clients = []
        for c in self.clients:
            entry: dict[str, Any] = {
                "name": c.name,
                "train": c.num_train,
                "test": c.num_test,
                "label_counts": _label_counts(c.y_train, self.num_classes),
                "test_label_counts": _label_counts(c.y_test, self.num_classes),
            }
            if c.user_ids is not None:
                entry["users"] = int(len(np.unique(c.user_ids)))
            clients.append(entry)
        return {
            "name": self.name,
            "clients": clients,
            "features": int(np.prod(self.input_shape)),
            "classes": int(self.num_classes),
            "input_shape": list(self.input_shape),
            "feature_names": self.feature_names,
            "class_names": self.class_names,
            "total_train": sum(c.num_train for c in self.clients),
            "total_test": sum(c.num_test for c in self.clients),
        }

    def pooled(self) -> ClientData:
        """All silos' train and test records concatenated (for centralized baselines)."""
        cs = self.clients
        users = None
        if all(c.user_ids is not None for c in cs):
            users = np.concatenate([c.user_ids for c in cs if c.user_ids is not None])
        test_ids = None
        if all(c.test_record_ids is not None for c in cs):
            test_ids = np.concatenate(
                [c.test_record_ids for c in cs if c.test_record_ids is not None]
            )
        return ClientData(
            name=f"{self.name}-pooled",
            x_train=np.concatenate([c.x_train for c in cs]),
            y_train=np.concatenate([c.y_train for c in cs]),
            x_test=np.concatenate([c.x_test for c in cs]),
            y_test=np.concatenate([c.y_test for c in cs]),
            record_ids=np.concatenate([c.record_ids for c in cs]),
            user_ids=users,
            test_record_ids=test_ids,
        )
