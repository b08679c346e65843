"""Loading a model into a :class:`~onnxpipe.ir.model.ModelView`: the checks a file must pass, nodes
put in topological order where the file has them out of it, stable node names, the tensors subgraph
bodies read from outside, ONNX shape inference, cheap constants and the topological order that keeps
few bytes live across any cut; optimum's merged decoder is unwrapped to its with-past branch
(:func:`onnxpipe.ir.joined.unwrap_merged_decoder`); a text model is joined with its embedding model
(:mod:`onnxpipe.ir.joined`).

External weights stay on disk: the exporter reads each stage's weights when it writes the stage.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import onnx
from onnx import shape_inference

from onnxpipe.core.errors import ModelLoadError
from onnxpipe.core.files import file_sha256
from onnxpipe.ir.external import external_info, holds_external, is_external, stored_tensors, weightless_copy
from onnxpipe.ir.graph import (
    dfs_order,
    greedy_live_order,
    live_bytes_profile,
    stable_order,
)
from onnxpipe.ir.joined import join_embedding, unwrap_merged_decoder
from onnxpipe.ir.model import (
    PROTOBUF_LIMIT,
    ModelView,
    NodeInfo,
    TensorInfo,
    default_opset,
    initializer_nbytes,
    set_items,
    subgraph_outer_reads,
    subgraphs,
    tensor_info,
)


def load_model(path: str | Path, *, check: bool = True, embedding: Path | None = None) -> ModelView:
    """Read ``path`` into a :class:`ModelView` (its external weights left on disk); errors name the file
    and say what to do.  ``embedding``: the embedding model joined ahead of a text model that takes
    ``inputs_embeds`` (:mod:`onnxpipe.ir.joined`)."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"{p}: no such file; give the path of an .onnx model")
    if not p.is_file():
        raise ModelLoadError(f"{p}: is not a file; give the path of an .onnx model")
    try:
        # format given: onnx would otherwise pick a JSON or text parser from a .json/.txt suffix
        proto = onnx.load(str(p), format="protobuf", load_external_data=False)
    except Exception as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelLoadError(
            f"{p}: not a readable ONNX model ({detail}); "
            "check that the file is complete and was saved by an ONNX exporter"
        ) from e
    if not proto.graph.node and not proto.graph.output:
        raise ModelLoadError(f"{p}: holds no ONNX graph (empty or not a model file); re-export the model")
    reordered = sort_graph_nodes(proto.graph)
    notes: tuple[str, ...] = (_sorted_note(reordered),) if reordered else ()
    if check:
        _check_external_data(proto, p)
    if check and embedding is None:
        note = _check(proto, p, in_memory=bool(reordered))
        notes = (*notes, note) if note else notes
    unwrapped = unwrap_merged_decoder(proto)
    if unwrapped is not None:
        proto, notes = unwrapped.proto, (*notes, unwrapped.note)
    if embedding is not None:
        joined = join_embedding(proto, p, embedding)
        note = _check(joined.proto, p, in_memory=True) if check else None  # the graph split is the joined one
        proto, notes = joined.proto, (*notes, *((note,) if note else ()), joined.note)
    view = view_from_proto(proto, path=p, sha256=file_sha256(p), base_dir=p.parent)
    rewritten = unwrapped is not None or embedding is not None
    return dataclasses.replace(view, notes=notes, rewritten=rewritten, embedding=embedding) if notes else view


def _check_external_data(proto: onnx.ModelProto, p: Path) -> None:
    """Every external weight's file exists beside the model and is long enough to hold it.

    Checked up front because onnxruntime and the checker report a short or missing weights file late,
    as a multi-line log, or not at all.
    """
    sizes: dict[str, int] = {}
    for t in proto.graph.initializer:
        if not is_external(t):
            continue
        location, offset, length = external_info(t)
        target = p.parent / location
        if not location or not target.is_file():
            raise ModelLoadError(
                f"{p}: weight {t.name!r} lives in {location or '(no file named)'}, which is not beside the "
                "model; copy the model together with its weights file"
            )
        if location not in sizes:
            sizes[location] = target.stat().st_size
        length = initializer_nbytes(t) if length is None else length
        if offset + length > sizes[location]:
            raise ModelLoadError(
                f"{p}: weights file {location} is truncated: weight {t.name!r} needs bytes "
                f"{offset}..{offset + length} but the file has {sizes[location]}; copy it again"
            )


def _check(proto: onnx.ModelProto, p: Path, *, in_memory: bool) -> str | None:
    """The checker's verdict: ``None``, or a note when it accepts onnxruntime's own default-domain ops
    only (:func:`check_model`); anything else it refuses is a :class:`ModelLoadError`.

    ``in_memory``: the loaded model differs from the file (its nodes were sorted), so the checker sees
    the model in memory, its external weights as inputs (their files are checked by
    :func:`_check_external_data`), not the file on disk."""
    try:
        has_external = holds_external(proto)
        large = proto.ByteSize() > PROTOBUF_LIMIT  # a text model and its embedding joined may pass it
        if in_memory and (has_external or large):
            return check_model(external_as_inputs(proto, every=large))
        if has_external or large:
            return check_model(p)  # by path: resolves external files beside the model
        return check_model(proto)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "invalid model"
        raise ModelLoadError(
            f"{p}: fails the ONNX checker: {first}; fix or re-export the model (onnx.checker.check_model)"
        ) from e


def sort_graph_nodes(graph: onnx.GraphProto, outer: frozenset[str] = frozenset()) -> int:
    """Put ``graph``'s nodes, and its bodies' nodes, in a topological order where the file has them out of
    it; returns how many graphs were reordered (0: the file's order is kept as it is).

    Tools write such files and onnxruntime runs them (onnxruntime's float16 converter with
    ``keep_io_types=True`` appends the Casts of the inputs after the nodes that read them), but the
    ONNX checker, and so the stages, must have each node after what it reads.  The order kept is the
    file's as far as it goes (a ready node with the lowest file index first).  A graph that no order can
    sort (a cycle, a read of nothing) is left as it is for the checker to name.
    """
    defined = outer | {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    scope = defined | {o for n in graph.node for o in n.output if o}
    reordered = sum(sort_graph_nodes(g, scope) for n in graph.node for g in subgraphs(n))
    nodes = list(graph.node)
    deps = [sorted({i for i in n.input if i} | subgraph_outer_reads(n)) for n in nodes]
    outs = [[o for o in n.output if o] for n in nodes]
    order = stable_order(deps, outs, defined)
    if order is None or order == list(range(len(nodes))):
        return reordered
    set_items(graph.node, [nodes[i] for i in order])
    return reordered + 1


def _sorted_note(reordered: int) -> str:
    where = "its graph" if reordered == 1 else f"{reordered} graphs (the main graph or subgraph bodies)"
    return (
        f"the file's nodes are out of topological order in {where} (onnx.checker refuses that; onnxruntime "
        "runs it, and converters such as onnxruntime's float16 one with keep_io_types write it): sorted on "
        "load, the file's own order kept where it allows"
    )


def view_from_proto(
    proto: onnx.ModelProto,
    *,
    path: Path | None = None,
    sha256: str | None = None,
    base_dir: Path | None = None,
) -> ModelView:
    """Build the view from an in-memory model (used by tests and by :func:`load_model`)."""
    if sha256 is None:
        sha256 = hashlib.sha256(proto.SerializeToString()).hexdigest()
    graph = proto.graph
    _ensure_unique_node_names(graph)

    init_bytes: dict[str, int] = {t.name: initializer_nbytes(t) for t in graph.initializer}
    for sp in graph.sparse_initializer:
        init_bytes[sp.values.name] = initializer_nbytes(sp.values) + initializer_nbytes(sp.indices)
    inputs = tuple(i.name for i in graph.input if i.name not in init_bytes)
    outputs = tuple(o.name for o in graph.output)

    tensors = _infer_tensor_types(proto)

    drafts = []  # in file order; each gets its place, weights and constness below
    for idx, node in enumerate(graph.node):
        ins = tuple(i for i in node.input if i)
        outer = tuple(t for t in sorted(subgraph_outer_reads(node)) if t not in ins)
        outs = tuple(o for o in node.output if o)
        has_subgraph = any(True for _ in subgraphs(node))
        drafts.append(
            NodeInfo(idx, idx, node.name, node.op_type, node.domain, ins, outer, outs, 0, False, has_subgraph)
        )

    constant_idx = _constant_nodes(drafts, init_bytes, tensors)
    # weights: initializers and constant-node outputs (old exporters build weights with ConstantOfShape)
    weights = dict(init_bytes)
    for i in constant_idx:
        for o in drafts[i].outputs:
            weights[o] = max(0, tensors[o].nbytes()) if o in tensors else 0
    order = _choose_order(drafts, set(init_bytes), set(weights), inputs, outputs, tensors)
    nodes = [
        dataclasses.replace(
            drafts[idx],
            position=pos,
            param_bytes=sum(weights.get(t, 0) for t in dict.fromkeys(drafts[idx].reads)),
            is_constant=idx in constant_idx,
        )
        for pos, idx in enumerate(order)
    ]
    producer, consumers = _links(nodes)
    return ModelView(
        path=path,
        sha256=sha256,
        nodes=tuple(nodes),
        tensors=MappingProxyType(tensors),
        inputs=inputs,
        outputs=outputs,
        initializers=MappingProxyType(init_bytes),
        weights=MappingProxyType(weights),
        producer=producer,
        consumers=consumers,
        proto=proto,
        base_dir=base_dir,
    )


def in_order(view: ModelView, names: Iterable[str]) -> ModelView:
    """``view`` with the nodes ``names`` only, in that order (renumbered, producers and readers indexed
    again): for a transform whose new nodes must stay together (a cut node's parts), where the loader's
    own order might interleave them."""
    by_name = view.node_by_name
    nodes = [dataclasses.replace(by_name[name], position=pos) for pos, name in enumerate(names)]
    producer, consumers = _links(nodes)
    return dataclasses.replace(view, nodes=tuple(nodes), producer=producer, consumers=consumers)


def _links(nodes: Iterable[NodeInfo]) -> tuple[Mapping[str, int], Mapping[str, tuple[int, ...]]]:
    """Each tensor's producer and readers, by node position."""
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for n in nodes:
        for o in n.outputs:
            producer[o] = n.position
        for t in dict.fromkeys(n.reads):
            consumers.setdefault(t, []).append(n.position)
    return MappingProxyType(producer), MappingProxyType({k: tuple(v) for k, v in consumers.items()})


def _ensure_unique_node_names(graph: onnx.GraphProto) -> None:
    """Give unnamed or duplicate nodes stable names ``<OpType>_<index>`` (suffixed until unique).

    Deterministic: the same file always yields the same names, so saved profiles keep matching.
    """
    taken = {node.name for node in graph.node if node.name}
    kept: set[str] = set()
    for idx, node in enumerate(graph.node):
        if node.name and node.name not in kept:
            kept.add(node.name)
            continue
        base = f"{node.op_type}_{idx}" if not node.name else f"{node.name}__{idx}"
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        node.name = name
        taken.add(name)


def _infer_tensor_types(proto: onnx.ModelProto) -> dict[str, TensorInfo]:
    """Run ONNX shape inference on a weight-less copy; fall back to the file's own annotations."""
    graph = proto.graph
    light = weightless_copy(proto)  # so that models over 2 GB still infer, their weights left on disk
    try:
        src = shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True).graph
    except Exception:  # noqa: BLE001 - inference is best effort; the file's annotations remain
        src = graph
    types: dict[str, TensorInfo] = {}
    for vi in [*src.value_info, *graph.input, *graph.output, *src.input, *src.output]:
        info, prev = tensor_info(vi) or TensorInfo(vi.name, 0, None), types.get(vi.name)
        if prev is None or (prev.shape is None and info.shape is not None):
            types[vi.name] = info
    for t in graph.initializer:
        types[t.name] = TensorInfo(t.name, t.data_type, tuple(int(d) for d in t.dims))
    return types


# --------------------------------------------------------------------------------------------------
# ordering


def _choose_order(
    drafts: list[NodeInfo],
    weights: set[str],
    free: set[str],
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    tensors: Mapping[str, TensorInfo],
) -> list[int]:
    """A topological order with few bytes live across any point.

    Candidates: the file's own order (when it is topological), a depth-first Kahn order (a ready stack,
    so each branch runs to its join before the next starts, which keeps branches together), and a greedy
    list schedule that runs next the ready node adding the fewest live bytes (ties depth-first).
    The one with the smaller sum of live bytes over all cut points wins; ties keep the file order.
    ``free`` tensors (weights and cheap constants) never cross a cut, so they do not count.
    """
    size = {name: 0 if name in free else t.nbytes() for name, t in tensors.items()}
    deps = [n.reads for n in drafts]
    outs = [n.outputs for n in drafts]
    available = weights | set(inputs)
    file_order = list(range(len(drafts)))
    candidates = [file_order] if stable_order(deps, outs, available) == file_order else []  # topological
    candidates += [dfs_order(deps, outs, available, [n.name for n in drafts])]
    candidates += [greedy_live_order(deps, outs, available, size)]
    return min(candidates, key=lambda order: sum(live_bytes_profile(order, deps, outs, size, free, outputs)))


def _constant_nodes(
    drafts: list[NodeInfo],
    init_bytes: Mapping[str, int],
    tensors: Mapping[str, TensorInfo],
) -> set[int]:
    """Indices of nodes whose outputs are cheap constants that each stage may recompute itself."""
    const_tensors: set[str] = set(init_bytes)
    result: set[int] = set()
    changed = True
    # iterate to a fixed point: the file order need not be topological
    while changed:
        changed = False
        for idx, node in enumerate(drafts):
            if idx in result or node.domain not in ("", "ai.onnx") or node.outer_inputs:
                continue
            ins = node.inputs
            if (
                node.op_type == "Constant"
                or (node.op_type in ("ConstantOfShape", "Identity") and all(i in const_tensors for i in ins))
                or (node.op_type == "Shape" and bool(ins) and ins[0] in tensors and tensors[ins[0]].is_static)
            ):
                result.add(idx)
                const_tensors.update(node.outputs)
                changed = True
    return result


# --------------------------------------------------------------------------------------------------
# onnxruntime's own ops written in the default domain: accepted with a note instead of refused.
#
# ONNX Runtime GenAI's model builder (what Olive uses to make the LLM files most users have) writes
# ``SimplifiedLayerNormalization`` in the default ONNX domain.  onnxruntime registers that op (and its
# pre-opset-17 ``LayerNormalization``) there itself, so it runs the model; ``onnx.checker`` knows only
# ONNX's ops and refuses it ("No Op registered for SimplifiedLayerNormalization with domain_version of
# 22").  Refusing would turn away the format most decoder users have, and accepting any unknown op would
# let typos through to a late onnxruntime failure.  So the checker runs on a copy in which only these
# named ops are moved to onnxruntime's ``com.microsoft`` domain (which the checker does not verify): every
# other complaint still refuses the model, and the original complaint is kept as a note.  Stages keep the
# nodes exactly as the source wrote them.

ORT_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization", "LayerNormalization"})
"""Ops onnxruntime registers in the default ONNX domain beyond (or before) ONNX's own: the checker
refuses them where the opset lacks them; onnxruntime runs them."""

_CONTRIB_DOMAIN = "com.microsoft"


def check_model(model: onnx.ModelProto | Path) -> str | None:
    """``onnx.checker.check_model``, except that onnxruntime's default-domain ops are accepted.

    Returns ``None`` when the checker accepts the model as it is, or a note with the checker's complaint
    when it accepts it only with those ops set aside.  Raises the checker's
    :class:`onnx.checker.ValidationError` (or ``ValueError``) for anything else.
    """
    try:
        onnx.checker.check_model(str(model) if isinstance(model, Path) else model)
        return None
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "invalid model"
        proto = onnx.load(str(model), load_external_data=False) if isinstance(model, Path) else model
        moved = _moved_to_contrib(proto)
        if moved is None:
            raise
        ops = sorted({n.op_type for n in proto.graph.node if _is_ort_op(n)})
        try:
            onnx.checker.check_model(moved)
        except onnx.checker.ValidationError:
            raise e from None
        return (
            f"onnx.checker refuses the model ({first}); accepted because onnxruntime runs "
            f"{', '.join(ops)} in the default domain (its own contrib op), and the stages keep those nodes"
        )


def _is_ort_op(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in ORT_DEFAULT_DOMAIN_OPS


def _moved_to_contrib(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy with onnxruntime's default-domain ops in ``com.microsoft``; ``None`` if the
    model has none (then the checker's complaint is about something else)."""
    if not any(_is_ort_op(n) for n in proto.graph.node):
        return None
    copy = external_as_inputs(proto)
    for n in copy.graph.node:
        if _is_ort_op(n):
            if n.op_type == "LayerNormalization" and default_opset(copy) >= 17:
                continue  # ONNX's own op from opset 17: the complaint is about something else
            n.domain = _CONTRIB_DOMAIN
    if not any(o.domain == _CONTRIB_DOMAIN for o in copy.opset_import):
        copy.opset_import.append(onnx.helper.make_opsetid(_CONTRIB_DOMAIN, 1))
    return copy


def external_as_inputs(proto: onnx.ModelProto, *, every: bool = False) -> onnx.ModelProto:
    """A copy of ``proto`` whose weights in external files are graph inputs of the same type, for checking
    in memory: initializers, and the values of ``Constant`` nodes (optimum's fp32 exports keep some there).
    ``every``: all its weights, also those held in the model (one over protobuf's 2 GB, which the
    checker cannot take whole).

    The checker checks an in-memory model's external weights by path from the current folder, not from
    the model's (the builder's ``model.onnx.data`` "is not regular file"), and the copy is checked in
    memory; whether those files are there and whole is checked where the model is loaded
    (:mod:`onnxpipe.ir.load`).  As inputs, the weights' types and shapes still meet the checker.
    """
    moved = (lambda t: True) if every else is_external
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    graph = copy.graph
    constants = {
        i: a.t
        for i, n in enumerate(graph.node)
        if n.op_type == "Constant"
        for a in n.attribute
        if a.type == onnx.AttributeProto.TENSOR and moved(a.t)
    }
    values = [(t.name, t) for t in graph.initializer if moved(t)]
    values += [(graph.node[i].output[0], t) for i, t in constants.items()]
    set_items(graph.initializer, [t for t in graph.initializer if not moved(t)])
    graph.input.extend(onnx.helper.make_tensor_value_info(n, t.data_type, list(t.dims)) for n, t in values)
    set_items(graph.node, [n for i, n in enumerate(graph.node) if i not in constants])
    return copy


# --------------------------------------------------------------------------------------------------
# What ``inspect MODEL`` tells about a model before it is split: its inputs and outputs (dtypes, dims
# with their symbols), opsets, node counts, weights, control-flow nodes and external weight files.
#
# These decide what a split will do and cannot be seen in a table of operators: a symbolic dim is sized
# by a guess unless ``--shape`` sets it, an If or Loop node is one stage's whole, weights kept in external
# files are read from there at export.


@dataclass(frozen=True)
class ModelSummary:
    """The facts of one model that decide how it splits (see the module docstring)."""

    name: str
    inputs: tuple[TensorInfo, ...]
    """The model inputs as shape inference saw them: ``shape`` None when the rank is unknown, a str dim a
    symbol."""
    outputs: tuple[TensorInfo, ...]
    ir_version: int
    opsets: tuple[tuple[str, int], ...]
    """``(domain, version)``, the default domain written ``ai.onnx``."""
    node_count: int
    compute_node_count: int
    param_bytes: int
    control_flow: tuple[tuple[str, str], ...]
    """``(node name, op type)`` of the nodes with subgraphs (If, Loop, Scan)."""
    external_data: tuple[tuple[str, int], ...]
    """``(file, tensors)`` of the files holding weights outside the model file."""
    op_counts: tuple[tuple[str, int], ...]


def summarize(view: ModelView) -> ModelSummary:
    """The :class:`ModelSummary` of ``view`` (reads no weights)."""
    files = Counter(external_info(t)[0] for t in stored_tensors(view.proto) if is_external(t))
    ops: Counter[str] = Counter(
        f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in view.nodes
    )
    return ModelSummary(
        name=view.label,
        inputs=tuple(view.tensor(n) for n in view.inputs),
        outputs=tuple(view.tensor(n) for n in view.outputs),
        ir_version=int(view.proto.ir_version),
        opsets=tuple(sorted((o.domain or "ai.onnx", int(o.version)) for o in view.proto.opset_import)),
        node_count=len(view.nodes),
        compute_node_count=len(view.compute_nodes),
        param_bytes=view.param_bytes,
        control_flow=tuple((n.name, n.op_type) for n in view.nodes if n.has_subgraph),
        external_data=tuple(sorted(files.items())),
        op_counts=tuple(ops.most_common()),
    )
