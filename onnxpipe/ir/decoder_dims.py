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

from dataclasses import dataclass
from pathlib import Path

from onnxpipe.core.iocontract import Role
from onnxpipe.core.model_config import FolderConfig, ModelDims, SourceConfig, config_beside
from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.decoder_shapes import attention_head_sizes
from onnxpipe.ir.embedding import from_weights, reads_table, table_read, vocabulary
from onnxpipe.ir.kv_layout import batch_symbol, cache_layout
from onnxpipe.ir.model import ModelView


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
