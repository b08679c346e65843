"""Knowing a decoder LLM: its KV cache pairs, each node's layer, its embedding and its LM head.

A decoder with a KV cache takes each layer's past keys and values as inputs and returns them, grown by
the new tokens, as outputs.  Splitting one well means keeping each layer's past and present key and value
in one stage (ONNX Runtime GenAI's ``decoder-pipeline`` requires it, and a stage's worker can then keep
its own layers' cache), cutting only between layers, and never charging the cache to the links.

:func:`find_decoder` finds the pairs by the exporters' naming conventions (``past_key_values.N.key`` with
``present.N.key``, ``past.N.value``, ``past_key_N``, ``key_cache.N``...) and *confirms* each through the
graph: the present must be computed from the past of the same layer.  Each node's layer comes from the
exporter's name scopes (``/model/layers.3/...`` in node names, torch's ``pkg.torch.onnx.name_scopes``
metadata) where there are any, else from the KV it reads, then made monotone along the edges (a node is in
no earlier layer than what it reads), so that ordering the nodes by layer keeps a topological order.
Nodes before the first layer (the embedding, the rotary tables, the mask) form group ``-1``; the final
norm and LM head group ``L`` (told apart by their scopes).  Without scopes a layer's nodes before its cache
(its input norm and projections) stay with the previous layer, and the head with the last layer: each
cache stays whole, the cuts just carry a little more.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

import onnx

from onnxpipe.core.iocontract import IOContract, Role
from onnxpipe.core.kv import KVPair
from onnxpipe.ir.kv_pairs import find_pairs
from onnxpipe.ir.model import FLOAT_TYPES, INTEGER_TYPES, ModelView, NodeInfo, TensorInfo

SCOPE_KEY = "pkg.torch.onnx.name_scopes"
"""The node metadata key where torch's dynamo exporter lists a node's module scopes."""

SHAPE_OPS = frozenset({"Shape", "Size"})
"""Ops that read a tensor's shape, not its data: they do not make a node part of a layer."""

_LAYER_SCOPE = re.compile(r"(?:^|[./_])(?:layers|layer|h|blocks|block)[._](\d+)(?:$|[./_])")
_HEAD_SCOPE = re.compile(r"(?:^|[./_])(?:lm_head|ln_f|final_layernorm|final_norm|norm)(?:$|[./_])")
_EMBED_SCOPE = re.compile(r"(?:^|[./_])(?:embed_tokens|wte|wpe|embed_positions|embeddings|embed)(?:$|[./_])")


@dataclass(frozen=True)
class DecoderInfo:
    """What :func:`find_decoder` found: the cache pairs, each compute node's layer group, and the ends.

    ``node_layer[name]`` is ``-1`` for what runs before the first layer (the embedding, rotary tables,
    masks), ``0 .. layers - 1`` for a layer, ``layers`` for the final norm and LM head.  ``ids_input``
    is the token input (``tokens`` says whether it takes their ids or their embeddings);
    ``mask_input`` and ``positions_input`` may be absent.
    """

    layers: int
    kv: tuple[KVPair, ...]
    node_layer: Mapping[str, int]
    embedding_nodes: tuple[str, ...]
    lm_head_nodes: tuple[str, ...]
    ids_input: str
    mask_input: str | None
    positions_input: str | None
    scoped: bool
    """Whether the layers came from the exporter's name scopes (else from the KV each node reads)."""
    shape_readers: tuple[tuple[str, str], ...] = ()
    """(node, past) where a node of another layer reads a past tensor's shape only (the past length the
    exporter took from one layer's cache): it reads no cache data."""
    tokens: Role = Role.TOKEN_IDS
    """What ``ids_input`` takes: the tokens' ids, or (``INPUTS_EMBEDS``) their embeddings made by an
    embedding model apart."""

    @property
    def past_inputs(self) -> tuple[str, ...]:
        return tuple(t for p in self.kv for t in p.pasts)

    @property
    def present_outputs(self) -> tuple[str, ...]:
        return tuple(t for p in self.kv for t in p.presents)

    def layer_of_tensor(self) -> dict[str, int]:
        """Every past and present tensor's layer."""
        return {t: p.layer for p in self.kv for t in (*p.pasts, *p.presents)}

    def describe(self) -> str:
        """One line for ``inspect`` and plan notes."""
        how = "name scopes" if self.scoped else "the KV each node reads"
        names = ", ".join(self.kv[0].pasts + self.kv[0].presents)
        embedding = (
            f"takes {self.ids_input} (its embedding model runs apart)"
            if self.tokens == Role.INPUTS_EMBEDS
            else f"embedding {len(self.embedding_nodes)} node(s)"
        )
        cross = "; and a cross-attention cache each (an encoder-decoder's)" if self.kv[-1].cross else ""
        return (
            f"decoder: {self.layers} layers with a KV cache (layer 0: {names}){cross}; layers from {how}; "
            f"{embedding}, LM head {len(self.lm_head_nodes)} node(s)"
        )


def find_decoder(view: ModelView) -> DecoderInfo | None:
    """The decoder structure of ``view``, or ``None`` when it is not a decoder with a KV cache.

    Needs the cache pairs of every layer ``0 .. L-1``, each present computed from its past
    (:func:`onnxpipe.ir.kv_pairs.find_pairs`: by name, else by the attention nodes' slots), and a token
    input (:func:`token_input`: the integer input that indexes the embedding
    table, through whatever gather the exporter wrote), else an embeddings input (:func:`embeds_input`):
    anything less and the model is treated like any other.
    """
    pairs = find_pairs(view)
    if pairs is None:
        return None
    pasts = {t for p in pairs for t in p.pasts}
    ids = token_input(view, pasts, {t for p in pairs for t in p.presents})
    embeds = embeds_input(view, pasts)
    if embeds is not None and (ids is None or not table_reads(view, ids)):  # the mask is no token input
        return _with_layers(view, pairs, embeds, Role.INPUTS_EMBEDS)
    return None if ids is None else _with_layers(view, pairs, ids, Role.TOKEN_IDS)


def embeds_input(view: ModelView, exclude: set[str]) -> str | None:
    """The tokens' embeddings a decoder takes in place of their ids (``inputs_embeds``, ``[batch, new
    tokens, hidden]``): the one float input of rank 3 not in ``exclude`` (the cache) named like
    ``embeds`` (by name: an encoder-decoder's ``encoder_hidden_states`` is no token input)."""
    return _named_input(
        view, "embeds", exclude, lambda t: t.elem_type in FLOAT_TYPES and len(t.shape or ()) == 3
    )


@dataclass(frozen=True)
class FoundDecoder:
    """:func:`find_decoder`'s answer for one view, found once at the door of a request (a split, a plan)
    and passed down, so that each step of the request (its checks, its phases, each plan tried, the
    export) asks it rather than the graph again."""

    view: ModelView
    info: DecoderInfo | None

    @staticmethod
    def of(view: ModelView) -> FoundDecoder:
        return FoundDecoder(view, find_decoder(view))


def decoder_of(view: ModelView, found: FoundDecoder | None) -> DecoderInfo | None:
    """``view``'s decoder: the one ``found`` at the door, when ``view`` is the view it was found on; else
    found now (no door, or a view frozen or cut since the door is another graph)."""
    return found.info if found is not None and view is found.view else find_decoder(view)


def _named_input(
    view: ModelView, word: str, exclude: set[str], fits: Callable[[TensorInfo], bool] = lambda _: True
) -> str | None:
    """The one input not in ``exclude`` whose name holds ``word`` (and whose type ``fits``), else None."""
    found = [t for t in view.inputs if word in t.lower() and t not in exclude and fits(view.tensor(t))]
    return found[0] if len(found) == 1 else None


def node_scopes(view: ModelView, node: NodeInfo) -> tuple[str, ...]:
    """The exporter's scopes of ``node``, innermost last: torch's metadata list, else the node's name
    split at ``/`` (optimum and ORT GenAI's builder name nodes ``/model/layers.3/attn/...``)."""
    proto = view.proto.graph.node[node.index]
    for prop in proto.metadata_props:
        if prop.key == SCOPE_KEY:
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                break
            if isinstance(scopes, list):
                return tuple(str(s) for s in scopes)
    return tuple(s for s in node.name.split("/")[:-1] if s)


def scope_group(scopes: Sequence[str], layers: int) -> int | None:
    """A node's group from its scopes: its layer, ``layers`` for the head, ``-1`` for the embedding."""
    for s in reversed(scopes):
        m = _LAYER_SCOPE.search(s)
        if m is not None and int(m.group(1)) < layers:
            return int(m.group(1))
    for s in reversed(scopes):
        if _HEAD_SCOPE.search(s):
            return layers
        if _EMBED_SCOPE.search(s):
            return -1
    return None


def _with_layers(view: ModelView, pairs: tuple[KVPair, ...], ids: str, tokens: Role) -> DecoderInfo | None:
    """Each compute node's group, monotone along the edges; ``None`` if no consistent layering exists."""
    layers = len({p.layer for p in pairs})  # an encoder-decoder's layer has two pairs (self, cross)
    layer_of = {t: p.layer for p in pairs for t in (*p.pasts, *p.presents)}
    pasts = {t for p in pairs for t in p.pasts}
    compute = view.compute_nodes
    scoped_groups = {n.name: scope_group(node_scopes(view, n), layers) for n in compute}
    scoped = sum(g is not None and 0 <= g < layers for g in scoped_groups.values()) >= layers
    group: dict[str, int] = {}
    tensor_group: dict[str, int] = {}
    for n in compute:
        anchors = [layer_of[t] for t in n.reads if t in pasts and n.op_type not in SHAPE_OPS]
        anchors += [layer_of[t] for t in n.outputs if t in layer_of]
        own = scoped_groups[n.name] if scoped else None
        upstream = [tensor_group[t] for t in n.reads if t in tensor_group]
        g = max([-1, *anchors, *upstream] + ([own] if own is not None else []))
        group[n.name] = g
        for o in n.outputs:
            tensor_group[o] = g
    shape_readers: list[tuple[str, str]] = []
    for p in pairs:  # a layer's cache must be its own: its data read and made by that layer's nodes only
        groups = {group[view.nodes[view.producer[t]].name] for t in p.presents if t in view.producer}
        for t in p.pasts:
            for node in (view.nodes[q] for q in view.consumers.get(t, ())):
                if node.op_type in SHAPE_OPS and group.get(node.name, p.layer) != p.layer:
                    shape_readers.append((node.name, t))
                elif node.op_type not in SHAPE_OPS and not node.is_constant:
                    groups.add(group[node.name])
        if groups != {p.layer}:
            return None
    embedding = tuple(
        n.name
        for n in compute
        if group[n.name] == -1 and ((tokens == Role.TOKEN_IDS and ids in n.reads) or reads_table(view, n))
    )
    head = tuple(n.name for n in compute if group[n.name] == layers)
    return DecoderInfo(
        layers=layers,
        kv=pairs,
        node_layer=group,
        embedding_nodes=embedding,
        lm_head_nodes=head,
        ids_input=ids,
        # an encoder-decoder's encoder_attention_mask is the encoder's, not the decoder's own
        mask_input=_named_input(view, "mask", pasts | {t for t in view.inputs if "encoder" in t.lower()}),
        positions_input=_named_input(view, "position", pasts),
        scoped=scoped,
        shape_readers=tuple(shape_readers),
        tokens=tokens,
    )


# --------------------------------------------------------------------------------------------------
# A decoder's token input and the tables it indexes, found through the graph rather than by names.
#
# Every exporter turns token ids into vectors by reading rows of a table: a plain ``Gather`` (torch, optimum,
# GenAI's builder at fp32), ``GatherBlockQuantized`` (the builder's int4 models, whose embedding is the LM
# head's own 4-bit table when the embeddings are tied), ``GatherND``; the ids may pass through casts and
# reshapes first, and the table may be computed from weights (a ``Transpose`` of a tied LM head's weight, a
# ``Reshape`` of a quantized one).  Position ids read tables too (GPT-2's learned positions, the rotary
# angles), so among the integer inputs that index a table the token input is the one whose table has as
# many rows as the logits have columns: the vocabulary.

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


def io_contract(view: ModelView, dec: DecoderInfo) -> IOContract:
    """The split's IO contract, what a generation loop feeds and reads: ``dec``'s token, mask and
    position inputs, its cache pairs, and the logits (the one output besides the presents, or the one
    named ``logits``).  The planner writes it in the manifest; a manifest written before it gets it from
    here too, from its source model (:func:`onnxpipe.runtime.generation.generator.split_contract`)."""
    presents = set(dec.present_outputs)
    rest = [t for t in view.outputs if t not in presents]
    named = [t for t in rest if "logits" in t.lower()]
    logits = named[0] if len(named) == 1 else (rest[0] if len(rest) == 1 else None)
    pasts = set(dec.past_inputs)
    encoder = [t for t in view.inputs if "encoder" in t.lower() and t not in pasts]  # an encoder-decoder's
    masks = [t for t in encoder if "mask" in t.lower()]  # T5's and Marian's encoder_attention_mask
    encoder = [t for t in encoder if t not in masks]
    cross = any(p.cross for p in dec.kv)
    return IOContract.of_decoder(
        dec.ids_input,
        dec.mask_input,
        dec.positions_input,
        logits,
        dec.kv,
        dec.tokens,
        encoder[0] if len(encoder) == 1 and cross else None,
        masks[0] if len(masks) == 1 and cross else None,
    )
