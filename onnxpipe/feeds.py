"""Concrete input shapes and seeded random inputs for a model (shared by the profiler and the verifier).

Symbolic or unknown input dims get sizes that make typical models run:

* the first dim (batch) is 1;
* the spatial dims (2 and 3) of a rank-4, image-like input are 64, a multiple of 32 so that detectors
  with several stride-2 stages still line up;
* the channel dim (1) of a rank-4 input is 3;
* every other dim (sequence length, time steps, ...) is 16.

The same symbolic name gets the same size everywhere, and a size given for it by an override is used for
every other input that names it.

>>> parse_shape_overrides(["x=1,3,224,224"])
{'x': (1, 3, 224, 224)}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx

from onnxpipe.core.dims import Dim
from onnxpipe.core.errors import UsageError
from onnxpipe.model import ModelView, NodeInfo

BATCH_SIZE = 1
IMAGE_SIZE = 64
IMAGE_CHANNELS = 3
SEQUENCE_SIZE = 16
SMALL_INT_HIGH = 2
"""Integer inputs that are neither indices nor masks take values in ``[0, SMALL_INT_HIGH)``."""

_PASS_THROUGH = frozenset(
    {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand", "Transpose", "Slice", "Tile"}
)
"""Ops that carry index values through unchanged on the way to a Gather."""

_FLOAT_TYPES: dict[int, type[np.generic]] = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.FLOAT16: np.float16,
}
_INT_TYPES: dict[int, type[np.generic]] = {
    onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.INT16: np.int16,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.UINT16: np.uint16,
    onnx.TensorProto.UINT32: np.uint32,
    onnx.TensorProto.UINT64: np.uint64,
}


# --------------------------------------------------------------------------------------------------
# shapes


def parse_shape_overrides(items: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``["name=1,3,224,224", ...]`` (``x`` also separates dims; ``name=`` is a scalar).

    The name is everything before the last ``=``, so names holding ``=`` still work.
    """
    result: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims_text = item.rpartition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--shape {item!r}: expected NAME=D1,D2,...; write it like input=1,3,224,224")
        text = dims_text.strip().replace("x", ",").replace("X", ",")
        dims: list[int] = []
        if text:
            for part in text.split(","):
                part = part.strip()
                try:
                    value = int(part)
                except ValueError:
                    raise UsageError(
                        f"--shape {item!r}: {part!r} is not a whole number; write NAME=D1,D2,..."
                    ) from None
                if value < 0:
                    raise UsageError(
                        f"--shape {item!r}: dims must be >= 0, got {value}; give sizes like NAME=1,3,224,224"
                    )
                dims.append(value)
        if name in result:
            raise UsageError(f"--shape {item!r}: input {name!r} is given twice; give each input once")
        result[name] = tuple(dims)
    return result


def resolve_input_shapes(
    view: ModelView, overrides: Mapping[str, Sequence[int]] | None = None
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for every model input (see the module docstring for the defaults).

    Raises :class:`UsageError` when an override names no input, has the wrong rank, or contradicts a
    fixed dim of the model, and when an input of unknown rank has no override.
    """
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(view.inputs))
    if unknown:
        listed = ", ".join(view.inputs) if view.inputs else "(none)"
        raise UsageError(f"--shape names {unknown[0]!r}, which is not a model input; inputs are: {listed}")

    symbols: dict[str, int] = {}
    # overrides first, so that the sizes they give to symbolic names reach every other input
    for name, given in overrides.items():
        shape = view.tensor(name).shape
        dims = tuple(int(d) for d in given)
        if shape is not None:
            if len(dims) != len(shape):
                raise UsageError(
                    f"--shape {name}: the model's input {name!r} has rank {len(shape)} "
                    f"({_show(shape)}), the override gives {len(dims)} dims; give {len(shape)} dims"
                )
            for axis, (declared, value) in enumerate(zip(shape, dims, strict=True)):
                if isinstance(declared, int) and declared >= 0 and declared != value:
                    raise UsageError(
                        f"--shape {name}: dim {axis} of input {name!r} is fixed at {declared} by the model "
                        f"({_show(shape)}), the override gives {value}; give {declared} for dim {axis}"
                    )
                if isinstance(declared, str):
                    symbols.setdefault(declared, value)

    result: dict[str, tuple[int, ...]] = {}
    for name in view.inputs:
        if name in overrides:
            result[name] = tuple(int(d) for d in overrides[name])
            continue
        shape = view.tensor(name).shape
        if shape is None:
            raise UsageError(
                f"input {name!r} has no known rank; give its shape with --shape {name}=D1,D2,..."
            )
        resolved: list[int] = []
        for axis, d in enumerate(shape):
            if isinstance(d, int) and d >= 0:  # some exporters write -1 for "unknown"
                resolved.append(d)
            elif isinstance(d, str) and d in symbols:
                resolved.append(symbols[d])
            else:
                size = _default_dim(axis, len(shape))
                if isinstance(d, str):
                    symbols[d] = size
                resolved.append(size)
        result[name] = tuple(resolved)
    return result


def symbol_sizes(view: ModelView, input_shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """The size each symbolic input dim (``"batch"``) takes in ``input_shapes``."""
    symbols: dict[str, int] = {}
    for name, dims in input_shapes.items():
        declared = view.tensor(name).shape
        if declared is not None and len(declared) == len(dims):
            for d, v in zip(declared, dims, strict=True):
                if isinstance(d, str):
                    symbols.setdefault(d, int(v))
    return symbols


def _default_dim(axis: int, rank: int) -> int:
    if axis == 0:
        return BATCH_SIZE
    if rank == 4:
        return IMAGE_CHANNELS if axis == 1 else IMAGE_SIZE
    return SEQUENCE_SIZE


def _show(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


# --------------------------------------------------------------------------------------------------
# feeds


def random_feeds(
    view: ModelView, shapes: Mapping[str, Sequence[int]], seed: int = 0
) -> dict[str, np.ndarray]:
    """Seeded random values for every model input at ``shapes``.

    Floats are standard normal; integers that end up as Gather indices lie in ``[0, rows)`` of the data
    they index; integers (and booleans) named like a mask are ones; other integers lie in
    ``[0, SMALL_INT_HIGH)``; other booleans are random.  Strings and exotic types raise
    :class:`UsageError`.
    """
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for name in view.inputs:
        if name not in shapes:
            raise UsageError(f"no shape for input {name!r}; give one with --shape {name}=D1,D2,...")
        shape = tuple(int(d) for d in shapes[name])
        elem = view.tensor(name).elem_type
        is_mask = "mask" in name.lower()
        if elem in _FLOAT_TYPES:
            feeds[name] = np.asarray(rng.standard_normal(shape), dtype=_FLOAT_TYPES[elem])
        elif elem in _INT_TYPES:
            dtype = _INT_TYPES[elem]
            if is_mask:
                feeds[name] = np.ones(shape, dtype=dtype)
            else:
                high = gather_rows(view, name)
                high = SMALL_INT_HIGH if high is None else max(1, high)
                feeds[name] = np.asarray(rng.integers(0, high, size=shape), dtype=dtype)
        elif elem == onnx.TensorProto.BOOL:
            feeds[name] = np.ones(shape, dtype=np.bool_) if is_mask else np.asarray(rng.random(shape) < 0.5)
        else:
            type_name = onnx.TensorProto.DataType.Name(elem) if elem else "undefined"
            raise UsageError(
                f"input {name!r} has element type {type_name}, which onnxpipe cannot make random values for;"
                " run the model with your own inputs instead"
            )
    return feeds


def gather_rows(view: ModelView, tensor: str) -> int | None:
    """Smallest number of rows of any data that ``tensor`` indexes (directly or through casts/reshapes).

    ``None`` when the tensor reaches no Gather as indices, or the rows are not known statically.
    """
    protos = view.proto.graph.node
    nodes = view.nodes
    best: int | None = None
    seen: set[str] = set()
    stack = [tensor]
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        for pos in view.consumers.get(t, ()):
            node = nodes[pos]
            rows = _rows_indexed(view, node, protos[node.index], t)
            if rows is not None:
                best = rows if best is None else min(best, rows)
            elif node.op_type in _PASS_THROUGH and node.inputs and node.inputs[0] == t:
                stack.extend(node.outputs[:1])
    return best


def _rows_indexed(view: ModelView, node: NodeInfo, proto: onnx.NodeProto, t: str) -> int | None:
    """Rows of the data ``node`` indexes with ``t``, when ``t`` is its index input and the rows are known."""
    data: str | None = None
    axis = 0
    if node.op_type in ("Gather", "GatherElements") and len(node.inputs) > 1 and node.inputs[1] == t:
        data = node.inputs[0]
        for attr in proto.attribute:
            if attr.name == "axis":
                axis = int(attr.i)
    elif node.op_type == "EmbedLayerNormalization":
        # com.microsoft: input_ids -> word_embedding, segment_ids -> segment_embedding,
        # position_ids (input 8) -> position_embedding
        pairs = {0: 2, 1: 4, 8: 3}
        for idx, data_idx in pairs.items():
            if idx < len(proto.input) and proto.input[idx] == t and data_idx < len(proto.input):
                data = proto.input[data_idx] or None
    if data is None:
        return None
    shape = view.tensor(data).shape
    if shape is None or not shape:
        return None
    if axis < 0:
        axis += len(shape)
    if not 0 <= axis < len(shape):
        return None
    rows = shape[axis]
    return rows if isinstance(rows, int) else None
