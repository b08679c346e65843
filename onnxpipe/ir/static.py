"""Tensor shapes at concrete input sizes: inferred without running the model (:func:`concrete_shapes`,
the section below), or frozen into a copy of the model, for runtimes and NPUs that need fixed shapes.

Why: tract, NPU compilers and OpenVINO's static mode type every tensor before they run anything; a
stage of a dynamic model hands them symbolic dims and ``Shape -> Gather -> Concat`` arithmetic feeding
its ``Reshape`` targets, which some cannot type at all.  ``split --static`` splits this copy instead:

1. the given input shapes replace the declared ones;
2. the source's ``value_info`` and declared output shapes are dropped: they describe the dynamic model
   (and some exporters' are simply wrong), and would contradict the frozen shapes;
3. ONNX shape inference (with data propagation) and, when installed, onnxruntime's symbolic inference
   settle the shapes, and :func:`fold_constants` folds the shape arithmetic they
   make constant, and replaces an ``If`` whose condition folds by the branch it takes; repeated until
   nothing more folds.

The result computes bit for bit what the source computes at those shapes (only exact ops are folded),
so a static split verifies against the source at its profiled shapes.  What stays open is what no
freezing fixes: a size that follows data (a ``NonZero``'s count, an ``If`` on a value), which
:func:`unsettled` finds for the plan's notes to name.  The sizes frozen are the ones the model runs at:
``split`` chooses them as a measured profile does (:mod:`onnxpipe.cost.runnable`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference
from onnx.reference import ReferenceEvaluator

from onnxpipe.core.dims import Dim
from onnxpipe.core.extras import install_hint
from onnxpipe.core.text import names_text
from onnxpipe.ir.external import inlined, is_external, weightless_copy
from onnxpipe.ir.load import view_from_proto
from onnxpipe.ir.model import (
    ModelView,
    default_opset,
    set_input_shapes,
    set_items,
    subgraph_outer_reads,
    value_dims,
)
from onnxpipe.ir.shapes import symbol_sizes
from onnxpipe.ir.symbolic import available as symbolic_available
from onnxpipe.ir.symbolic import symbolic_dims

MAX_ROUNDS = 8
"""Rounds of inference and folding: each settles shapes that the previous fold made constant."""


def freeze_shapes(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], base_dir: Path | None = None
) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with ``shapes`` frozen and its shape arithmetic folded; and the number of
    nodes folded (``base_dir``: the model's folder, where its external tensors are read from).  ``model``
    itself is not changed."""
    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    graph = frozen.graph
    set_input_shapes(graph, shapes)
    del graph.value_info[:]
    for vi in graph.output:
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")
    folded = 0
    for _ in range(MAX_ROUNDS):
        done = fold_constants(frozen, _static_shapes(frozen, symbolic=False), base_dir)
        if not done:  # the dearer second opinion only where ONNX's own inference is stuck
            done = fold_constants(frozen, _static_shapes(frozen, symbolic=True), base_dir)
        folded += done
        if not done:
            break
    return frozen, folded


def _static_shapes(model: onnx.ModelProto, *, symbolic: bool) -> dict[str, tuple[int, ...]]:
    """Tensors whose every dim is a number, by ONNX's inference (and onnxruntime's symbolic one)."""
    found = inferred_dims(model)
    for name, dims in ((symbolic_dims(model) if symbolic else None) or {}).items():
        offer_dims(found, name, dims)
    return {
        name: tuple(d for d in dims if isinstance(d, int))
        for name, dims in found.items()
        if all(isinstance(d, int) for d in dims)
    }


def static_view(view: ModelView, shapes: Mapping[str, Sequence[int]]) -> tuple[ModelView, int]:
    """``view``'s model with ``shapes`` frozen (:func:`freeze_shapes`), as a view that keeps the source's
    path, folder and hash: the stages of a static split are checked against the source file."""
    frozen, folded = freeze_shapes(view.proto, shapes, view.base_dir)
    return view_from_proto(frozen, path=view.path, sha256=view.sha256, base_dir=view.base_dir), folded


def unsettled(
    view: ModelView, groups: Sequence[tuple[int, Sequence[str]]]
) -> list[tuple[int, str, tuple[Dim, ...] | None]]:
    """``(group, tensor, dims)`` for each tensor of ``groups`` (a stage's index and its outputs) whose
    dims in ``view`` (a frozen model) are not all numbers; ``dims`` None for an unknown rank."""
    found: list[tuple[int, str, tuple[Dim, ...] | None]] = []
    for index, names in groups:
        for name in names:
            info = view.tensors.get(name)
            if info is None or not info.is_static:
                found.append((index, name, None if info is None else info.shape))
    return found


# --------------------------------------------------------------------------------------------------
# Fold what a model computes from constants alone into initializers, where the result is exact.
#
# Why: a runtime that wants fixed shapes (tract, an NPU compiler, OpenVINO's static mode) has to see a
# ``Reshape`` target as a constant, not as ``Shape -> Gather -> Concat`` arithmetic; once the input
# shapes are frozen (above) that arithmetic reads only constants and folds away.
#
# Only ops whose result does not depend on how a runtime computes it are folded: data movement (any
# element type), comparisons and logic, and arithmetic on integers.  Floating-point arithmetic is left
# to the runtime, so a folded model computes bit for bit what the source computes.  A folded value above
# :data:`MAX_FOLDED_BYTES` stays a node (the stage would otherwise carry a large tensor).  Values come
# from onnx's reference evaluator, one node at a time.
#
# An ``If`` whose condition folds is replaced by the nodes of the branch it takes (its outputs renamed
# to the ``If``'s by ``Identity`` nodes): torch exports a ``squeeze(dim)`` of a dim it cannot prove is 1,
# or a check of a state's size, as an ``If`` on a value of shapes, whose branches give tensors of
# different ranks (Silero VAD's decoder), so no inference can type what it makes until the branch is
# known.  The branch's own nodes then fold like any others.

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


# --------------------------------------------------------------------------------------------------
# The shape of every tensor of the main graph at concrete input sizes, without running the model.
#
# ONNX shape inference runs on a weight-less copy of the model with the inputs fixed to concrete sizes, so
# models over 2 GB work without reading their weights; where it leaves dims unsettled (the shape
# arithmetic of torch exports), onnxruntime's symbolic shape inference (:mod:`onnxpipe.ir.symbolic`) is
# asked too.  Static costs and the profiler's value matching both size tensors with it.


def concrete_shapes(
    view: ModelView,
    input_shapes: Mapping[str, Sequence[int]],
    notes: list[str] | None = None,
    *,
    symbolic: bool = True,
) -> dict[str, tuple[int, ...]]:
    """Shape of every tensor of the main graph with the inputs fixed to ``input_shapes``.

    ONNX shape inference runs on a weight-less copy whose input dims are replaced.  Where it leaves a
    node's output unsettled, onnxruntime's symbolic shape inference (:mod:`onnxpipe.ir.symbolic`) is asked
    too, and the answer with fewer unknown dims wins.  Dims still unsettled take the size the inputs
    gave their symbolic name, else 1.  Tensors of unknown rank are left out.  ``notes`` gets a line
    naming the tensors whose dims stayed unsettled.  ``symbolic=False`` asks ONNX's inference alone
    (what the benchmarks compare against).
    """
    symbols = symbol_sizes(view, input_shapes)
    light = weightless_copy(view.proto, view.base_dir)
    del light.graph.value_info[:]
    set_input_shapes(light.graph, input_shapes)
    found = inferred_dims(light)
    for name, info in view.tensors.items():
        offer_dims(found, name, info.shape)

    # a dim named after an input's symbol (``batch``) is settled by the inputs' sizes; ``unk__3`` is not
    # a sequence, map or optional (typed UNDEFINED by shape inference) has no shape to settle
    tensors = [
        t
        for n in view.nodes
        for t in n.outputs
        if t and (t not in view.tensors or view.tensors[t].elem_type != onnx.TensorProto.UNDEFINED)
    ]

    def unsettled() -> list[str]:
        return [
            t
            for t in tensors
            if t not in found or any(not isinstance(d, int) and d not in symbols for d in found[t])
        ]

    if unsettled():
        for name, dims in ((symbolic_dims(light) if symbolic else None) or {}).items():
            offer_dims(found, name, dims)
        left = unsettled()
        if left and notes is not None:
            why = (
                "symbolic shape inference was not asked"
                if not symbolic
                else "onnxruntime's symbolic shape inference could not settle them either"
                if symbolic_available()
                else f"{install_hint('shapes')} installs sympy, which lets onnxruntime's symbolic shape "
                "inference settle them"
            )
            notes.append(
                f"{len(left)} tensor(s) have dims shape inference left unsettled, sized from the inputs' "
                f"symbols or as 1 (e.g. {names_text(left, 3)}): {why}"
            )
    result = {
        name: tuple(d if isinstance(d, int) else symbols.get(d, 1) if isinstance(d, str) else 1 for d in dims)
        for name, dims in found.items()
    }
    result |= {name: tuple(int(d) for d in given) for name, given in input_shapes.items()}
    return result | {t.name: tuple(int(d) for d in t.dims) for t in view.proto.graph.initializer}


def inferred_dims(model: onnx.ModelProto) -> dict[str, tuple[Dim, ...]]:
    """The dims ONNX shape inference (with data propagation) gives the value infos, outputs and inputs
    of ``model``'s main graph; the model's own declarations where inference fails."""
    try:
        graph = shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True).graph
    except Exception:  # noqa: BLE001 - best effort: the model's own declarations remain
        graph = model.graph
    found: dict[str, tuple[Dim, ...]] = {}
    for vi in [*graph.value_info, *graph.output, *graph.input]:
        offer_dims(found, vi.name, value_dims(vi))
    return found


def offer_dims(found: dict[str, tuple[Dim, ...]], name: str, dims: tuple[Dim, ...] | None) -> None:
    """Keep ``dims`` as ``name``'s in ``found`` where it holds none yet, or dims with more unknowns."""
    if dims is not None and (name not in found or _unknowns(found[name]) > _unknowns(dims)):
        found[name] = dims


def _unknowns(dims: Sequence[Dim]) -> int:
    return sum(1 for d in dims if not isinstance(d, int))
