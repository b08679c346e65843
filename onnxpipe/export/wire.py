"""Compressed boundaries written into the stage files (``boundary_dtype``, planned by
:func:`onnxpipe.planning.planner.plan_with_wire`).

The sending stage casts each compressed float32 output to float16 or bfloat16, or quantizes it to int8
with a per-tensor scale it computes at run time (``max|x| / 127``, symmetric, zero point 0) and sends
beside it; the receiving stage casts back, or dequantizes, into the source's own tensor name first
thing, so its nodes read what they read in the source.  The tensor on the link takes a derived name
(:meth:`BoundaryDtype.wire_name`, :func:`scale_name`), which both stages and the manifest use: every
runtime that chains stages by name runs the compressed split as it is.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxpipe.core.choices import BoundaryDtype, scale_name
from onnxpipe.core.errors import ExportError
from onnxpipe.core.options import opt
from onnxpipe.planning.types import StageSpec

NODE_PREFIX = "onnxpipe/wire/"
ELEM_TYPE = {
    BoundaryDtype.FLOAT16: onnx.TensorProto.FLOAT16,
    BoundaryDtype.BFLOAT16: onnx.TensorProto.BFLOAT16,
    BoundaryDtype.INT8: onnx.TensorProto.INT8,
}
MIN_OPSET = {BoundaryDtype.FLOAT16: 6, BoundaryDtype.BFLOAT16: 13, BoundaryDtype.INT8: 10}
"""The default domain's opset each needs: Cast to bfloat16 (13), ``QuantizeLinear`` (10)."""


def compress_stage(model: onnx.ModelProto, spec: StageSpec, wire: Mapping[str, BoundaryDtype]) -> None:
    """Rewrite ``model`` (stage ``spec``) so that the tensors of ``wire`` it emits or receives cross
    compressed (see the module docstring)."""
    graph = model.graph
    inputs = {vi.name: vi for vi in graph.input}
    decompress: list[onnx.NodeProto] = []
    for t in spec.inputs:
        dtype = wire.get(t)
        if dtype is None:
            continue
        _to_wire(model, spec, inputs[t], dtype)
        if dtype == BoundaryDtype.INT8:
            graph.input.append(helper.make_tensor_value_info(scale_name(t), onnx.TensorProto.FLOAT, []))
            decompress.append(_node("DequantizeLinear", [dtype.wire_name(t), scale_name(t)], t))
        else:
            decompress.append(_node("Cast", [dtype.wire_name(t)], t, to=onnx.TensorProto.FLOAT))
    for i, node in enumerate(decompress):
        graph.node.insert(i, node)
    for out in list(graph.output):
        dtype = wire.get(out.name)
        if dtype is None:
            continue
        t = out.name
        _to_wire(model, spec, out, dtype)
        if dtype == BoundaryDtype.INT8:
            graph.output.append(helper.make_tensor_value_info(scale_name(t), onnx.TensorProto.FLOAT, []))
        if t not in inputs:  # else the stage passes on the compressed input it received
            graph.node.extend(_compressed(graph, t, dtype))


def _compressed(graph: onnx.GraphProto, t: str, dtype: BoundaryDtype) -> list[onnx.NodeProto]:
    """The nodes that make ``t``'s wire tensor (and an int8 one's scale)."""
    if dtype != BoundaryDtype.INT8:
        return [_node("Cast", [t], dtype.wire_name(t), to=ELEM_TYPE[dtype])]
    base = NODE_PREFIX + t
    constants: dict[str, np.ndarray] = {
        f"{base}/127": np.array(127.0, dtype=np.float32),
        f"{base}/tiny": np.array(np.finfo(np.float32).tiny, dtype=np.float32),
        f"{base}/zero_point": np.array(0, dtype=np.int8),
    }
    graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in constants.items())
    return [
        _node("Abs", [t], f"{base}/abs"),
        _node("ReduceMax", [f"{base}/abs"], f"{base}/max", keepdims=0),
        _node("Div", [f"{base}/max", f"{base}/127"], f"{base}/step"),
        _node("Max", [f"{base}/step", f"{base}/tiny"], scale_name(t)),  # an all-zero tensor: no 0/0
        _node("QuantizeLinear", [t, scale_name(t), f"{base}/zero_point"], dtype.wire_name(t)),
    ]


def _node(op: str, inputs: list[str], output: str, **attrs: int) -> onnx.NodeProto:
    node = helper.make_node(op, inputs, [output], name=NODE_PREFIX + output)
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    return node


def _to_wire(model: onnx.ModelProto, spec: StageSpec, vi: onnx.ValueInfoProto, dtype: BoundaryDtype) -> None:
    """Declare the boundary tensor ``vi`` as its wire tensor of ``dtype``, once the model's opset has the
    ops that make and read it."""
    version = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if version < MIN_OPSET[dtype]:
        raise ExportError(
            f"stage {spec.index}: {dtype} boundaries need ONNX opset {MIN_OPSET[dtype]} or later and the "
            f"model imports opset {version}; choose {opt('boundary_dtype', BoundaryDtype.FLOAT16)}, or "
            "convert the model to a newer opset"
        )
    vi.name = dtype.wire_name(vi.name)
    vi.type.tensor_type.elem_type = ELEM_TYPE[dtype]


__all__ = ["compress_stage"]
