"""A stage's own weights file (``stage_<i>.onnx.data``), written without holding the weights in memory.

:func:`externalize` moves the data of a stage model's initializers (dense, and the values and indices of
sparse ones) of at least ``threshold`` bytes into one file and points the tensors at it.  A tensor whose
data is still in the *source's* external file is copied from there in chunks, so the stage's weights
never sit in memory; a tensor held in memory is written as it is.  Offsets are aligned to
:data:`ALIGNMENT` bytes (onnxruntime can then map the file instead of copying it), and the file's
sha256 is computed while writing, so it is never read back.

Errors reading the source's files are :class:`~onnxpipe.core.errors.ModelLoadError` (the model's weights are
missing or truncated); errors writing are left as ``OSError`` for the caller, who knows the file's name
as the user will see it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import numpy_helper

from onnxpipe.ir.external import (
    external_info,
    is_external,
    model_folder,
    read_inline,
    read_source,
    source_file,
    stored_tensors,
)
from onnxpipe.ir.model import initializer_nbytes

ALIGNMENT = 4096

_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")


class WeightFile:
    """Appends tensors' data to one file at aligned offsets and hashes it as it goes; opened lazily."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO | None = None
        self._sha = hashlib.sha256()
        self._size = 0

    def add(self, t: onnx.TensorProto, source_dir: Path | None) -> None:
        """Move ``t``'s data to the end of this file and point ``t`` at it."""
        if self._size % ALIGNMENT:
            self._write(b"\0" * (ALIGNMENT - self._size % ALIGNMENT))
        offset = self._size
        if is_external(t):
            for chunk in read_source(t, source_file(t, model_folder(t, source_dir))):
                self._write(chunk)
        elif t.HasField("raw_data"):
            self._write(t.raw_data)
        else:
            self._write(np.ascontiguousarray(numpy_helper.to_array(t)).tobytes())
        t.ClearField("raw_data")
        for name in _TYPED_FIELDS:
            t.ClearField(name)
        del t.external_data[:]
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", offset), ("length", self._size - offset)):
            entry = t.external_data.add()
            entry.key, entry.value = key, str(value)

    def close(self) -> str | None:
        """Close the file; its sha256, or ``None`` when nothing was written (and no file exists)."""
        if self._file is None:
            return None
        self._file.close()
        self._file = None
        return self._sha.hexdigest()

    def _write(self, data: bytes | memoryview) -> None:
        if self._file is None:
            self._file = self.path.open("xb")
        self._file.write(data)
        self._sha.update(data)
        self._size += len(data)


def externalize(model: onnx.ModelProto, path: Path, source_dir: Path | None, threshold: int) -> str | None:
    """Move every stored tensor of ``model`` of ``threshold`` bytes or more into the file ``path``.

    Returns the file's sha256, or ``None`` when no tensor was big enough (no file is created).  String
    tensors stay inside the model (they have no raw byte form).
    """
    weights = WeightFile(path)
    try:
        for t in stored_tensors(model):
            if t.data_type == onnx.TensorProto.STRING:
                continue
            size = external_info(t)[2] if is_external(t) else None
            if (initializer_nbytes(t) if size is None else size) >= threshold:
                weights.add(t, source_dir)
            elif is_external(t):  # small, but still in the source's file: into the stage file itself
                read_inline(t, model_folder(t, source_dir))
    except BaseException:
        weights.close()
        raise
    return weights.close()


__all__ = ["ALIGNMENT", "WeightFile", "externalize"]
