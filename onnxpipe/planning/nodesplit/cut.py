"""The model with one node cut: ``p`` ordinary ONNX nodes in place of the node, each computing a slice of
its output, and a join that puts the slices back together (see :mod:`.find` for the kinds of cut).

The cut model keeps every tensor name the rest of the graph reads (the join writes the chain's last
output), so the stages made from it are compared with the original model by ``verify`` as they are.
Weights are sliced by value (:class:`.find.Constants`); what only the cut chain read (the whole weights, the
nodes that computed them) leaves the model.

:func:`cut_node` reads as its steps: check the sizes, make each part, make the join, put them where the
chain was, and keep the original order.

What the parts of a cut node cost (:func:`sized_costs`, :func:`shared_costs`): measured, because a narrower
MatMul is not proportionally faster.

The profile gives the cut chain's cost in the whole model (:class:`~onnxpipe.cost.profile.Profile`). A
part's cost is that figure times the part's measured share: the chain alone, each distinct part alone and
the join alone are timed side by side with onnxruntime at deployment settings and the profile's threads, on
random inputs at the profiled shapes, taking turns (so that a machine whose speed drifts slows them alike),
and ``part = chain cost * time(part) / time(chain)``. So a part that runs less efficiently than its share of
the FLOPs (a narrow GEMM, the cache behaviour of a thin slice) costs what it really costs, and the join
costs what it costs instead of nothing.

With static costs (nothing is timed in that mode), or when the chain's input shape is not known at the
profiled shapes, the parts get their share of the columns (or channels, or reduction) and the join is free:
:attr:`PartCosts.measured` says which.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxpipe.core.errors import UsageError
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.core.runtimes import time_in_turns
from onnxpipe.cost.profile import CostSource, Profile
from onnxpipe.ir.load import in_order, view_from_proto
from onnxpipe.ir.model import ModelView, dtype_name, itemsize, set_items, subgraph_outer_reads
from onnxpipe.ir.shapes import symbol_sizes
from onnxpipe.planning.nodesplit.find import (
    BINARY_OPS,
    UNARY_OPS,
    Constants,
    SplitKind,
    Splittable,
    part_sizes,
    tensor_rank,
)


@dataclass(frozen=True)
class CutModel:
    """The model with one node cut: its view (in the original order, parts in place of the chain) and
    the names of the new nodes."""

    view: ModelView
    parts: tuple[tuple[str, ...], ...]
    """The nodes of each part, in order (a part is the cut node's slice and its carried nodes)."""
    join: str
    kind: SplitKind
    spec: Splittable


def cut_node(view: ModelView, spec: Splittable, kind: SplitKind, parts: int | Sequence[int]) -> CutModel:
    """``view`` with ``spec``'s chain replaced by ``parts`` parts and their join (see the module doc).

    ``parts``: how many parts of (nearly) equal size, or the size of each part, in order (they must sum
    to the columns, channels or reduction length).
    """
    sizes = _checked_sizes(spec, kind, parts)
    cutter = _Cutter(view, spec, kind)
    starts = [0, *itertools.accumulate(sizes)]
    part_nodes = [cutter.part(_Slice(i, starts[i], starts[i + 1])) for i in range(len(sizes))]
    join = cutter.join([nodes[-1].output[0] for nodes in part_nodes])
    new = [*(n for nodes in part_nodes for n in nodes), join]
    proto = _rebuilt(view, spec, new, cutter.inits)
    return CutModel(
        view=_in_order(view, proto, spec, [n.name for n in new]),
        parts=tuple(tuple(n.name for n in nodes) for nodes in part_nodes),
        join=join.name,
        kind=kind,
        spec=spec,
    )


def _checked_sizes(spec: Splittable, kind: SplitKind, parts: int | Sequence[int]) -> list[int]:
    """The size of each part; a kind the node does not offer, or sizes that do not share out its extent
    in two or more non-empty parts, are refused (:class:`UsageError`)."""
    if kind not in spec.kinds:
        raise UsageError(
            f"node {spec.node}: cannot be cut by {kind.value}; it offers {', '.join(spec.kinds)}"
        )
    total = spec.extent(kind)
    sizes = part_sizes(total, parts) if isinstance(parts, int) else [int(s) for s in parts]
    if len(sizes) < 2 or min(sizes) < 1 or sum(sizes) != total:
        raise UsageError(
            f"node {spec.node}: cannot cut {total} {kind.value} into {len(sizes)} parts of {sizes}"
        )
    return sizes


@dataclass(frozen=True)
class _Slice:
    """Part ``index`` of a cut: the columns, channels or reduction indices ``lo:hi``."""

    index: int
    lo: int
    hi: int


# --------------------------------------------------------------------------------------------------
# the parts and the join


class _Cutter:
    """What every part of one cut needs: the weights by value, names that collide with nothing, and the
    new initializers (the weights' slices) in the order they are made."""

    def __init__(self, view: ModelView, spec: Splittable, kind: SplitKind) -> None:
        self.spec = spec
        self.kind = kind
        self.consts = Constants(view)
        self.taken = {n.name for n in view.nodes} | set(view.tensors) | set(view.initializers)
        self.inits: list[onnx.TensorProto] = []
        self.chain = [self.consts.protos[n] for n in spec.chain]
        head = self.chain[0]
        self.axis = 0 if kind != SplitKind.CHANNELS else (tensor_rank(view, head.output[0]) or 4) - 2
        """The split axis counted from the end (the carried nodes' constants are sliced along it)."""

    def part(self, s: _Slice) -> list[onnx.NodeProto]:
        """Part ``s`` of the chain: the cut node on its slice (a reduction's ``Slice`` of the input first),
        then each carried node on the part's running output."""
        head = self.chain[0]
        nodes: list[onnx.NodeProto] = []
        ins = (
            self._reduction_inputs(s, nodes) if self.kind == SplitKind.REDUCTION else self._sliced_weights(s)
        )
        out = self._append(nodes, head, ins, s)
        for follower in self.chain[1:]:
            out = self._append(nodes, follower, self._carried_inputs(follower, out, s), s)
        return nodes

    def join(self, outputs: list[str]) -> onnx.NodeProto:
        """The node that writes the chain's output from the parts': their sum, or their concatenation
        along the split axis."""
        name = self._fresh(f"{self.spec.node}__join")
        if self.kind == SplitKind.REDUCTION:
            return helper.make_node("Sum", outputs, [self.spec.output], name=name)
        axis = 1 if self.kind == SplitKind.CHANNELS else -1
        return helper.make_node("Concat", outputs, [self.spec.output], name=name, axis=axis)

    def _reduction_inputs(self, s: _Slice, nodes: list[onnx.NodeProto]) -> list[str]:
        """A reduction part multiplies ``A[..., lo:hi]`` (a ``Slice`` appended to ``nodes``) by
        ``W[lo:hi, :]``."""
        head = self.chain[0]
        a, w = head.input[0], head.input[1]
        weight = self.consts.weight(w)
        sliced = self._fresh(f"{a}__k{s.index}")
        bounds = [
            self._const(np.array([v], np.int64), f"{head.name}__k{s.index}_{what}")
            for v, what in ((s.lo, "start"), (s.hi, "end"), (-1, "axis"))
        ]
        slicer = self._fresh(f"{head.name}__slice{s.index}")
        nodes.append(helper.make_node("Slice", [a, *bounds], [sliced], name=slicer))
        return [sliced, self._const(weight[s.lo : s.hi, :], f"{w}__k{s.index}")]

    def _sliced_weights(self, s: _Slice) -> list[str]:
        """A part by columns or channels reads the node's input whole, and its slice of the weight (and
        of the bias where the bias has the columns)."""
        head = self.chain[0]
        ins = list(head.input)
        part = slice(s.lo, s.hi)
        w = self.consts.weight(ins[1])
        if head.op_type == "MatMul":
            ins[1] = self._part(w[:, part], ins[1], s)
        elif head.op_type == "Gemm":
            trans_b = any(a.name == "transB" and a.i for a in head.attribute)
            ins[1] = self._part(w[part, :] if trans_b else w[:, part], ins[1], s)
            if len(ins) > 2 and ins[2]:
                c = self.consts.weight(ins[2])
                if c.ndim >= 1 and c.shape[-1] == self.spec.width:
                    ins[2] = self._part(c[..., part], ins[2], s)
        else:  # Conv
            ins[1] = self._part(w[part], ins[1], s)
            if len(ins) > 2 and ins[2]:
                ins[2] = self._part(self.consts.weight(ins[2])[part], ins[2], s)
        return ins

    def _carried_inputs(self, node: onnx.NodeProto, src: str, s: _Slice) -> list[str]:
        """The inputs of part ``s`` of the carried ``node``: ``src`` (the part's running output) for the
        chain's tensor, and the slice of a constant that has the split axis."""
        ins = list(node.input)
        if node.op_type in BINARY_OPS:
            # the operand that is not constant is the chain's
            which = 1 if self.consts.is_constant(ins[0]) else 0
            other = 1 - which
            value = self.consts.weight(ins[other])
            at = value.ndim - 1 - self.axis
            if at >= 0 and value.shape[at] == self.spec.width and self.spec.width > 1:
                ins[other] = self._part(np.take(value, range(s.lo, s.hi), axis=at), ins[other], s)
            ins[which] = src
        elif node.op_type == "BatchNormalization":
            ins[0] = src
            for j in range(1, 5):
                ins[j] = self._part(self.consts.weight(ins[j])[s.lo : s.hi], ins[j], s)
        else:
            assert node.op_type in UNARY_OPS
            ins[0] = src
        return ins

    def _append(self, nodes: list[onnx.NodeProto], node: onnx.NodeProto, ins: list[str], s: _Slice) -> str:
        """Append part ``s`` of ``node`` (a copy reading ``ins``) to ``nodes``; its output's name."""
        out = self._fresh(f"{node.output[0]}__part{s.index}")
        nodes.append(_copy(node, ins, [out], self._fresh(f"{node.name}__part{s.index}")))
        return out

    def _part(self, value: np.ndarray, weight: str, s: _Slice) -> str:
        """A new initializer holding part ``s`` of ``weight`` (``value``, already sliced); its name."""
        return self._const(value, f"{weight}__part{s.index}")

    def _fresh(self, hint: str) -> str:
        """A tensor or node name that collides with nothing in the model."""
        name, k = hint, 1
        while name in self.taken:
            name, k = f"{hint}_{k}", k + 1
        self.taken.add(name)
        return name

    def _const(self, value: np.ndarray, hint: str) -> str:
        """A new initializer holding ``value``; its name."""
        name = self._fresh(hint)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name


def _copy(node: onnx.NodeProto, inputs: Sequence[str], outputs: Sequence[str], name: str) -> onnx.NodeProto:
    new = onnx.NodeProto()
    new.CopyFrom(node)
    del new.input[:]
    new.input.extend(inputs)
    del new.output[:]
    new.output.extend(outputs)
    new.name = name
    return new


# --------------------------------------------------------------------------------------------------
# the model with the parts in place


def _rebuilt(
    view: ModelView, spec: Splittable, new_nodes: list[onnx.NodeProto], new_inits: list[onnx.TensorProto]
) -> onnx.ModelProto:
    """A copy of the model with the chain's nodes replaced by ``new_nodes`` (where the head was) and
    whatever only the chain read removed (weights, the nodes that computed them)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(view.proto)
    graph = proto.graph
    outputs = {o.name for o in graph.output}
    chain = set(spec.chain)
    kept: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.name == spec.node:
            kept.extend(new_nodes)
        elif node.name not in chain:
            kept.append(node)
    kept = _without_dead(kept, outputs)
    read = _reads(kept) | outputs
    init_names = {t.name for t in view.proto.graph.initializer}
    set_items(graph.node, kept)
    set_items(graph.initializer, [t for t in graph.initializer if t.name in read] + new_inits)
    set_items(graph.input, [i for i in graph.input if i.name not in init_names or i.name in read])
    produced = {o for n in kept for o in n.output} | {i.name for i in graph.input}
    set_items(graph.value_info, [v for v in graph.value_info if v.name in produced])
    return proto


def _reads(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    """Every tensor ``nodes`` read, their subgraphs' outer reads included (a weight only a branch reads
    stays)."""
    return {t for n in nodes for t in (*n.input, *subgraph_outer_reads(n))}


def _without_dead(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` without those whose outputs nobody reads (repeatedly): the weights' producers that only
    the cut chain read."""
    alive = list(nodes)
    while True:
        read = _reads(alive) | outputs
        keep = [n for n in alive if any(o and o in read for o in n.output)]
        if len(keep) == len(alive):
            return keep
        alive = keep


def _in_order(view: ModelView, proto: onnx.ModelProto, spec: Splittable, new: list[str]) -> ModelView:
    """The view of ``proto`` in ``view``'s order, ``new`` where the chain's head was: the parts stay next
    to each other, as the planner's sequence assumes (the loader's own order might interleave them)."""
    fresh = view_from_proto(proto, path=view.path, sha256=view.sha256, base_dir=view.base_dir)
    kept = {n.name for n in fresh.nodes}
    chain = set(spec.chain)
    order: list[str] = []
    for n in view.nodes:
        if n.name == spec.node:
            order.extend(new)
        elif n.name not in chain and n.name in kept:
            order.append(n.name)
    return in_order(fresh, order)


# --------------------------------------------------------------------------------------------------
# what the parts cost

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
