"""Parser for the IDX format of the MNIST files (gzip-compressed or raw)."""

from __future__ import annotations

import gzip
import os

import numpy as np

_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def parse_idx(data: bytes) -> np.ndarray:
    """Decode IDX bytes: magic ``00 00 <dtype> <ndim>``, big-endian uint32 dims, payload."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError("not an IDX file: bad magic number")
    code, ndim = data[2], data[3]
    if code not in _DTYPES:
        raise ValueError(f"IDX: unknown element type 0x{code:02x}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError("IDX: truncated header")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_DTYPES[code])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise ValueError(
            f"IDX: payload has {len(data) - header} bytes, dims {dims} need {expected}"
        )
    return (
        np.frombuffer(data, dtype=dtype, offset=header)
        .reshape(dims)
        .astype(dtype.newbyteorder("="))
    )


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file, transparently gunzipping ``*.gz``."""
    with open(path, "rb") as fh:
        raw = fh.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return parse_idx(raw)
