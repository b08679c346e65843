"""How a decoder's cache tensors are laid out, and the bytes one token adds to them.

Exporters lay a layer's cache out in several ways: ``[batch, kv_heads, past, head_size]`` (optimum,
torch, GenAI's builder), ``[batch, past, kv_heads, head_size]``, key and value in one tensor
``[2, batch, kv_heads, past, head_size]`` (older GPT-2 exports), and some leave a dim besides the batch and
the past symbolic (the builder names the head size ``kv_cache_dim``).  So the bytes a token adds are not
"every number in the shape": the batch axis is the one that carries the token input's batch symbol, the
sequence axis the one where the present differs from the past (``past_sequence_length`` against
``total_sequence_length``), and every other dim counts, a symbolic one at the size the model was run at
(the profiled shapes) or read off the attention node that takes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from onnxpipe.core.kv import KVPair
from onnxpipe.ir.decoder_shapes import attention_head_sizes
from onnxpipe.ir.model import ModelView, itemsize


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
