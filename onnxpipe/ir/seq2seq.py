"""An encoder-decoder as optimum writes it for Whisper: a folder, and its decoder as one graph.

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
so that the cross cache is never grown.  It is not free: each step's ``Concat`` copies it whole (Whisper
large in float32: about 491 MB per token per sequence).  Each layer's both caches are then made and read
by that layer's nodes only, which is what a layer cut needs.  Decoders that also take an
``encoder_attention_mask`` (T5's, Marian's) are not served: the decoder contract has no role for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import helper, numpy_helper

from onnxpipe.core.errors import ModelLoadError, UsageError
from onnxpipe.core.tokenizer_files import has_tokenizer, looked_in, model_folders, tokenizer_files
from onnxpipe.ir.joined import branch_model, merged_if
from onnxpipe.ir.model import graph_free_names, set_items

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
    configs: tuple[Path, ...] = ()
    """The ``config.json`` and ``generation_config.json`` read, beside the files or one folder up."""
    notes: tuple[str, ...] = ()
    """What was set aside reading them (a ``forced_decoder_ids`` entry forcing no token)."""

    @property
    def merged(self) -> bool:
        return self.decoder.name == MERGED

    @property
    def side_files(self) -> tuple[Path, ...]:
        """What goes with its split: the configs read (:attr:`configs`) and the tokenizer's files
        (:func:`~onnxpipe.core.tokenizer_files.tokenizer_files`) of the first folder holding a tokenizer,
        beside the files or one folder up."""
        found = next((tokenizer_files(f) for f in model_folders(self.encoder) if has_tokenizer(f)), ())
        files = {p.name: p for p in found} | {p.name: p for p in self.configs}
        return tuple(files.values())


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
    origin: dict[str, Path] = {}
    for name in ("config.json", "generation_config.json"):  # the generation config has the last word
        path = next((f / name for f in model_folders(encoder) if (f / name).is_file()), None)
        if path is not None:
            try:
                read = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as e:
                raise UsageError(f"{path}: not JSON ({e})") from None
            if not isinstance(read, dict):
                raise UsageError(f"{path}: not a JSON object")
            config |= read
            origin |= dict.fromkeys(read, path)
    start = config.get("decoder_start_token_id")
    if not isinstance(start, int):
        raise UsageError(
            f"{folder}: no decoder_start_token_id in a config.json or generation_config.json "
            f"{looked_in(encoder)}: generation cannot know the token each sequence starts with"
        )
    forced, notes = _forced(config.get("forced_decoder_ids"), origin.get("forced_decoder_ids", folder))
    eos = config.get("eos_token_id")
    eos_ids = (eos,) if isinstance(eos, int) else tuple(int(e) for e in eos) if isinstance(eos, list) else ()
    configs = tuple(dict.fromkeys(origin.values()))
    return Seq2SeqFolder(folder, encoder, decoder, with_past, (start, *forced), eos_ids, configs, notes)


def _forced(forced: object, path: Path) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The tokens ``forced_decoder_ids`` (``[[position, token], ...]``, positions from 1) puts after the
    start token, up to the first position it forces no token at: whisper-large-v3's ``[[1, null], [2,
    50360]]`` leaves the language to the model, so what follows it cannot be forced either; the note says
    so.  A :class:`UsageError` for an entry that is no pair of a position and a token or ``null``."""
    if forced is None:
        return (), ()
    if not isinstance(forced, list) or not all(
        isinstance(p, list)
        and len(p) == 2
        and isinstance(p[0], int)
        and (p[1] is None or isinstance(p[1], int))
        for p in forced
    ):
        raise UsageError(f"{path}: forced_decoder_ids is {forced!r}: give [[position, token or null], ...]")
    tokens: list[int] = []
    for position, token in sorted(forced, key=lambda p: int(p[0])):
        if token is None or position != len(tokens) + 1:
            note = (
                f"{path.name}: forced_decoder_ids forces no token at position {len(tokens) + 1}: each "
                f"sequence starts with the {len(tokens) + 1} token(s) before it and the model chooses the "
                "rest (the later forced tokens are not forced)"
            )
            return tuple(tokens), (note,)
        tokens.append(token)
    return tuple(tokens), ()


def family_hint(model: Path | None) -> str:
    """Where ``model`` is an encoder-decoder's merged decoder (one ``If``, which no cut divides), what to
    split instead, for a message naming it: `` (an encoder-decoder's merged decoder: split its folder
    DIR)``; else ``""``."""
    if model is None or model.name != MERGED or not (model.parent / ENCODER).is_file():
        return ""
    return f" (an encoder-decoder's merged decoder: split its folder {model.parent})"


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
    slice_nodes = _slice(first.graph, cross, found.decoder)
    reads = {t for n in slice_nodes for t in n.input}
    have = {t.name: t for t in graph.initializer}
    # a weight of the same name and bytes is the with-past file's own; any other is copied, renamed
    copied = [t for t in first.graph.initializer if t.name in reads and have.get(t.name) != t]
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
    set_items(graph.node, [n for n in graph.node if not set(n.output) & set(wanted)])
    set_items(graph.output, [o for o in graph.output if o.name not in wanted])
    set_items(graph.value_info, [v for v in graph.value_info if v.name not in wanted])  # its empty tensors'
    grown = {past: present for present, past in wanted.items()}
    for node in graph.node:  # the with-past nodes read the grown cross cache in place of the past one
        node.input[:] = [grown.get(t, t) for t in node.input]
    made += [
        helper.make_node(
            "Concat", [past, rename[present]], [present], name=f"{_PREFIX}{present}/Concat", axis=-2
        )
        for present, past in wanted.items()
    ]
    set_items(graph.node, [*made, *graph.node])
    if all(i.name != ENCODER_OUTPUT for i in graph.input):  # a merged file's branch has it already
        graph.input.append(next(i for i in first.graph.input if i.name == ENCODER_OUTPUT))
    encoded = next(i for i in graph.input if i.name == ENCODER_OUTPUT)
    frames = encoded.type.tensor_type.shape.dim[1]  # its frames come once: 0 on later steps
    frames.dim_param = "encoder_sequence_length"
    for past in wanted.values():
        dims = next(i for i in graph.input if i.name == past).type.tensor_type.shape.dim
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


def _slice(graph: onnx.GraphProto, outputs: list[str], path: Path) -> list[onnx.NodeProto]:
    """The nodes of ``graph`` (read from ``path``) that ``outputs`` are computed from, in the graph's
    order; a :class:`UsageError` where they read a graph input besides the encoder's output.

    The TorchScript exporter (optimum's) records the cross cache's reshape with the batch of the
    decoder's own hidden states, ``Shape(hidden)[0]``, which leads back to the token ids; such a ``Shape``
    is read from the encoder's output instead, whose dim 0 is the same batch: only where every reader of
    it takes dim 0 alone (:func:`_batch_only`).  torch's dynamo exporter reads the batch and the frames
    off the first input that has them, T5's ``encoder_attention_mask`` [batch, frames]: such a ``Shape``
    is read from the encoder's output's first two dims instead (:func:`_on_encoder_output`), which at a
    later step has the frames the cross cache grows by (none), where the mask has every frame."""
    producer = {o: n for n in graph.node for o in n.output}
    others = {i.name for i in graph.input} - {ENCODER_OUTPUT}
    decoder_side = set(others)  # what the decoder's other inputs reach
    for n in graph.node:
        if decoder_side.intersection(n.input):
            decoder_side.update(n.output)
    keep: dict[int, onnx.NodeProto] = {}
    stack = list(outputs)
    while stack:
        node = producer.get(stack.pop())
        if node is None or id(node) in keep:
            continue
        if node.op_type == "Shape":
            batch = node.input[0] in decoder_side and _batch_only(graph, node, producer)
            name = node.input[0].lower()
            if batch or ("encoder" in name and "mask" in name):  # the encoder's mask: encoder_attention_mask
                keep[id(node)] = _on_encoder_output(node, mask=not batch)
                continue
        keep[id(node)] = node
        read = [t for t in node.input if t in others]
        if read:
            raise UsageError(
                f"{path}: its cross-attention cache reads {read[0]!r}, not only {ENCODER_OUTPUT!r}: "
                "onnxpipe cannot make it once per sequence"
            )
        stack.extend(node.input)
    return [keep[id(n)] for n in graph.node if id(n) in keep]


def _on_encoder_output(shape: onnx.NodeProto, *, mask: bool) -> onnx.NodeProto:
    """``shape`` (a ``Shape`` node) as ``Shape`` of the encoder's output [batch, frames, hidden]; of the
    encoder's mask [batch, frames] (``mask``), its ``end`` kept within the first two dims."""
    rooted = onnx.NodeProto()
    rooted.CopyFrom(shape)
    rooted.input[0] = ENCODER_OUTPUT
    if not mask:
        return rooted
    end = next((a for a in rooted.attribute if a.name == "end"), None)
    if end is None:
        rooted.attribute.append(helper.make_attribute("end", 2))
    elif end.i < 0:
        end.i += 2
    return rooted


def _batch_only(graph: onnx.GraphProto, shape: onnx.NodeProto, producer: dict[str, onnx.NodeProto]) -> bool:
    """Whether every reader of ``shape``'s output takes its dim 0 alone (``Gather`` of index 0 on axis 0,
    or ``Slice`` 0:1), the shape taken from dim 0 (no ``start`` attribute past it)."""
    weights = {t.name: t for t in graph.initializer}

    def ints(name: str) -> list[int] | None:
        made = producer.get(name)
        value: object = weights.get(name)
        if made is not None and made.op_type == "Constant" and len(made.attribute) == 1:
            value = helper.get_attribute_value(made.attribute[0])
        if isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value).reshape(-1).tolist()
        if isinstance(value, int):
            value = [value]
        return [int(v) for v in value] if isinstance(value, list) else None

    def dim0(reader: onnx.NodeProto) -> bool:
        if reader.input[0] != shape.output[0] or reader.op_type not in ("Gather", "Slice"):
            return False
        if reader.op_type == "Gather":
            axis0 = all(a.i == 0 for a in reader.attribute if a.name == "axis")
            return axis0 and ints(reader.input[1]) == [0]
        args = [ints(t) if t else None for t in reader.input[1:]]
        args += [None] * (4 - len(args))  # starts, ends, axes, steps
        return args[:2] == [[0], [1]] and args[2] in (None, [0]) and args[3] in (None, [1])

    readers = [n for n in graph.node if shape.output[0] in n.input]
    starts = [a.i for a in shape.attribute if a.name == "start"]
    return bool(readers) and starts in ([], [0]) and all(dim0(r) for r in readers)


def _branches(path: Path) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The first-step and the with-past decoders of optimum's merged file ``path``, each branch of its
    ``If`` a model of its own (:func:`~onnxpipe.ir.joined.branch_model`); the with-past one is the branch
    reading a past cross-attention cache."""
    proto = onnx.load(str(path))
    found = merged_if(proto.graph)
    if found is None:
        raise ModelLoadError(f"{path}: not optimum's merged decoder (one If on use_cache_branch)")
    node, *branches = found
    models = {
        any(_CROSS in t and t.startswith("past") for t in graph_free_names(b)): branch_model(proto, node, b)
        for b in branches
    }
    if len(models) != 2:
        raise ModelLoadError(f"{path}: no branch of its If is the decoder taking the cross-attention cache")
    return models[False], models[True]
