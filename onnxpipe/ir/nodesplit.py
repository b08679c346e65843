"""Nodes that can be cut into independent parts, and the model with one of them cut.

A contiguous pipeline can never beat its largest node; GPT-2's LM head or an early Conv of a CNN can be a
quarter of the whole time.  Such a node is cut here into ``p`` ordinary ONNX nodes that each compute a
slice of the output, so that the planner can put them in consecutive stages:

* **columns**: ``MatMul(A, W)`` or ``Gemm(A, B, C)`` with a constant weight: part ``i`` multiplies by
  the weight's output columns ``cols_i``; the parts' outputs are joined by ``Concat`` on the last axis;
* **reduction**: ``MatMul(A, W)`` with a constant 2-D weight: part ``i`` multiplies ``A[..., ks_i]``
  (a ``Slice``) by ``W[ks_i, :]``; the partial products are joined by ``Sum`` (exact up to the order
  of the additions);
* **channels**: ``Conv`` (``group = 1``) with constant weights: part ``i`` computes output channels
  ``chs_i``; joined by ``Concat`` on axis 1.

The nodes right after it in the order that work column by column (or channel by channel) are carried
along into every part, so that the join comes after them: unary activations, ``Add``/``Sub``/``Mul``/
``Div`` by a constant that broadcasts along the split axis (a bias), ``BatchNormalization`` with
constant statistics (channels).  Each is carried only when it is the sole reader of what it takes.

The cut model keeps every tensor name the rest of the graph reads (the join writes the run's last
output), so the stages made from it are compared with the original model by ``verify`` as they are.
Weights are sliced by value: initializers (inline or external) and tensors computed from constants only
(``ConstantOfShape``, ``Transpose`` of an initializer...), evaluated with ``onnx.reference``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnxpipe.core.errors import UsageError
from onnxpipe.ir.load import view_from_proto
from onnxpipe.ir.model import ModelView, NodeInfo


class SplitKind(StrEnum):
    """How a node is cut: by output columns, by the reduction (with a sum), or by output channels."""

    COLUMNS = "columns"
    REDUCTION = "reduction"
    CHANNELS = "channels"


UNARY_OPS = frozenset(
    {"Relu", "Sigmoid", "Tanh", "Gelu", "Erf", "Softplus", "Softsign", "LeakyRelu", "Elu", "Selu",
     "HardSigmoid", "HardSwish", "Mish", "Neg", "Abs", "Exp", "Sqrt", "Identity"}
)  # fmt: skip
"""Elementwise nodes of one input that can run on any slice of their input."""
BINARY_OPS = frozenset({"Add", "Sub", "Mul", "Div"})
MAX_CONSTANT_NODES = 32
"""Most nodes a weight may be computed by and still count as constant (a chain from initializers)."""


@dataclass(frozen=True)
class Splittable:
    """A node that may be cut, with the nodes carried along (``chain``: the node first) and the kinds
    of cut it offers; ``width`` is the size of the split axis (columns, channels) and ``depth`` the
    reduction's length (0 when no reduction split is offered)."""

    node: str
    chain: tuple[str, ...]
    kinds: tuple[SplitKind, ...]
    width: int
    depth: int
    output: str
    """The tensor the chain ends with, which the join writes."""


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


def part_sizes(total: int, parts: int) -> list[int]:
    """``total`` cut into ``parts`` sizes as equal as possible, the larger ones first."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


# --------------------------------------------------------------------------------------------------
# constants


class Constants:
    """Values of the tensors that depend on initializers and constants only, computed on demand."""

    def __init__(self, view: ModelView) -> None:
        self.view = view
        self.inits = {t.name: t for t in view.proto.graph.initializer}
        self.protos = {n.name: n for n in view.proto.graph.node}
        self.cache: dict[str, np.ndarray | None] = {}

    def is_constant(self, name: str) -> bool:
        return self._ancestors(name) is not None

    def value(self, name: str) -> np.ndarray | None:
        if name in self.cache:
            return self.cache[name]
        result: np.ndarray | None = None
        if name in self.inits:
            base = str(self.view.base_dir) if self.view.base_dir is not None else ""
            result = numpy_helper.to_array(self.inits[name], base)
        else:
            chain = self._ancestors(name)
            if chain is not None:
                result = self._evaluate(name, chain)
        self.cache[name] = result
        return result

    def _ancestors(self, name: str) -> list[NodeInfo] | None:
        """The nodes that compute ``name`` from initializers alone, in order; None if it needs more."""
        if name in self.inits:
            return []
        found: dict[int, NodeInfo] = {}
        todo = [name]
        while todo:
            t = todo.pop()
            if t in self.inits or not t:
                continue
            pos = self.view.producer.get(t)
            if pos is None:
                return None  # a model input
            node = self.view.nodes[pos]
            if pos in found:
                continue
            if node.has_subgraph or node.domain not in ("", "ai.onnx") or len(found) >= MAX_CONSTANT_NODES:
                return None
            found[pos] = node
            todo.extend(node.reads)
        return [found[p] for p in sorted(found)]

    def _evaluate(self, name: str, chain: list[NodeInfo]) -> np.ndarray | None:
        needed = {t for n in chain for t in n.reads if t in self.inits}
        graph = helper.make_graph(
            [self.protos[n.name] for n in chain],
            "constant",
            [],
            [helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)],
            [numpy_helper.from_array(self.value(t), t) for t in sorted(needed)],  # type: ignore[arg-type]
        )
        model = helper.make_model(graph, opset_imports=list(self.view.proto.opset_import))
        model.ir_version = max(self.view.proto.ir_version, 4)
        try:
            (out,) = ReferenceEvaluator(model).run(None, {})
        except Exception:  # noqa: BLE001 - an op the reference cannot run: the weight is not usable
            return None
        return np.asarray(out)


# --------------------------------------------------------------------------------------------------
# finding


def _attr(node: onnx.NodeProto, name: str, default: int | float) -> int | float:
    for a in node.attribute:
        if a.name == name:
            return float(a.f) if a.type == onnx.AttributeProto.FLOAT else int(a.i)
    return default


def _rank(view: ModelView, tensor: str) -> int | None:
    shape = view.tensor(tensor).shape
    return None if shape is None else len(shape)


def find_splittable(view: ModelView) -> dict[str, Splittable]:
    """Every node of ``view`` that can be cut, by name."""
    consts = Constants(view)
    protos = {n.name: n for n in view.proto.graph.node}
    compute = view.compute_nodes
    found: dict[str, Splittable] = {}
    for i, info in enumerate(compute):
        proto = protos[info.name]
        head = _head(view, consts, info, proto)
        if head is None:
            continue
        kinds, width, depth, axis = head
        chain = [info.name]
        out = info.outputs[0]
        if kinds != (SplitKind.REDUCTION,):
            j = i + 1
            while j < len(compute):
                nxt = compute[j]
                if not _carries(view, consts, protos[nxt.name], nxt, out, axis, width):
                    break
                chain.append(nxt.name)
                out = nxt.outputs[0]
                j += 1
        if SplitKind.REDUCTION in kinds and len(chain) > 1:
            kinds = tuple(k for k in kinds if k != SplitKind.REDUCTION) or kinds
        found[info.name] = Splittable(info.name, tuple(chain), kinds, width, depth, out)
    return found


def _single_reader(view: ModelView, tensor: str) -> bool:
    return len(view.consumers.get(tensor, ())) == 1 and tensor not in view.outputs


def _head(
    view: ModelView, consts: Constants, info: NodeInfo, proto: onnx.NodeProto
) -> tuple[tuple[SplitKind, ...], int, int, int] | None:
    """``(kinds, width, depth, split axis from the end)`` of a node that can be cut, else None."""
    if info.domain not in ("", "ai.onnx") or len(info.outputs) != 1 or info.has_subgraph:
        return None
    ins = list(proto.input)
    if info.op_type == "MatMul" and len(ins) == 2 and consts.is_constant(ins[1]):
        shape = view.tensor(ins[1]).shape
        rank_a = _rank(view, ins[0])
        if shape is None or len(shape) != 2 or not all(isinstance(d, int) for d in shape) or not rank_a:
            return None
        depth, width = int(shape[0]), int(shape[1])  # type: ignore[arg-type]
        kinds = (
            (SplitKind.COLUMNS, SplitKind.REDUCTION) if rank_a >= 1 and depth >= 2 else (SplitKind.COLUMNS,)
        )
        return (kinds, width, depth, 0) if width >= 2 else None
    if info.op_type == "Gemm" and len(ins) >= 2 and consts.is_constant(ins[1]):
        shape = view.tensor(ins[1]).shape
        if shape is None or len(shape) != 2 or not all(isinstance(d, int) for d in shape):
            return None
        if len(ins) > 2 and ins[2] and not consts.is_constant(ins[2]):
            return None
        width = int(shape[0] if _attr(proto, "transB", 0) else shape[1])  # type: ignore[arg-type]
        return ((SplitKind.COLUMNS,), width, 0, 0) if width >= 2 else None
    if info.op_type == "Conv" and len(ins) >= 2 and consts.is_constant(ins[1]):
        shape = view.tensor(ins[1]).shape
        if _attr(proto, "group", 1) != 1 or shape is None or not isinstance(shape[0], int):
            return None
        if len(ins) > 2 and ins[2] and not consts.is_constant(ins[2]):
            return None
        rank = _rank(view, info.outputs[0]) or (len(shape) if shape else 0)
        width = int(shape[0])
        return ((SplitKind.CHANNELS,), width, 0, rank - 2) if width >= 2 and rank >= 3 else None
    return None


def _carries(
    view: ModelView,
    consts: Constants,
    proto: onnx.NodeProto,
    info: NodeInfo,
    src: str,
    axis: int,
    width: int,
) -> bool:
    """Whether ``info`` (the next node in the order) works slice by slice on ``src`` along ``axis``
    (counted from the end) and may be carried into every part."""
    if not _single_reader(view, src) or len(info.outputs) != 1 or info.domain not in ("", "ai.onnx"):
        return False
    ins = list(proto.input)
    if info.op_type in UNARY_OPS:
        return ins == [src]
    if info.op_type in BINARY_OPS and len(ins) == 2 and src in ins and ins[0] != ins[1]:
        other = ins[1] if ins[0] == src else ins[0]
        rank = _rank(view, src)
        value = consts.value(other) if consts.is_constant(other) else None
        if value is None or rank is None or value.ndim > rank:
            return False
        at = value.ndim - 1 - axis  # the split axis in the constant (right-aligned broadcasting)
        return at < 0 or value.shape[at] in (1, width)
    if info.op_type == "BatchNormalization" and axis >= 1 and ins[0] == src and len(proto.output) == 1:
        rank = _rank(view, src)
        return rank is not None and rank - 1 - axis == 1 and all(consts.is_constant(t) for t in ins[1:5])
    return False


# --------------------------------------------------------------------------------------------------
# cutting


def cut_node(view: ModelView, spec: Splittable, kind: SplitKind, parts: int | Sequence[int]) -> CutModel:
    """``view`` with ``spec``'s chain replaced by ``parts`` parts and their join (see the module doc).

    ``parts``: how many parts of (nearly) equal size, or the size of each part, in order (they must sum
    to the columns, channels or reduction length).
    """
    if kind not in spec.kinds:
        raise UsageError(
            f"node {spec.node}: cannot be cut by {kind.value}; it offers {', '.join(spec.kinds)}"
        )
    total = spec.depth if kind == SplitKind.REDUCTION else spec.width
    sizes = part_sizes(total, parts) if isinstance(parts, int) else [int(s) for s in parts]
    if len(sizes) < 2 or min(sizes) < 1 or sum(sizes) != total:
        raise UsageError(
            f"node {spec.node}: cannot cut {total} {kind.value} into {len(sizes)} parts of {sizes}"
        )
    parts = len(sizes)
    consts = Constants(view)
    protos = {n.name: n for n in view.proto.graph.node}
    taken = {n.name for n in view.nodes} | set(view.tensors) | set(view.initializers)
    names = _Names(taken)
    new_inits: list[onnx.TensorProto] = []
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    chain = [protos[n] for n in spec.chain]
    head = chain[0]
    part_nodes: list[list[onnx.NodeProto]] = []
    part_outputs: list[str] = []

    def const(value: np.ndarray, hint: str) -> str:
        name = names.fresh(hint)
        new_inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    for i in range(parts):
        lo, hi = int(starts[i]), int(starts[i + 1])
        nodes: list[onnx.NodeProto] = []
        ins = list(head.input)
        if kind == SplitKind.REDUCTION:
            w = consts.value(ins[1])
            assert w is not None
            sliced = names.fresh(f"{ins[0]}__k{i}")
            nodes.append(
                helper.make_node(
                    "Slice",
                    [
                        ins[0],
                        const(np.array([lo], np.int64), f"{head.name}__k{i}_start"),
                        const(np.array([hi], np.int64), f"{head.name}__k{i}_end"),
                        const(np.array([-1], np.int64), f"{head.name}__k{i}_axis"),
                    ],
                    [sliced],
                    name=names.fresh(f"{head.name}__slice{i}"),
                )
            )
            ins = [sliced, const(w[lo:hi, :], f"{ins[1]}__k{i}")]
        elif head.op_type == "MatMul":
            w = consts.value(ins[1])
            assert w is not None
            ins[1] = const(w[:, lo:hi], f"{ins[1]}__part{i}")
        elif head.op_type == "Gemm":
            w = consts.value(ins[1])
            assert w is not None
            ins[1] = const(w[lo:hi, :] if _attr(head, "transB", 0) else w[:, lo:hi], f"{ins[1]}__part{i}")
            if len(ins) > 2 and ins[2]:
                c = consts.value(ins[2])
                assert c is not None
                if c.ndim >= 1 and c.shape[-1] == spec.width:
                    ins[2] = const(c[..., lo:hi], f"{ins[2]}__part{i}")
        else:  # Conv
            w = consts.value(ins[1])
            assert w is not None
            ins[1] = const(w[lo:hi], f"{ins[1]}__part{i}")
            if len(ins) > 2 and ins[2]:
                b = consts.value(ins[2])
                assert b is not None
                ins[2] = const(b[lo:hi], f"{ins[2]}__part{i}")
        out = names.fresh(f"{head.output[0]}__part{i}")
        nodes.append(_copy(head, ins, [out], names.fresh(f"{head.name}__part{i}")))
        axis_from_end = 0 if kind != SplitKind.CHANNELS else (_rank(view, head.output[0]) or 4) - 2
        for follower in chain[1:]:
            out = _carry(
                view, consts, follower, out, i, lo, hi, axis_from_end, spec.width, names, const, nodes
            )
        part_nodes.append(nodes)
        part_outputs.append(out)
    if kind == SplitKind.REDUCTION:
        join = helper.make_node("Sum", part_outputs, [spec.output], name=names.fresh(f"{spec.node}__join"))
    else:
        axis = 1 if kind == SplitKind.CHANNELS else -1
        join = helper.make_node(
            "Concat", part_outputs, [spec.output], name=names.fresh(f"{spec.node}__join"), axis=axis
        )
    proto = _rebuilt(view, spec, [n for p in part_nodes for n in p] + [join], new_inits)
    new_view = _in_order(view, proto, spec, [n.name for p in part_nodes for n in p] + [join.name])
    return CutModel(
        view=new_view,
        parts=tuple(tuple(n.name for n in p) for p in part_nodes),
        join=join.name,
        kind=kind,
        spec=spec,
    )


class _Names:
    """Fresh tensor and node names that collide with nothing in the model."""

    def __init__(self, taken: set[str]) -> None:
        self.taken = set(taken)

    def fresh(self, hint: str) -> str:
        name, k = hint, 1
        while name in self.taken:
            name, k = f"{hint}_{k}", k + 1
        self.taken.add(name)
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


def _carry(
    view: ModelView,
    consts: Constants,
    node: onnx.NodeProto,
    src: str,
    i: int,
    lo: int,
    hi: int,
    axis: int,
    width: int,
    names: _Names,
    const: object,
    nodes: list[onnx.NodeProto],
) -> str:
    """Append part ``i`` of the carried ``node`` (reading ``src``, the part's running output)."""
    make = const  # (value, hint) -> initializer name
    assert callable(make)
    prev = node.input[0] if node.op_type in UNARY_OPS or node.op_type == "BatchNormalization" else ""
    ins = list(node.input)
    if node.op_type in BINARY_OPS:
        which = 1 if consts.is_constant(ins[0]) else 0  # the operand that is not constant is the chain's
        other = 1 - which
        value = consts.value(ins[other])
        assert value is not None
        at = value.ndim - 1 - axis
        if at >= 0 and value.shape[at] == width and width > 1:
            ins[other] = make(np.take(value, range(lo, hi), axis=at), f"{ins[other]}__part{i}")
        ins[which] = src
    elif node.op_type == "BatchNormalization":
        ins[0] = src
        for j in range(1, 5):
            value = consts.value(ins[j])
            assert value is not None
            ins[j] = make(value[lo:hi], f"{ins[j]}__part{i}")
    else:
        assert prev
        ins[0] = src
    out = names.fresh(f"{node.output[0]}__part{i}")
    nodes.append(_copy(node, ins, [out], names.fresh(f"{node.name}__part{i}")))
    return out


def _rebuilt(
    view: ModelView, spec: Splittable, new_nodes: list[onnx.NodeProto], new_inits: list[onnx.TensorProto]
) -> onnx.ModelProto:
    """A copy of the model with the chain's nodes replaced by ``new_nodes`` (where the head was) and
    whatever only the chain read removed (weights, the nodes that computed them)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(view.proto)
    graph = proto.graph
    chain = set(spec.chain)
    kept: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.name == spec.node:
            kept.extend(new_nodes)
        elif node.name not in chain:
            kept.append(node)
    kept = _without_dead(kept, {o.name for o in graph.output})
    read = {t for n in kept for t in n.input} | {o.name for o in graph.output}
    for n in kept:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                read |= _graph_reads(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    read |= _graph_reads(g)
    del graph.node[:]
    graph.node.extend(kept)
    inits = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(inits + new_inits)
    init_names = {t.name for t in view.proto.graph.initializer}
    inputs = [i for i in graph.input if i.name not in init_names or i.name in read]
    del graph.input[:]
    graph.input.extend(inputs)
    produced = {o for n in kept for o in n.output} | {i.name for i in graph.input}
    infos = [v for v in graph.value_info if v.name in produced]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    return proto


def _graph_reads(g: onnx.GraphProto) -> set[str]:
    out = set()
    for n in g.node:
        out |= set(n.input)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                out |= _graph_reads(a.g)
    return out


def _without_dead(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` without those whose outputs nobody reads (repeatedly): the weights' producers that only
    the cut chain read."""
    alive = list(nodes)
    while True:
        read = set(outputs)
        for n in alive:
            read.update(n.input)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    read |= _graph_reads(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g in a.graphs:
                        read |= _graph_reads(g)
        keep = [n for n in alive if any(o and o in read for o in n.output)]
        if len(keep) == len(alive):
            return keep
        alive = keep


def _in_order(view: ModelView, proto: onnx.ModelProto, spec: Splittable, new: list[str]) -> ModelView:
    """The view of ``proto`` in ``view``'s order, ``new`` where the chain's head was: the parts stay next
    to each other, as the planner's sequence assumes (the loader's own order might interleave them)."""
    fresh = view_from_proto(proto, path=view.path, sha256=view.sha256, base_dir=view.base_dir)
    by_name = {n.name: n for n in fresh.nodes}
    chain = set(spec.chain)
    order: list[str] = []
    for n in view.nodes:
        if n.name == spec.node:
            order.extend(new)
        elif n.name not in chain and n.name in by_name:
            order.append(n.name)
    nodes = [replace(by_name[name], position=pos) for pos, name in enumerate(order)]
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for n in nodes:
        for o in n.outputs:
            producer[o] = n.position
        for t in dict.fromkeys(n.reads):
            consumers.setdefault(t, []).append(n.position)
    return replace(
        fresh,
        nodes=tuple(nodes),
        producer=MappingProxyType(producer),
        consumers=MappingProxyType({k: tuple(v) for k, v in consumers.items()}),
    )


def describe(spec: Splittable) -> str:
    carried = f" with {', '.join(spec.chain[1:])} carried along" if len(spec.chain) > 1 else ""
    return f"{spec.node} ({'/'.join(spec.kinds)}, {spec.width} wide){carried}"


__all__ = [
    "Constants",
    "CutModel",
    "SplitKind",
    "Splittable",
    "cut_node",
    "describe",
    "find_splittable",
    "part_sizes",
]
