"""File utilities shared by the trainer and the data builders: atomic writes and digests.

Atomic writes go to a temporary file in the target's folder, are fsynced and renamed over the target
(then the folder is fsynced): a crash at any point leaves either the previous file or the new one,
never a partial file under the final name. The data caches, checkpoints and metrics use them.
The standard library has the pieces (``tempfile``, ``os.replace``) but no atomic-replace helper.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np


@contextlib.contextmanager
def atomic_path(final: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``final``; on success fsync it and rename it over ``final``."""
    final = Path(final)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual mode
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
        dir_fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_text_atomic(text: str, path: str | Path) -> None:
    """Replace ``path`` by ``text`` atomically (see the module docstring)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def file_digest(path: str | Path, algorithm: str = "md5") -> str:
    """Hex digest of a file, read in 4 MiB chunks (``hashlib.file_digest`` needs Python 3.11)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def write_npz(path: str | Path, arrays: dict[str, np.ndarray]) -> None:
    """An uncompressed ``.npz`` (``np.load`` reads it) with fixed zip timestamps: same arrays, same bytes.

    ``np.savez`` stamps each member with the current time, which breaks byte-identical re-runs.
    """
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(arrays[name]), allow_pickle=False)
