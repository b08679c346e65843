"""Weights a model keeps in external files: where each one's bytes are, read without loading the model.

Reading only; the stage files' own weights files are written by :mod:`onnxpipe.export.weightfile`.  A location
outside the model's folder is refused (a model must not make onnxpipe read any file on the machine), and
errors reading are :class:`~onnxpipe.core.errors.ModelLoadError`: the model's weights are missing or
truncated.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import onnx

from onnxpipe.core.errors import ModelLoadError

CHUNK_BYTES = 16 << 20


def is_external(t: onnx.TensorProto) -> bool:
    return t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL


def external_info(t: onnx.TensorProto) -> tuple[str, int, int | None]:
    """``(location, offset, length)`` of an external tensor; ``length`` ``None`` means to the file's end."""
    entries = {e.key: e.value for e in t.external_data}
    length = entries.get("length")
    return entries.get("location", ""), int(entries.get("offset", "0") or 0), int(length) if length else None


def source_file(t: onnx.TensorProto, source_dir: Path) -> Path:
    """The source's file holding ``t``; refuses a location outside the model's folder."""
    location, _, _ = external_info(t)
    path = source_dir / location
    if not location or os.path.isabs(location) or not path.resolve().is_relative_to(source_dir.resolve()):
        raise ModelLoadError(
            f"{source_dir}: initializer {t.name!r} names its weights file {location!r}, which is not a file "
            "inside the model's folder; re-export the model with its weights beside it"
        )
    return path


def read_source(t: onnx.TensorProto, src: Path) -> Iterator[bytes]:
    """The bytes of external tensor ``t`` in the source's file ``src``, in chunks of at most 16 MiB."""
    _, offset, length = external_info(t)
    try:
        with src.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            want = size - offset if length is None else length
            if offset + want > size:
                raise ModelLoadError(
                    f"{src}: ends inside the weights of initializer {t.name!r} (bytes {offset}..."
                    f"{offset + want}, the file has {size}); the weights file is truncated: copy it "
                    "again or re-export the model"
                )
            f.seek(offset)
            left = want
            while left > 0:
                chunk = f.read(min(CHUNK_BYTES, left))
                if not chunk:
                    return
                yield chunk
                left -= len(chunk)
    except OSError as e:
        raise ModelLoadError(
            f"{src}: cannot read the weights of initializer {t.name!r} ({e.strerror or e}); keep the "
            "model's weight files next to it"
        ) from e


def read_inline(t: onnx.TensorProto, source_dir: Path) -> None:
    """Bring external tensor ``t``'s data into its ``raw_data`` (for tensors too small for a file)."""
    t.raw_data = b"".join(read_source(t, source_file(t, source_dir)))
    del t.external_data[:]
    t.data_location = onnx.TensorProto.DEFAULT


def stored_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """The main graph's initializers, and the values and indices of its sparse initializers."""
    yield from model.graph.initializer
    for sp in model.graph.sparse_initializer:
        yield sp.values
        yield sp.indices
