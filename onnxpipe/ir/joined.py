"""A text decoder that takes ``inputs_embeds`` joined with its embedding model into one graph that takes
token ids (``split --embedding FILE.onnx``, or the embedding model the source folder's
``genai_config.json`` names).

GenAI's ``exclude_embeds`` layout (a vision-language model's text part) leaves the embedding Gather in a
model of its own.  Joined ahead of the text model, that Gather is the decoder's embedding again, as in any
token-id decoder: the planner places it as it places every decoder's embedding (anywhere the balance puts
it, ``--ends attached`` with the first layer, ``--ends own`` in a stage of its own), the stage holding it
takes the token ids, and the split generates, verifies and runs in GenAI as a token-id decoder.  The
embedding model's inputs besides the ids (a vision model's ``image_features``) are fed empty: the split
is the text path (:func:`embedding_inputs`, the rule the driver's embedding session follows too).  An
embedding model of another opset is converted to the text model's: one graph has one opset.  The
embedding's weights come into memory (a table, the largest one, but one); the text model's stay on disk
(a file of the two joined, weights and all, is written only for a worker that runs the whole model:
:func:`runnable_file`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter

from onnxpipe.core.dims import Dim
from onnxpipe.core.errors import UsageError
from onnxpipe.core.files import file_sha256
from onnxpipe.core.model_config import GENAI_CONFIG_NAME, config_beside
from onnxpipe.core.options import opt
from onnxpipe.ir.model import (
    FLOAT_TYPES,
    INTEGER_TYPES,
    PROTOBUF_LIMIT,
    Rewritten,
    default_opset,
    graph_free_names,
    set_items,
    value_dims,
)


@dataclass(frozen=True)
class NamedEmbedding:
    """The embedding model a GenAI config names, and its tensors' names where the config gives them."""

    file: Path
    ids: str | None
    embeds: str | None


def join_embedding(decoder: onnx.ModelProto, where: Path, embedding: Path) -> Rewritten:
    """``decoder`` (read from ``where``) with the embedding model in ``embedding`` feeding its
    ``inputs_embeds``: one graph from the token ids to the logits.  A :class:`UsageError` naming both files
    where the embedding model's output is no input of the text model, or is not as wide as it."""
    emb = _at_opset(_read(embedding), embedding, decoder, where)
    takes = {vi.name: vi for vi in decoder.graph.input}
    made = [o for o in emb.graph.output if o.name in takes]
    if len(made) != 1:
        raise UsageError(
            f"{embedding}: an embedding model's output feeds the text model's inputs_embeds, but its outputs "
            f"({', '.join(o.name for o in emb.graph.output)}) match none of {where}'s inputs "
            f"({', '.join(takes)}); give the text model's own embedding model"
        )
    out = made[0].name
    width, wanted = ((value_dims(vi) or (None,))[-1] for vi in (made[0], takes[out]))  # their last dims
    if isinstance(width, int) and isinstance(wanted, int) and width != wanted:
        raise UsageError(
            f"{embedding}: its output {out!r} is {width} wide, but {where} takes {out!r} {wanted} wide; "
            "give the text model's own embedding model"
        )
    _rename_clashes(emb.graph, _names(decoder.graph) - {out})
    weights = {t.name for t in emb.graph.initializer}  # older exports list them as inputs too
    inputs = {i.name: i for i in emb.graph.input if i.name not in weights}
    ids, empty = embedding_inputs(
        embedding, {n: (i.type.tensor_type.elem_type, value_dims(i)) for n, i in inputs.items()}
    )
    model = onnx.ModelProto()
    model.CopyFrom(decoder)
    g = model.graph
    set_items(g.node, [*emb.graph.node, *decoder.graph.node])
    set_items(g.input, [inputs[ids], *(vi for vi in decoder.graph.input if vi.name != out)])
    g.initializer.extend([*emb.graph.initializer, *(numpy_helper.from_array(v, n) for n, v in empty.items())])
    g.value_info.extend([*emb.graph.value_info, takes[out]])
    model.functions.extend(emb.functions)
    versions = {o.domain: o.version for o in decoder.opset_import}
    for o in emb.opset_import:
        versions[o.domain] = max(o.version, versions.get(o.domain, 0))
    set_items(model.opset_import, (helper.make_opsetid(d, v) for d, v in sorted(versions.items())))
    model.ir_version = max(decoder.ir_version, emb.ir_version)
    fed_empty = f"; {', '.join(empty)} fed empty (the text path)" if empty else ""
    note = (
        f"embedding model {embedding.name} joined ahead of the text model: {len(emb.graph.node)} node(s) "
        f"from the token ids {ids!r} to {out!r}, placed by the planner as a decoder's embedding{fed_empty}"
    )
    return Rewritten(model, note)


def embedding_inputs(
    embedding: Path, inputs: Mapping[str, tuple[int, tuple[Dim, ...] | None]], ids: str | None = None
) -> tuple[str, dict[str, np.ndarray]]:
    """The token ids input of the embedding model in ``embedding`` (``ids``, else its one integer input,
    else ``input_ids``) and a feed with no rows for each other input (``inputs``: each one's element type
    and dims): the split, and the driver that runs the embedding model, take the text path, with no image.
    A :class:`UsageError` where the ids are not an integer input or another input is not a float one."""
    integer = [n for n, (t, _) in inputs.items() if t in INTEGER_TYPES]
    ids = ids or (integer[0] if len(integer) == 1 else "input_ids")
    others = {n: v for n, v in inputs.items() if n != ids}
    if ids not in integer or any(t not in FLOAT_TYPES for t, _ in others.values()):
        raise UsageError(
            f"{embedding}: an embedding model takes the token ids (one integer input) and float inputs "
            f"besides, fed empty; its inputs are {', '.join(inputs)}"
        )
    return ids, {n: _empty(t, dims) for n, (t, dims) in others.items()}


def named_embedding(model: Path) -> Path | None:
    """The embedding model the GenAI config beside ``model`` (whose decoder is ``model``) names, else
    ``None``."""
    config = config_beside(model).config
    if config is None or config.path.name != GENAI_CONFIG_NAME:
        return None
    named = genai_embedding(config.path)
    return None if named is None else named.file


def genai_embedding(config: Path) -> NamedEmbedding | None:
    """The embedding model the GenAI config ``config`` names beside it (``model.embedding``, as GenAI's
    vision-language configs and the builder's ``exclude_embeds`` write it), else ``None``; a
    :class:`UsageError` where the file it names is not there."""
    if not config.is_file():
        return None
    try:
        section = json.loads(config.read_text(encoding="utf-8"))["model"]["embedding"]
        name = section["filename"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(name, str):
        return None
    if not (config.parent / name).is_file():
        raise UsageError(
            f"{config}: names the embedding model {name}, which is not beside it; copy it there or "
            f"give {opt('embedding', 'FILE.onnx')}"
        )
    ids, embeds = section.get("inputs", {}).get("input_ids"), section.get("outputs", {}).get("inputs_embeds")
    return NamedEmbedding(config.parent / name, ids, embeds)


def _read(embedding: Path) -> onnx.ModelProto:
    """The embedding model with its weights in memory (a :class:`UsageError` naming it where unreadable)."""
    if not embedding.is_file():
        raise UsageError(f"{embedding}: no such embedding model file")
    try:
        return onnx.load(str(embedding))
    except Exception as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UsageError(f"{embedding}: not a readable ONNX embedding model ({detail})") from e


def _at_opset(
    emb: onnx.ModelProto, embedding: Path, decoder: onnx.ModelProto, where: Path
) -> onnx.ModelProto:
    """``emb`` converted to the text model's default-domain opset (one graph has one opset: an op of the
    other's version would not run), or a :class:`UsageError` naming both where it cannot be."""
    mine, wanted = default_opset(emb), default_opset(decoder)
    if mine == wanted:
        return emb
    try:
        return version_converter.convert_version(emb, wanted)
    except Exception as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(
            f"{embedding} (opset {mine}) cannot be converted to the opset of {where} (opset {wanted}) to be "
            f"joined ahead of it ({detail}); export the embedding model at opset {wanted}"
        ) from e


def _names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor and node name ``graph`` uses at its top level (an empty one, an unnamed node or an
    optional input left out, is no name)."""
    names = {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    names |= {t.name for t in graph.initializer} | {n.name for n in graph.node}
    return (names | {t for n in graph.node for t in (*n.input, *n.output)}) - {""}


def _rename_clashes(graph: onnx.GraphProto, taken: set[str]) -> None:
    """Prefix ``graph``'s names that ``taken`` holds with ``embedding/`` (its nodes join another graph)."""
    clash = {n: f"embedding/{n}" for n in _names(graph) & taken}
    for n in graph.node:
        n.name = clash.get(n.name, n.name)
        n.input[:] = [clash.get(t, t) for t in n.input]
        n.output[:] = [clash.get(t, t) for t in n.output]
    for v in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
        v.name = clash.get(v.name, v.name)


def _empty(elem_type: int, dims: tuple[Dim, ...] | None) -> np.ndarray:
    """A value with no rows: each dim the file leaves open is 0 (one of unknown rank: no elements)."""
    shape = [d if isinstance(d, int) else 0 for d in dims] if dims is not None else [0]
    return np.zeros(shape, helper.tensor_dtype_to_np_dtype(elem_type))


# --------------------------------------------------------------------------------------------------
# optimum's merged decoder (``decoder_model_merged.onnx``) unwrapped to its with-past decoder.
#
# optimum (and the transformers.js repositories made with it) ship a decoder LLM as one ``If`` on a boolean
# graph input (``use_cache_branch``): one branch the decoder that takes no cache (the first step), the
# other the decoder that takes the cache; both read the same graph inputs and the weights hoisted into the
# outer graph.  Seen whole, the model is one control-flow node, which no cut can divide.  The with-past
# branch computes the first step too, fed an empty past (length 0), so the loader makes that branch the
# graph: the flag is dropped, the outer weights the branch reads become its initializers, and its nodes
# are the model's; a note says so.  Recognised only when it is that shape: the graph's one node an ``If``
# on a boolean graph input whose outputs are the graph's, one branch reading graph inputs (the cache) the
# other does not, the other reading integer inputs only (token ids, mask, positions).  An encoder-decoder's
# merged decoder (Whisper's) is left whole: its no-past branch reads the encoder's output and makes the
# cross-attention cache, which an empty past cannot stand for.

_BOOL = onnx.TensorProto.BOOL


def unwrap_merged_decoder(proto: onnx.ModelProto) -> Rewritten | None:
    """``proto``'s with-past branch as a model of its own, or ``None`` when ``proto`` is no merged
    decoder (see the module docstring)."""
    found = _cache_branches(proto.graph)
    if found is None:
        return None
    node, with_past = found
    flag = node.input[0]
    model = branch_model(proto, node, with_past)
    nodes = model.graph.node
    note = (
        f"merged decoder unwrapped: the graph was one If on {flag!r} choosing between the decoder without "
        f"a cache and the one with it; it is taken as the with-past branch ({len(nodes)} nodes), which "
        f"serves the first step with an empty past (length 0), and {flag!r} is dropped"
    )
    return Rewritten(model, note)


def runnable_file(path: Path, embedding: Path | None = None) -> Path:
    """``path``, or, for a merged decoder (unwrapped) or a text model joined with its ``embedding`` model
    (:mod:`onnxpipe.ir.joined`), a file of the model onnxpipe split, with its weights: what a worker running
    the whole model opens (``generate --compare``, ``run --compare``), for it feeds the model as onnxpipe
    split it.  Written once per source file (by its hash, and its embedding model's) into the temporary
    folder, as one file, or with its weights beside it when they pass protobuf's 2 GB."""
    proto = onnx.load(str(path), load_external_data=False)
    unwrapped = unwrap_merged_decoder(proto)
    if unwrapped is None and embedding is None:
        return path
    key = file_sha256(path)[:16] + (f"-{file_sha256(embedding)[:16]}" if embedding is not None else "")
    folder = Path(tempfile.gettempdir()) / "onnxpipe-unwrapped" / key
    target = folder / path.name
    if target.is_file():
        return target
    model = proto if unwrapped is None else unwrapped.proto
    if embedding is not None:
        model = join_embedding(model, path, embedding).proto
    onnx.load_external_data_for_model(model, str(path.parent))
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{os.getpid()}.{path.name}"
    large = model.ByteSize() > PROTOBUF_LIMIT
    onnx.save(model, str(partial), save_as_external_data=large, location=f"{path.name}.data")
    os.replace(partial, target)
    return target


def branch_model(proto: onnx.ModelProto, node: onnx.NodeProto, branch: onnx.GraphProto) -> onnx.ModelProto:
    """``branch``, a branch of ``proto``'s one ``If`` ``node``, as a model of its own: the graph's inputs
    but the ``If``'s flag, the outer weights it reads (but those its own weights shadow), its nodes, and
    the ``If``'s outputs (a branch may name its outputs otherwise: ``Identity`` nodes rename them)."""
    graph = proto.graph
    reads = graph_free_names(branch)
    local = {t.name for t in branch.initializer}
    outer = [t for t in graph.initializer if t.name in reads and t.name not in local]
    nodes = list(branch.node)
    for inner, out in zip(branch.output, node.output, strict=True):
        if inner.name != out:
            nodes.append(helper.make_node("Identity", [inner.name], [out], name=f"{out}/unwrapped"))
    body = helper.make_graph(
        nodes,
        graph.name,
        [vi for vi in graph.input if vi.name != node.input[0]],
        list(graph.output),
        initializer=[*outer, *branch.initializer],
        value_info=[*branch.value_info],
    )
    body.sparse_initializer.extend(branch.sparse_initializer)
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    model.graph.CopyFrom(body)
    return model


def merged_if(graph: onnx.GraphProto) -> tuple[onnx.NodeProto, onnx.GraphProto, onnx.GraphProto] | None:
    """The ``If`` node and its ``then`` and ``else`` branches when ``graph`` is one ``If`` on a boolean
    graph input giving the graph's outputs, as optimum merges two decoders."""
    if len(graph.node) != 1 or graph.node[0].op_type != "If" or graph.node[0].domain not in ("", "ai.onnx"):
        return None
    node = graph.node[0]
    types = {vi.name: vi.type.tensor_type.elem_type for vi in graph.input}  # 0 for a sequence, a map...
    if types.get(node.input[0]) != _BOOL or list(node.output) != [o.name for o in graph.output]:
        return None
    branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    then, other = branches.get("then_branch"), branches.get("else_branch")
    if then is None or other is None or len(then.output) != len(other.output):
        return None
    return node, then, other


def _cache_branches(graph: onnx.GraphProto) -> tuple[onnx.NodeProto, onnx.GraphProto] | None:
    """The ``If`` node and its with-past branch (the one reading graph inputs, the cache, that the other
    does not), when ``graph`` is a merged decoder."""
    found = merged_if(graph)
    if found is None:
        return None
    node, then, other = found
    inputs = {vi.name for vi in graph.input} - {node.input[0]}
    then_reads, else_reads = graph_free_names(then) & inputs, graph_free_names(other) & inputs
    if else_reads < then_reads:
        with_past, first_reads = then, else_reads
    elif then_reads < else_reads:
        with_past, first_reads = other, then_reads
    else:
        return None
    # the first step's decoder reads token ids, a mask, positions: integers.  One that reads floats
    # (an encoder-decoder's encoder output) makes a cache the with-past branch cannot make from nothing
    types = {vi.name: vi.type.tensor_type.elem_type for vi in graph.input}
    if any(types[t] not in INTEGER_TYPES for t in first_reads):
        return None
    return node, with_past
