"""Sizes for a decoder's inputs, derived from one another: past length, new tokens, total length.

A decoder's inputs name four sizes with symbols: the batch, the new tokens (``input_ids``, ``position_ids``),
the cached tokens (each ``past_key_values.N.*``'s sequence axis) and the total (the attention mask: past
plus new).  Sized independently by the generic rule (every non-batch dim 16) they contradict each other
(a mask of 16 for a past of 16 and 16 new tokens) and the model fails in a ``Gather`` of the mask.  Here
the symbols are found from the inputs' roles and sized together for one phase:

* **decode** (the default): one new token after ``DECODE_PAST`` cached ones, what a generation step
  runs and what most of the time of a generation goes to;
* **prefill**: ``PREFILL_TOKENS`` new tokens and no past (a zero-length cache, as ONNX Runtime GenAI
  runs a prompt).

Sizes the user gives (``--shape``) win: a past length or a new-token count read from them is used for
the other inputs that share it, and the total is their sum.  Only inputs found by name (see
:func:`decoder_roles`) are sized so; everything else keeps the generic rule of :mod:`onnxpipe.ir.shapes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from onnxpipe.core.choices import Phase
from onnxpipe.ir.decoder import embeds_input
from onnxpipe.ir.decoder_kinds import PhaseShape, phase_shape
from onnxpipe.ir.kv_pairs import ATTENTION_SLOTS, PAST_NAME
from onnxpipe.ir.model import FLOAT_TYPES, INTEGER_TYPES, ModelView, NodeInfo


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
