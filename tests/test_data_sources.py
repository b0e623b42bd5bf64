"""File resolution: local copies, cache, download with SHA-256 check, clear errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pdpfl.data import ChecksumError, DataFileNotFoundError, FileSpec, resolve_file, sources


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PDPFL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PDPFL_DATA_DIR", raising=False)
    monkeypatch.delenv("PDPFL_NO_DOWNLOAD", raising=False)


def _spec(tmp_path: Path, content: bytes, sha: str | None = None) -> FileSpec:
    origin = tmp_path / "origin" / "file.bin"
    origin.parent.mkdir(parents=True, exist_ok=True)
    origin.write_bytes(content)
    digest = sha or hashlib.sha256(content).hexdigest()
    return FileSpec("file.bin", origin.as_uri(), digest, "thing")


def test_download_verifies_and_caches(tmp_path) -> None:
    spec = _spec(tmp_path, b"hello")
    path = resolve_file(spec)
    assert path == tmp_path / "cache" / "thing" / "file.bin"
    assert path.read_bytes() == b"hello"
    (tmp_path / "origin" / "file.bin").unlink()  # second call: served from the cache
    assert resolve_file(spec) == path


def test_checksum_mismatch_on_download_is_clear_and_leaves_nothing(tmp_path) -> None:
    spec = _spec(tmp_path, b"tampered", sha="0" * 64)
    with pytest.raises(ChecksumError, match="file.bin") as info:
        resolve_file(spec)
    assert "0" * 64 in str(info.value)
    cache = tmp_path / "cache" / "thing"
    assert not cache.exists() or not any(cache.iterdir())


def test_checksum_mismatch_on_local_copy(tmp_path) -> None:
    spec = _spec(tmp_path, b"good")
    local = tmp_path / "mine"
    local.mkdir()
    (local / "file.bin").write_bytes(b"bad!")
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        resolve_file(spec, local)


def test_missing_file_names_file_url_and_remedy(tmp_path) -> None:
    spec = FileSpec(
        "absent.data", (tmp_path / "nowhere" / "absent.data").as_uri(), "0" * 64, "thing"
    )
    with pytest.raises(DataFileNotFoundError) as info:
        resolve_file(spec, tmp_path / "empty")
    msg = str(info.value)
    assert "absent.data" in msg and spec.url in msg
    assert "PDPFL_DATA_DIR" in msg and "data_dir" in msg


def test_downloads_can_be_disabled(tmp_path, monkeypatch) -> None:
    spec = _spec(tmp_path, b"hello")
    monkeypatch.setenv("PDPFL_NO_DOWNLOAD", "1")
    with pytest.raises(DataFileNotFoundError, match="disabled"):
        resolve_file(spec)
    monkeypatch.delenv("PDPFL_NO_DOWNLOAD")
    with pytest.raises(DataFileNotFoundError, match="disabled"):
        resolve_file(spec, download_missing=False)


def test_lookup_order_data_dir_then_env_then_cache(tmp_path, monkeypatch) -> None:
    spec = FileSpec("f.txt", "file:///nonexistent/f.txt", None, "thing")
    explicit, env, cache = tmp_path / "explicit", tmp_path / "env", tmp_path / "cache"
    for d in (explicit / "thing", env, cache / "thing"):
        d.mkdir(parents=True)
        (d / "f.txt").write_text(str(d))
    monkeypatch.setenv("PDPFL_DATA_DIR", str(env))
    assert resolve_file(spec, explicit).parent == explicit / "thing"
    assert resolve_file(spec).parent == env
    monkeypatch.delenv("PDPFL_DATA_DIR")
    assert resolve_file(spec).parent == cache / "thing"
    assert sources.search_dirs(explicit)[0] == explicit


def test_missing_dataset_file_from_loader(tmp_path, monkeypatch) -> None:
    from pdpfl.data import load_federation

    monkeypatch.setenv("PDPFL_NO_DOWNLOAD", "1")
    with pytest.raises(DataFileNotFoundError, match=r"processed\.cleveland\.data"):
        load_federation("heart-disease", data_dir=tmp_path)
    with pytest.raises(DataFileNotFoundError, match="t10k-images-idx3-ubyte.gz"):
        load_federation("mnist-10k", data_dir=tmp_path)


def test_shared_files_match_the_canonical_checksums(shared_data_dir) -> None:
    from pdpfl.data.registry import file_specs

    for spec in file_specs("heart-disease") + file_specs("mnist-10k"):
        resolve_file(spec, shared_data_dir, download_missing=False)
