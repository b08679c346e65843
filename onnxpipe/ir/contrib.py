"""onnxruntime's own ops written in the default domain: accepted with a note instead of refused.

ONNX Runtime GenAI's model builder (what Olive uses to make the LLM files most users have) writes
``SimplifiedLayerNormalization`` in the default ONNX domain.  onnxruntime registers that op (and its
pre-opset-17 ``LayerNormalization``) there itself, so it runs the model; ``onnx.checker`` knows only
ONNX's ops and refuses it ("No Op registered for SimplifiedLayerNormalization with domain_version of
22").  Refusing would turn away the format most decoder users have, and accepting any unknown op would
let typos through to a late onnxruntime failure.  So the checker runs on a copy in which only these
named ops are moved to onnxruntime's ``com.microsoft`` domain (which the checker does not verify): every
other complaint still refuses the model, and the original complaint is kept as a note.  Stages keep the
nodes exactly as the source wrote them.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from onnxpipe.ir.external import is_external
from onnxpipe.ir.model import default_opset, set_items

ORT_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization", "LayerNormalization"})
"""Ops onnxruntime registers in the default ONNX domain beyond (or before) ONNX's own: the checker
refuses them where the opset lacks them; onnxruntime runs them."""

_CONTRIB_DOMAIN = "com.microsoft"


def check_model(model: onnx.ModelProto | Path) -> str | None:
    """``onnx.checker.check_model``, except that onnxruntime's default-domain ops are accepted.

    Returns ``None`` when the checker accepts the model as it is, or a note with the checker's complaint
    when it accepts it only with those ops set aside.  Raises the checker's
    :class:`onnx.checker.ValidationError` (or ``ValueError``) for anything else.
    """
    try:
        onnx.checker.check_model(str(model) if isinstance(model, Path) else model)
        return None
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "invalid model"
        proto = onnx.load(str(model), load_external_data=False) if isinstance(model, Path) else model
        moved = _moved_to_contrib(proto)
        if moved is None:
            raise
        ops = sorted({n.op_type for n in proto.graph.node if _is_ort_op(n)})
        try:
            onnx.checker.check_model(moved)
        except onnx.checker.ValidationError:
            raise e from None
        return (
            f"onnx.checker refuses the model ({first}); accepted because onnxruntime runs "
            f"{', '.join(ops)} in the default domain (its own contrib op), and the stages keep those nodes"
        )


def _is_ort_op(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in ORT_DEFAULT_DOMAIN_OPS


def _moved_to_contrib(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy with onnxruntime's default-domain ops in ``com.microsoft``; ``None`` if the
    model has none (then the checker's complaint is about something else)."""
    if not any(_is_ort_op(n) for n in proto.graph.node):
        return None
    copy = external_as_inputs(proto)
    for n in copy.graph.node:
        if _is_ort_op(n):
            if n.op_type == "LayerNormalization" and default_opset(copy) >= 17:
                continue  # ONNX's own op from opset 17: the complaint is about something else
            n.domain = _CONTRIB_DOMAIN
    if not any(o.domain == _CONTRIB_DOMAIN for o in copy.opset_import):
        copy.opset_import.append(onnx.helper.make_opsetid(_CONTRIB_DOMAIN, 1))
    return copy


def external_as_inputs(proto: onnx.ModelProto, *, every: bool = False) -> onnx.ModelProto:
    """A copy of ``proto`` whose weights in external files are graph inputs of the same type, for checking
    in memory: initializers, and the values of ``Constant`` nodes (optimum's fp32 exports keep some there).
    ``every``: all its weights, also those held in the model (one over protobuf's 2 GB, which the
    checker cannot take whole).

    The checker checks an in-memory model's external weights by path from the current folder, not from
    the model's (the builder's ``model.onnx.data`` "is not regular file"), and the copy is checked in
    memory; whether those files are there and whole is checked where the model is loaded
    (:mod:`onnxpipe.ir.load`).  As inputs, the weights' types and shapes still meet the checker.
    """
    moved = (lambda t: True) if every else is_external
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    graph = copy.graph
    constants = {
        i: a.t
        for i, n in enumerate(graph.node)
        if n.op_type == "Constant"
        for a in n.attribute
        if a.type == onnx.AttributeProto.TENSOR and moved(a.t)
    }
    values = [(t.name, t) for t in graph.initializer if moved(t)]
    values += [(graph.node[i].output[0], t) for i, t in constants.items()]
    set_items(graph.initializer, [t for t in graph.initializer if not moved(t)])
    graph.input.extend(onnx.helper.make_tensor_value_info(n, t.data_type, list(t.dims)) for n, t in values)
    set_items(graph.node, [n for i, n in enumerate(graph.node) if i not in constants])
    return copy
