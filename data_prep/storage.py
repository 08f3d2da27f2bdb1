"""Output storage for shards: a local directory or any fsspec URL (``s3://bucket/prefix``), written atomically.

Local files are written to a temporary name in the target directory, fsynced and renamed. Remote files are
staged in a local temporary file and uploaded under their final name (an object store makes an object
visible only once the upload completes), so in both cases a reader never sees a partial file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import fsspec

TMP_SUFFIX = ".tmp"


def is_remote(url: str) -> bool:
    """True for fsspec URLs other than plain local paths (``file://`` counts as local)."""
    return "://" in url and not url.startswith("file://")


def local_path(url: str) -> str:
    return url[len("file://") :] if url.startswith("file://") else url


def join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path inside it) for a URL or local path."""
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path


def exists(url: str) -> bool:
    if not is_remote(url):
        return os.path.exists(local_path(url))
    fs, path = filesystem(url)
    fs.invalidate_cache(path)  # NOTE: s3fs caches listings; a rerun must see what another process wrote
    return fs.exists(path)


def read_bytes(url: str) -> bytes:
    with fsspec.open(url, "rb") as f:
        return f.read()


def open_input(url: str) -> BinaryIO | str:
    """A path soundfile can open directly, or an open fsspec file for remote audio (caller closes it)."""
    return fsspec.open(url, "rb").open() if is_remote(url) else local_path(url)


def remove(url: str) -> None:
    """Delete a file if it exists."""
    if not is_remote(url):
        Path(local_path(url)).unlink(missing_ok=True)
    elif exists(url):
        fs, path = filesystem(url)
        fs.rm_file(path)


def make_dirs(url: str) -> None:
    if not is_remote(url):
        Path(local_path(url)).mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def atomic_writer(url: str, durable: bool = True) -> Iterator[BinaryIO]:
    """Open a binary file that appears at ``url`` only after the ``with`` block completes without error.

    ``durable`` fsyncs the data before the rename, so not even a power cut can leave a partial file under the
    final name. Files that are cheap to lose (a shard's sidecar: losing it only redoes the shard) skip it.
    NOTE: the directory is not fsynced: a rename lost to a power cut only means the file is written again.
    """
    if is_remote(url):
        fd, tmp = tempfile.mkstemp(suffix=TMP_SUFFIX)
    else:
        final = Path(local_path(url))
        tmp = str(final.with_name(f".{final.name}{TMP_SUFFIX}"))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        _publish(tmp, url)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _publish(tmp: str, url: str) -> None:
    if is_remote(url):
        fs, path = filesystem(url)
        fs.put_file(tmp, path)
        return
    os.replace(tmp, local_path(url))


def write_bytes(url: str, data: bytes, durable: bool = True) -> None:
    """Atomically write a small file (index, stats, sidecars)."""
    with atomic_writer(url, durable) as f:
        f.write(data)


def remove_stale_temps(url: str) -> int:
    """Delete temporary files a killed run left in a local output dir; returns how many."""
    if is_remote(url) or not os.path.isdir(local_path(url)):
        return 0
    stale = list(Path(local_path(url)).glob(f".*{TMP_SUFFIX}"))
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def open_input_stream(url: str) -> BinaryIO:
    """A binary file object for reading a local path or fsspec URL (a context manager)."""
    return fsspec.open(url, "rb").open()
