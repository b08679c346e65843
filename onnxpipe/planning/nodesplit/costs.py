"""What the parts of a cut node cost: measured, because a narrower MatMul is not proportionally faster.

The profile gives the cut chain's cost in the whole model (:class:`~onnxpipe.cost.profile.Profile`).  A
part's cost is that figure times the part's measured share: the chain alone, each distinct part alone and
the join alone are timed side by side with onnxruntime at deployment settings and the profile's threads,
on random inputs at the profiled shapes, taking turns (so that a machine whose speed drifts slows them
alike), and ``part = chain cost * time(part) / time(chain)``.  So a part that runs less efficiently than
its share of the FLOPs (a narrow GEMM, the cache behaviour of a thin slice) costs what it really costs,
and the join costs what it costs instead of nothing.

With static costs (nothing is timed in that mode), or when the chain's input shape is not known at the
profiled shapes, the parts get their share of the columns (or channels, or reduction) and the join is
free: :attr:`PartCosts.measured` says which.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.core.runtimes import time_in_turns
from onnxpipe.cost.profile import CostSource, Profile
from onnxpipe.ir.load import view_from_proto
from onnxpipe.ir.model import ModelView, dtype_name, itemsize
from onnxpipe.ir.shapes import symbol_sizes
from onnxpipe.planning.nodesplit.cut import cut_node
from onnxpipe.planning.nodesplit.find import Constants, SplitKind, Splittable, part_sizes

DEFAULT_RUNS = 15
"""Timed runs of each piece (after one untimed run per turn); the medians are compared."""
TURN = 3
"""Timed runs per piece per turn."""


@dataclass(frozen=True)
class PartCosts:
    """The seconds of each of ``parts`` parts and of their join, in the whole model's terms."""

    parts: int
    part_seconds: tuple[float, ...]
    join_seconds: float
    measured: bool
    """True when timed (see the module doc); False when scaled by the share of the work."""


def chain_seconds(profile: Profile, spec: Splittable) -> float:
    """The profile's cost of the cut node and the nodes carried along with it."""
    return sum(node_seconds(profile, n) for n in spec.chain)


def node_seconds(profile: Profile, node: str) -> float:
    """A node's profiled cost, never negative (a measured difference may come out below zero)."""
    return max(0.0, float(profile.node_seconds.get(node, 0.0)))


def shared_costs(
    profile: Profile, spec: Splittable, kind: SplitKind, parts: int | Sequence[int]
) -> PartCosts:
    """Each part its share of the chain's cost (by the size of its slice), the join free."""
    total = spec.extent(kind)
    sizes = part_sizes(total, parts) if isinstance(parts, int) else list(parts)
    cost = chain_seconds(profile, spec)
    return PartCosts(len(sizes), tuple(cost * s / total for s in sizes), 0.0, measured=False)


def sized_costs(
    view: ModelView,
    profile: Profile,
    spec: Splittable,
    kind: SplitKind,
    layouts: Sequence[Sequence[int]],
    *,
    runs: int = DEFAULT_RUNS,
) -> list[PartCosts]:
    """The costs of ``spec`` cut by ``kind`` into parts of each of ``layouts``' sizes (module doc)."""
    mini = _chain_model(view, profile, spec) if profile.source == CostSource.PROFILE.value else None
    if mini is None:
        return [shared_costs(profile, spec, kind, sizes) for sizes in layouts]
    pieces, read = _pieces(*mini, spec, kind, layouts)
    options = session_options(threads=profile.threads)
    keys = list(pieces)
    sessions = [
        (open_session(model.SerializeToString(), options), [o.name for o in model.graph.output], feeds)
        for model, feeds in (pieces[k] for k in keys)
    ]
    seconds = dict(zip(keys, time_in_turns(sessions, runs=runs, block=TURN), strict=True))
    cost, whole = chain_seconds(profile, spec), seconds["chain"]
    if whole <= 0:
        return [shared_costs(profile, spec, kind, sizes) for sizes in layouts]
    return [
        PartCosts(
            len(names), tuple(cost * seconds[k] / whole for k in names), cost * seconds[join] / whole, True
        )
        for names, join in read
    ]


_Piece = tuple[onnx.ModelProto, dict[str, np.ndarray]]
"""A model to time and its feed."""


def _pieces(
    mini: ModelView,
    feed: dict[str, np.ndarray],
    spec: Splittable,
    kind: SplitKind,
    layouts: Sequence[Sequence[int]],
) -> tuple[dict[str, _Piece], list[tuple[list[str], str]]]:
    """The pieces to time (the chain alone, each distinct part size, a join per part count) and, for each
    layout, the keys of its parts' pieces and of its join's."""
    pieces: dict[str, _Piece] = {"chain": (mini.proto, feed)}
    read: list[tuple[list[str], str]] = []
    rng = np.random.default_rng(0)
    for sizes in layouts:
        cut = cut_node(mini, spec, kind, sizes)
        names = []
        for size, nodes in zip(sizes, cut.parts, strict=True):
            key = f"part {size}"
            if key not in pieces:
                pieces[key] = (_submodel(cut.view, list(nodes), feed), feed)
            names.append(key)
        join_key = f"join {len(sizes)}"
        if join_key not in pieces:  # a join's cost depends on the total it writes, hardly on the parts
            pieces[join_key] = _join_model(cut.view, cut.join, rng)
        read.append((names, join_key))
    return pieces, read


def _concrete(view: ModelView, profile: Profile, tensor: str) -> tuple[int, ...] | None:
    """``tensor``'s shape at the profiled input shapes; one dim that no input names (a reshape's
    ``unk__`` symbol) is worked out from the bytes the profile measured; None when that fails."""
    info = view.tensor(tensor)
    if info.shape is None:
        return None
    dims = symbol_sizes(view, profile.input_shapes)
    out: list[int | None] = []
    for d in info.shape:
        if isinstance(d, int):
            out.append(d)
        elif isinstance(d, str) and d in dims:
            out.append(dims[d])
        else:
            out.append(None)
    unknown = [i for i, d in enumerate(out) if d is None]
    if len(unknown) > 1:
        return None
    if unknown:
        known = math.prod(d for d in out if d is not None) * itemsize(info.elem_type)
        nbytes = profile.tensor_bytes.get(tensor, 0)
        if known <= 0 or nbytes <= 0 or nbytes % known:
            return None
        out[unknown[0]] = nbytes // known
    return tuple(d for d in out if d is not None)


def _chain_model(
    view: ModelView, profile: Profile, spec: Splittable
) -> tuple[ModelView, dict[str, np.ndarray]] | None:
    """The chain alone as a model (its weights inline), with a random feed of its input at the profiled
    shape; None when that shape is not known."""
    consts = Constants(view)
    nodes = [consts.protos[n] for n in spec.chain]
    source = nodes[0].input[0]
    shape = _concrete(view, profile, source)
    elem = view.tensor(source).elem_type
    if shape is None or elem == 0:
        return None
    made = {o for m in nodes for o in m.output}
    inits = []
    for t in (t for n in nodes for t in n.input):
        if t and t != source and t not in made:
            value = consts.value(t)
            if value is None:
                return None
            inits.append(onnx.numpy_helper.from_array(value, t))
    model = _piece_model(
        view,
        "chain",
        nodes,
        [helper.make_tensor_value_info(source, elem, shape)],
        _output(spec.output, view.tensor(spec.output).elem_type),
        list({t.name: t for t in inits}.values()),
    )
    feed = {source: np.random.default_rng(0).standard_normal(shape).astype(dtype_name(elem))}
    return view_from_proto(model), feed


def _submodel(view: ModelView, names: list[str], feed: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The nodes ``names`` of ``view`` as a model reading the chain's input, writing their last output."""
    protos = {n.name: n for n in view.proto.graph.node}
    nodes = [protos[n] for n in names]
    read = {t for n in nodes for t in n.input}
    inits = [t for t in view.proto.graph.initializer if t.name in read]
    (source,) = feed
    inputs = [helper.make_tensor_value_info(source, view.tensor(source).elem_type, feed[source].shape)]
    last = nodes[-1].output[0]
    return _piece_model(view, "part", nodes, inputs, _output(last, view.tensor(last).elem_type), inits)


def _join_model(
    view: ModelView, join: str, rng: np.random.Generator
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The join alone, fed random tensors of its inputs' shapes."""
    proto = next(n for n in view.proto.graph.node if n.name == join)
    feeds: dict[str, np.ndarray] = {}
    inputs = []
    for t in proto.input:
        info = view.tensor(t)
        shape = tuple(int(d) if isinstance(d, int) else 1 for d in (info.shape or ()))
        feeds[t] = rng.standard_normal(shape).astype(info.dtype)
        inputs.append(helper.make_tensor_value_info(t, info.elem_type, shape))
    output = _output(proto.output[0], view.tensor(proto.input[0]).elem_type)
    return _piece_model(view, "join", [proto], inputs, output, []), feeds


def _piece_model(
    view: ModelView,
    name: str,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    output: onnx.ValueInfoProto,
    inits: list[onnx.TensorProto],
) -> onnx.ModelProto:
    """``nodes`` as a model of their own with ``view``'s opsets: one piece of the chain to time."""
    graph = helper.make_graph(nodes, name, inputs, [output], inits)
    model = helper.make_model(graph, opset_imports=list(view.proto.opset_import))
    model.ir_version = view.proto.ir_version if view.proto.ir_version >= 4 else 7
    return model


def _output(name: str, elem: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None)
