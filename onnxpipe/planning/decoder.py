"""Layer-aligned cuts for decoders: the layers as items, the KV cache as state, its memory per stage.

On a decoder (:func:`onnxpipe.ir.decoder.find_decoder`) the compute nodes are lined up by layer group
(before the layers, layer 0, ..., layer L-1, the head; inside a group in the view's order, which stays
topological since a node's group is never below its inputs'), and the partitioner sees one item per group
(:class:`LayerSequences`): its costs summed, the bytes a stage starting at the group receives.  The optimum
over that coarser sequence is exact for splits that cut only between layers, which is all that is then
allowed: each layer's past and present key and value land in one stage.

The past inputs are state: a stage's worker keeps its layers' cache, so they never cross a link and are
not charged to any (they are "free" in :func:`onnxpipe.ir.graph.cut_profile`, like weights); the presents
are the stage's own outputs and cross nothing either.  Each stage's cache at ``max_context`` tokens (or
the model's own context, where that is smaller) is reported and counted in the device memory check.

Where the embedding and the LM head go (:class:`~onnxpipe.planning.decoder_kinds.Ends`): anywhere the
balance puts them (``free``), with their neighbouring layer (``attached``), or each a stage of its own
(``own``, as Olive's ``unique_embeds_lm_head_splits`` does).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from onnxpipe.core.choices import Ends
from onnxpipe.core.errors import UsageError
from onnxpipe.core.iocontract import IOContract
from onnxpipe.core.options import opt
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.decoder_dims import (
    batch_symbol,
    cache_batch,
    counted_context,
    kv_bytes_per_token,
    own_context,
)
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.recompute import shape_from_dims
from onnxpipe.planning.sequences import Sequences, sequences
from onnxpipe.planning.types import ShapeParts, StageSpec


@dataclass(frozen=True)
class LayerSequences:
    """The fine sequence lined up by layer group, and the groups as coarse items.

    ``seq`` holds one entry per compute node in layer order (its ``allowed`` cuts fall between groups
    only); ``starts[g]`` is where coarse item ``g`` begins in it (``starts[-1]`` is the node count), and
    ``groups[g]`` the layer group of the item (``-1`` before the layers, ``L`` the head).
    """

    seq: Sequences
    starts: tuple[int, ...]
    groups: tuple[int, ...]

    @property
    def coarse_costs(self) -> list[float]:
        c = self.seq.costs
        return [float(sum(c[a:b])) for a, b in itertools.pairwise(self.starts)]

    @property
    def coarse_cut_bytes(self) -> list[int]:
        """What a stage starting at each coarse position receives (one per position ``0 .. n``)."""
        return [self.seq.cut_bytes[a] for a in self.starts]

    def fine_bounds(self, coarse: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.starts[b] for b in coarse)


def layer_sequences(view: ModelView, profile: Profile, dec: DecoderInfo) -> LayerSequences:
    """The compute nodes by layer group, their costs, and the cut bytes with the cache left out."""
    compute = sorted(view.compute_nodes, key=lambda n: (dec.node_layer[n.name], n.position))
    runs = itertools.groupby(range(len(compute)), key=lambda p: dec.node_layer[compute[p].name])
    groups, starts = [], []
    for g, positions in runs:
        groups.append(g)
        starts.append(next(positions))
    starts.append(len(compute))
    boundary = set(starts)
    seq = dataclasses.replace(
        sequences(view, profile, compute, set(view.weights) | set(dec.past_inputs)),
        allowed=tuple(p in boundary for p in range(len(compute) + 1)),
        cuttable=None,
    )
    return LayerSequences(seq, tuple(starts), tuple(groups))


def coarse_allowed(layers: LayerSequences, dec: DecoderInfo, ends: Ends) -> list[bool]:
    """Which coarse boundaries a stage may start at: all of them but those ``ends`` glues together."""
    n = len(layers.groups)
    allowed = [True] * (n + 1)
    if ends == Ends.ATTACHED:
        for g in range(1, n):
            before, here = layers.groups[g - 1], layers.groups[g]
            if (before == -1 and here == 0) or (before == dec.layers - 1 and here == dec.layers):
                allowed[g] = False
    return allowed


def layer_cut_items(
    view: ModelView, profile: Profile, dec: DecoderInfo, ends: Ends, what: str
) -> tuple[LayerSequences, list[bool]]:
    """The decoder's layer groups and which of their boundaries a stage may start at (``--ends
    attached``: not between the embedding and the first layer, the last layer and the head), for the
    partitioners that take one sequence with allowed cuts (devices, interleaved workers); ``what``: the
    option those plans come from, for ``--ends own``, which they cannot make."""
    refuse_own_ends(ends, what)
    layers = layer_sequences(view, profile, dec)
    return layers, coarse_allowed(layers, dec, ends)


def refuse_own_ends(ends: Ends, what: str) -> None:
    """``ends="own"`` is planned for a chain of identical workers only: refused with ``what`` (the
    option that asks for another plan: a devices file, workers)."""
    if ends == Ends.OWN:
        raise UsageError(
            f"{opt('ends', Ends.OWN)} with {what}: the embedding and LM head stages of their own are planned "
            f"for a chain of identical workers only; give {opt('ends', Ends.FREE)} or attached"
        )


def fine_allowed(layers: LayerSequences, coarse: Sequence[bool]) -> Sequences:
    """``layers.seq`` with a stage allowed to start only at the coarse boundaries ``coarse`` allows."""
    allowed = {p for p, ok in zip(layers.starts, coarse, strict=True) if ok}
    return dataclasses.replace(
        layers.seq, allowed=tuple(p in allowed for p in range(len(layers.seq.compute) + 1))
    )


def with_kv(
    view: ModelView, profile: Profile, dec: DecoderInfo, specs: Sequence[StageSpec], max_context: int
) -> tuple[StageSpec, ...]:
    """``specs`` with each stage's own layers (where their presents are made) and their cache's bytes at
    the context counted (:func:`counted_context`: ``max_context``, or the model's own where smaller) for
    the profiled batch and shapes, and only its own layers' pasts as inputs (:func:`own_cache_only`)."""
    makers = kv_makers(view, dec, profile.input_shapes, counted_context(view, dec, max_context))
    out = []
    for st in specs:
        mine = [makers[n] for n in st.node_names if n in makers]
        owned, nbytes = tuple(sorted({layer for layer, _ in mine})), sum(b for _, b in mine)
        out.append(own_cache_only(view, dec, dataclasses.replace(st, kv_layers=owned, kv_cache_bytes=nbytes)))
    return tuple(out)


def context_words(view: ModelView, dec: DecoderInfo, max_context: int) -> str:
    """ "N tokens of context", saying where the model's own context made N smaller than ``max_context``."""
    own = own_context(view, dec)
    if own is None or own.tokens >= max_context:
        return f"{max_context} tokens of context"
    under = opt("max_context", max_context)
    return f"{own.tokens} tokens of context (the model's own, from {own.source}, under {under})"


def kv_makers(
    view: ModelView, dec: DecoderInfo, shapes: Mapping[str, Sequence[int]], context: int
) -> dict[str, tuple[int, int]]:
    """For each node that makes a layer's present key: the layer, and its cache's bytes at ``context``
    tokens for the batch and the head dims of ``shapes`` (the profiled input shapes).  Where that node
    runs, the layer's cache is held.  An encoder-decoder's cross-attention cache counts at the encoder's
    frames (its present's length), not the context: it holds the encoder's output, whatever the tokens."""
    batch = cache_batch(view, dec.kv[0], dec.ids_input, shapes)
    symbol = batch_symbol(view, dec.ids_input)
    makers: dict[str, tuple[int, int]] = {}
    for p in dec.kv:
        pos = view.producer.get(p.present_key)
        if pos is None:
            continue
        frames = (view.tensor(p.present_key).shape or (None, None))[-2]
        length = frames if p.cross and isinstance(frames, int) else context
        makers[view.nodes[pos].name] = (p.layer, kv_bytes_per_token(view, p, batch, shapes, symbol) * length)
    return makers


def own_cache_only(view: ModelView, dec: DecoderInfo, stage: StageSpec) -> StageSpec:
    """``stage`` reading no other layer's cache: each ``Shape`` of another layer's past (the past length
    torch's exporter reads off one layer's cache, :attr:`DecoderInfo.shape_readers`) is made of the
    dims of tensors the stage has (its own layers' pasts, the mask), and that past leaves its inputs.

    Why: a worker holds only its own layers' cache, and ONNX Runtime GenAI's ``decoder-pipeline`` feeds
    each stage only its own layers' past.  A past that some node reads otherwise, or whose dims are not
    found so, stays an input (:func:`foreign_pasts` names it).
    """
    layer_of = dec.layer_of_tensor()
    owned = set(stage.kv_layers)
    pasts = set(dec.past_inputs)
    foreign = [t for t in stage.inputs if t in pasts and layer_of[t] not in owned]
    if not foreign:
        return stage
    have = {t for t in stage.inputs if t not in foreign}
    have |= {t for t in view.inputs if t not in pasts or layer_of[t] in owned}
    by_name = {n.name: n for n in view.nodes}
    file_nodes = [by_name[n] for n in (*stage.recomputed_nodes, *stage.file_node_names)]
    sources = dict(stage.shape_sources)
    dropped: list[str] = []
    for t in foreign:
        readers = [n for n in file_nodes if t in n.reads]
        found: dict[str, ShapeParts] = {}
        for n in readers:
            parts = shape_from_dims(view, n, have) if n.op_type == "Shape" else None
            if parts is None:
                break
            found[n.name] = parts
        else:
            sources.update(found)
            dropped.append(t)
    if not dropped:
        return stage
    used = [d[0] for parts in sources.values() for d in parts if isinstance(d, tuple)]
    inputs = [t for t in stage.inputs if t not in dropped]
    inputs += [t for t in dict.fromkeys(used) if t not in inputs]
    return dataclasses.replace(stage, inputs=tuple(inputs), shape_sources=tuple(sorted(sources.items())))


def foreign_pasts(dec: DecoderInfo, stage: StageSpec) -> tuple[str, ...]:
    """Past inputs of ``stage`` from layers whose cache it does not hold (none after
    :func:`own_cache_only`, on every exporter seen)."""
    layer_of = dec.layer_of_tensor()
    owned = set(stage.kv_layers)
    return tuple(t for t in stage.inputs if t in layer_of and layer_of[t] not in owned)


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
