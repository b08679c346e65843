"""Files onnxpipe writes and checks: content hashes, and writes a reader never sees half of."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks (a weights file may not fit in memory)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, synced and renamed into place.

    A reader sees the old file or the new one, never a half-written one, and a failed write leaves no
    temporary file behind; the ``OSError`` is the caller's to word (it knows what the file is for).
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
