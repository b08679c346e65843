"""What the graph tells GenAI: the managed tensors' names (the cache's as ``%d`` templates of the layer) and
the dims GenAI sizes its buffers with, read off a decoder's graph alone."""

from __future__ import annotations

import re
from collections.abc import Sequence

from onnxpipe.core.kv import KVPair
from onnxpipe.export.genai.config import GraphDims, TensorNames, Unsupported
from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.model import ModelView


def logits_output(view: ModelView, dec: DecoderInfo) -> str | None:
    """The logits: the output named so, else the one floating-point output that is no cache."""
    presents = set(dec.present_outputs)
    others = [t for t in view.outputs if t not in presents]
    named = [t for t in others if "logits" in t.lower()]
    if len(named) == 1:
        return named[0]
    floats = [t for t in others if view.tensor(t).elem_type in (1, 10, 11, 16)]
    return floats[0] if len(floats) == 1 else None


def tensor_names(
    ids: str, mask: str | None, positions: str | None, logits: str | None, kv: Sequence[KVPair]
) -> TensorNames | Unsupported:
    """The managed tensors' names, the cache's as ``%d`` templates; :class:`Unsupported` when GenAI's
    naming cannot express them (key and value in one tensor, names that follow no template)."""
    if logits is None:
        return Unsupported("no logits output was found")
    if not kv or any(p.past_value is None or p.present_value is None for p in kv):
        return Unsupported("key and value share one cache tensor per layer; GenAI needs them apart")
    if [p.layer for p in kv] != list(range(len(kv))):
        return Unsupported("the cache's layers are not numbered 0 to N-1")
    templates: list[str] = []
    for role in ("past_key", "past_value", "present_key", "present_value"):
        template = layer_template([getattr(p, role) for p in kv])
        if template is None:
            first = getattr(kv[0], role)
            return Unsupported(f"the cache names ({first}, ...) follow no single %d pattern of the layer")
        templates.append(template)
    pk, pv, qk, qv = templates
    return TensorNames(ids, mask, positions, pk, pv, logits, qk, qv)


_NUMBER = re.compile(r"(?<!\d)0(?!\d)")


def layer_template(names: Sequence[str]) -> str | None:
    """The ``%d`` template that gives ``names[i]`` for layer ``i`` (``past_key_values.%d.key``), or None.

    Layer 0's name is tried with each standalone ``0`` in turn as the placeholder; a name holding ``%``
    has none (GenAI would read it as a format)."""
    if not names or any("%" in n for n in names):
        return None
    for m in _NUMBER.finditer(names[0]):
        template = names[0][: m.start()] + "%d" + names[0][m.end() :]
        if all(template % i == n for i, n in enumerate(names)):
            return template
    return None


def graph_dims(view: ModelView, dec: DecoderInfo, logits: str) -> GraphDims | Unsupported:
    """Head count and size from the past key (``[batch, kv_heads, past, head_size]``), the vocabulary from
    the logits' last dim (else the embedding table's rows), the hidden size from the embedding table
    (``[vocab, hidden]``, read by a ``Gather`` of the token ids), the position table's rows (another
    ``[rows, hidden]`` table the embedding reads: GPT-2's ``wpe``) that bound the context."""
    shape = view.tensor(dec.kv[0].past_key).shape
    if shape is None or len(shape) != 4:
        return Unsupported(f"the past key {dec.kv[0].past_key} is not [batch, heads, past, head size]")
    kv_heads = shape[1] if isinstance(shape[1], int) else None
    head_size = shape[3] if isinstance(shape[3], int) else None
    heads, attention_kv_heads = _attention_heads(view, dec.kv[0].past_key)
    kv_heads = kv_heads or attention_kv_heads
    tables = _embedding_tables(view, dec)
    out = view.tensor(logits).shape
    vocab = out[-1] if out and isinstance(out[-1], int) else None
    if vocab is None:
        vocab = max((rows for rows, _ in tables), default=None)
    if vocab is None:
        return Unsupported(
            f"the vocabulary size is neither the logits' ({logits}) last dim nor an embedding's"
        )
    hidden = next((cols for rows, cols in tables if rows == vocab), None)
    positions = [rows for rows, cols in tables if rows != vocab and (hidden is None or cols == hidden)]
    positions += _rotary_rows(view, dec.kv[0].past_key)
    if head_size is None and heads is not None and hidden is not None and hidden % heads == 0:
        head_size = hidden // heads  # the usual layout: the query heads split the hidden size
    return GraphDims(
        layers=dec.layers,
        kv_heads=kv_heads,
        head_size=head_size,
        vocab_size=vocab,
        hidden_size=hidden,
        position_rows=min(positions) if positions else None,
        attention_heads=heads,
    )


_ROTARY_CACHE_INPUT = 7
"""``GroupQueryAttention``'s ``cos_cache`` input: a ``[positions, rotary dim / 2]`` table."""


def _rotary_rows(view: ModelView, past: str) -> list[int]:
    """The positions of the rotary table a ``GroupQueryAttention`` reading ``past`` takes (GenAI's builder
    gives it ``max_position_embeddings`` rows): positions past it have no angles."""
    rows = []
    for pos in view.consumers.get(past, ()):
        proto = view.proto.graph.node[view.nodes[pos].index]  # by position: with its empty inputs
        if proto.op_type == "GroupQueryAttention" and len(proto.input) > _ROTARY_CACHE_INPUT:
            table = proto.input[_ROTARY_CACHE_INPUT]
            shape = view.tensor(table).shape if table in view.weights else None
            if shape and isinstance(shape[0], int):
                rows.append(shape[0])
    return rows


_HEAD_ATTRIBUTES = (("num_heads", "q_num_heads"), ("kv_num_heads",))


def _attention_heads(view: ModelView, past: str) -> tuple[int | None, int | None]:
    """(query heads, key/value heads) from the attribute of an attention op that reads ``past``
    (onnxruntime's ``GroupQueryAttention``/``MultiHeadAttention``, ONNX's ``Attention``), where the
    past's shape leaves them open (GenAI's builder names the head size ``kv_cache_dim``)."""
    for pos in view.consumers.get(past, ()):
        proto = view.proto.graph.node[view.nodes[pos].index]
        found = {a.name: int(a.i) for a in proto.attribute if a.type == a.INT}
        query, kv = (next((found[k] for k in keys if found.get(k, 0) > 0), None) for keys in _HEAD_ATTRIBUTES)
        if query is not None:
            return query, kv or query
    return None, None


def _embedding_tables(view: ModelView, dec: DecoderInfo) -> list[tuple[int, int]]:
    """(rows, columns) of each 2-D weight a ``Gather`` of the embedding reads as its table."""
    tables = []
    by_name = view.node_by_name
    for name in dec.embedding_nodes:
        node = by_name[name]
        if node.op_type != "Gather" or not node.inputs or node.inputs[0] not in view.weights:
            continue
        shape = view.tensor(node.inputs[0]).shape
        if shape is not None and len(shape) == 2 and all(isinstance(d, int) for d in shape):
            rows, cols = shape
            assert isinstance(rows, int) and isinstance(cols, int)
            tables.append((rows, cols))
    return tables


def model_facts(view: ModelView, dec: DecoderInfo) -> tuple[TensorNames, GraphDims] | Unsupported:
    """The names and dims GenAI needs, from the graph alone (used before profiling to refuse a
    ``--genai-config`` early, and at export)."""
    logits = logits_output(view, dec)
    names = tensor_names(dec.ids_input, dec.mask_input, dec.positions_input, logits, dec.kv)
    if isinstance(names, Unsupported):
        return names
    dims = graph_dims(view, dec, names.logits)
    if isinstance(dims, Unsupported):
        return dims
    managed = {dec.ids_input, dec.mask_input, dec.positions_input, *dec.past_inputs}
    extra = [t for t in view.inputs if t not in managed]
    if extra:
        return Unsupported(f"the model takes {extra[0]!r}, which GenAI does not feed")
    return names, dims
