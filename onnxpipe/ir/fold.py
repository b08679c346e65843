"""Fold what a model computes from constants alone into initializers, where the result is exact.

Why: a runtime that wants fixed shapes (tract, an NPU compiler, OpenVINO's static mode) has to see a
``Reshape`` target as a constant, not as ``Shape -> Gather -> Concat`` arithmetic; once the input
shapes are frozen (:mod:`onnxpipe.ir.static`) that arithmetic reads only constants and folds away.

Only ops whose result does not depend on how a runtime computes it are folded: data movement (any
element type), comparisons and logic, and arithmetic on integers.  Floating-point arithmetic is left
to the runtime, so a folded model computes bit for bit what the source computes.  A folded value above
:data:`MAX_FOLDED_BYTES` stays a node (the stage would otherwise carry a large tensor).  Values come
from onnx's reference evaluator, one node at a time.

An ``If`` whose condition folds is replaced by the nodes of the branch it takes (its outputs renamed
to the ``If``'s by ``Identity`` nodes): torch exports a ``squeeze(dim)`` of a dim it cannot prove is 1,
or a check of a state's size, as an ``If`` on a value of shapes, whose branches give tensors of
different ranks (Silero VAD's decoder), so no inference can type what it makes until the branch is
known.  The branch's own nodes then fold like any others.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnxpipe.ir.external import inlined, is_external
from onnxpipe.ir.model import default_opset, set_items, subgraph_outer_reads

MAX_FOLDED_BYTES = 1 << 20
"""The largest tensor a fold writes as an initializer (1 MiB)."""

MOVEMENT_OPS = frozenset(
    {
        "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Concat", "Gather", "GatherElements",
        "Slice", "Transpose", "Expand", "Tile", "Split", "Constant", "ConstantOfShape", "Shape", "Size",
        "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Where",
    }
)  # fmt: skip
"""Ops folded whatever the element type: their results are copies or exact comparisons."""

INTEGER_OPS = frozenset(
    {"Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Max", "Min", "Range", "ReduceProd", "ReduceSum",
     "ReduceMax", "ReduceMin", "Cast", "CumSum"}
)  # fmt: skip
"""Ops folded when every input and output is an integer (or bool) tensor: integer results are exact."""


def fold_constants(
    model: onnx.ModelProto, static_shapes: dict[str, tuple[int, ...]], base_dir: Path | None = None
) -> int:
    """Fold ``model``'s main graph in place; returns how many nodes were folded.

    ``static_shapes``: tensors whose shape is settled (a ``Shape`` of one of them folds).  Nodes of
    other domains, with subgraphs, or reading tensors stored in external files are left alone; a node
    holding an external tensor (a ``Constant``'s value) folds with it read from ``base_dir``, the model's
    folder.
    """
    graph = model.graph
    opset = default_opset(model, 17)
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer if not is_external(t)}
    kept: list[onnx.NodeProto] = []
    added: list[onnx.TensorProto] = []
    graph_outputs = {o.name for o in graph.output}
    folded = 0
    for node in graph.node:
        branch = _taken_branch(node, values)
        if branch is not None:
            folded += 1
            kept.extend(_inlined(node, branch, added))
            continue
        result = _fold(inlined(node, base_dir), values, static_shapes, opset)
        if result is None or any(o in graph_outputs for o in node.output):
            kept.append(node)
            continue
        folded += 1
        for name, value in zip(node.output, result, strict=False):
            if name:
                values[name] = value
                added.append(numpy_helper.from_array(value, name))
    if not folded:
        return 0
    set_items(graph.node, kept)
    graph.initializer.extend(added)
    _drop_unused_initializers(graph)
    return folded


def _fold(
    node: onnx.NodeProto, values: dict[str, np.ndarray], static_shapes: dict[str, tuple[int, ...]], opset: int
) -> list[np.ndarray] | None:
    if node.domain not in ("", "ai.onnx") or any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
    ):
        return None
    if node.op_type == "Shape":
        shape = static_shapes.get(node.input[0]) if node.input else None
        if shape is None and node.input and node.input[0] in values:
            shape = tuple(values[node.input[0]].shape)
        if shape is None:
            return None
        bounds = {a.name: int(a.i) for a in node.attribute}
        return [np.array(shape, dtype=np.int64)[bounds.get("start", 0) : bounds.get("end", len(shape))]]
    if node.op_type == "Size" and node.input and node.input[0] in static_shapes:
        return [np.array(int(np.prod(static_shapes[node.input[0]])), dtype=np.int64)]
    if node.op_type not in MOVEMENT_OPS and node.op_type not in INTEGER_OPS:
        return None
    inputs = [i for i in node.input if i]
    if not all(i in values for i in inputs):
        return None
    if node.op_type in INTEGER_OPS and not all(_exact(values[i]) for i in inputs):
        return None
    try:
        evaluator = ReferenceEvaluator(_one_node_model(node, values, opset))
        out = evaluator.run(None, {i: values[i] for i in inputs})
    except Exception:  # noqa: BLE001 - an op the reference evaluator cannot run stays a node
        return None
    arrays = [np.asarray(v) for v in out]
    if any(a.nbytes > MAX_FOLDED_BYTES or a.dtype == object for a in arrays):
        return None
    if node.op_type in INTEGER_OPS and not all(_exact(a) for a in arrays):
        return None
    return arrays


def _taken_branch(node: onnx.NodeProto, values: dict[str, np.ndarray]) -> onnx.GraphProto | None:
    """The branch an ``If`` of the default domain takes, when its condition is a known value."""
    if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.input:
        return None
    cond = values.get(node.input[0])
    if cond is None or cond.size != 1:
        return None
    name = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
    return next((a.g for a in node.attribute if a.name == name), None)


def _inlined(
    node: onnx.NodeProto, branch: onnx.GraphProto, initializers: list[onnx.TensorProto]
) -> list[onnx.NodeProto]:
    """The nodes of ``branch`` in place of ``node``, its outputs given the ``If``'s names by ``Identity``
    nodes (ONNX names are unique across a graph and its bodies, so none clashes); its initializers join
    ``initializers``."""
    initializers.extend(branch.initializer)
    nodes = list(branch.node)
    for inner, outer in zip(branch.output, node.output, strict=False):
        if outer:
            nodes.append(helper.make_node("Identity", [inner.name], [outer], name=f"{node.name}/{outer}"))
    return nodes


def _exact(a: np.ndarray) -> bool:
    """Whether ``a`` holds integers or booleans (of any width, signed or not)."""
    return a.dtype.kind in "iub"


def _one_node_model(node: onnx.NodeProto, values: dict[str, np.ndarray], opset: int) -> onnx.ModelProto:
    inputs = [
        helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(values[i].dtype), values[i].shape)
        for i in dict.fromkeys(i for i in node.input if i)
    ]
    outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    graph = helper.make_graph([node], "fold", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    """Initializers nothing reads any more go, and with them their IR-3 graph input entries."""
    used: set[str] = {o.name for o in graph.output}
    for n in graph.node:
        used.update(n.input)
        used |= subgraph_outer_reads(n)
    dropped = {t.name for t in graph.initializer if t.name not in used}
    if not dropped:
        return
    set_items(graph.initializer, [t for t in graph.initializer if t.name not in dropped])
    set_items(graph.input, [i for i in graph.input if i.name not in dropped])


__all__ = ["INTEGER_OPS", "MAX_FOLDED_BYTES", "MOVEMENT_OPS", "fold_constants"]
