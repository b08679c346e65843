"""Weights a model keeps in external files: where each one's bytes are, read without loading the model.

Reading only; the stage files' own weights files are written by :mod:`onnxpipe.export.weightfile`.  A location
outside the model's folder is refused (a model must not make onnxpipe read any file on the machine), and
errors reading are :class:`~onnxpipe.core.errors.ModelLoadError`: the model's weights are missing or
truncated.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from onnxpipe.core.errors import ModelLoadError
from onnxpipe.ir.model import initializer_nbytes, subgraphs

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


def model_folder(t: onnx.TensorProto, source_dir: Path | None) -> Path:
    """The model's folder ``source_dir``, which holds the external file of ``t``'s data; refused when
    unknown."""
    if source_dir is None:
        raise ModelLoadError(
            f"tensor {t.name!r} is stored in an external file but the model's folder is unknown; load the "
            "model with onnxpipe.load_model(path)"
        )
    return source_dir


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


def tensor_values(t: onnx.TensorProto, source_dir: Path | None) -> np.ndarray:
    """``t``'s values, its bytes read from the model's folder ``source_dir`` where it keeps them in a file.

    ``numpy_helper.to_array`` given no folder reads an external tensor relative to the working directory,
    so a Constant node's value kept in ``model.onnx_data`` (optimum's fp32 exports) is "not regular file"
    from any folder but the model's: every reader of a node's or a body's tensor comes through here.
    """
    if not is_external(t):
        return numpy_helper.to_array(t)
    inline = onnx.TensorProto()
    inline.CopyFrom(t)
    read_inline(inline, model_folder(t, source_dir))
    return numpy_helper.to_array(inline)


def tensors_inside(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    """Tensors held by a node: attribute values, and the initializers of its bodies, to any depth."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR:
            yield attr.t
        elif attr.type == onnx.AttributeProto.TENSORS:
            yield from attr.tensors
        elif attr.type == onnx.AttributeProto.SPARSE_TENSOR:
            yield attr.sparse_tensor.values
            yield attr.sparse_tensor.indices
    for g in subgraphs(node):
        yield from g.initializer
        for sp in g.sparse_initializer:
            yield sp.values
            yield sp.indices
        for n in g.node:
            yield from tensors_inside(n)


def holds_external(model: onnx.ModelProto) -> bool:
    """Whether any tensor of ``model`` lives in an external file: an initializer, a sparse one's parts, a
    node's attribute (a ``Constant``'s value) or a body's initializer."""
    return any(is_external(t) for t in stored_tensors(model)) or any(
        is_external(t) for n in model.graph.node for t in tensors_inside(n)
    )


def inlined(node: onnx.NodeProto, source_dir: Path | None) -> onnx.NodeProto:
    """``node`` itself when no tensor inside it is external (or the folder is unknown), else a copy with
    those tensors' bytes read in from the model's folder: for running the node on its own (the reference
    evaluator, like ``numpy_helper``, would read them relative to the working directory)."""
    if source_dir is None or not any(is_external(t) for t in tensors_inside(node)):
        return node
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for t in tensors_inside(copy):
        if is_external(t):
            read_inline(t, source_dir)
    return copy


def stored_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """The main graph's initializers, and the values and indices of its sparse initializers."""
    yield from model.graph.initializer
    for sp in model.graph.sparse_initializer:
        yield sp.values
        yield sp.indices


_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data")


SMALL_ELEMENTS = 1 << 16
"""Initializers up to this many elements keep their data in the shape-inference copy: symbolic shape
inference reads the values of those that shape arithmetic or a constant-folded chain touches (a BERT's
512 position ids, sliced to the sequence length; a bias folded with a constant).  The peak is the full
copy made first either way."""


def weightless_copy(proto: onnx.ModelProto, base_dir: Path | None = None) -> onnx.ModelProto:
    """A copy whose big initializers keep dims and type but no data (enough for shape inference); the
    small ones keep theirs, read from their external file when the model keeps them there (``base_dir``:
    the model's folder; unknown, they are left without data as well)."""
    light = onnx.ModelProto()
    light.CopyFrom(proto)
    for t in light.graph.initializer:
        small = math.prod(t.dims) <= SMALL_ELEMENTS
        if is_external(t):
            data = _small_external(t, base_dir) if small else None
            for f in _DATA_FIELDS:
                t.ClearField(f)
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
            if data is not None:
                t.raw_data = data
        elif not small:
            for f in _DATA_FIELDS:
                t.ClearField(f)
    return light


def _small_external(t: onnx.TensorProto, base_dir: Path | None) -> bytes | None:
    """The bytes of external tensor ``t`` (None: folder unknown, file outside it, too short, or a length
    that is not the tensor's size)."""
    if base_dir is None:
        return None
    size = initializer_nbytes(t)
    try:
        path = source_file(t, base_dir)
        _, offset, length = external_info(t)
        if length is not None and length != size:  # a tensor of other dims than its entry says
            return None
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read(size)
    except (OSError, ModelLoadError):
        return None
    return data if len(data) == size else None
