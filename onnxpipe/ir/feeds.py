"""Seeded random inputs for a model (shared by the profiler, the exporter, the verifier and ``run``).

Floats are standard normal; integers that end up as Gather indices lie in ``[0, rows)`` of the data
they index; integers (and booleans) named like a mask are ones; other integers lie in
``[0, SMALL_INT_HIGH)``; other booleans are random.  Sizes come from :mod:`onnxpipe.ir.shapes`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.ir.decoder import index_readers
from onnxpipe.ir.model import ModelView, NodeInfo, np_dtype
from onnxpipe.ir.samples import expected_text
from onnxpipe.ir.shapes import non_tensor_inputs

SMALL_INT_HIGH = 2
"""Integer inputs that are neither indices nor masks take values in ``[0, SMALL_INT_HIGH)``."""

_PASS_THROUGH = frozenset(
    {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand", "Transpose", "Slice", "Tile"}
)
"""Ops that carry index values through unchanged on the way to a Gather."""

_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16})
"""The float inputs given standard normal values (the 8-bit and brain floats have no random values)."""


def random_feeds(
    view: ModelView, shapes: Mapping[str, Sequence[int]], seed: int = 0, *, names: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """Seeded random values for every model input at ``shapes`` (``names``: for these inputs only), as the
    module docstring says; strings and exotic types raise :class:`UsageError`."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    others = non_tensor_inputs(view)
    for name in view.inputs if names is None else names:
        if name in others:
            raise UsageError(
                f"input {name!r} is {expected_text(view, name)}, which onnxpipe cannot make random values "
                "for and a file of arrays cannot hold; give real inputs from Python "
                f"({opt('ProfileOptions.inputs')}, made by onnxpipe.ir.samples.samples_from_feeds)"
            )
        if name not in shapes:
            raise UsageError(
                f"no shape for input {name!r}; give one with {opt('shapes', f'{name}=D1,D2,...')}"
            )
        shape = tuple(int(d) for d in shapes[name])
        elem = view.tensor(name).elem_type
        dtype = np_dtype(elem)
        is_mask = "mask" in name.lower()
        if elem in _FLOAT_TYPES:
            feeds[name] = np.asarray(rng.standard_normal(shape), dtype=dtype)
        elif dtype is not None and dtype.kind in "iu":
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
    found = [_rows_indexed(view, node, t) for node, t in index_readers(view, tensor, _PASS_THROUGH)]
    return min((rows for rows in found if rows is not None), default=None)


def _rows_indexed(view: ModelView, node: NodeInfo, t: str) -> int | None:
    """Rows of the data ``node`` indexes with ``t``, when ``t`` is its index input and the rows are known."""
    data: str | None = None
    axis = 0
    if node.op_type in ("Gather", "GatherElements") and len(node.inputs) > 1 and node.inputs[1] == t:
        data = node.inputs[0]
        axis = view.int_attributes(node).get("axis", 0)
    elif node.op_type == "EmbedLayerNormalization":
        # com.microsoft: input_ids -> word_embedding, segment_ids -> segment_embedding,
        # position_ids (input 8) -> position_embedding
        proto = view.proto.graph.node[node.index]
        pairs = {0: 2, 1: 4, 8: 3}
        for idx, data_idx in pairs.items():
            if idx < len(proto.input) and proto.input[idx] == t and data_idx < len(proto.input):
                data = proto.input[data_idx] or None
    if data is None:
        return None
    shape = view.tensor(data).shape
    if not shape or not -len(shape) <= axis < len(shape):
        return None
    rows = shape[axis]
    return rows if isinstance(rows, int) else None
