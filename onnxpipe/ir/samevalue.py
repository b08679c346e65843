"""Tensors that provably hold the same value: value numbering over the main graph.

Exporters repeat computations.  A torch-exported BERT builds its attention mask once per layer, each
time a ``Where`` of the same tensor and of equal constants.  onnxruntime merges such repeats inside one
session (common subexpression elimination), so the whole model computes the mask once.  A stage cut
undoes that: each repeat that a later stage reads becomes a graph output of its own, which onnxruntime
must compute and may not merge, and each is sent across the cut, which the ``stagecost`` benchmark sees
as time the first stage spends on copies.  :func:`onnxpipe.planning.stages.assign_stages` sends one tensor of
each class instead, and the receiving stage makes the others from it with ``Identity`` nodes.

The classes are exact, not measured: two tensors share one when they are the same graph input;
initializers or ``Constant`` values of equal type, dims and bytes; or the same output of two nodes with
equal op type, attributes and inputs of equal classes.  Only deterministic ops of the default domain
without subgraphs join others.  Random ops, ``Dropout``, other domains, model-local functions, control
flow, and initializers or attributes over :data:`CONTENT_LIMIT` bytes (or stored outside the file) each
form a class of their own: large weights are never compared.
"""

from __future__ import annotations

from collections.abc import Hashable

import onnx

from onnxpipe.ir.external import is_external
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapevalues import RANDOM_OPS

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
