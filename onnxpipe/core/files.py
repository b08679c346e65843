"""Files onnxpipe writes and checks: content hashes, and writes a reader never sees half of."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Annotated

from onnxpipe.core.jsonread import Rule


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


def is_plain_file_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name


def is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


# A stage file outside the folder would let a manifest make the runner load (and check_stage_files hash)
# any file on the machine; a malformed hash could never match, so both are refused when a file is read
# (:mod:`onnxpipe.core.codec` checks a field of these types).
FileName = Annotated[str, Rule(is_plain_file_name, "a plain file name in the folder")]
Sha256 = Annotated[str, Rule(is_sha256, "a sha256 as 64 lowercase hex digits")]
