"""The model with one node cut: ``p`` ordinary ONNX nodes in place of the node, each computing a slice of
its output, and a join that puts the slices back together (see :mod:`.find` for the kinds of cut).

The cut model keeps every tensor name the rest of the graph reads (the join writes the chain's last
output), so the stages made from it are compared with the original model by ``verify`` as they are.
Weights are sliced by value (:class:`.find.Constants`); what only the cut chain read (the whole weights, the
nodes that computed them) leaves the model.

:func:`cut_node` reads as its steps: check the sizes, make each part, make the join, put them where the
chain was, and keep the original order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxpipe.core.errors import UsageError
from onnxpipe.ir.load import in_order, view_from_proto
from onnxpipe.ir.model import ModelView, set_items, subgraph_outer_reads
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
