"""optimum's merged decoder (``decoder_model_merged.onnx``) unwrapped to its with-past decoder.

optimum (and the transformers.js repositories made with it) ship a decoder LLM as one ``If`` on a boolean
graph input (``use_cache_branch``): one branch the decoder that takes no cache (the first step), the
other the decoder that takes the cache; both read the same graph inputs and the weights hoisted into the
outer graph.  Seen whole, the model is one control-flow node, which no cut can divide.  The with-past
branch computes the first step too, fed an empty past (length 0), so the loader makes that branch the
graph: the flag is dropped, the outer weights the branch reads become its initializers, and its nodes
are the model's; a note says so.  Recognised only when it is that shape: the graph's one node an ``If``
on a boolean graph input whose outputs are the graph's, one branch reading graph inputs (the cache) the
other does not, the other reading integer inputs only (token ids, mask, positions).  An encoder-decoder's
merged decoder (Whisper's) is left whole: its no-past branch reads the encoder's output and makes the
cross-attention cache, which an empty past cannot stand for.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx
from onnx import helper

from onnxpipe.core.files import file_sha256
from onnxpipe.ir.joined import join_embedding
from onnxpipe.ir.model import INTEGER_TYPES, PROTOBUF_LIMIT, Rewritten, graph_free_names

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
