"""Finding, downloading and verifying dataset files.

Resolution order for every file (:func:`resolve_file`):

1. an explicit ``data_dir`` argument,
2. the ``PDPFL_DATA_DIR`` environment variable,
3. the cache directory (``PDPFL_CACHE_DIR``, default ``~/.cache/pdpfl``),
4. a download from the canonical URL (``urllib``; SHA-256 verified before an atomic rename
   into the cache), unless downloads are disabled (``download=False`` or
   ``PDPFL_NO_DOWNLOAD=1``),
5. otherwise :class:`DataFileNotFoundError`, naming the file, the URL and how to provide it.

In each folder a file is looked up both directly and under the dataset's sub-folder
(e.g. ``<dir>/mnist/t10k-images-idx3-ubyte.gz`` or ``<dir>/t10k-images-idx3-ubyte.gz``).
Files with a known checksum are verified wherever they were found.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pdpfl.io import atomic_path

ENV_DATA_DIR = "PDPFL_DATA_DIR"
ENV_CACHE_DIR = "PDPFL_CACHE_DIR"
ENV_NO_DOWNLOAD = "PDPFL_NO_DOWNLOAD"


class DataFileNotFoundError(FileNotFoundError):
    """A dataset file is in none of the searched folders and could not be downloaded."""


class ChecksumError(ValueError):
    """A dataset file's SHA-256 differs from the canonical one."""


@dataclass(frozen=True)
class FileSpec:
    """One canonical dataset file."""

    filename: str
    url: str
    sha256: str | None
    subdir: str


def cache_dir() -> Path:
    """``$PDPFL_CACHE_DIR`` or ``~/.cache/pdpfl``."""
    env = os.environ.get(ENV_CACHE_DIR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pdpfl"


def sha256_of(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(path: Path, spec: FileSpec) -> Path:
    """Raise :class:`ChecksumError` unless ``path`` has ``spec.sha256`` (when known)."""
    if spec.sha256 is None:
        return path
    got = sha256_of(path)
    if got != spec.sha256:
        raise ChecksumError(
            f"checksum mismatch for {spec.filename} at {path}: SHA-256 is {got}, expected "
            f"{spec.sha256} (the canonical file from {spec.url}). The file is corrupt or a "
            f"different version; delete it and provide the canonical file."
        )
    return path


def search_dirs(data_dir: str | os.PathLike[str] | None) -> list[Path]:
    """The folders searched, in order: ``data_dir``, ``$PDPFL_DATA_DIR``, the cache."""
    dirs: list[Path] = []
    if data_dir is not None:
        dirs.append(Path(data_dir).expanduser())
    env = os.environ.get(ENV_DATA_DIR)
    if env:
        dirs.append(Path(env).expanduser())
    dirs.append(cache_dir())
    return dirs


def _candidates(root: Path, spec: FileSpec) -> list[Path]:
    return [root / spec.subdir / spec.filename, root / spec.filename]


def find_local(spec: FileSpec, data_dir: str | os.PathLike[str] | None) -> Path | None:
    for root in search_dirs(data_dir):
        for cand in _candidates(root, spec):
            if cand.is_file():
                return cand
    return None


def download(spec: FileSpec, timeout: float = 60.0) -> Path:
    """Download ``spec.url`` into the cache, verify its SHA-256, then rename it into place."""
    target = cache_dir() / spec.subdir / spec.filename
    with atomic_path(target) as tmp:
        with urllib.request.urlopen(spec.url, timeout=timeout) as resp, open(tmp, "wb") as out:
            shutil.copyfileobj(resp, out, length=1 << 20)
        verify(tmp, spec)
    return target


def resolve_file(
    spec: FileSpec,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    download_missing: bool = True,
) -> Path:
    """Path of a verified local copy of ``spec`` (see the module docstring for the order)."""
    found = find_local(spec, data_dir)
    if found is not None:
        return verify(found, spec)
    allowed = download_missing and os.environ.get(ENV_NO_DOWNLOAD, "") in ("", "0")
    reason = "downloads are disabled (download=False or PDPFL_NO_DOWNLOAD=1)"
    if allowed:
        try:
            return download(spec)
        except ChecksumError:
            raise
        except Exception as exc:  # network errors, HTTP errors, bad URLs, disk errors
            reason = f"download from {spec.url} failed: {type(exc).__name__}: {exc}"
    searched = ", ".join(str(d) for d in search_dirs(data_dir))
    raise DataFileNotFoundError(
        f"dataset file {spec.filename!r} not found (searched {searched}, each directly and "
        f"under {spec.subdir}/); {reason}. To provide it, download {spec.url} and put it in "
        f"a folder passed as data_dir=... (CLI: --data-dir) or named by ${ENV_DATA_DIR}, or "
        f"into the cache folder {cache_dir() / spec.subdir}."
    )
