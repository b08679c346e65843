"""A text decoder that takes ``inputs_embeds`` joined with its embedding model into one graph that takes
token ids (``split --embedding FILE.onnx``, or the embedding model the source folder's
``genai_config.json`` names).

GenAI's ``exclude_embeds`` layout (a vision-language model's text part) leaves the embedding Gather in a
model of its own.  Joined ahead of the text model, that Gather is the decoder's embedding again, as in any
token-id decoder: the planner places it as it places every decoder's embedding (anywhere the balance puts
it, ``--ends attached`` with the first layer, ``--ends own`` in a stage of its own), the stage holding it
takes the token ids, and the split generates, verifies and runs in GenAI as a token-id decoder.  The
embedding model's inputs besides the ids (a vision model's ``image_features``) are fed empty: the split
is the text path.  The embedding's weights come into memory (a table, the largest one, but one); the
text model's stay on disk.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxpipe.core.errors import UsageError
from onnxpipe.core.model_config import GENAI_CONFIG_NAME, config_beside
from onnxpipe.core.options import opt

_INTS = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


@dataclass(frozen=True)
class Joined:
    """The text model with its embedding model ahead of it, and the note saying so."""

    proto: onnx.ModelProto
    note: str


def join_embedding(decoder: onnx.ModelProto, where: Path, embedding: Path) -> Joined:
    """``decoder`` (read from ``where``) with the embedding model in ``embedding`` feeding its
    ``inputs_embeds``: one graph from the token ids to the logits.  A :class:`UsageError` naming both files
    where the embedding model's output is no input of the text model, or is not as wide as it."""
    emb = _read(embedding)
    takes = {vi.name: vi for vi in decoder.graph.input}
    made = [o for o in emb.graph.output if o.name in takes]
    if len(made) != 1:
        raise UsageError(
            f"{embedding}: an embedding model's output feeds the text model's inputs_embeds, but its outputs "
            f"({', '.join(o.name for o in emb.graph.output)}) match none of {where}'s inputs "
            f"({', '.join(takes)}); give the text model's own embedding model"
        )
    out = made[0].name
    width, wanted = _last_dim(made[0]), _last_dim(takes[out])
    if isinstance(width, int) and isinstance(wanted, int) and width != wanted:
        raise UsageError(
            f"{embedding}: its output {out!r} is {width} wide, but {where} takes {out!r} {wanted} wide; "
            "give the text model's own embedding model"
        )
    ids = [i for i in emb.graph.input if i.type.tensor_type.elem_type in _INTS]
    if len(ids) != 1:
        raise UsageError(
            f"{embedding}: an embedding model takes the token ids (one integer input); its inputs are "
            f"{', '.join(i.name for i in emb.graph.input)}"
        )
    _rename_clashes(emb.graph, _names(decoder.graph) - {out})
    empty = [_empty(i) for i in emb.graph.input if i.name != ids[0].name]
    model = onnx.ModelProto()
    model.CopyFrom(decoder)
    g = model.graph
    nodes = [*emb.graph.node, *decoder.graph.node]
    del g.node[:], g.input[:]
    g.node.extend(nodes)
    g.input.extend([ids[0], *(vi for vi in decoder.graph.input if vi.name != out)])
    g.initializer.extend([*emb.graph.initializer, *empty])
    g.value_info.extend([*emb.graph.value_info, takes[out]])
    model.functions.extend(emb.functions)
    versions = {o.domain: o.version for o in decoder.opset_import}
    for o in emb.opset_import:
        versions[o.domain] = max(o.version, versions.get(o.domain, 0))
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(d, v) for d, v in sorted(versions.items()))
    model.ir_version = max(decoder.ir_version, emb.ir_version)
    fed_empty = f"; {', '.join(t.name for t in empty)} fed empty (the text path)" if empty else ""
    note = (
        f"embedding model {embedding.name} joined ahead of the text model: {len(emb.graph.node)} node(s) "
        f"from the token ids {ids[0].name!r} to {out!r}, placed by the planner as a decoder's embedding"
        f"{fed_empty}"
    )
    return Joined(model, note)


def named_embedding(model: Path) -> Path | None:
    """The embedding model the GenAI config beside ``model`` (whose decoder is ``model``) names
    (``model.embedding.filename``, as GenAI's vision-language configs and the builder's
    ``exclude_embeds`` write it), else ``None``."""
    config = config_beside(model).config
    if config is None or config.path.name != GENAI_CONFIG_NAME:
        return None
    section = config.document.get("model", {}).get("embedding", {})
    name = section.get("filename") if isinstance(section, dict) else None
    if not isinstance(name, str):
        return None
    if not (config.path.parent / name).is_file():
        raise UsageError(
            f"{config.path}: names the embedding model {name}, which is not beside it; copy it there or "
            f"give {opt('embedding', 'FILE.onnx')}"
        )
    return config.path.parent / name


def joined_file(path: Path, embedding: Path) -> Path:
    """A file of ``path``'s text model joined with ``embedding`` (what a worker running the whole model
    opens: ``generate --compare``), written once per pair of files into the temporary folder, the text
    model's weights beside it where they pass protobuf's 2 GB."""
    key = hashlib.sha256(f"{path.resolve()}\0{embedding.resolve()}".encode()).hexdigest()[:16]
    for f in (path, embedding):
        key += f"-{f.stat().st_mtime_ns}"
    folder = Path(tempfile.gettempdir()) / "onnxpipe-joined" / key
    target = folder / path.name
    if target.is_file():
        return target
    model = join_embedding(onnx.load(str(path)), path, embedding).proto
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{os.getpid()}.{path.name}"
    large = model.ByteSize() > 2_000_000_000
    onnx.save(model, str(partial), save_as_external_data=large, location=f"{path.name}.data")
    os.replace(partial, target)
    return target


def _read(embedding: Path) -> onnx.ModelProto:
    """The embedding model with its weights in memory (a :class:`UsageError` naming it where unreadable)."""
    if not embedding.is_file():
        raise UsageError(f"{embedding}: no such embedding model file")
    try:
        return onnx.load(str(embedding))
    except Exception as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UsageError(f"{embedding}: not a readable ONNX embedding model ({detail})") from e


def _last_dim(vi: onnx.ValueInfoProto) -> int | str | None:
    dims = vi.type.tensor_type.shape.dim
    if not dims:
        return None
    last = dims[-1]
    return last.dim_value if last.HasField("dim_value") else (last.dim_param or None)


def _names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor and node name ``graph`` uses at its top level."""
    names = {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    names |= {t.name for t in graph.initializer} | {n.name for n in graph.node}
    return names | {t for n in graph.node for t in (*n.input, *n.output) if t}


def _rename_clashes(graph: onnx.GraphProto, taken: set[str]) -> None:
    """Prefix ``graph``'s names that ``taken`` holds with ``embedding/`` (its nodes join another graph)."""
    clash = {n: f"embedding/{n}" for n in _names(graph) & taken}
    if not clash:
        return
    for n in graph.node:
        n.name = clash.get(n.name, n.name)
        n.input[:] = [clash.get(t, t) for t in n.input]
        n.output[:] = [clash.get(t, t) for t in n.output]
    for v in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
        v.name = clash.get(v.name, v.name)


def _empty(vi: onnx.ValueInfoProto) -> onnx.TensorProto:
    """A constant standing for the input ``vi`` with no rows: each dim the file leaves open is 0."""
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in vi.type.tensor_type.shape.dim]
    dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
    return numpy_helper.from_array(np.zeros(dims, dtype), vi.name)
