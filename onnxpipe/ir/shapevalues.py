"""Which tensors are shape values and which are constant-only: what no stage should receive across a cut.

Why: a stage file is handed to runtimes other than onnxruntime.  tract refuses an int64 shape tensor as
a stage input ("Unsupported DatumType in the public API TDim") and cannot type a ``Reshape`` whose shape
arrives from outside; OpenVINO's onnxruntime provider fails on stages that receive values computed only
from weights (Inception v2's first stage sent 117 ``Unsqueeze(initializer)`` tensors).  Both kinds are
cheap to make again where they are read, so :mod:`onnxpipe.planning.recompute` has the consumer stage
recompute them from what it already has, and :func:`onnxpipe.ir.static.fold_constants` folds the
constant ones.

* A **shape value** is an integer tensor that reaches, through integer shape arithmetic only, an input
  of an op that reads it as a shape, an index range or axes (``Reshape``'s shape, ``Expand``'s shape,
  ``Slice``'s starts/ends/axes/steps, ``Range``, ``ConstantOfShape``, ``Tile``'s repeats, ...).
* A **constant-only value** is computed from initializers and constants alone (no model input reaches
  it), by deterministic ops: random generators are left out, since a copy would draw other numbers.
* A **shape-derived value** is computed from shapes alone: a ``Shape`` or ``Size`` of a data tensor,
  and what deterministic ops make of such values and constants, whatever reads it (a sequence length
  that indexes a flattened mask, ``Shape(mask)[1]`` in a torch-exported BERT; a causal mask built with
  ``Range``, ``LessOrEqual`` and ``Where`` from ``Shape(input_ids)``; the ``If`` condition of a voice
  detector made from ``Shape(state)``).  Its values follow the input sizes only, so any stage that has a
  tensor of the same dims can make it, and tract refuses the integer ones as stage inputs just the same.

Each is found in one pass over the view's nodes (linear in the graph).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

import onnx

from onnxpipe.core.dims import Dim
from onnxpipe.ir.external import is_external
from onnxpipe.ir.model import INTEGER_TYPES, ModelView
from onnxpipe.ir.symbolic import symbolic_dims

SHAPE_INPUTS: Mapping[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Slice": (1, 2, 3, 4),
    "Range": (0, 1, 2),
    "ConstantOfShape": (0,),
    "Tile": (1,),
    "Unsqueeze": (1,),
    "Squeeze": (1,),
    "Split": (1,),
    "Pad": (1, 3),
    "Resize": (3,),
    "Upsample": (),
    "TopK": (1,),
    "OneHot": (1,),
    "ReduceSum": (1,),
    "ReduceMean": (1,),
    "ReduceMax": (1,),
    "ReduceMin": (1,),
    "ReduceProd": (1,),
    "CenterCropPad": (1,),
    "RandomNormalLike": (),
}
"""Inputs (by position) that an op reads as a shape, a range bound, counts or axes."""

SHAPE_ARITHMETIC = frozenset(
    {
        "Shape", "Size", "Gather", "GatherElements", "Concat", "Unsqueeze", "Squeeze", "Slice", "Cast",
        "Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Max", "Min", "Equal", "Less", "Greater",
        "Where", "Not", "And", "Or", "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin", "Identity",
        "Reshape", "Range", "Constant", "ConstantOfShape", "Expand", "Floor", "Ceil", "Sqrt",
    }
)  # fmt: skip
"""Ops that shape arithmetic is written with (what torch and tf2onnx exporters emit between a ``Shape``
and the op reading the result)."""

RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)
"""Ops whose outputs differ from run to run: never copied into a second stage."""


@dataclass(frozen=True)
class ValueKinds:
    """The tensors of a view that a stage should make itself rather than receive."""

    shape_values: frozenset[str]
    constant_only: frozenset[str]
    shape_derived: frozenset[str] = frozenset()
    """Tensors computed from shapes alone (see the module docstring): a superset of most shape values."""
    settled_shapes: Callable[[], Mapping[str, tuple[Dim, ...]]] | None = None
    """Dims of the model's tensors from onnxruntime's symbolic inference (:mod:`onnxpipe.ir.symbolic`),
    computed on the first call (it costs seconds on a transformer): a ``Shape`` of a tensor a stage
    lacks may then be read off a tensor it has whose dims ONNX's own inference left as made-up symbols."""

    def recomputable(self, tensor: str) -> bool:
        return tensor in self.shape_values or tensor in self.constant_only or tensor in self.shape_derived


def value_kinds(view: ModelView) -> ValueKinds:
    """Shape values and constant-only values of ``view`` (see the module docstring)."""

    @functools.cache
    def settled() -> Mapping[str, tuple[Dim, ...]]:
        return symbolic_dims(view.proto) or {}

    const = constant_only(view)
    return ValueKinds(
        shape_values=shape_values(view),
        constant_only=const,
        shape_derived=shape_derived(view, const),
        settled_shapes=settled,
    )


def _is_integer(view: ModelView, tensor: str) -> bool:
    return view.tensor(tensor).elem_type in INTEGER_TYPES


def shape_values(view: ModelView) -> frozenset[str]:
    """Integer tensors that reach a shape input through integer shape arithmetic (made by a node)."""
    found: set[str] = set()
    stack: list[str] = []
    for node in view.nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        for pos in SHAPE_INPUTS.get(node.op_type, ()):
            if pos < len(node.inputs) and _is_integer(view, node.inputs[pos]):
                stack.append(node.inputs[pos])
    while stack:
        t = stack.pop()
        if t in found or t not in view.producer:
            continue
        found.add(t)
        maker = view.nodes[view.producer[t]]
        if maker.op_type not in SHAPE_ARITHMETIC or maker.op_type == "Shape" or maker.has_subgraph:
            continue
        stack.extend(i for i in maker.inputs if _is_integer(view, i))
    return frozenset(found)


def constant_only(view: ModelView) -> frozenset[str]:
    """Tensors made by nodes (constant producers included) from initializers and constants alone."""
    const: set[str] = set(view.initializers)
    made: set[str] = set()
    todo = [
        n
        for n in view.nodes
        if n.op_type not in RANDOM_OPS and not n.has_subgraph and n.domain in ("", "ai.onnx")
    ]
    changed = True
    while changed:  # the view may list a constant producer after its readers: to a fixed point
        changed = False
        rest = []
        for node in todo:
            # Shape of a static tensor is exported as a Constant
            if (node.op_type == "Shape" and node.is_constant) or all(t in const for t in node.reads):
                const.update(node.outputs)
                made.update(node.outputs)
                changed = True
            else:
                rest.append(node)
        todo = rest
    return frozenset(made)


def shape_derived(view: ModelView, const: frozenset[str] | None = None) -> frozenset[str]:
    """Tensors computed from shapes alone: the outputs of ``Shape`` and ``Size`` nodes (but those of
    static tensors, which are constants) and of every deterministic node of the standard domain, without
    subgraphs, that reads only such tensors, initializers and constant-only values (``const``, worked
    out when not given).  Found forward from the ``Shape`` nodes, each node looked at once per input."""
    known = set(view.initializers) | set(constant_only(view) if const is None else const)
    found: set[str] = set()
    stack: list[str] = []
    for node in view.nodes:
        if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx") and not node.is_constant:
            found.update(node.outputs)
            stack.extend(node.outputs)
    while stack:
        t = stack.pop()
        for pos in view.consumers.get(t, ()):
            node = view.nodes[pos]
            if node.op_type in RANDOM_OPS or node.has_subgraph or node.domain not in ("", "ai.onnx"):
                continue
            if all(o in found for o in node.outputs) or not all(r in found or r in known for r in node.reads):
                continue
            found.update(node.outputs)
            stack.extend(node.outputs)
    return frozenset(found - known)


# --------------------------------------------------------------------------------------------------
# Tensors that provably hold the same value: value numbering over the main graph.
#
# Exporters repeat computations.  A torch-exported BERT builds its attention mask once per layer, each
# time a ``Where`` of the same tensor and of equal constants.  onnxruntime merges such repeats inside one
# session (common subexpression elimination), so the whole model computes the mask once.  A stage cut
# undoes that: each repeat that a later stage reads becomes a graph output of its own, which onnxruntime
# must compute and may not merge, and each is sent across the cut, which the ``stagecost`` benchmark sees
# as time the first stage spends on copies.  :func:`onnxpipe.planning.stages.assign_stages` sends one tensor
# of each class instead, and the receiving stage makes the others from it with ``Identity`` nodes.
#
# The classes are exact, not measured: two tensors share one when they are the same graph input;
# initializers or ``Constant`` values of equal type, dims and bytes; or the same output of two nodes with
# equal op type, attributes and inputs of equal classes.  Only deterministic ops of the default domain
# without subgraphs join others.  Random ops, ``Dropout``, other domains, model-local functions, control
# flow, and initializers or attributes over :data:`CONTENT_LIMIT` bytes (or stored outside the file) each
# form a class of their own: large weights are never compared.

CONTENT_LIMIT = 1 << 16
"""Initializers and attributes up to this many bytes are compared by content; larger ones only equal
themselves."""

NONDETERMINISTIC = RANDOM_OPS | {"Dropout"}
"""Ops whose outputs two runs on equal inputs need not share (``Dropout`` in training mode is random)."""


def value_classes(view: ModelView) -> dict[str, int]:
    """A class number for every tensor of the main graph; equal numbers mean provably equal values."""
    keys: dict[Hashable, int] = {}
    classes: dict[str, int] = {}

    def intern(key: Hashable) -> int:
        return keys.setdefault(key, len(keys))

    def own(name: str) -> int:
        return intern(("own", name))

    graph = view.proto.graph
    declared_inputs = {vi.name for vi in graph.input}
    for t in graph.initializer:
        # an initializer listed among the graph inputs can be fed by the caller: only equal to itself
        small = not is_external(t) and view.initializers.get(t.name, CONTENT_LIMIT + 1) <= CONTENT_LIMIT
        classes[t.name] = (
            intern(("tensor", _tensor_bytes(t))) if small and t.name not in declared_inputs else own(t.name)
        )
    for name in view.inputs:
        classes[name] = own(name)
    local_functions = {(f.domain, f.name) for f in view.proto.functions}
    for info in view.nodes:
        node = graph.node[info.index]
        alone = (
            info.has_subgraph
            or node.domain not in ("", "ai.onnx")
            or node.op_type in NONDETERMINISTIC
            or (node.domain, node.op_type) in local_functions
            or any(a.ByteSize() > CONTENT_LIMIT for a in node.attribute)  # a large Constant: not hashed
        )
        if alone:
            for o in node.output:
                if o:
                    classes[o] = own(o)
            continue
        ins = tuple(classes[i] if i in classes else own(i) if i else -1 for i in node.input)
        attrs = tuple(sorted((a.name, _attribute_bytes(a)) for a in node.attribute))
        for k, o in enumerate(node.output):
            if o:
                classes[o] = intern(("node", node.op_type, ins, attrs, k))
    return classes


def _tensor_bytes(t: onnx.TensorProto) -> bytes:
    """The tensor's serialization without its name and doc string: equal for equal type, dims and data."""
    copy = onnx.TensorProto()
    copy.CopyFrom(t)
    copy.ClearField("name")
    copy.ClearField("doc_string")
    return bytes(copy.SerializeToString())


def _attribute_bytes(a: onnx.AttributeProto) -> bytes:
    """The attribute's serialization with the names of tensors inside it (a ``Constant``'s value) left
    out: they are labels, not values."""
    if not (a.doc_string or a.HasField("t") or a.tensors or a.HasField("sparse_tensor")):
        return bytes(a.SerializeToString())  # nothing to leave out: no copy (most attributes)
    copy = onnx.AttributeProto()
    copy.CopyFrom(a)
    copy.ClearField("doc_string")
    if copy.HasField("t"):
        copy.t.ClearField("name")
    for t in copy.tensors:
        t.ClearField("name")
    if copy.HasField("sparse_tensor"):
        copy.sparse_tensor.values.ClearField("name")
        copy.sparse_tensor.indices.ClearField("name")
    return bytes(copy.SerializeToString())
