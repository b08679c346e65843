"""A decoder's dims and context, from its graph and its own config: what a cache, a generator and GenAI
are sized with.

The graph says most of it, though not always where an exporter would put it: the cache's head count and
head size in the past tensors' shape, or (GenAI's builder names the head size ``kv_cache_dim``) in the
attributes of the attention node that reads the cache (``num_heads``, ``kv_num_heads``) and the width of
its packed q/k/v projection; the vocabulary in the logits' last dim, else the embedding table's rows; the
hidden size in the embedding table's row width (dequantized for the builder's int4 tables); the positions
the model has angles or embeddings for in its rotary or position tables.  The model's own config beside it
(:func:`onnxpipe.core.model_config.config_beside`) adds its context length and token ids, when its dims
agree with the graph's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from onnxpipe.core.choices import Phase
from onnxpipe.core.iocontract import Role
from onnxpipe.core.kv import KVPair
from onnxpipe.core.model_config import FolderConfig, ModelDims, SourceConfig, config_beside
from onnxpipe.ir.decoder import DecoderInfo, embeds_input, from_weights, reads_table, table_read, vocabulary
from onnxpipe.ir.decoder_kinds import PhaseShape, phase_shape
from onnxpipe.ir.kv_pairs import ATTENTION_SLOTS, PAST_NAME
from onnxpipe.ir.model import FLOAT_TYPES, INTEGER_TYPES, ModelView, NodeInfo, itemsize


@dataclass(frozen=True)
class DecoderDims(ModelDims):
    """What the graph says of a decoder's sizes (None where it does not say; its layers it always says).
    ``attention_heads``: the query heads of an attention node that reads the cache (``num_heads``)."""

    layers: int
    position_rows: int | None = None
    """Positions the model has angles or embeddings for (its rotary or position table's rows)."""


def decoder_dims(view: ModelView, dec: DecoderInfo) -> DecoderDims:
    """The decoder's dims as its graph gives them."""
    pair = dec.kv[0]
    layout = cache_layout(view, pair.past_key, pair.present_key, batch_symbol(view, dec.ids_input))
    kv_heads, head_size = layout.dims if len(layout.dims) == 2 else (None, None)
    heads, attention_kv_heads = attention_heads(view, pair.past_key)
    kv_heads = kv_heads or attention_kv_heads
    symbolic = (view.tensor(pair.past_key).shape or (None,))[-1]
    head_size = head_size or (attention_head_sizes(view).get(symbolic) if isinstance(symbolic, str) else None)
    tables = _tables(view, dec)
    vocab = vocabulary(view, set(dec.present_outputs)) or max((rows for rows, _ in tables), default=None)
    hidden = next((cols for rows, cols in tables if rows == vocab), None) or _embeds_width(view, dec)
    if head_size is None and heads is not None and hidden is not None and hidden % heads == 0:
        head_size = hidden // heads  # the usual layout: the query heads split the hidden size
    positions = [rows for rows, cols in tables if rows != vocab and (hidden is None or cols == hidden)]
    positions += _rotary_rows(view)
    return DecoderDims(
        layers=dec.layers,
        kv_heads=kv_heads,
        head_size=head_size,
        vocab_size=vocab,
        hidden_size=hidden,
        position_rows=min(positions) if positions else None,
        attention_heads=heads,
    )


def _embeds_width(view: ModelView, dec: DecoderInfo) -> int | None:
    """The hidden size an ``inputs_embeds`` decoder takes (its input's last dim; it has no table)."""
    shape = view.tensor(dec.ids_input).shape if dec.tokens == Role.INPUTS_EMBEDS else None
    return shape[-1] if shape and isinstance(shape[-1], int) else None


_HEAD_ATTRIBUTES = (("num_heads", "q_num_heads"), ("kv_num_heads",))


def attention_heads(view: ModelView, past: str) -> tuple[int | None, int | None]:
    """(query heads, key/value heads) from the attributes of an attention op that reads ``past``
    (onnxruntime's ``GroupQueryAttention``/``MultiHeadAttention``, ONNX's ``Attention``)."""
    for pos in view.consumers.get(past, ()):
        found = view.int_attributes(view.nodes[pos])
        query, kv = (next((found[k] for k in keys if found.get(k, 0) > 0), None) for keys in _HEAD_ATTRIBUTES)
        if query is not None:
            return query, kv or query
    return None, None


def _tables(view: ModelView, dec: DecoderInfo) -> list[tuple[int, int]]:
    """(rows, row width) of each weight-made table the nodes before the layers gather from."""
    embedding = set(dec.embedding_nodes)
    reads = [table_read(view, n) for n in view.nodes if n.name in embedding and reads_table(view, n)]
    return [r for r in reads if r is not None]


ROTARY_TABLE_SLOTS = {"GroupQueryAttention": (7,), "RotaryEmbedding": (1, 2)}
"""Where a node takes its rotary ``cos_cache`` (``[positions, rotary dim / 2]``): GroupQueryAttention's
input 7, onnxruntime's RotaryEmbedding input 2 and ONNX's input 1."""


def _rotary_rows(view: ModelView) -> list[int]:
    """The positions of the rotary tables the attention and rotary nodes take (GenAI's builder gives them
    ``max_position_embeddings`` rows): positions past them have no angles."""
    rows = []
    for node in view.nodes:
        slots = ROTARY_TABLE_SLOTS.get(node.op_type, ())
        proto = view.proto.graph.node[node.index]  # by position: with its empty inputs
        for slot in slots:
            table = proto.input[slot] if len(proto.input) > slot else ""
            shape = view.tensor(table).shape if table and from_weights(view, table) else None
            if shape and len(shape) == 2 and isinstance(shape[0], int):
                rows.append(shape[0])
                break
    return rows


# --------------------------------------------------------------------------------------------------
# the model's own config and its context


def own_config(view: ModelView, dec: DecoderInfo, dims: DecoderDims | None = None) -> FolderConfig:
    """The config beside the model (:func:`config_beside`), set aside with a note when its layers,
    vocabulary, key/value heads, head size or hidden size contradict the graph's: it belongs to another
    model."""
    found = config_beside(view.path)
    config = found.config
    if config is None:
        return found
    contradiction = config.dims.contradicted(dims or decoder_dims(view, dec))
    if contradiction is not None:
        key, said, seen = contradiction
        note = f"{config.path.name} beside the model says {key} {said}, the model has {seen}: not read"
        return FolderConfig(None, (*found.notes, note))
    return found


@dataclass(frozen=True)
class ModelContext:
    """The positions the model itself takes, and what says so."""

    tokens: int
    source: str


def own_context(view: ModelView, dec: DecoderInfo, config: SourceConfig | None = None) -> ModelContext | None:
    """The smallest context the model's config (``config``, else the one beside it) and its position or
    rotary tables allow; None when nothing says one."""
    dims = decoder_dims(view, dec)
    if config is None:
        config = own_config(view, dec, dims).config
    found = []
    if config is not None and config.context_length is not None:
        found.append(ModelContext(config.context_length, config.path.name))
    if dims.position_rows is not None:
        found.append(ModelContext(dims.position_rows, "its position table"))
    return min(found, key=lambda c: c.tokens) if found else None


def counted_context(view: ModelView, dec: DecoderInfo, max_context: int) -> int:
    """The context the KV cache is counted (and checked) at: ``max_context``, or the model's own where
    that is smaller (a cache never holds more positions than the model takes)."""
    own = own_context(view, dec)
    return min(max_context, own.tokens) if own is not None else max_context


@dataclass(frozen=True)
class DecoderFacts:
    """A decoder's dims as its graph gives them, its own config (and why one beside it was set aside),
    and its context: what ``inspect`` shows."""

    dims: DecoderDims
    config: FolderConfig
    context: ModelContext | None
    model: Path | None = None
    """The model's file, whose folder the config is beside (or one folder up from)."""

    def describe(self) -> str:
        """One line: vocabulary, context and where it came from, heads, token ids, the config read."""
        d = self.dims
        config = self.config.config
        tokens = config.tokens if config is not None else None
        parts = [
            f"vocabulary {_said(d.vocab_size)}",
            f"context {self.context.tokens} ({self.context.source})" if self.context else "context ?",
            f"heads {_said(d.attention_heads)}, KV heads {_said(d.kv_heads)}, head size {_said(d.head_size)}",
            f"eos {', '.join(map(str, tokens.eos))}" if tokens is not None else "no token ids",
            self._config_text(),
        ]
        return "model: " + "; ".join([", ".join(parts), *self.config.notes])

    def _config_text(self) -> str:
        config = self.config.config
        if config is None:
            return "no config" if self.config.notes else "no config beside it"
        if self.model is not None and config.path.parent.absolute() != self.model.absolute().parent:
            return f"config {config.path.name} one folder up ({config.path.parent})"
        return f"config {config.path.name}"


def _said(value: int | None) -> str:
    return "?" if value is None else str(value)


def decoder_facts(view: ModelView, dec: DecoderInfo) -> DecoderFacts:
    """:class:`DecoderFacts` of the decoder ``view``."""
    dims = decoder_dims(view, dec)
    found = own_config(view, dec, dims)
    return DecoderFacts(dims, found, own_context(view, dec, found.config), view.path)


# --------------------------------------------------------------------------------------------------
# Sizes for a decoder's inputs, derived from one another: past length, new tokens, total length.
#
# A decoder's inputs name four sizes with symbols: the batch, the new tokens (``input_ids``,
# ``position_ids``), the cached tokens (each ``past_key_values.N.*``'s sequence axis) and the total (the
# attention mask: past plus new).  Sized independently by the generic rule (every non-batch dim 16) they
# contradict each other (a mask of 16 for a past of 16 and 16 new tokens) and the model fails in a ``Gather``
# of the mask.  Here the symbols are found from the inputs' roles and sized together for one phase:
#
# * **decode** (the default): one new token after ``DECODE_PAST`` cached ones, what a generation step
#   runs and what most of the time of a generation goes to;
# * **prefill**: ``PREFILL_TOKENS`` new tokens and no past (a zero-length cache, as ONNX Runtime GenAI
#   runs a prompt).
#
# Sizes the user gives (``--shape``) win: a past length or a new-token count read from them is used for
# the other inputs that share it, and the total is their sum.  Only inputs found by name (see
# :func:`decoder_roles`) are sized so; everything else keeps the generic rule of :mod:`onnxpipe.ir.shapes`.


@dataclass(frozen=True)
class DecoderRoles:
    """The symbols of a decoder's inputs: ``batch``, ``sequence`` (new tokens), ``past``, ``total``."""

    batch: str | None
    sequence: str | None
    past: str | None
    total: str | None


def decoder_roles(view: ModelView) -> DecoderRoles | None:
    """The symbols of the decoder's inputs, or ``None`` when the inputs do not look like a decoder's
    (no float input named like a past cache with a symbolic sequence axis, or no token input: their ids
    ``[batch, new]`` or their embeddings ``[batch, new, hidden]``)."""
    pasts = [t for t in view.inputs if PAST_NAME.search(t) and view.tensor(t).elem_type in FLOAT_TYPES]
    shapes = [s for s in (view.tensor(t).shape for t in pasts) if s is not None and len(s) >= 3]
    past_sym = next((s[-2] for s in shapes if isinstance(s[-2], str)), None)  # the sequence axis
    batch_sym = next((s[0] for s in shapes if isinstance(s[0], str)), None)
    if past_sym is None:
        return None
    ids = [t for t in view.inputs if "input_ids" in t.lower()] or [
        t  # an integer: no past (a float)
        for t in view.inputs
        if "mask" not in t.lower()
        and "position" not in t.lower()
        and view.tensor(t).elem_type in INTEGER_TYPES
    ]
    embeds = embeds_input(view, set(pasts))
    if len(ids) != 1 and embeds is None:
        return None
    ids_shape = view.tensor(ids[0] if len(ids) == 1 else embeds or "").shape
    if ids_shape is None or len(ids_shape) != (2 if len(ids) == 1 else 3):
        return None
    seq_sym = ids_shape[1] if isinstance(ids_shape[1], str) else None
    masks = [t for t in view.inputs if "mask" in t.lower()]
    mask = (view.tensor(masks[0]).shape or ()) if len(masks) == 1 else ()
    total_sym = mask[-1] if len(mask) >= 2 and isinstance(mask[-1], str) and mask[-1] != seq_sym else None
    return DecoderRoles(batch_sym, seq_sym, past_sym, total_sym)


def decoder_symbol_sizes(
    view: ModelView, given: Mapping[str, int], shape: PhaseShape | None = None
) -> dict[str, int]:
    """Sizes for the decoder's symbols that ``given`` (sizes read from the user's shapes) lacks.

    ``shape``: the phase to size for (default: decode).  A past or new-token count in ``given`` is
    kept, and the total is then their sum; an empty dict when ``view`` is no decoder.
    """
    roles = decoder_roles(view)
    if roles is None:
        return {}
    shape = shape or phase_shape(Phase.DECODE)
    seq = given.get(roles.sequence or "", shape.sequence)
    past = given.get(roles.past or "", shape.past)
    sizes = {roles.batch: 1, roles.sequence: seq, roles.past: past, roles.total: past + seq}
    out = {sym: size for sym, size in sizes.items() if sym and sym not in given}
    for sym, size in attention_head_sizes(view).items():
        if sym not in given and sym not in out:
            out[sym] = size
    return out


_ATTENTION_OPS = frozenset({"GroupQueryAttention", "MultiHeadAttention"})


def attention_head_sizes(view: ModelView) -> dict[str, int]:
    """Sizes of a past tensor's symbolic head dim (GenAI's builder writes ``kv_cache_dim``), read off the
    node that takes it: an onnxruntime attention node, by the query's width over the heads (``num_heads``,
    plus ``2 * kv_num_heads`` when query, key and value come packed in one tensor); a ``Concat`` that grows
    the past, by the new entries' size on that axis (the builder's fp16 models).  Without it the generic
    size (64) makes onnxruntime refuse the cache ("should match the packed KV head dimension")."""
    out: dict[str, int] = {}
    for node in view.nodes:
        if node.op_type in _ATTENTION_OPS:
            _attention_node_sizes(view, node, out)
        elif node.op_type == "Concat":
            _concat_sizes(view, node, out)
    return out


def _attention_node_sizes(view: ModelView, node: NodeInfo, out: dict[str, int]) -> None:
    proto = view.proto.graph.node[node.index]
    inputs = list(proto.input)  # with the empty names of absent optional inputs, by position
    pasts = [inputs[slot] for slot, _ in ATTENTION_SLOTS[(node.op_type, False)] if slot < len(inputs)]
    if not pasts or not inputs[0]:
        return
    attrs = view.int_attributes(node)
    heads = attrs.get("num_heads", 0)
    kv_heads = attrs.get("kv_num_heads", heads)
    query = view.tensor(inputs[0]).shape
    if heads <= 0 or not query or not isinstance(query[-1], int):
        return
    parts = heads + 2 * kv_heads if not inputs[1] else heads  # query, key and value packed in input 0
    if query[-1] % parts:
        return
    head = query[-1] // parts
    for past in pasts:
        shape = view.tensor(past).shape if past in view.inputs else None
        if shape and isinstance(shape[-1], str):
            out.setdefault(shape[-1], head)


def _concat_sizes(view: ModelView, node: NodeInfo, out: dict[str, int]) -> None:
    """The sizes a ``Concat`` of a past input with new entries gives the past's symbolic dims (on every
    axis but the one it grows)."""
    pasts = [t for t in node.inputs if t in view.inputs and PAST_NAME.search(t)]
    if len(pasts) != 1:
        return
    shape = view.tensor(pasts[0]).shape
    axis = view.int_attributes(node).get("axis", 0)
    if not shape:
        return
    for other in node.inputs:
        dims = view.tensor(other).shape
        if other == pasts[0] or not dims or len(dims) != len(shape):
            continue
        for a, (mine, theirs) in enumerate(zip(shape, dims, strict=True)):
            if a != axis % len(shape) and isinstance(mine, str) and isinstance(theirs, int):
                out.setdefault(mine, theirs)


def expression_size(dim: str, symbols: Mapping[str, int]) -> int | None:
    """The size of a dim written as a sum of symbols and numbers (``past_sequence_length + 1``), else
    ``None``."""
    parts = [part.strip() for part in dim.split("+")]
    if len(parts) < 2 or not all(part.isdigit() or part in symbols for part in parts):
        return None
    return sum(int(part) if part.isdigit() else symbols[part] for part in parts)


def decoder_inputs(view: ModelView) -> set[str]:
    """The inputs whose sizes a phase sets: those naming one of the decoder's symbols."""
    roles = decoder_roles(view)
    if roles is None:
        return set()
    symbols = {s for s in (roles.sequence, roles.past, roles.total) if s}
    return {t for t in view.inputs if any(d in symbols for d in (view.tensor(t).shape or ()))}


# --------------------------------------------------------------------------------------------------
# How a decoder's cache tensors are laid out, and the bytes one token adds to them.
#
# Exporters lay a layer's cache out in several ways: ``[batch, kv_heads, past, head_size]`` (optimum,
# torch, GenAI's builder), ``[batch, past, kv_heads, head_size]``, key and value in one tensor
# ``[2, batch, kv_heads, past, head_size]`` (older GPT-2 exports), and some leave a dim besides the batch and
# the past symbolic (the builder names the head size ``kv_cache_dim``).  So the bytes a token adds are not
# "every number in the shape": the batch axis is the one that carries the token input's batch symbol, the
# sequence axis the one where the present differs from the past (``past_sequence_length`` against
# ``total_sequence_length``), and every other dim counts, a symbolic one at the size the model was run at
# (the profiled shapes) or read off the attention node that takes it.


@dataclass(frozen=True)
class CacheLayout:
    """One cache tensor's layout: which axis holds the batch (None where none does) and which the
    tokens, and the size of every other dim (None where nothing tells it)."""

    batch_axis: int | None
    sequence_axis: int
    dims: tuple[int | None, ...]
    """Every dim but the batch and sequence ones, in order."""
    itemsize: int

    def bytes_per_token(self, batch: int = 1) -> int:
        """Bytes one token adds for ``batch`` sequences (the unknown dims counted as 1)."""
        return batch * math.prod(d or 1 for d in self.dims) * self.itemsize


def cache_layout(
    view: ModelView, past: str, present: str, batch_symbol: str | None, shape: Sequence[int] | None = None
) -> CacheLayout:
    """The layout of the cache tensor ``past`` (grown into ``present``); ``batch_symbol``: the token
    input's batch dim (else the first symbolic dim but the tokens' is the batch); ``shape``: a shape the
    model ran with, whose sizes settle the symbolic dims."""
    dims = view.tensor(past).shape or ()
    grown = view.tensor(present).shape or ()
    changed = [a for a, d in enumerate(dims) if a < len(grown) and grown[a] != d and d != batch_symbol]
    sequence_axis = changed[0] if len(changed) == 1 else max(0, len(dims) - 2)
    symbolic = [a for a, d in enumerate(dims) if isinstance(d, str) and a != sequence_axis]
    # without the tokens' batch symbol, the first symbolic dim besides the tokens': a batch leads every
    # layout exporters write
    batch_axis = next((a for a in symbolic if batch_symbol in (None, dims[a])), None)
    heads = attention_head_sizes(view)
    sizes: list[int | None] = []
    for a, d in enumerate(dims):
        if a in (batch_axis, sequence_axis):
            continue
        if shape is not None and a < len(shape):
            sizes.append(int(shape[a]))
        elif isinstance(d, int):
            sizes.append(d)
        else:
            sizes.append(heads.get(d) if isinstance(d, str) else None)
    return CacheLayout(batch_axis, sequence_axis, tuple(sizes), itemsize(view.tensor(past).elem_type))


def kv_bytes_per_token(
    view: ModelView,
    pair: KVPair,
    batch: int = 1,
    shapes: Mapping[str, Sequence[int]] | None = None,
    batch_symbol: str | None = None,
) -> int:
    """Bytes one token adds to ``pair``'s cache (key and value) for ``batch`` sequences; ``shapes``: the
    shapes the model ran with (a profile's), which settle symbolic dims; ``batch_symbol``: the token
    input's batch dim, which finds the batch axis (see :func:`cache_layout`)."""
    given = shapes or {}
    return sum(
        cache_layout(view, past, present, batch_symbol, given.get(past)).bytes_per_token(batch)
        for past, present in zip(pair.pasts, pair.presents, strict=True)
    )


def batch_symbol(view: ModelView, ids: str) -> str | None:
    """The token input's batch dim, where it is a symbol."""
    shape = view.tensor(ids).shape
    return shape[0] if shape and isinstance(shape[0], str) else None


def cache_batch(view: ModelView, pair: KVPair, ids: str, shapes: Mapping[str, Sequence[int]]) -> int:
    """The sequences ``shapes`` (a profile's) hold in ``pair``'s past key: its batch axis's size, 1 when
    the cache has none or the shape is not given."""
    layout = cache_layout(view, pair.past_key, pair.present_key, batch_symbol(view, ids))
    shape = shapes.get(pair.past_key)
    if shape is None or layout.batch_axis is None or layout.batch_axis >= len(shape):
        return 1
    return max(1, int(shape[layout.batch_axis]))
