"""A decoder's token input and the tables it indexes, found through the graph rather than by names.

Every exporter turns token ids into vectors by reading rows of a table: a plain ``Gather`` (torch, optimum,
GenAI's builder at fp32), ``GatherBlockQuantized`` (the builder's int4 models, whose embedding is the LM
head's own 4-bit table when the embeddings are tied), ``GatherND``; the ids may pass through casts and
reshapes first, and the table may be computed from weights (a ``Transpose`` of a tied LM head's weight, a
``Reshape`` of a quantized one).  Position ids read tables too (GPT-2's learned positions, the rotary
angles), so among the integer inputs that index a table the token input is the one whose table has as
many rows as the logits have columns: the vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator

import onnx

from onnxpipe.ir.model import FLOAT_TYPES, INTEGER_TYPES, ModelView, NodeInfo

GATHERS = frozenset({"Gather", "GatherBlockQuantized", "GatherND"})
"""Ops that read rows of a table (input 0) by the indices in input 1."""

CARRIERS = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"})
"""Ops that carry ids to a gather unchanged in value (only their type or shape changes)."""

_PACKED = frozenset({onnx.TensorProto.UINT8, onnx.TensorProto.INT8})
"""Element types that hold several low-bit values of a block-quantized table per byte."""


def table_reads(view: ModelView, ids: str) -> list[tuple[int, int] | None]:
    """Every gather that indexes a weight-made table with ``ids`` (through :data:`CARRIERS`): its table's
    :func:`table_read`."""
    return [
        table_read(view, node)
        for node, t in index_readers(view, ids, CARRIERS)
        if node.op_type in GATHERS and node.inputs[1:2] == (t,) and from_weights(view, node.inputs[0])
    ]


def index_readers(view: ModelView, ids: str, carriers: Collection[str]) -> Iterator[tuple[NodeInfo, str]]:
    """Each reader of ``ids``, or of what ``carriers`` make of it (their first input carried to their
    output), with the tensor it reads."""
    seen: set[str] = set()
    stack = [ids]
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        for pos in view.consumers.get(t, ()):
            node = view.nodes[pos]
            yield node, t
            if node.op_type in carriers and node.inputs and node.inputs[0] == t:
                stack.extend(node.outputs[:1])


def from_weights(view: ModelView, tensor: str, depth: int = 8) -> bool:
    """Whether ``tensor`` is a weight or made of weights alone (a few nodes deep)."""
    if tensor in view.weights:
        return True
    pos = view.producer.get(tensor)
    if pos is None or depth == 0:
        return False
    node = view.nodes[pos]
    return bool(node.reads) and all(from_weights(view, t, depth - 1) for t in node.reads)


def reads_table(view: ModelView, n: NodeInfo) -> bool:
    """Whether ``n`` gathers rows of a table made of weights alone (an embedding, a position table)."""
    return n.op_type in GATHERS and bool(n.inputs) and from_weights(view, n.inputs[0])


def table_read(view: ModelView, node: NodeInfo) -> tuple[int, int] | None:
    """The rows and the width of a row (dequantized for a block-quantized table) of the table ``node``
    gathers from; None where the shapes do not say."""
    info = view.tensor(node.inputs[0])
    shape = info.shape
    if shape is None or len(shape) < 2 or not all(isinstance(d, int) for d in shape):
        return None
    attrs = view.int_attributes(node)
    axis = attrs.get("gather_axis", attrs.get("axis", 0)) % len(shape)
    rows = shape[axis]
    width = math.prod(d for a, d in enumerate(shape) if a != axis and isinstance(d, int))
    if node.op_type == "GatherBlockQuantized" and info.elem_type in _PACKED:
        width *= 8 // max(1, attrs.get("bits", 4))
    assert isinstance(rows, int)
    return rows, width


def logits_output(view: ModelView, presents: Collection[str]) -> str | None:
    """The logits: the output named so, else the one floating-point output that is no cache."""
    others = [t for t in view.outputs if t not in presents]
    named = [t for t in others if "logits" in t.lower()]
    if len(named) == 1:
        return named[0]
    floats = [t for t in others if view.tensor(t).elem_type in FLOAT_TYPES]
    return floats[0] if len(floats) == 1 else None


def vocabulary(view: ModelView, presents: Collection[str]) -> int | None:
    """The logits' last dim, where it is a number."""
    logits = logits_output(view, presents)
    shape = view.tensor(logits).shape if logits is not None else None
    return shape[-1] if shape and isinstance(shape[-1], int) else None


def token_input(view: ModelView, exclude: Collection[str], presents: Collection[str]) -> str | None:
    """The token ids: of the integer inputs (not in ``exclude``), the one that indexes a table with a row
    per entry of the vocabulary; else the one named ``input_ids``; else the only one that indexes a
    table; else the only one not named a mask or positions."""
    candidates = [t for t in view.inputs if t not in exclude and view.tensor(t).elem_type in INTEGER_TYPES]
    reads = {t: table_reads(view, t) for t in candidates}
    vocab = vocabulary(view, presents)
    by_rows = [t for t in candidates if vocab is not None and any(r and r[0] == vocab for r in reads[t])]
    named = [t for t in candidates if "input_ids" in t.lower()]
    indexing = [t for t in candidates if reads[t]]
    plain = [t for t in candidates if "mask" not in t.lower() and "position" not in t.lower()]
    for found in (by_rows, named, indexing, plain, candidates):
        if len(found) == 1:
            return found[0]
    return None


TIED_SHARE = 0.01
"""A weight counts as a tied table, and a weight shared by stages is named in the export's notes, from
this share of the model's weights on: a tied token embedding and LM head (about 16% of a 0.5B model), not
the small constants exporters share."""


def tied_tables(view: ModelView) -> tuple[str, ...]:
    """The weights (of at least :data:`TIED_SHARE` of the model's) that only nodes of the model's first and
    last quarters read, of both: a tied token embedding and LM head's table, which a split into stages on
    their own workers holds twice; not a table every layer reads (the rotary cos and sin)."""
    n, large = len(view.nodes), TIED_SHARE * view.param_bytes
    found = []
    for t, nbytes in view.weights.items():
        ends = {
            "first" if i < n / 4 else "last" if i >= 3 * n / 4 else "middle"
            for i in view.consumers.get(t, ())
        }
        if nbytes >= large and ends == {"first", "last"}:
            found.append(t)
    return tuple(found)
