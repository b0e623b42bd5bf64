"""Federated EMNIST digits (TFF ``emnist.load_data(only_digits=True)``; IDP-FedAvg's "FMNIST").

3,383 writers are the clients; each writer's examples are split into train (341,873 in all)
and test (40,832) by TFF, so every client has its own test records and the pooled test set is
TFF's. The canonical file is TFF's ``emnist_all.sqlite.lzma`` (170,507,172 bytes): an
LZMA-compressed SQLite database whose ``examples`` table holds one serialized
``tf.train.Example`` per row (``split_name``, ``client_id``, ``serialized_example_proto``;
splits ``digits_only_train`` / ``digits_only_test``). It is decompressed once into the cache
(4.7 GB) and read with :mod:`sqlite3`; the protocol buffers are decoded by a small, strict
parser (:func:`parse_example`) -- no TensorFlow, no pickle.

Pixels: float32 in [0, 1], **1 = background, 0 = ink** as in TFF (``invert=True`` gives the
MNIST convention). Images are ``(n, 1, 28, 28)``. Record ids: train examples numbered in
(writer, row) order, test examples after all train examples.
"""

from __future__ import annotations

import lzma
import os
import shutil
import sqlite3
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl.data._rng import numpy_generator
from pdpfl.data.federation import ClientData, Federation
from pdpfl.data.many_clients import uniform_assignment
from pdpfl.data.sources import FileSpec, cache_dir, find_local, resolve_file, verify
from pdpfl.io import atomic_path

URL = "https://storage.googleapis.com/tff-datasets-public/emnist_all.sqlite.lzma"
#: SHA-256 of the compressed archive and of the decompressed database (TFF's public files).
SHA256 = "c3aaf91b4cf4e69d53d81627ad119eccdc878ff906f68e66063ff10f67faad48"
SQLITE_SHA256 = "239b48fb3b3d69e70406d18a0605c821d4db3c803443c64788736bcb9f79ac56"
SPEC = FileSpec("emnist_all.sqlite.lzma", URL, SHA256, "femnist")
DATABASE = FileSpec("emnist_all.sqlite", URL, SQLITE_SHA256, "femnist")
SPLITS = {"train": "digits_only_train", "test": "digits_only_test"}
NUM_WRITERS = 3383
PARTITIONS = ("natural", "iid")


# ------------------------------------------------------------------ tf.train.Example parsing


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a protobuf message; value is bytes or int."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > end:
                raise ValueError("truncated length-delimited field")
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > end:
            raise ValueError("truncated field")
        yield number, wire, value


def _feature(buf: bytes) -> np.ndarray | list[bytes]:
    for number, wire, value in _fields(buf):
        if wire != 2:
            continue
        if number == 2:  # FloatList: repeated float value = 1 (packed or not)
            out: list[float] = []
            for n2, w2, v2 in _fields(value):
                if n2 != 1:
                    continue
                if w2 == 2:
                    return np.frombuffer(v2, dtype="<f4").astype(np.float32)
                out.append(struct.unpack("<f", v2)[0])
            return np.asarray(out, dtype=np.float32)
        if number == 3:  # Int64List: repeated int64 value = 1 (packed or not)
            ints: list[int] = []
            for n2, w2, v2 in _fields(value):
                if n2 != 1:
                    continue
                if w2 == 2:
                    p = 0
                    while p < len(v2):
                        x, p = _varint(v2, p)
                        ints.append(x - (1 << 64) if x >= 1 << 63 else x)
                else:
                    ints.append(v2 - (1 << 64) if v2 >= 1 << 63 else v2)
            return np.asarray(ints, dtype=np.int64)
        if number == 1:  # BytesList
            return [v2 for n2, _, v2 in _fields(value) if n2 == 1]
    return np.zeros(0, dtype=np.float32)


def parse_example(serialized: bytes) -> dict[str, Any]:
    """Decode one serialized ``tf.train.Example`` into ``{feature name: values}``."""
    out: dict[str, Any] = {}
    for number, wire, features in _fields(bytes(serialized)):
        if number != 1 or wire != 2:
            continue
        for n2, w2, entry in _fields(features):  # map<string, Feature> entries
            if n2 != 1 or w2 != 2:
                continue
            key, value = None, b""
            for n3, _, v3 in _fields(entry):
                if n3 == 1:
                    key = bytes(v3).decode("utf-8")
                elif n3 == 2:
                    value = v3
            if key is not None:
                out[key] = _feature(value)
    return out


# ------------------------------------------------------------------------------ files


def database_path(data_dir: str | os.PathLike[str] | None = None, *, download: bool = True) -> Path:
    """The verified ``emnist_all.sqlite``: found in a searched folder, or decompressed (once,
    atomically, into the cache) from the verified ``emnist_all.sqlite.lzma``."""
    found = find_local(DATABASE, data_dir)
    if found is not None:
        return verify(found, DATABASE)
    archive = resolve_file(SPEC, data_dir, download_missing=download)
    target = cache_dir() / DATABASE.subdir / DATABASE.filename
    with atomic_path(target) as tmp:
        with lzma.open(archive, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 22)
        verify(tmp, DATABASE)
    return target


def read_split(
    database: str | os.PathLike[str], split: str
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{writer id: (pixels float32 (n, 28, 28), labels int64)}`` of ``train`` or ``test``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    con = sqlite3.connect(f"file:{Path(database)}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"examples", "client_metadata"} <= tables:
            raise ValueError(f"{database}: not a TFF client-data database (tables {tables})")
        columns = {r[1] for r in con.execute("PRAGMA table_info(examples)")}
        if not {"split_name", "client_id", "serialized_example_proto"} <= columns:
            raise ValueError(f"{database}: examples table lacks the TFF columns")
        rows = con.execute(
            "SELECT client_id, serialized_example_proto FROM examples WHERE split_name = ? "
            "ORDER BY client_id, rowid",
            (SPLITS[split],),
        )
        pixels: dict[str, list[np.ndarray]] = {}
        labels: dict[str, list[int]] = {}
        for client, proto in rows:
            ex = parse_example(proto)
            px, lab = ex.get("pixels"), ex.get("label")
            if (
                not isinstance(px, np.ndarray)
                or px.size != 784
                or not isinstance(lab, np.ndarray)
                or lab.size != 1
            ):
                raise ValueError(f"{database}: malformed example of client {client!r}")
            pixels.setdefault(client, []).append(px.reshape(28, 28))
            labels.setdefault(client, []).append(int(lab[0]))
    finally:
        con.close()
    return {
        c: (np.stack(pixels[c]).astype(np.float32), np.asarray(labels[c], dtype=np.int64))
        for c in sorted(pixels)
    }


def load_femnist_digits(
    *,
    num_clients: int | None = None,
    partition: str = "natural",
    seed: int = 42,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
    invert: bool = False,
) -> Federation:
    """Federated EMNIST digits as a :class:`Federation` (one client per writer).

    ``partition``: ``natural`` (writers as in TFF) or ``iid`` (every example reassigned to a
    uniformly random client, flidp's ``make_clientdata_iid``, seeded). ``num_clients`` below
    3,383 keeps a seeded random subset of the writers.
    """
    if partition not in PARTITIONS:
        raise ValueError(
            f"partition must be one of {list(PARTITIONS)} for femnist-digits, got {partition!r}"
        )
    db = database_path(data_dir, download=download)
    train, test = read_split(db, "train"), read_split(db, "test")
    writers = sorted(set(train) | set(test))
    if num_clients is not None:
        if not 1 <= int(num_clients) <= len(writers):
            raise ValueError(f"num_clients must be in [1, {len(writers)}], got {num_clients!r}")
        keep = numpy_generator(seed, "femnist-writers").permutation(len(writers))[:num_clients]
        writers = [writers[i] for i in sorted(keep)]
    empty = (np.zeros((0, 28, 28), np.float32), np.zeros(0, np.int64))
    xs_tr = [train.get(w, empty)[0] for w in writers]
    ys_tr = [train.get(w, empty)[1] for w in writers]
    xs_te = [test.get(w, empty)[0] for w in writers]
    ys_te = [test.get(w, empty)[1] for w in writers]
    n_tr = sum(len(y) for y in ys_tr)
    if partition == "iid":
        rng = numpy_generator(seed, "femnist-iid")
        for xs, ys in ((xs_tr, ys_tr), (xs_te, ys_te)):
            x_all, y_all = np.concatenate(xs), np.concatenate(ys)
            parts = uniform_assignment(len(y_all), len(writers), rng)
            xs[:] = [x_all[p] for p in parts]
            ys[:] = [y_all[p] for p in parts]
    clients, offset_tr, offset_te = [], 0, n_tr
    for k, w in enumerate(writers):
        x_tr, x_te = xs_tr[k], xs_te[k]
        if invert:
            x_tr, x_te = 1.0 - x_tr, 1.0 - x_te
        clients.append(
            ClientData(
                name=str(w),
                x_train=x_tr[:, None],
                y_train=ys_tr[k],
                x_test=x_te[:, None],
                y_test=ys_te[k],
                record_ids=np.arange(offset_tr, offset_tr + len(ys_tr[k])),
                test_record_ids=np.arange(offset_te, offset_te + len(ys_te[k])),
            )
        )
        offset_tr += len(ys_tr[k])
        offset_te += len(ys_te[k])
    return Federation(
        name="femnist-digits",
        clients=clients,
        input_shape=(1, 28, 28),
        num_classes=10,
        class_names=[str(k) for k in range(10)],
        metadata={
            "partition": partition,
            "seed": seed,
            "writers": len(writers),
            "invert": bool(invert),
        },
    )
