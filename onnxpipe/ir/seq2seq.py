"""An encoder-decoder as optimum writes it (Whisper, T5, Marian): a folder, and its decoder as one graph.

optimum exports such a model as ``encoder_model.onnx`` (the encoder's inputs -> ``last_hidden_state``),
``decoder_model.onnx`` (the first step: token ids and ``encoder_hidden_states`` -> logits, each layer's
self-attention cache ``present.N.decoder.*`` and cross-attention cache ``present.N.encoder.*``) and
``decoder_with_past_model.onnx`` (the later steps: token ids and both caches -> logits and the grown
self-attention cache), or both decoders as ``decoder_model_merged.onnx`` (one ``If`` on ``use_cache_branch``
choosing between them, whose with-past branch gives the cross-attention outputs it does not make as empty
tensors): each branch is then taken as its decoder.  :func:`find_seq2seq` recognises that folder.

Two decoder graphs for one decoder cannot share a split's stages, so :func:`step_decoder` makes the one
graph a decoder with a KV cache already is: the with-past decoder, taking ``encoder_hidden_states`` too,
whose cross-attention cache is *grown* like the self-attention cache: ``present.N.encoder.key =
Concat(past_key_values.N.encoder.key, K_N(encoder_hidden_states))``, the projection ``K_N`` copied from
``decoder_model.onnx``.  The first step feeds the encoder's output and empty pasts (the cross cache is
made from it, once per sequence); every later step feeds an empty encoder output (``[batch, 0, hidden]``),
so that the cross cache is never grown and costs nothing to carry.  Each layer's both caches are then
made and read by that layer's nodes only, which is what a layer cut needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import helper

from onnxpipe.core.errors import ModelLoadError, UsageError
from onnxpipe.ir.model import graph_free_names

ENCODER, DECODER, WITH_PAST = "encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"
MERGED = "decoder_model_merged.onnx"
ENCODER_OUTPUT = "encoder_hidden_states"
"""The decoders' input that takes the encoder's output (optimum's name)."""
_CROSS = ".encoder."
"""What names a cross-attention cache tensor in optimum's files (``present.N.encoder.key``)."""
_PREFIX = "cross/"


@dataclass(frozen=True)
class Seq2SeqFolder:
    """The files of an encoder-decoder folder, and the token ids generation starts and ends with."""

    folder: Path
    encoder: Path
    decoder: Path
    with_past: Path
    """Both the merged file (:attr:`merged`) where the folder holds the decoders as one."""
    start_ids: tuple[int, ...]
    """The tokens each sequence starts with (``decoder_start_token_id``, then ``forced_decoder_ids``)."""
    eos_ids: tuple[int, ...]

    @property
    def merged(self) -> bool:
        return self.decoder.name == MERGED


def find_seq2seq(folder: Path) -> Seq2SeqFolder | None:
    """``folder``'s encoder-decoder, ``None`` where it holds neither ``decoder_model.onnx`` and
    ``decoder_with_past_model.onnx`` nor ``decoder_model_merged.onnx``; a :class:`ModelLoadError` naming
    what is missing where the decoders are there but not the encoder."""
    decoder, with_past, encoder = folder / DECODER, folder / WITH_PAST, folder / ENCODER
    if not (decoder.is_file() and with_past.is_file()):
        if not (folder / MERGED).is_file():
            return None
        decoder = with_past = folder / MERGED
    if not encoder.is_file():
        have = decoder.name if decoder == with_past else f"{DECODER} and {WITH_PAST}"
        raise ModelLoadError(
            f"{folder}: holds {have} but no {ENCODER}: an encoder-decoder folder needs its encoder too "
            "(export it again with optimum, or split the decoder file alone)"
        )
    config: dict[str, object] = {}
    for name in ("config.json", "generation_config.json"):  # the generation config has the last word
        path = folder / name
        if path.is_file():
            try:
                config |= json.loads(path.read_text(encoding="utf-8"))
            except ValueError as e:
                raise UsageError(f"{path}: not JSON ({e})") from None
    start = config.get("decoder_start_token_id")
    if not isinstance(start, int):
        raise UsageError(
            f"{folder}: no decoder_start_token_id in its config.json or generation_config.json: generation "
            "cannot know the token each sequence starts with"
        )
    forced = config.get("forced_decoder_ids")
    pairs = sorted((int(p[0]), int(p[1])) for p in forced) if isinstance(forced, list) else []
    eos = config.get("eos_token_id")
    eos_ids = (eos,) if isinstance(eos, int) else tuple(int(e) for e in eos) if isinstance(eos, list) else ()
    return Seq2SeqFolder(folder, encoder, decoder, with_past, (start, *(t for _, t in pairs)), eos_ids)


def step_decoder(found: Seq2SeqFolder) -> onnx.ModelProto:
    """The decoder of ``found`` as one graph with both caches grown (see the module docstring)."""
    if found.merged:
        first, model = _branches(found.decoder)
    else:
        first, model = onnx.load(str(found.decoder)), onnx.load(str(found.with_past))
    graph = model.graph
    cross = [o.name for o in first.graph.output if _CROSS in o.name]
    pasts = {i.name for i in graph.input}
    wanted = {c: c.replace("present", "past_key_values", 1) for c in cross}
    missing = [p for p in wanted.values() if p not in pasts]
    if not cross or missing:
        raise UsageError(
            f"{found.with_past}: takes no cross-attention cache {missing[0] if missing else ''!s} that "
            f"{found.decoder.name} makes: not an optimum encoder-decoder"
        )
    slice_nodes = _slice(first.graph, cross)
    reads = {t for n in slice_nodes for t in n.input}
    have = {t.name: t for t in graph.initializer}
    weights = [t for t in first.graph.initializer if t.name in reads]
    # a weight of the same name and bytes is the with-past file's own; any other is copied, renamed
    copied = [t for t in weights if t.name not in have or have[t.name] != t]
    rename = {o: _PREFIX + o for n in slice_nodes for o in n.output if o}
    rename |= {t.name: _PREFIX + t.name for t in copied}
    for t in copied:
        graph.initializer.append(t)
        graph.initializer[-1].name = rename[t.name]
    made: list[onnx.NodeProto] = []
    for n in slice_nodes:
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        copy.name = _PREFIX + n.name
        copy.input[:] = [rename.get(t, t) for t in n.input]
        copy.output[:] = [rename.get(t, t) for t in n.output]
        made.append(copy)
    # what the with-past decoder gives as the cross cache (nothing, or a merged file's empty tensors) goes
    kept = [n for n in graph.node if not set(n.output) & set(wanted)]
    del graph.node[:]
    graph.node.extend(kept)
    outputs = [o for o in graph.output if o.name not in wanted]
    del graph.output[:]
    graph.output.extend(outputs)
    grown = {past: present for present, past in wanted.items()}
    for node in graph.node:  # the with-past nodes read the grown cross cache in place of the past one
        node.input[:] = [grown.get(t, t) for t in node.input]
    made += [
        helper.make_node(
            "Concat", [past, rename[present]], [present], name=f"{_PREFIX}{present}/Concat", axis=-2
        )
        for present, past in wanted.items()
    ]
    nodes = [*made, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    encoded = next(i for i in first.graph.input if i.name == ENCODER_OUTPUT)
    graph.input.append(encoded)
    frames = graph.input[-1].type.tensor_type.shape.dim[1]  # its frames come once: 0 on later steps
    frames.ClearField("dim_value")
    frames.dim_param = "encoder_sequence_length"
    for past in wanted.values():
        dims = next(i for i in graph.input if i.name == past).type.tensor_type.shape.dim
        dims[2].ClearField("dim_value")
        dims[2].dim_param = "encoder_past_sequence_length"
    graph.output.extend(o for o in first.graph.output if o.name in wanted)
    frames = encoder_frames(found)
    for out in graph.output[len(graph.output) - len(wanted) :]:  # as long as the encoder's output, always
        if frames is not None:
            out.type.tensor_type.shape.dim[2].dim_value = frames
    return model


def encoder_frames(found: Seq2SeqFolder) -> int | None:
    """The frames of the encoder's output, where its graph fixes them (Whisper's 1500): the length of
    every cross-attention cache."""
    encoder = onnx.load(str(found.encoder), load_external_data=False)
    dims = encoder.graph.output[0].type.tensor_type.shape.dim
    return dims[1].dim_value if len(dims) == 3 and dims[1].HasField("dim_value") else None


def _slice(graph: onnx.GraphProto, outputs: list[str]) -> list[onnx.NodeProto]:
    """The nodes of ``graph`` that ``outputs`` are computed from, in the graph's order; a
    :class:`UsageError` where they read a graph input besides the encoder's output."""
    producer = {o: n for n in graph.node for o in n.output}
    inputs = {i.name for i in graph.input}
    keep: set[int] = set()
    stack = list(outputs)
    while stack:
        node = producer.get(stack.pop())
        if node is None or id(node) in keep:
            continue
        keep.add(id(node))
        for t in node.input:
            if t in inputs and t != ENCODER_OUTPUT:
                raise UsageError(
                    f"{graph.name}: its cross-attention cache reads {t!r}, not only {ENCODER_OUTPUT!r}: "
                    "onnxpipe cannot make it once per sequence"
                )
            stack.append(t)
    return [n for n in graph.node if id(n) in keep]


def _branches(path: Path) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The first-step and the with-past decoders of optimum's merged file ``path``, each branch of its
    ``If`` a model of its own: the graph inputs and outer weights it reads, its outputs the ``If``'s."""
    proto = onnx.load(str(path))
    graph = proto.graph
    if len(graph.node) != 1 or graph.node[0].op_type != "If":
        raise ModelLoadError(f"{path}: not optimum's merged decoder (one If on use_cache_branch)")
    node = graph.node[0]
    models = []
    for attribute in node.attribute:
        if attribute.type != onnx.AttributeProto.GRAPH:
            continue
        branch = attribute.g
        reads = graph_free_names(branch)
        nodes = [*branch.node]
        nodes += [
            helper.make_node("Identity", [inner.name], [outer], name=f"{outer}/branch")
            for inner, outer in zip(branch.output, node.output, strict=True)
            if inner.name != outer
        ]
        body = helper.make_graph(
            nodes,
            branch.name,
            [vi for vi in graph.input if vi.name in reads],
            list(graph.output),
            initializer=[*(t for t in graph.initializer if t.name in reads), *branch.initializer],
        )
        model = onnx.ModelProto()
        model.CopyFrom(proto)
        model.graph.CopyFrom(body)
        models.append((any(_CROSS in i.name and i.name.startswith("past") for i in body.input), model))
    firsts = [m for past, m in models if not past]
    later = [m for past, m in models if past]
    if len(firsts) != 1 or len(later) != 1:
        raise ModelLoadError(f"{path}: no branch of its If is the decoder taking the cross-attention cache")
    return firsts[0], later[0]
